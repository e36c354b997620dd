"""The jobs the CLI runs: orchestration on top of every other package.

* :mod:`.training`: ``agentrl train`` (:class:`~agentrl_core.jobs.training.Trainer`): the
  control plane, the Ray pools, the rollout manager and the learner steps;
* :mod:`.evaluation`: ``agentrl eval`` (:class:`~agentrl_core.jobs.evaluation.Evaluation`);
* :mod:`.sft`: ``agentrl sft``, supervised cold start with the RL learner;
* :mod:`.progress`: what they print while they run.

Nothing below imports this package: the libraries they compose (``train``, ``eval``,
``rollout``, ``launch``, ``controlplane``) stay usable on their own.
"""
