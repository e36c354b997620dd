"""Rollout: the agent loops, chat encoding, tool parsers, samplers, the engine client and the drivers.

* :mod:`.agent_loop` (``chat``) plays an episode against an engine pool, token in token out;
  :mod:`.openai_loop` plays one against any OpenAI-compatible endpoint (``agentrl eval
  --engine openai``);
* :mod:`.chat_encoding`, :mod:`.tokenizer`, :mod:`.tool_parsers`, :mod:`.sampler`;
* :mod:`.engine_client`: the async client of every engine (SGLang's native API subset);
* :mod:`.drivers`: the engine-driver kit, with the ``hf`` and ``sglang`` drivers.

The hf engine server itself is :mod:`agentrl_core.engine`. Nothing heavy is imported here.
See ``core/docs/engine.md`` for the engine protocol.
"""
