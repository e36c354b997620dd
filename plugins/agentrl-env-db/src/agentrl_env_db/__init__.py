"""agentrl environment ``db``: the AgentBench DB task (dbbench) with AgentBench-FC semantics.

The environment itself lives in :mod:`agentrl_env_db.env`; this package import is cheap.
"""

from importlib import metadata

__version__ = metadata.version("agentrl-env-db")  # the root VERSION file, at build time
