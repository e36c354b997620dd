"""Config section ``environments.kg``."""

from __future__ import annotations

from typing import Literal

from attrs import field, frozen

from agentrl_core.structure import check, in_range


@frozen
class KGConfig:
    """Config section ``environments.kg``.

    ``source`` picks the questions: ``fb15k237`` (generated over the bundled graph; index
    sets ``fb-train``, ``fb-dev``, ``fb-test``) or ``agentbench`` (AgentBench's ``std``,
    ``dev``, ``train``; they need Freebase: a ``sparql`` endpoint, or an embedded store
    built from ``graph_files``). ``backend`` picks where queries run.
    """

    source: Literal["fb15k237", "agentbench"] = "fb15k237"
    backend: Literal["embedded", "sparql"] = "embedded"
    endpoint: str | None = field(default=None, validator=check(lambda v: v.startswith(("http://", "https://")), "must be an http(s) URL"))
    store_path: str | None = None  # embedded store directory; default: a cache folder keyed by the data
    graph_files: list[str] = field(factory=list)  # N-Triples files for the embedded store instead of the bundled graph
    data_dir: str | None = None  # a folder holding the data files instead of the installed ones
    questions_file: str | None = None  # a generated question file instead of the shipped one (fb15k237)
    max_rounds: int = field(default=15, validator=in_range(1))
    one_shot: bool = False
    query_timeout: float = field(default=30.0, validator=in_range(0.0, lo_open=True))
    connect_timeout: float = field(default=5.0, validator=in_range(0.0, lo_open=True))
    max_results: int = field(default=10_000, validator=in_range(1))
    query_threads: int = field(default=4, validator=in_range(1))
    max_connections: int = field(default=32, validator=in_range(1))
    concurrency: int = field(default=256, validator=in_range(1))
