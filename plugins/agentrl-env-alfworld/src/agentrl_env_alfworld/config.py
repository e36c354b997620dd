"""Config section ``environments.alfworld``."""

from __future__ import annotations

from typing import Literal

from attrs import field, frozen

from agentrl_core.structure import in_range


@frozen
class AlfworldConfig:
    """Config section ``environments.alfworld``.

    Games run in worker processes (one game per process at a time, reused for
    ``max_episodes_per_process`` episodes, then replaced so the engine's memory growth is
    shed). A reset or step that takes longer than its timeout stops that process and the
    episode ends as ``task error``.
    """

    data_dir: str | None = None  # a folder with the archives and split lists instead of the installed ones
    game_cache_dir: str | None = None  # where archives are unpacked; default $AGENTRL_CACHE_DIR/alfworld or ~/.cache/agentrl/alfworld
    # "agentbench": ALFWorld 0.2.2 grammar and domain as AgentBench FC ("put X in/on Y", "You arrive at loc N.");
    # "native": the grammar stored in each game file (ALFWorld >= 0.4: "move X to Y").
    wording: Literal["agentbench", "native"] = "agentbench"
    # How turns are read and episodes end. "upstream": AgentBench-FC's task.py exactly (any tool name, its first
    # argument is the action; bad turns get upstream's user messages and their status sticks to a later win);
    # "agentrl": bad turns get error observations and never change the status of a win; "auto": "upstream" for
    # the evaluation sets std and dev, "agentrl" for train and train-extra.
    termination: Literal["auto", "upstream", "agentrl"] = "auto"
    # The oracle behind `agentrl demos`: "walkthrough" plays each game's stored expert walkthrough, which goes
    # straight to where the game put each object; "search" looks for each object it takes (likeliest receptacles
    # first, by where the training games' walkthroughs found that kind of object), as an agent must.
    oracle: Literal["walkthrough", "search"] = "walkthrough"
    max_steps: int = field(default=20, validator=in_range(1))
    repeat_limit: int = field(default=3, validator=in_range(2))  # identical actions in a row that end the episode
    snap_threshold: float = field(default=0.01, validator=in_range(0.0))  # BLEU above which an action snaps to a valid one
    concurrency: int = field(default=16, validator=in_range(1))
    max_idle_processes: int = field(default=4, validator=in_range(0))
    max_episodes_per_process: int = field(default=50, validator=in_range(0))  # 0: never replace a healthy process
    start_timeout: float = field(default=120.0, validator=in_range(0.0, lo_open=True))  # process start (imports)
    reset_timeout: float = field(default=60.0, validator=in_range(0.0, lo_open=True))  # load + reset of one game
    step_timeout: float = field(default=30.0, validator=in_range(0.0, lo_open=True))
