"""agentrl environment ``db``: the AgentBench DB task (dbbench) with AgentBench-FC semantics.

The environment itself lives in :mod:`agentrl_env_db.env`; this package import is cheap.
"""

__version__ = "0.1.0"
