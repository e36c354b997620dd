"""The environment control plane: the services that serve environments to rollouts.

* :mod:`.controller`: ``agentrl controller``, the registry of task workers that routes
  every session (``state``: its bookkeeping, ``upkeep``: heartbeats, reconciliation and
  timeouts, ``metrics``: Prometheus text, ``openapi``: the API description);
* :mod:`.worker`: ``agentrl worker``, one environment's index set behind HTTP;
* :mod:`.wire`: the JSON shapes both speak (AgentRL/AgentBench compatible);
* :mod:`.client`: the rollout side's async client of the controller;
* :mod:`.embedded`: a controller and one worker per task as child processes, which
  ``agentrl train`` and ``agentrl eval`` start when ``controller.url`` is not set.

Environments themselves are written against :mod:`agentrl_core.env`, which imports none
of this.
"""
