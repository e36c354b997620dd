"""The OpenAI-compatible training gateway: train any agent that talks to ``/v1/chat/completions``.

``agentrl gateway`` serves OpenAI's chat and completion endpoints in front of the engine
pools and keeps, per session, the exact token ids, log-probs and policy versions of every
call (:mod:`.capture`); ``agentrl train`` with ``agent: ...`` runs an agent program against
it and trains on what it captured (:mod:`.loop`). Reference: ``core/docs/gateway.md``;
design: docs/architecture.md section 5.

* :mod:`.protocol`: the OpenAI wire format (requests, responses, streaming, errors);
* :mod:`.capture`: token capture, the append / realign / fork decisions;
* :mod:`.sessions`: sessions, keys, deadlines, replayed retries;
* :mod:`.engines`: pool choice, weight-update windows;
* :mod:`.openai_api`, :mod:`.session_api`: one handler per endpoint; :mod:`.server`: the app;
* :mod:`.process`: building and running a gateway; :mod:`.client`: the trainer's client;
* :mod:`.loop`: the agent loop that runs agent programs (:class:`AgentTask`).
"""

from agentrl_core.gateway.loop import AgentTask, EnvironmentHandle, EpisodeFinished, Observation

__all__ = ["AgentTask", "EnvironmentHandle", "EpisodeFinished", "Observation"]
