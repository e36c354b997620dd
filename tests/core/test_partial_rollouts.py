"""Interruptible generation (``rollout.partial_rollouts``) on the hf engine, end to end.

A weight update in the middle of a generation keeps the tokens sampled so far; the engine
prefills prompt + those tokens under the new weights and continues; every token carries the
version that sampled it, and its log-prob is that version's. The transports choose the
retracting pause when the engines offer it; the step metrics read per-token versions; the
learner's ratios (PPO and decoupled) are taken per token against the behaviour log-probs of
whichever version sampled it. docs/architecture.md sections 5 and 6.
"""

from __future__ import annotations

import threading

import anyio
import httpx
import pytest
import torch
import transformers

from agentrl_core.config import LossConfig, OptimConfig, TrainConfig
from agentrl_core.engine.process import BackgroundEngine
from agentrl_core.engine.server import EngineServer
from agentrl_core.rollout.engine_client import EngineClient, EngineError, GenerateResult, pause_mode_for
from agentrl_core.train.step_metrics import batch_metrics, lag_histogram, rollout_waste_metrics
from agentrl_core.train.weight_sync import DiskTransport
from agentrl_core.types import FailureKind, Status, Trajectory, TurnRecord

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture(scope="module")
def v0(tiny_model_dir):
    return transformers.AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def v1_dir(tiny_model_dir, tmp_path_factory):
    """Other weights of the same architecture (every parameter perturbed), saved as a model directory."""
    torch.manual_seed(11)
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    out = tmp_path_factory.mktemp("v1")
    model.save_pretrained(out)
    transformers.AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def v1(v1_dir):
    return transformers.AutoModelForCausalLM.from_pretrained(v1_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    # a small prefill budget: re-prefilling prompt + tokens after a retraction takes several chunks
    with BackgroundEngine(EngineServer(tiny_model_dir, max_running_requests=8, dtype="float32",
                                       max_prefill_tokens=16)) as background:
        yield background


@pytest.fixture
async def at_v0(engine, tiny_model_dir):
    async with EngineClient(engine.url) as client:
        await client.update_weights_from_disk(str(tiny_model_dir), weight_version=0)
        yield client
        await client.update_weights_from_disk(str(tiny_model_dir), weight_version=0)


def logprobs_of(model, prompt, output, temperature):
    with torch.no_grad():
        logits = model(torch.tensor([prompt + output])).logits[0, len(prompt) - 1 : -1].float()
    scale = temperature if temperature > 0 else 1.0
    return torch.log_softmax(logits / scale, dim=-1).gather(1, torch.tensor(output)[:, None])[:, 0]


def greedy(model, prompt, n):
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=n, min_new_tokens=n, do_sample=False,
                             pad_token_id=0)
    return out[0, len(prompt):].tolist()


def pause_when(scheduler, monkeypatch, condition):
    """Retract on the scheduler thread right after the step at which ``condition(running)`` first holds.

    The pause is what ``POST /pause_generation {"mode": "retract"}`` runs; doing it from the
    step itself puts it at an exact token, whatever the machine's load.
    """
    paused = threading.Event()
    sample = scheduler._sample_and_append

    def sample_then_maybe_pause(requests, logits):
        sample(requests, logits)
        if not paused.is_set() and condition(scheduler.running):
            scheduler.pause("retract")
            paused.set()

    monkeypatch.setattr(scheduler, "_sample_and_append", sample_then_maybe_pause)
    return paused


def split(result: GenerateResult):
    """(tokens of version 0, tokens of version 1), checking the versions are 0...0 1...1."""
    k = result.versions.count(0)
    assert result.versions == [0] * k + [1] * (len(result.versions) - k), result.versions
    return result.output_ids[:k], result.output_ids[k:]


async def test_a_weight_update_mid_generation_keeps_the_tokens_and_continues_with_the_new_weights(
        engine, at_v0, monkeypatch, v0, v1, v1_dir, tiny_vocab):
    client, scheduler = at_v0, engine.server.scheduler
    prompt = [tiny_vocab["im_start"], 17, 600 % tiny_vocab["size"], 12, 99]
    cut, total = 12, 32
    paused = pause_when(scheduler, monkeypatch, lambda running: any(len(r.output_ids) == cut for r in running))
    before = dict(await client.server_info())
    async with anyio.create_task_group() as tg:
        box = {}

        async def long_request():
            box["result"] = await client.generate(prompt, {"temperature": 0, "max_new_tokens": total,
                                                           "ignore_eos": True})

        tg.start_soon(long_request)
        await anyio.to_thread.run_sync(paused.wait, 60)
        assert (await client.server_info())["waiting"] == 1  # back in the queue with its 12 tokens
        await client.update_weights_from_disk(str(v1_dir), weight_version=1)
        await client.continue_generation()
    result = box["result"]
    after = await client.server_info()
    assert result.finish_reason == "length" and len(result.output_ids) == total  # nothing was lost
    old, new = split(result)
    assert len(old) == cut and result.mixed_versions and result.weight_version == 1
    assert result.meta_info["weight_versions"] == [{"version": 0, "start": 0, "end": cut},
                                                   {"version": 1, "start": cut, "end": total}]
    assert result.meta_info["num_retractions"] == 1
    # the kept tokens are v0's greedy continuation, the rest what v1 samples given prompt + kept tokens
    assert old == greedy(v0, prompt, cut)
    assert new == greedy(v1, prompt + old, total - cut)
    lp = torch.tensor(result.logprobs)
    torch.testing.assert_close(lp[:cut], logprobs_of(v0, prompt, old, 0), atol=1e-4, rtol=0)
    torch.testing.assert_close(lp[cut:], logprobs_of(v1, prompt + old, new, 0), atol=1e-4, rtol=0)
    assert after["aborted"] == before["aborted"]  # nothing aborted, nothing discarded
    assert after["retracted"] == before["retracted"] + 1
    assert after["recomputed_tokens"] - before["recomputed_tokens"] == len(prompt) + cut  # the re-prefill


async def test_concurrent_requests_retracted_in_every_state_keep_exact_logprobs(
        engine, at_v0, monkeypatch, v0, v1, v1_dir, tiny_vocab):
    """Decoding, still prefilling (a 40-token prompt in 16-token chunks) and waiting requests at the pause;
    slots are handed round on re-admission; every token's log-prob is its version's."""
    client, scheduler = at_v0, engine.server.scheduler
    rng = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, tiny_vocab["size"], (n,), generator=rng).tolist() for n in (5, 9, 40, 3, 7)]
    paused = pause_when(scheduler, monkeypatch, lambda running: sum(len(r.output_ids) for r in running) >= 20)
    results = {}
    async with anyio.create_task_group() as tg:
        async def run(i):
            results[i] = await client.generate(prompts[i], {"temperature": 1.0, "max_new_tokens": 24,
                                                            "ignore_eos": True, "seed": 50 + i})

        for i in range(len(prompts)):
            tg.start_soon(run, i)
        await anyio.to_thread.run_sync(paused.wait, 60)
        await client.update_weights_from_disk(str(v1_dir), weight_version=1)
        await client.continue_generation()
    assert any(0 < len(split(r)[0]) < 24 for r in results.values())  # some were cut in the middle
    for i, result in results.items():
        assert result.finish_reason == "length" and len(result.output_ids) == 24
        old, new = split(result)
        lp = torch.tensor(result.logprobs)
        if old:
            torch.testing.assert_close(lp[: len(old)], logprobs_of(v0, prompts[i], old, 1.0), atol=1e-4, rtol=0)
        if new:
            torch.testing.assert_close(lp[len(old):], logprobs_of(v1, prompts[i] + old, new, 1.0), atol=1e-4,
                                       rtol=0)


async def test_pause_modes_on_the_wire(engine, at_v0, monkeypatch, tiny_vocab):
    client, scheduler = at_v0, engine.server.scheduler
    info = await client.model_info()
    assert info["pause_modes"] == ["abort", "retract"]
    async with httpx.AsyncClient(base_url=engine.url) as http:
        refused = await http.post("/pause_generation", json={"mode": "in_place"})
        assert refused.status_code == 400 and "old weights" in refused.json()["detail"]
    assert (await client.pause_generation("retract"))["retracted"] == 0
    await client.continue_generation()
    # a retracted request aborted while it waits in the queue answers abort with the tokens it had
    paused = pause_when(scheduler, monkeypatch, lambda running: any(len(r.output_ids) == 7 for r in running))
    async with anyio.create_task_group() as tg:
        box = {}

        async def request():
            box["result"] = await client.generate([tiny_vocab["im_start"], 5, 6], {"max_new_tokens": 50,
                                                                                   "ignore_eos": True}, rid="r7")

        tg.start_soon(request)
        await anyio.to_thread.run_sync(paused.wait, 60)
        await client.abort_request("r7")
    await client.continue_generation()
    assert box["result"].finish_reason == "abort" and len(box["result"].output_ids) == 7
    assert pause_mode_for([info, info], partial_rollouts=True) == "retract"
    assert pause_mode_for([info, {"weight_version": 0}], partial_rollouts=True) == "abort"  # an SGLang engine
    assert pause_mode_for([info], partial_rollouts=False) == "abort"


def test_per_token_versions_are_read_from_spans_and_checked():
    answer = {"output_ids": [5, 6, 7], "meta_info": {
        "finish_reason": {"type": "length"}, "output_token_logprobs": [[-1.0, 5, None], [-2.0, 6, None],
                                                                        [-3.0, 7, None]],
        "weight_version": "4", "weight_versions": [{"version": "3", "start": 0, "end": 1},
                                                   {"version": "4", "start": 1, "end": 3}]}}
    result = GenerateResult.from_response(answer)
    assert result.versions == [3, 4, 4] and result.weight_version == 4 and result.mixed_versions
    del answer["meta_info"]["weight_versions"]  # one version per answer (SGLang 0.5.x)
    assert GenerateResult.from_response(answer).versions == [4, 4, 4]
    answer["meta_info"]["weight_versions"] = [{"version": 3, "start": 0, "end": 2}]
    with pytest.raises(EngineError, match="cover 2 tokens"):
        GenerateResult.from_response(answer)


async def test_the_disk_transport_pauses_with_retract_only_when_asked_and_offered(
        engine, at_v0, v0, v1, tmp_path, tiny_vocab):
    client = at_v0
    off = DiskTransport(disk_path=str(tmp_path / "off"), partial_rollouts=False)
    on = DiskTransport(disk_path=str(tmp_path / "on"), partial_rollouts=True)
    for transport in (off, on):
        transport.connect(None, [engine.url])
    try:
        assert (off.pause_mode, on.pause_mode) == ("abort", "retract")
        tensors = [(name, p.detach()) for name, p in v1.named_parameters()]  # tied weights once
        prompt = [tiny_vocab["im_start"], 40, 41, 42]
        generated = (await client.server_info())["generated_tokens"]
        async with anyio.create_task_group() as tg:
            box = {}

            async def long_request():
                box["result"] = await client.generate(prompt, {"temperature": 1.0, "max_new_tokens": 1000,
                                                               "ignore_eos": True, "seed": 9})

            tg.start_soon(long_request)
            with anyio.fail_after(60):  # the sync comes while the request is decoding
                while (await client.server_info())["generated_tokens"] < generated + 5:
                    await anyio.sleep(0.01)
            stats = await anyio.to_thread.run_sync(on.send, tensors, 1)
    finally:
        off.close()
        on.close()
    result = box["result"]
    assert stats["retracted_requests"] == 1 and stats["aborted_requests"] == 0
    assert result.finish_reason == "length" and len(result.output_ids) == 1000
    old, new = split(result)
    assert old and new
    lp = torch.tensor(result.logprobs)
    torch.testing.assert_close(lp[: len(old)], logprobs_of(v0, prompt, old, 1.0), atol=1e-4, rtol=0)
    torch.testing.assert_close(lp[len(old):], logprobs_of(v1, prompt + old, new, 1.0), atol=1e-4, rtol=0)


# ---------------------------------------------------------------------------------------
# What the learner and the step metrics make of a turn that straddles two versions


def mixed_trajectory(prompt, old, new, lp_old, lp_new, version_new=1):
    ids = prompt + old + new
    mask = [0] * len(prompt) + [1] * (len(old) + len(new))
    logprobs = [0.0] * len(prompt) + list(lp_old) + list(lp_new)
    versions = [-1] * len(prompt) + [version_new - 1] * len(old) + [version_new] * len(new)
    return Trajectory(
        group_id="g", uid="g/0", task="calc-train", split="train", index=0, input_ids=ids, loss_mask=mask,
        rollout_logprobs=logprobs, versions=versions,
        turns=[TurnRecord("current", "e0", version_new - 1, len(old) + len(new), "length")], reward=1.0,
        training_reward=1.0, status=Status.COMPLETED, failure=FailureKind.NONE, num_turns=1,
        prompt_length=len(prompt), metrics={"interrupted_turns": 1, "mixed_version_tokens": len(old) + len(new),
                                            "discarded_tokens": 0, "aborted_turns": 0})


def test_lag_is_measured_per_token_and_waste_per_step():
    t = mixed_trajectory([1, 2], [3, 4, 5], [6], [-1.0] * 3, [-1.0], version_new=4)
    # learner at version 5: three tokens of version 3 (lag 2), one of version 4 (lag 1)
    assert lag_histogram([t], 5) == {1: 1, 2: 3}
    metrics = batch_metrics([t], 5)
    assert metrics["version_lag/mean"] == pytest.approx(1.75) and metrics["version_lag/max"] == 2.0
    assert metrics["version_lag/current/mean"] == pytest.approx(1.75)
    assert rollout_waste_metrics([t, t]) == {"rollout/aborted_turns": 0.0, "rollout/discarded_tokens": 0.0,
                                             "rollout/interrupted_turns": 2.0, "rollout/mixed_version_tokens": 8.0}


@pytest.mark.parametrize("off_policy", ["ppo", "decoupled"])
def test_the_learners_ratio_is_per_token_against_the_version_that_sampled_it(
        off_policy, world_of_one, v0, v1, v1_dir, tiny_vocab):
    """A turn cut after 6 tokens of v0 and continued by v1, trained by a learner holding v1."""
    from agentrl_core.train.batching import TrainSample
    from agentrl_core.train.learner import Learner

    prompt = [tiny_vocab["im_start"], 30, 31, 32, 33]
    old = greedy(v0, prompt, 6)
    new = greedy(v1, prompt + old, 6)
    lp_old, lp_new = logprobs_of(v0, prompt, old, 1.0), logprobs_of(v1, prompt + old, new, 1.0)
    t = mixed_trajectory(prompt, old, new, lp_old.tolist(), lp_new.tolist())
    sample = TrainSample(t.input_ids, t.loss_mask, t.rollout_logprobs, [float(m) for m in t.loss_mask])
    loss = LossConfig(kl_coef=0.0, off_policy=off_policy, behave_weight_cap=None)
    learner = Learner(v1_dir, train=TrainConfig(device="cpu", reference=False), optim=OptimConfig(), loss=loss,
                      temperature=1.0)
    metrics = learner.forward_backward([sample])
    # what the learner holds (v1) over what sampled each token: 1 for v1's tokens, v1/v0 for the others
    learner_lp = torch.cat([logprobs_of(v1, prompt, old, 1.0), lp_new])
    per_token = torch.exp(learner_lp - torch.tensor(t.rollout_logprobs[len(prompt):]))
    assert per_token[6:].tolist() == pytest.approx([1.0] * 6, abs=1e-4)
    assert (per_token[:6] - 1).abs().max() > 1e-2  # v0's tokens are off-policy for v1
    if off_policy == "ppo":
        assert metrics["ratio"] == pytest.approx(per_token.mean().item(), abs=1e-4)
    else:  # decoupled: the ratio is against the proximal policy (v1 itself), the weight is the per-token ratio
        assert metrics["ratio"] == pytest.approx(1.0, abs=1e-6)
        assert metrics["behave_weight"] == pytest.approx(per_token.mean().item(), abs=1e-4)
    learner.close()
