"""How close the task containers come to upstream's: probes, the tasks' own scripts, run-log replays.

Three measurements, each through the real environment (a container per task, init scripts run,
the agent's shell open):

* :func:`probe`: commands that show what an image is (distribution, PATH, file counts, users,
  which commands exist) in a container of a task without init scripts;
* :func:`example_outputs`: every task's example script, upstream's own check command whose
  output the agent's answer is compared with, run after the task's init scripts; compared
  across images, and with the values upstream's runs printed for the same commands
  (:data:`UPSTREAM_OBSERVED`);
* :func:`replay`: the bash commands of a recorded AgentBench-FC run (``runs.jsonl``) played
  again, each output compared with the one upstream's run recorded.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import anyio
from attrs import field, frozen

from agentrl_core.types import Message
from agentrl_env_os.env import OSEnvironment, OSSession
from agentrl_env_os.evaluate import run_script
from agentrl_env_os.shell import clean_output

PROBES = {
    "os_release": ". /etc/os-release; echo $PRETTY_NAME",
    "python": "python3 --version",
    "path": "echo $PATH",
    "path_existing_dirs": 'n=0; for d in $(echo $PATH | tr ":" " "); do [ -d "$d" ] && n=$((n+1)); done; echo $n',
    "usr_files_changed_last_day": "find /usr -type f -mtime -1 | wc -l",
    "usr_empty_files": "find /usr -type f -size 0 | wc -l",
    "executables_in_path": "find $(echo $PATH | tr ':' ' ') -type f -executable | wc -l",
    "groups": "getent group | wc -l",
    "users": "getent passwd | wc -l",
    "home": "ls /home",
    "packages": "dpkg-query -W | wc -l",
    "missing_commands": "for c in ps free less gcc make file bc sudo killall setfacl ping; do "
                        "command -v $c >/dev/null || printf '%s ' $c; done; echo",
    "open_files": "ulimit -n",
    "own_name_resolves": 'getent hosts "$(hostname)" >/dev/null && echo yes || echo no',
}
PROBE_TASK = 13  # std 13 ("How many groups are in this UNIX system?"): default image, no init script

# What upstream's runs printed for a task's own check command (the example script, or the same
# command typed by an agent), in containers of upstream's images after the task's init scripts.
# From third-party AgentBench-FC runs of 2026-02 (runs.jsonl of four ollama models), which agree.
# Keys are std indices (upstream's and ours: the same tasks since tasks.UPSTREAM_FILE_ORDER).
UPSTREAM_OBSERVED: dict[int, dict[str, str]] = {
    7: {"command": "executables in PATH (find ... -type f -executable | wc -l)", "output": "556"},
    13: {"command": "getent group | wc -l", "output": "40"},
    26: {"command": "echo $PATH | tr ':' '\\n' | wc -l (after the init's ~/.bashrc)", "output": "9"},
    27: {"command": "existing directories in $PATH (after the init's ~/.bashrc)", "output": "7"},
    43: {"command": "find /usr -type f -size 0 | wc -l", "output": "49"},
    46: {"command": "find /usr -type f -mtime -1 | wc -l", "output": "3"},
}

OUTPUT_PREFIX = "The output of the OS:\n\n"


async def _opened(env: OSEnvironment, split: str, index: int) -> OSSession:
    session = await env.open(split, index)
    try:
        await session.start()
    except BaseException:
        await session.close()
        raise
    return session


async def probe(env: OSEnvironment, scripts: dict[str, str] | None = None) -> dict[str, str]:
    """Each probe's output in the agent's shell of a fresh default container (not cut, no round limit)."""
    session = await _opened(env, "std", PROBE_TASK)
    out = {}
    try:
        assert session.shell is not None
        for name, script in (scripts or PROBES).items():
            result = await session.shell.run(script)
            out[name] = (clean_output(result.output) or "").strip()
    finally:
        await session.close()
    return out


async def example_outputs(env: OSEnvironment, indices: Iterable[int], *, concurrency: int = 4,
                          split: str = "std") -> dict[int, str]:
    """The stdout of each task's example script after its init scripts (tasks without one are left out)."""
    results: dict[int, str] = {}
    limiter = anyio.CapacityLimiter(concurrency)

    async def one(index: int) -> None:
        task = env.task(split, index)
        if task.example is None or not task.asks_for_answer:
            return
        async with limiter:
            try:
                session = await _opened(env, split, index)
            except Exception as exc:  # an init script that cannot run here (std 22's file descriptor)
                results[index] = f"<setup failed: {type(exc).__name__}: {str(exc)[:160]}>"
                return
            try:
                run = await run_script(env.backend, session.container_id, task.example,
                                       timeout=env.config.script_timeout_s)
                results[index] = run.stdout.decode("utf-8", errors="replace").strip()
            finally:
                await session.close()

    async with anyio.create_task_group() as tg:
        for index in indices:
            tg.start_soon(one, index)
    return dict(sorted(results.items()))


# -- replays of recorded runs ---------------------------------------------------------------------


@frozen
class RecordedEpisode:
    model: str
    index: int  # upstream's std index
    status: str
    reward: float
    prompt: str = field(repr=False)  # the first user message
    messages: list[Message] = field(repr=False)  # after the system and first user message


def read_runs(folder: str | Path, task: str = "os-std") -> list[RecordedEpisode]:
    """Episodes with a result in ``folder/**/<task>/runs.jsonl`` (model = the folder above)."""
    found = []
    for path in sorted(Path(folder).rglob("runs.jsonl")):
        if path.parent.name != task:
            continue
        for line in path.read_text(encoding="utf-8").splitlines():
            if not line.strip():
                continue
            output = json.loads(line)["output"]
            result = output.get("result") or {}
            if not result.get("messages"):
                continue
            messages = list(result["messages"])
            found.append(RecordedEpisode(path.parent.parent.name, int(output["index"]), str(output["status"]),
                                         float(result.get("reward") or 0), str(messages[1].get("content", "")),
                                         messages[2:]))
    return found


def prompt_mismatches(env: OSEnvironment, episodes: Iterable[RecordedEpisode]) -> list[tuple[str, int]]:
    """(model, index) of the recorded episodes whose first user message is not the one our std task
    of that index sends: none when our numbering is upstream's (tasks.UPSTREAM_FILE_ORDER)."""
    from agentrl_env_os.env import USER_PROMPT

    tasks = env.tasks("std")
    return [(e.model, e.index) for e in episodes
            if not 0 <= e.index < len(tasks) or USER_PROMPT.format(description=tasks[e.index].description) != e.prompt]


def normalized(content: str) -> str:
    """Upstream's terminal text as ours: CRLF -> LF (upstream keeps the CRs)."""
    return content.replace("\r\n", "\n")


def compare_output(upstream: str, ours: str) -> str:
    """``same``, ``same_but_echo`` (upstream's terminal echoed part of a long command before its
    output, which our quiet terminal does not), ``truncated_same`` (both cut, equal as far as the
    shorter goes) or ``different``."""
    up, mine = normalized(upstream), ours
    if up == mine:
        return "same"
    head, _, body = up.partition(OUTPUT_PREFIX)
    if not head and "\r" in body and OUTPUT_PREFIX + body.rsplit("\r", 1)[1] == mine:
        return "same_but_echo"
    marker = "\n[truncated because the output is too long]"
    if marker in up and marker in mine:
        a, b = up.split(marker)[0], mine.split(marker)[0]
        n = min(len(a), len(b))
        if a[:n] == b[:n]:
            return "truncated_same"
    return "different"


@frozen
class ReplayResult:
    episode: RecordedEpisode
    outputs: list[str]  # per compared command: same / same_but_echo / truncated_same / different / lost
    status: str  # as upstream would name it ("task error" where its task crashed on the turn)
    reward: float
    first_difference: dict[str, str] | None = None
    lost_turns: int = 0  # assistant turns the log had lost and the search restored

    @property
    def all_same(self) -> bool:
        return all(o != "different" for o in self.outputs)


def _status(session: OSSession, step: Any) -> str:
    """The status upstream would report (its ``task error`` where its task crashed on a turn)."""
    upstream = step.metrics.get("upstream_status") if step is not None else None
    return str(upstream or session.status.value)


def _same(upstream: Message, ours: Message) -> str | None:
    """How ``ours`` compares with a recorded message (None: different)."""
    if upstream.get("role") != ours.get("role"):
        return None
    if ours.get("role") != "tool":
        return "same" if upstream.get("content") == ours.get("content") else None
    outcome = compare_output(str(upstream.get("content") or ""), str(ours.get("content") or ""))
    return None if outcome == "different" else outcome


class _Player:
    """One live session of the task; replays a prefix of turns on demand (a new container when it must)."""

    def __init__(self, env: OSEnvironment, index: int) -> None:
        self.env, self.index = env, index
        self.session: OSSession | None = None
        self.played: list[str] = []
        self.steps: dict[tuple[str, ...], Any] = {}
        self.env_steps = 0

    async def answer(self, turns: Sequence[Message], keys: tuple[str, ...]) -> Any:
        if keys in self.steps:
            return self.steps[keys]
        if self.session is None or tuple(self.played) != keys[:-1]:
            await self.aclose()
            self.session = await _opened(self.env, "std", self.index)
            self.played = []
            for i, turn in enumerate(turns[:-1]):
                await self.session.step(turn)
                self.env_steps += 1
                self.played.append(keys[i])
        step = await self.session.step(turns[-1])
        self.env_steps += 1
        self.played.append(keys[-1])
        self.steps[keys] = (step, _status(self.session, step))
        return self.steps[keys]

    async def aclose(self) -> None:
        if self.session is not None:
            session, self.session = self.session, None
            await session.close()


async def _restore(env: OSEnvironment, episode: RecordedEpisode, index: int, max_env_steps: int) -> ReplayResult | None:
    """The conversation the deduplicated log was filtered from, if one is found (as ALFWorld's replay).

    The recording client kept a message only if its JSON text was new, so a word-for-word repeat of
    a turn, and an answer identical to an earlier one, are missing from the log. Depth-first: the
    next turn is the next recorded assistant message or a copy of an earlier one; every answer is
    the next recorded message or a copy of one already kept; the end is upstream's status and
    reward. Backtracking starts a new container; the search stops after ``max_env_steps`` steps.
    """
    recorded = episode.messages
    player = _Player(env, index)

    async def search(position: int, turns: list[Message], keys: tuple[str, ...], kept: list[Message],
                     outputs: list[str], lost: int) -> ReplayResult | None:
        candidates: list[tuple[Message, bool]] = []
        if position < len(recorded) and recorded[position].get("role") == "assistant":
            candidates.append((recorded[position], True))
        repeats: dict[str, Message] = {}
        for message in reversed(recorded[:position]):
            if message.get("role") == "assistant":
                repeats.setdefault(json.dumps(message, sort_keys=True), message)
        candidates.extend((message, False) for message in repeats.values())
        for turn, is_recorded in candidates:
            if player.env_steps >= max_env_steps:
                return None
            key = json.dumps(turn, sort_keys=True)
            step, status = await player.answer([*turns, turn], (*keys, key))
            at, now_kept, now_outputs, ok = position + int(is_recorded), [*kept, turn], list(outputs), True
            for answer in step.messages:
                following = recorded[at] if at < len(recorded) else None
                outcome = _same(following, answer) if following is not None else None
                if outcome is not None:
                    at += 1
                    now_kept.append(following)
                elif any(_same(m, answer) for m in now_kept):
                    outcome = "same"  # identical to a message already kept: lost in the log
                else:
                    ok = False
                    break
                if answer.get("role") == "tool":
                    now_outputs.append(outcome)
            if not ok:
                continue
            restored = lost + int(not is_recorded)
            if step.finish:
                if at == len(recorded) and status == episode.status and step.reward == episode.reward:
                    return ReplayResult(episode, now_outputs, status, step.reward, None, restored)
                continue
            found = await search(at, [*turns, turn], (*keys, key), now_kept, now_outputs, restored)
            if found is not None:
                return found
        return None

    try:
        return await search(0, [], (), [], [], 0)
    finally:
        await player.aclose()


async def replay(env: OSEnvironment, episode: RecordedEpisode, index: int, *, restore_lost_turns: bool = True,
                 max_env_steps: int = 40) -> ReplayResult:
    """Play the recorded assistant turns; compare each tool answer with the recorded one.

    With ``restore_lost_turns`` the turns the log lost are restored first (:func:`_restore`);
    where no such conversation is found within ``max_env_steps`` steps, or without it, the
    recorded turns are played once in order: an answer whose recorded message is missing is
    compared with the earlier messages (``lost`` if it matches none of them, which counts as a
    difference). ``index`` is our std index of the episode's task.
    """
    if restore_lost_turns:
        found = await _restore(env, episode, index, max_env_steps)
        if found is not None:
            return found
    session = await _opened(env, "std", index)
    outcomes: list[str] = []
    first: dict[str, str] | None = None
    seen = {normalized(m.get("content") or "") for m in episode.messages if m.get("role") == "tool"}
    step = None
    try:
        recorded = episode.messages
        for position, message in enumerate(recorded):
            if message.get("role") != "assistant" or session.status.value != "running":
                continue
            step = await session.step(message)
            if not step.messages or step.messages[0].get("role") != "tool":
                continue
            ours = step.messages[0]["content"]
            following = recorded[position + 1] if position + 1 < len(recorded) else None
            if following is not None and following.get("role") == "tool":
                outcome = compare_output(following["content"], ours)
            else:
                outcome = "same" if ours in seen else "lost"
            outcomes.append(outcome)
            if outcome in ("different", "lost") and first is None:
                script = json.dumps(message.get("tool_calls", [{}])[0].get("function", {}).get("arguments"))
                first = {"command": script[:300], "upstream": (following or {}).get("content", "")[:300],
                         "ours": ours[:300]}
    finally:
        await session.close()
    return ReplayResult(episode, [("different" if o == "lost" else o) for o in outcomes],
                        _status(session, step), session.reward, first)


async def replay_all(env: OSEnvironment, episodes: Sequence[RecordedEpisode], *, concurrency: int = 4,
                     restore_lost_turns: bool = True) -> list[ReplayResult]:
    """Replay each episode on our std task of the same index; one whose first message is not that
    task's (:func:`prompt_mismatches`) is left out."""
    results: list[ReplayResult] = []
    limiter = anyio.CapacityLimiter(concurrency)
    mismatched = set(prompt_mismatches(env, episodes))

    async def one(episode: RecordedEpisode) -> None:
        async with limiter:
            try:
                results.append(await replay(env, episode, episode.index, restore_lost_turns=restore_lost_turns))
            except Exception as exc:  # setup failed here (e.g. std 22's file descriptor)
                results.append(ReplayResult(episode, ["different"], "task error", 0.0,
                                            {"command": "(setup)", "upstream": episode.status, "ours": str(exc)[:300]}))

    async with anyio.create_task_group() as tg:
        for episode in episodes:
            if (episode.model, episode.index) not in mismatched:
                tg.start_soon(one, episode)
    return sorted(results, key=lambda r: (r.episode.model, r.episode.index))


def summarize(results: Iterable[ReplayResult]) -> dict[str, Any]:
    results = list(results)
    scored = [r for r in results if r.episode.status != "task error" and r.status != "task error"]
    same = [r for r in scored if r.all_same]
    commands = [o for r in scored for o in r.outputs]
    return {
        "episodes": len(results),
        "scored": len(scored),  # upstream's task errors (its own infrastructure) and ours left out
        "all_outputs_same": len(same),
        "all_outputs_same_rate": round(len(same) / len(scored), 4) if scored else None,
        "reward_agrees": sum(r.reward == r.episode.reward for r in scored),
        "status_agrees": sum(r.status == r.episode.status for r in results),
        "lost_turns_restored": sum(r.lost_turns for r in results),
        "agree_with_lost_turns_restored": sum(r.lost_turns > 0 for r in results),
        "reward_agrees_where_all_same": sum(r.reward == r.episode.reward for r in same),
        "commands": len(commands),
        "command_outputs": {k: commands.count(k) for k in ("same", "same_but_echo", "truncated_same", "different")},
    }


_NUMBER = re.compile(r"^-?\d+$")


def compare_examples(a: dict[int, str], b: dict[int, str]) -> dict[str, Any]:
    """Which tasks' example outputs differ between two images."""
    common = sorted(set(a) & set(b))
    differ = [i for i in common if a[i] != b[i]]
    return {"tasks": len(common), "same": len(common) - len(differ), "differ": differ}


def upstream_agreement(outputs: dict[int, str]) -> dict[str, Any]:
    """Tasks of :data:`UPSTREAM_OBSERVED`: our example output next to upstream's."""
    rows = {}
    for index, seen in UPSTREAM_OBSERVED.items():
        ours = outputs.get(index)
        rows[index] = {**seen, "ours": ours, "same": ours == seen["output"]}
    return {"same": sum(r["same"] for r in rows.values()), "of": len(rows), "tasks": rows}
