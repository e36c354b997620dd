"""agentrl-advnorm-task: standardize advantages per task (data_source) within a batch."""

__version__ = "0.1.0"
