"""The ``alfworld`` environment: AgentBench-FC's ALFWorld task on the bundled games.

Semantics (upstream ``src/server/tasks/alfworld/task.py`` of AgentBench, FC branch):

* the first messages are upstream's system instruction and "Here is your task. " + the room
  and goal + " AVAILABLE ACTIONS: " + the admissible commands, one per line;
* one tool, ``take_action(action)``; at most ``max_steps`` (20) assistant turns;
* the action is lower-cased, cut at its first newline and, if not admissible, replaced by the
  admissible command with the highest BLEU when that exceeds 0.01; otherwise it is sent as it
  is and the game answers "Nothing happens.";
* each observation (without "You arrive at loc N. ") is followed by the admissible commands;
* once more than three actions have been played, three identical ones in a row end the
  episode as ``agent invalid action`` (reward 0); this check comes before the win check;
* reward 1 when the goal holds (status ``completed``), else 0.

Turns that upstream could not execute (``termination`` in the config):

* ``upstream`` (default for std and dev): exactly as upstream's loop. Any tool name is
  accepted and the first value of its JSON arguments is the action. A turn without a tool call
  answers "No executable tool calls found. Please call a tool instead" (user message) and sets
  ``agent validation failed``; a call whose arguments cannot be read that way answers "No valid
  tool calls found. Please call a tool instead." and sets ``agent invalid action``. The episode
  continues; the last such status is the one a later win reports (with reward 1), as upstream.
* ``agentrl`` (default for train): a turn without a tool call gets the same user message; a
  malformed call (unknown tool, bad JSON, missing ``action``) gets a tool message with the
  reason; neither changes the status of a later win (``completed``).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from agentrl_core.env import (
    BadTurn,
    Environment,
    Status,
    Step,
    ToolCall,
    ToolSession,
    function_tool,
    run_blocking,
)
from agentrl_core.env.tools import tool_calls_of
from agentrl_core.types import Index, Message
from agentrl_env_alfworld.actions import (
    NO_TOOL_CALL,
    NO_VALID_TOOL_CALL,
    SYSTEM_PROMPT,
    available_actions,
    first_prompt,
    snap_action,
    strip_arrival,
    upstream_action,
)
from agentrl_env_alfworld.config import AlfworldConfig
from agentrl_env_alfworld.data import GameLibrary, GameRef
from agentrl_env_alfworld.game import NOTHING_HAPPENS
from agentrl_env_alfworld.oracle import SearchingOracle, WalkthroughOracle, walkthrough_of, where_taken
from agentrl_env_alfworld.pool import GamePool, GameProcess, GameProcessError

log = logging.getLogger(__name__)

UPSTREAM_SPLITS = frozenset({"std", "dev"})  # termination "auto" plays these exactly as upstream

TOOLS = [
    function_tool(
        "take_action",
        "Take an action.",
        {"action": {"type": "string", "description": "The action you would like to take"}},
        required=["action"],
    )
]


class AlfworldSession(ToolSession):
    def __init__(self, env: AlfworldEnvironment, ref: GameRef) -> None:
        super().__init__(TOOLS, max_rounds=env.config.max_steps)
        self.env = env
        self.ref = ref
        self.proc: GameProcess | None = None
        self.admissible: list[str] = []
        self.actions: list[str] = []  # the raw action arguments, as upstream compares them
        self.nothing_happens = 0
        self.snapped = 0
        mode = env.config.termination
        self.upstream = mode == "upstream" or (mode == "auto" and ref.split in UPSTREAM_SPLITS)
        # Upstream's finish_reason: set by a bad turn, reported by a later win.
        self.sticky_status = Status.COMPLETED

    def metrics(self) -> dict[str, Any]:
        return {
            **super().metrics(),
            "actions": len(self.actions),
            "nothing_happens": self.nothing_happens,
            "snapped_actions": self.snapped,
            "task_type": self.ref.task_type,
            "termination": "upstream" if self.upstream else "agentrl",
        }

    async def on_start(self) -> Step:
        env = self.env
        path = await run_blocking(env.library.game_file, self.ref)  # unpacks the archive on first use
        self.proc = await env.pool.acquire()
        request = {"op": "reset", "game": str(path), "logic": env.logic}
        try:
            reply = await env.pool.call(self.proc, request, env.config.reset_timeout)
        except GameProcessError:
            if self.proc.episodes == 0:
                raise
            # A reused process may have died while idle; one fresh process gets one more try.
            log.warning("ALFWorld game process %s failed at reset; retrying with a new one", self.proc.pid)
            self.proc = await env.pool.replace(self.proc)
            reply = await env.pool.call(self.proc, request, env.config.reset_timeout)
        self.admissible = list(reply["admissible"])
        return Step(
            [
                {"role": "system", "content": SYSTEM_PROMPT},
                {"role": "user", "content": first_prompt(reply["observation"], self.admissible)},
            ]
        )

    async def on_tool_call(self, call: ToolCall, message: Message) -> Step:
        return await self._act(call.id, call.arguments["action"])

    async def _act(self, call_id: str, raw: str) -> Step:
        assert self.proc is not None
        action = snap_action(raw, self.admissible, self.env.config.snap_threshold)
        if action != raw.strip().lower().split("\n")[0]:
            self.snapped += 1
        reply = await self.env.pool.call(self.proc, {"op": "step", "command": action}, self.env.config.step_timeout)
        observation = strip_arrival(reply["observation"])
        self.admissible = list(reply["admissible"])
        if NOTHING_HAPPENS.rstrip(".") in observation:
            self.nothing_happens += 1
        self.actions.append(raw)
        messages = [{"role": "tool", "tool_call_id": call_id, "content": observation + available_actions(self.admissible)}]
        limit = self.env.config.repeat_limit
        if len(self.actions) > limit and len(set(self.actions[-limit:])) == 1:
            return Step(messages, status=Status.AGENT_INVALID_ACTION, reward=0.0, metrics={"repeated_action": raw})
        if reply["won"]:
            return Step(messages, status=self.sticky_status, reward=1.0)
        return Step(messages)

    async def on_bad_turn(self, bad: BadTurn, message: Message) -> Step:
        if not isinstance(message, Mapping) or message.get("role", "assistant") != "assistant":
            return Step(bad.observation)
        if not tool_calls_of(message):
            if self.upstream:
                self.sticky_status = Status.AGENT_VALIDATION_FAILED
            return Step([{"role": "user", "content": NO_TOOL_CALL}])
        if not self.upstream:
            return Step(bad.observation)
        parsed = upstream_action(message)
        if parsed is None:
            self.sticky_status = Status.AGENT_INVALID_ACTION
            return Step([{"role": "user", "content": NO_VALID_TOOL_CALL}])
        # Another tool name or argument key: upstream plays its first argument all the same,
        # so this is not a bad turn (the base class counted it as one).
        self.invalid_turns -= 1
        return await self._act(*parsed)

    async def on_close(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None:
            await self.env.pool.release(proc)


class AlfworldEnvironment(Environment):
    name = "alfworld"
    tools = TOOLS

    def __init__(self, config: AlfworldConfig | None = None) -> None:
        super().__init__(config or AlfworldConfig())
        cfg: AlfworldConfig = self.config
        self.concurrency = cfg.concurrency
        self.library = GameLibrary(cfg.data_dir, cfg.game_cache_dir)
        self.logic = [str(p) for p in self.library.logic_files()] if cfg.wording == "agentbench" else None
        self.pool = GamePool(
            max_processes=cfg.concurrency,
            max_idle=cfg.max_idle_processes,
            max_episodes=cfg.max_episodes_per_process,
            start_timeout=cfg.start_timeout,
        )
        self._sets = self.library.index_sets()
        self._prior: dict[str, Counter[str]] | None = None  # search_prior()

    def index_sets(self) -> dict[str, Sequence[Index]]:
        return self._sets

    def game(self, split: str, index: Index) -> GameRef:
        return self.library.ref(split, int(self.check_index(split, index)))

    async def open(self, split: str, index: Index) -> AlfworldSession:
        return AlfworldSession(self, self.game(split, index))

    def oracle(self, split: str, index: Index, *, error_rate: float = 0.0, seed: int = 0) -> WalkthroughOracle:
        """The config's ``oracle``: the game's walkthrough, or a :class:`SearchingOracle` that looks for
        each object it takes (visiting receptacles by where the training games had that kind of object)."""
        ref = self.game(split, index)
        options = dict(wording=self.config.wording, error_rate=error_rate, seed=seed)
        if self.config.oracle == "search":
            return SearchingOracle(lambda: self.library.game_file(ref), prior=self.search_prior(), **options)
        return WalkthroughOracle(lambda: self.library.game_file(ref), **options)

    def search_prior(self) -> dict[str, Counter[str]]:
        """Where the training games' walkthroughs took each kind of object (read once: about 2 s,
        unpacking the training archive on first use; blocking)."""
        if self._prior is None:
            games = (self.library.ref("train", i) for i in self._sets.get("train", []))
            self._prior = where_taken(walkthrough_of(self.library.game_file(ref)) for ref in games)
        return self._prior

    def resource_count(self) -> int:
        return self.pool.leased

    async def aclose(self) -> None:
        await self.pool.aclose()
