"""``agentrl demos``: episodes played at once, written in index order as they come, nothing lost on a failure."""

from __future__ import annotations

import argparse
import json
import random

import anyio
import pytest

from agentrl_core.cli import demos
from agentrl_core.env import Environment, Status, Step, ToolSession, assistant_tool_call, function_tool, tool_result
from agentrl_core.errors import AgentrlError
from agentrl_core.registry import Registry

GUESS = function_tool("guess", "guess the number", {"n": {"type": "integer"}}, ["n"])


class GuessSession(ToolSession):
    def __init__(self, env: GuessEnv, index: int) -> None:
        super().__init__([GUESS], max_rounds=3)
        self.env, self.index = env, index

    async def on_start(self) -> Step:
        self.env.live += 1
        self.env.most_live = max(self.env.most_live, self.env.live)
        return Step([{"role": "user", "content": f"guess {self.index}"}])

    async def on_tool_call(self, call, message) -> Step:
        # later indices finish first: the file must still keep index order
        await anyio.sleep(0.002 * (20 - self.index) * random.random())
        if self.index == self.env.fail_at:
            raise AgentrlError(f"guess/train/{self.index}: the game broke")
        right = call.arguments["n"] == self.index
        return Step([tool_result(call, "yes" if right else "no")], status=Status.COMPLETED, reward=float(right))

    async def on_close(self) -> None:
        self.env.live -= 1


class Guesser:
    def __init__(self, index: int, wrong: bool) -> None:
        self.index, self.wrong = index, wrong

    def act(self, messages):
        return assistant_tool_call("guess", {"n": self.index + self.wrong})


class GuessEnv(Environment):
    name = "guess"
    tools = [GUESS]

    def __init__(self, fail_at: int | None = None) -> None:
        super().__init__()
        self.fail_at, self.live, self.most_live, self.closed = fail_at, 0, 0, False

    def index_sets(self):
        return {"train": list(range(20))}

    async def open(self, split, index):
        self.check_index(split, index)
        return GuessSession(self, index)

    def oracle(self, split, index, *, error_rate=0.0, seed=0):
        return Guesser(index, random.Random(seed).random() < error_rate)

    async def aclose(self):
        self.closed = True


def run_demos(monkeypatch, tmp_path, env: GuessEnv, *, concurrency: int, name: str = "demos.jsonl", **extra):
    monkeypatch.setattr(Registry, "build", lambda self, kind, name, config=None, **kw: env)
    out = tmp_path / name
    extra = {"indices": None, "limit": None, "overrides": [], **extra}
    args = argparse.Namespace(env="guess", split="train", out=str(out), error_rate=0.5, repeats=1,
                              seed=7, config=None, concurrency=concurrency, **extra)
    return demos.run(args), out


def test_episodes_are_played_at_once_and_written_in_index_order(monkeypatch, tmp_path, capsys):
    one_env, four_env = GuessEnv(), GuessEnv()
    rc1, one = run_demos(monkeypatch, tmp_path, one_env, concurrency=1, name="one.jsonl")
    rc4, four = run_demos(monkeypatch, tmp_path, four_env, concurrency=4, name="four.jsonl")
    assert rc1 == rc4 == 0
    assert one_env.most_live == 1 and four_env.most_live == 4  # --concurrency sessions at once, no more
    assert one.read_text() == four.read_text()  # same episodes, same order, whatever finished first
    records = [json.loads(line) for line in four.read_text().splitlines()]
    assert [r["index"] for r in records] == list(range(20))
    solved = sum(r["reward"] for r in records)
    assert 0 < solved < 20  # --error-rate 0.5: the seeds differ per index
    assert capsys.readouterr().out.endswith(f"wrote 20 episodes to {four}; {solved:.0f} with reward 1 "
                                            f"({solved / 20:.0%})\n")
    assert four_env.closed


@pytest.mark.parametrize("concurrency", [1, 4])
def test_a_failing_episode_stops_the_run_and_keeps_the_episodes_before_it(monkeypatch, tmp_path, concurrency):
    env = GuessEnv(fail_at=9)
    with pytest.raises(AgentrlError, match=r"^guess/train/9: the game broke$"):  # the error itself, not a group
        run_demos(monkeypatch, tmp_path, env, concurrency=concurrency)
    records = [json.loads(line) for line in (tmp_path / "demos.jsonl").read_text().splitlines()]
    indices = [r["index"] for r in records]
    assert indices == list(range(len(indices)))  # a prefix in index order: no gap, nothing after the failure
    assert len(indices) <= 9 and (concurrency > 1 or len(indices) == 9)
    assert env.live == 0 and env.closed  # every session closed, the environment too


def test_concurrency_below_one_is_one_sentence(monkeypatch, tmp_path):
    with pytest.raises(AgentrlError, match=r"^--concurrency 0: must be at least 1$"):
        run_demos(monkeypatch, tmp_path, GuessEnv(), concurrency=0)
    assert not (tmp_path / "demos.jsonl").exists()


def test_indices_choose_which_games_in_the_order_given(monkeypatch, tmp_path):
    env = GuessEnv()
    rc, out = run_demos(monkeypatch, tmp_path, env, concurrency=4, indices="12-14, 3,0", limit=4)
    assert rc == 0
    assert [json.loads(line)["index"] for line in out.read_text().splitlines()] == [12, 13, 14, 3]  # then --limit
    assert demos.parse_indices("0-2,fixed_7,10-10") == [0, 1, 2, "fixed_7", 10]


@pytest.mark.parametrize(("spec", "message"), [
    ("1,,2", r"^--indices '1,,2': an empty entry \(two commas, or one at an end\)$"),
    ("5-3", r"^--indices '5-3': range 5-3 runs backwards$"),
    ("1-3,2", r"^--indices '1-3,2': an index appears twice \(use --repeats for several episodes\)$"),
    ("18-25", r"index 20 .*train"),  # the environment's own sentence for an index it does not have
])
def test_bad_indices_are_one_sentence_and_leave_the_file_as_it_was(monkeypatch, tmp_path, spec, message):
    (tmp_path / "demos.jsonl").write_text("kept\n")
    env = GuessEnv()
    with pytest.raises(AgentrlError, match=message):
        run_demos(monkeypatch, tmp_path, env, concurrency=2, indices=spec)
    assert (tmp_path / "demos.jsonl").read_text() == "kept\n"
    assert env.closed == (spec == "18-25")  # a malformed list fails before the environment is built
