"""agentrl's own inference engine (the ``hf`` driver's server), on ``transformers``.

It speaks the subset of SGLang's native API that rollouts and weight sync use, plus OpenAI
chat completions (core/docs/engine.md):

* :mod:`.server`: the HTTP routes and request validation;
* :mod:`.openai_api`: ``/v1/chat/completions`` with tools and ``/v1/models``;
* :mod:`.process`: ``agentrl engine serve`` and ``BackgroundEngine`` (a thread, for tests);
* :mod:`.scheduler`: continuous batching, slots, pause/abort, weight versions;
* :mod:`.sampling`: sampling parameters, sampling and log-probs;
* :mod:`.model`: the forward pass with a slot KV cache;
* :mod:`.weight_group`: the learner-engine process group for weight updates (the engine
  side; the learner imports it too).

The rollout side (client, drivers, agent loop) is :mod:`agentrl_core.rollout`.
"""
