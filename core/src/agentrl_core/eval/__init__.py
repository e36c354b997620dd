"""Evaluation: success rate over repeats, pass@k, termination-status tables (``agentrl eval``)."""
