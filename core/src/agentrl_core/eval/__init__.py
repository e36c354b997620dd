"""Evaluation library: success rate over repeats, pass@k, termination-status tables, the episode runner.

``agentrl eval`` itself (engines, control plane, models) is :mod:`agentrl_core.jobs.evaluation`;
the training job's validation uses the same runner.
"""
