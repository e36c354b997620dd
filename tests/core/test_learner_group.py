"""LearnerGroup: every learner rank gets every call, in the same order, and rank 0 answers (no Ray)."""

from __future__ import annotations

import anyio
import pytest

from agentrl_core.launch.ray_pools import LearnerGroup
from agentrl_core.train.learner_actor import LearnerService


class FakeRank:
    """TEST DOUBLE of a LearnerRank actor handle: ``handle.method.remote(*args)`` returns an awaitable."""

    def __init__(self, rank: int, calls: list) -> None:
        self.rank, self.calls = rank, calls
        for name in ("connect", "train_step", "sync", "save_checkpoint", "load_checkpoint", "save_hf_model"):
            setattr(self, name, self._method(name))

    def _method(self, name: str):
        rank, calls = self.rank, self.calls

        class Method:
            @staticmethod
            async def remote(*args):
                await anyio.sleep(0.01 * (2 - rank))  # rank 0 answers last: the answer is still rank 0's
                calls.append((rank, name, args))
                return {"rank": rank, "call": name}

        return Method


@pytest.mark.anyio
async def test_every_rank_gets_every_call_and_rank_0_answers():
    calls: list = []
    group = LearnerGroup([FakeRank(0, calls), FakeRank(1, calls)])
    assert await group.connect({"current": ["http://e"]}, "10.0.0.1", {"current": 2}, {"current": True}) is None
    assert await group.train_step(["s"]) == {"rank": 0, "call": "train_step"}
    assert await group.sync(["current"], 3) == {"rank": 0, "call": "sync"}
    assert await group.save_checkpoint("/ckpt", {"step": 3}, 2, False) == {"rank": 0, "call": "save_checkpoint"}
    assert await group.load_checkpoint("/ckpt/step_3") == {"rank": 0, "call": "load_checkpoint"}
    assert await group.save_hf_model("/out") == {"rank": 0, "call": "save_hf_model"}
    for rank in (0, 1):
        assert [(name, args) for r, name, args in calls if r == rank] == [
            ("connect", ({"current": ["http://e"]}, "10.0.0.1", {"current": 2}, {"current": True})),
            ("train_step", (["s"],)),
            ("sync", (["current"], 3)),
            ("save_checkpoint", ("/ckpt", {"step": 3}, 2, False)),
            ("load_checkpoint", ("/ckpt/step_3",)),
            ("save_hf_model", ("/out",)),
        ]


def test_the_group_offers_the_services_calls():
    """LearnerGroup and LearnerService name the same calls; a call that exists on one exists on the other."""
    calls = {"connect", "train_step", "sync", "save_checkpoint", "load_checkpoint", "save_hf_model"}
    assert calls <= {n for n in vars(LearnerGroup) if not n.startswith("_")}
    assert calls <= {n for n in vars(LearnerService) if not n.startswith("_")}


@pytest.mark.anyio
async def test_token_logprobs_are_merged_from_every_rank():
    """Each rank trains its own share of the samples: the group returns all of them."""

    class Rank:
        def __init__(self, part):
            self.part = part
            outer = self

            class Method:
                @staticmethod
                async def remote():
                    return outer.part

            self.take_token_logprobs = Method

    group = LearnerGroup([Rank({0: [-1.0], 2: [-0.5, -0.25]}), Rank({1: [-2.0]})])
    assert await group.take_token_logprobs() == {0: [-1.0], 1: [-2.0], 2: [-0.5, -0.25]}
    assert "take_token_logprobs" in vars(LearnerService)


@pytest.mark.anyio
async def test_a_failed_call_returns_after_every_rank_left_it_with_rank_0s_error():
    """A retry must not reach a rank still inside the failed call (it would pair its collectives
    with the wrong ones): the group answers once every rank is out, with rank 0's error."""
    finished: list[int] = []

    class Rank:
        def __init__(self, rank: int) -> None:
            self.rank = rank

            class Sync:
                @staticmethod
                async def remote(pools, version):
                    if rank == 0:
                        raise RuntimeError("engine refused bucket 3")  # rank 0 fails first
                    await anyio.sleep(0.2)
                    finished.append(rank)
                    raise RuntimeError("stopped by another learner rank")

            self.sync = Sync

    group = LearnerGroup([Rank(0), Rank(1), Rank(2)])
    with pytest.raises(RuntimeError, match="engine refused bucket 3"):
        await group.sync(["current"], 1)
    assert sorted(finished) == [1, 2]
