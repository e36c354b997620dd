"""agentrl-advnorm-task: standardize advantages per task (data_source) within a batch."""

from importlib import metadata

__version__ = metadata.version("agentrl-advnorm-task")  # the root VERSION file, at build time
