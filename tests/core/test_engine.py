"""The HF engine: log-probs equal a plain transformers forward, continuous batching, weight versions."""

from __future__ import annotations

import json
import threading

import anyio
import httpx
import pytest
import torch
import transformers

from agentrl_core.engine.model import EngineModel, load_hf_model
from agentrl_core.engine.process import BackgroundEngine
from agentrl_core.engine.sampling import SamplingParams, truncate
from agentrl_core.engine.scheduler import Request, Scheduler
from agentrl_core.engine.server import EngineServer
from agentrl_core.rollout.engine_client import EngineClient, EngineError, EnginePool

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    with BackgroundEngine(EngineServer(tiny_model_dir, max_running_requests=16, dtype="float32")) as background:
        yield background


@pytest.fixture(scope="module")
def reference(tiny_model_dir):
    return transformers.AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


def reference_logprobs(model, prompt, output, temperature):
    with torch.no_grad():
        logits = model(torch.tensor([prompt + output])).logits[0, len(prompt) - 1 : -1].float()
    scale = temperature if temperature > 0 else 1.0
    return torch.log_softmax(logits / scale, dim=-1).gather(1, torch.tensor(output)[:, None])[:, 0]


@pytest.fixture(scope="module")
def prompts(tiny_vocab):
    start = tiny_vocab["im_start"]
    return [[start, 17, 600, 12, 99], [start, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15], [200, 201]]


async def test_logprobs_equal_a_plain_transformers_forward(prompts, engine, reference):
    """Concurrent requests (one batched forward per step) with temperatures, top-p, top-k, greedy."""
    settings = [dict(temperature=0.8), dict(temperature=1.3, top_p=0.9), dict(temperature=0.5, top_k=20),
                dict(temperature=0.0), dict(temperature=1.0, min_p=0.05)]
    async with EngineClient(engine.url) as client:
        results = {}

        async def run(i, prompt, params):
            results[i] = await client.generate(prompt, {**params, "max_new_tokens": 24 - 3 * i, "ignore_eos": True,
                                                        "seed": 100 + i})

        async with anyio.create_task_group() as tg:
            for i, params in enumerate(settings):
                tg.start_soon(run, i, prompts[i % len(prompts)], params)
    for i, params in enumerate(settings):
        result = results[i]
        assert result.finish_reason == "length" and len(result.output_ids) == 24 - 3 * i == len(result.logprobs)
        expected = reference_logprobs(reference, prompts[i % len(prompts)], result.output_ids, params["temperature"])
        assert torch.allclose(torch.tensor(result.logprobs), expected, atol=1e-4, rtol=0), params
        if params.get("top_k"):  # truncation limits what is sampled, not the returned log-probs
            assert all(lp >= torch.topk(expected, 1).values.item() - 50 for lp in result.logprobs)
        if params["temperature"] == 0.0:
            with torch.no_grad():
                greedy = reference.generate(torch.tensor([prompts[i % 3]]), max_new_tokens=24 - 3 * i,
                                            do_sample=False, min_new_tokens=24 - 3 * i,
                                            pad_token_id=0)[0, len(prompts[i % 3]):].tolist()
            assert result.output_ids == greedy


async def test_seeded_requests_repeat_and_top_k_restricts_sampling(prompts, engine, reference):
    async with EngineClient(engine.url) as client:
        params = {"temperature": 1.0, "max_new_tokens": 12, "ignore_eos": True, "seed": 7}
        a = await client.generate(prompts[0], params)
        b = await client.generate(prompts[0], params)
        c = await client.generate(prompts[0], {**params, "seed": 8})
        assert a.output_ids == b.output_ids and a.output_ids != c.output_ids
        k = await client.generate(prompts[1], {**params, "top_k": 3})
    with torch.no_grad():
        logits = reference(torch.tensor([prompts[1] + k.output_ids])).logits[0, len(prompts[1]) - 1 : -1]
    top3 = torch.topk(logits, 3, dim=-1).indices
    assert all(tok in top3[i].tolist() for i, tok in enumerate(k.output_ids))


async def test_many_requests_leaving_at_different_steps_keep_exact_logprobs(tiny_vocab, engine, reference):
    """Finishing requests hand their slot to the last running one (packed cache); nothing may get mixed up."""
    rng = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, tiny_vocab["size"], (int(n),), generator=rng).tolist()
               for n in torch.randint(2, 40, (24,), generator=rng)]
    lengths = [int(n) for n in torch.randint(1, 30, (24,), generator=rng)]
    results = {}
    async with EngineClient(engine.url) as client:
        async def run(i):
            results[i] = await client.generate(prompts[i], {"max_new_tokens": lengths[i], "ignore_eos": True,
                                                            "temperature": 1.0})

        async with anyio.create_task_group() as tg:
            for i in range(24):
                tg.start_soon(run, i)
    for i, result in results.items():
        assert len(result.output_ids) == lengths[i]
        expected = reference_logprobs(reference, prompts[i], result.output_ids, 1.0)
        assert torch.allclose(torch.tensor(result.logprobs), expected, atol=1e-4, rtol=0), i


@pytest.mark.parametrize("arch", ["qwen2_untied_gqa7", "llama", "qwen3"])
def test_forward_matches_transformers_for_other_supported_layouts(arch, tmp_path):
    """Qwen2.5-7B-like (untied embeddings, 7:1 GQA, rope 1e6), Llama and Qwen3 (q/k norms) layouts."""
    common = dict(vocab_size=300, hidden_size=112, intermediate_size=160, num_hidden_layers=2,
                  max_position_embeddings=512)
    if arch == "qwen2_untied_gqa7":
        config = transformers.Qwen2Config(**common, num_attention_heads=7, num_key_value_heads=1,
                                          tie_word_embeddings=False, rope_theta=1e6)
    elif arch == "llama":
        config = transformers.LlamaConfig(**common, num_attention_heads=4, num_key_value_heads=2)
    else:
        config = transformers.Qwen3Config(**common, num_attention_heads=4, num_key_value_heads=2, head_dim=32)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    model.save_pretrained(tmp_path)
    engine = EngineModel(load_hf_model(tmp_path, dtype="float32"), max_slots=4, max_context=512)
    seqs = [torch.randint(0, 300, (n,)).tolist() for n in (9, 4, 17)]
    prefill = engine.extend([0, 1, 2], [s[:-1] for s in seqs], [0, 0, 0])
    decode = engine.extend([0, 1, 2], [[s[-1]] for s in seqs], [len(s) - 1 for s in seqs])
    with torch.no_grad():
        for i, s in enumerate(seqs):
            logits = model(torch.tensor([s])).logits[0]
            assert torch.allclose(prefill[i], logits[-2], atol=1e-4), arch
            assert torch.allclose(decode[i], logits[-1], atol=1e-4), arch


def test_truncation_by_hand():
    probs = torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05])
    assert truncate(probs, top_k=2).tolist() == pytest.approx([0.5, 0.2, 0, 0, 0])
    # nucleus 0.75: the mass above each token is 0, .5, .7, .85, .95 -> the smallest set reaching .75 is 3 tokens
    assert truncate(probs, top_p=0.75).tolist() == pytest.approx([0.5, 0.2, 0.15, 0, 0])
    assert truncate(probs, min_p=0.3).tolist() == pytest.approx([0.5, 0.2, 0.15, 0, 0])


async def test_stop_tokens_and_strings(prompts, engine, tiny_model_dir):
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_model_dir)
    async with EngineClient(engine.url) as client:
        free = await client.generate(prompts[0], {"temperature": 0, "max_new_tokens": 10, "ignore_eos": True})
        stop_id = free.output_ids[3]
        first = free.output_ids.index(stop_id)
        stopped = await client.generate(prompts[0], {"temperature": 0, "max_new_tokens": 10,
                                                     "stop_token_ids": [stop_id]})
        assert stopped.finish_reason == "stop" and stopped.matched_stop == stop_id
        assert stopped.output_ids == free.output_ids[: first + 1]  # the stop token is returned (it was sampled)
        text = tokenizer.decode(free.output_ids[4:6])
        by_text = await client.generate(prompts[0], {"temperature": 0, "max_new_tokens": 10, "stop": [text]})
        assert by_text.finish_reason == "stop" and by_text.matched_stop == text
        assert text not in by_text.text and len(by_text.output_ids) <= 6


async def test_bad_requests_get_one_sentence_400s(engine):
    async with httpx.AsyncClient(base_url=engine.url) as http:
        cases = [
            ({"input_ids": [1, 2], "sampling_params": {"temprature": 1}}, "unknown sampling_params"),
            ({"input_ids": [[1, 2], [3]]}, "send one request per call"),
            ({"input_ids": [1, 10**9]}, "not a token id"),
            ({"input_ids": [1], "sampling_params": {"top_p": 0}}, "top_p must be in (0, 1]"),
            ({"input_ids": [1], "sampling_params": {"n": 2}}, "not supported"),
            ({"input_ids": [1] * 40000}, "max_context"),
        ]
        for body, reason in cases:
            response = await http.post("/generate", json=body)
            assert response.status_code == 400 and reason in response.json()["detail"], body
        response = await http.post("/pause_generation", json={"mode": "in_place"})
        assert response.status_code == 400 and "use 'abort'" in response.json()["detail"]


async def test_chat_completions_and_model_info(engine):
    async with EngineClient(engine.url) as client:
        info = await client.model_info()
        assert info["model_type"] == "qwen2" and info["weight_version"] == 0 and info["engine"] == "agentrl-hf"
        answer = await client.chat_completions({
            "messages": [{"role": "user", "content": "Compute 2 + 3"}], "max_tokens": 6, "temperature": 0.7,
            "seed": 1, "logprobs": True,
            "tools": [{"type": "function", "function": {"name": "calculate", "parameters": {"type": "object"}}}]})
    choice = answer["choices"][0]
    assert answer["object"] == "chat.completion" and choice["message"]["role"] == "assistant"
    assert answer["usage"]["completion_tokens"] == len(choice["logprobs"]["content"]) <= 6
    assert answer["metadata"]["weight_version"] == 0


# ---------------------------------------------------------------------------------------
# Continuous batching, driven on the scheduler directly (deterministic step accounting)


def make_scheduler(path, **kwargs):
    model = EngineModel(load_hf_model(path, dtype="float32"), max_slots=8, max_context=512)
    return Scheduler(model, eos_token_ids=[], **kwargs)


def test_requests_join_and_leave_every_step(tiny_model_dir):
    scheduler = make_scheduler(tiny_model_dir)
    done: dict[str, object] = {}
    finished = threading.Event()

    def collect(c):
        done[c.rid] = c
        if c.rid == "b":  # b leaves after one decoding step; c joins at the next step boundary
            scheduler.submit(Request("c", [5, 6, 7], SamplingParams(max_new_tokens=3), collect))
        if len(done) == 3:
            finished.set()

    scheduler.pause()  # queue a and b, then start them in the same step
    scheduler.submit(Request("a", [1, 2, 3, 4], SamplingParams(max_new_tokens=6), collect))
    scheduler.submit(Request("b", [9, 8, 7], SamplingParams(max_new_tokens=2), collect))
    scheduler.start()
    try:
        scheduler.call(scheduler.resume).result(30)
        assert finished.wait(60)
    finally:
        scheduler.stop()
    assert [len(done[r].output_ids) for r in "abc"] == [6, 2, 3]
    # a takes 6 forwards (its prefill, then 5 decoding steps); b and c ran inside those same forwards:
    # a and b prefilled together, c's prompt went in with a's third decoding step
    assert scheduler.stats.forwards == 6
    assert scheduler.stats.decode_steps == 5 and scheduler.stats.prefill_forwards == 2


def test_prefix_cache_reuses_the_previous_turn(prompts, tiny_vocab, tiny_model_dir, reference):
    scheduler = make_scheduler(tiny_model_dir, seed=3)
    results = []
    scheduler.start()
    try:
        first = _run(scheduler, "t1", prompts[1], SamplingParams(max_new_tokens=5, temperature=0.9))
        turn2 = prompts[1] + first.output_ids + [tiny_vocab["im_end"], 198, tiny_vocab["im_start"], 300, 301]
        second = _run(scheduler, "t2", turn2, SamplingParams(max_new_tokens=5, temperature=0.9))
        results = [first, second]
    finally:
        scheduler.stop()
    assert second.cached_tokens == len(prompts[1]) + len(first.output_ids) - 1  # all fed tokens were reused
    expected = reference_logprobs(reference, turn2, second.output_ids, 0.9)
    assert torch.allclose(torch.tensor(second.logprobs), expected, atol=1e-4, rtol=0)
    assert len(results) == 2


def test_grown_cache_and_slot_moves_after_long_requests(prompts, tiny_model_dir, reference):
    """Requests longer than the initial cache (it grows) that finish out of slot order (slots move)."""
    scheduler = make_scheduler(tiny_model_dir)
    done, finished = {}, threading.Event()

    def collect(c):
        done[c.rid] = c
        if len(done) == 3:
            finished.set()

    scheduler.pause()
    # slots x=0, a=1, b=2. x leaves first (b moves into slot 0); then b leaves from slot 0 after the
    # cache grew past 256 positions, and a moves from slot 1 to slot 0 with its 290 cached positions
    for rid, n in (("x", 20), ("a", 300), ("b", 280)):
        scheduler.submit(Request(rid, prompts[1], SamplingParams(max_new_tokens=n), collect))
    scheduler.start()
    try:
        scheduler.call(scheduler.resume).result(30)
        assert finished.wait(120)
    finally:
        scheduler.stop()
    assert scheduler.model.capacity > 256 and scheduler.error is None
    for rid, n in (("x", 20), ("a", 300), ("b", 280)):
        result = done[rid]
        assert len(result.output_ids) == n and result.finish_reason["type"] == "length"
        expected = reference_logprobs(reference, prompts[1], result.output_ids, 1.0)
        assert torch.allclose(torch.tensor(result.logprobs), expected, atol=1e-4, rtol=0), rid


def test_long_prompts_are_prefilled_in_chunks(tiny_model_dir, reference):
    scheduler = make_scheduler(tiny_model_dir, max_prefill_tokens=8)
    prompt = list(range(300, 330))  # 30 tokens: chunks of 8, 8, 8 and 6
    scheduler.start()
    try:
        result = _run(scheduler, "long", prompt, SamplingParams(max_new_tokens=4, temperature=1.0))
    finally:
        scheduler.stop()
    assert scheduler.stats.prefill_forwards == 4
    expected = reference_logprobs(reference, prompt, result.output_ids, 1.0)
    assert torch.allclose(torch.tensor(result.logprobs), expected, atol=1e-4, rtol=0)


def _run(scheduler, rid, ids, params):
    box = []
    event = threading.Event()
    scheduler.submit(Request(rid, list(ids), params, lambda c: (box.append(c), event.set())))
    assert event.wait(60)
    return box[0]


# ---------------------------------------------------------------------------------------
# Weight updates: pause (abort) -> update -> continue, every token tagged with its version


async def test_update_from_disk_during_generation_tags_every_token(prompts, engine, tiny_model_dir, reference, tmp_path):
    # a second set of weights: the same architecture with perturbed parameters
    torch.manual_seed(11)
    other = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        for p in other.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    other.save_pretrained(tmp_path / "v1")
    weights = {0: reference, 1: other}
    params = {"temperature": 1.0, "max_new_tokens": 400, "ignore_eos": True}
    async with EngineClient(engine.url) as client:
        await client.update_weights_from_disk(str(tiny_model_dir), weight_version=0)
        aborted = {}

        async def long_request(i):
            aborted[i] = await client.generate(prompts[i % 3], {**params, "seed": i})

        async with anyio.create_task_group() as tg:
            for i in range(4):
                tg.start_soon(long_request, i)
            while (await client.server_info())["running"] < 4:  # all four are decoding
                await anyio.sleep(0.01)
            await client.pause_generation()
            await client.update_weights_from_disk(str(tmp_path / "v1"), weight_version=1)
            await client.continue_generation()
        retried = {i: await client.generate(prompts[i % 3], {**params, "max_new_tokens": 8, "seed": i})
                   for i in range(4)}
        assert (await client.model_info())["weight_version"] == 1
        await client.update_weights_from_disk(str(tiny_model_dir), weight_version=0)  # restore for other tests
    for result in aborted.values():
        assert result.finish_reason == "abort" and result.message.startswith("generation was paused")
        assert result.weight_version == 0 and 0 < len(result.output_ids) < 400
    assert {r.weight_version for r in retried.values()} == {1}
    # every token's log-prob is the one of the weights its version names, and not the other's
    for i, result in [*aborted.items(), *retried.items()]:
        lp = torch.tensor(result.logprobs)
        assert torch.allclose(lp, reference_logprobs(weights[result.weight_version], prompts[i % 3],
                                                     result.output_ids, 1.0), atol=1e-4, rtol=0)
        assert not torch.allclose(lp, reference_logprobs(weights[1 - result.weight_version], prompts[i % 3],
                                                         result.output_ids, 1.0), atol=1e-3, rtol=0)


async def test_distributed_update_refused_unless_paused_and_complete(engine):
    async with httpx.AsyncClient(base_url=engine.url) as http:
        engine.server.groups["probe"] = object()  # a registered group name (never used: refused first)
        try:
            response = await http.post("/update_weights_from_distributed", json={
                "names": ["model.norm.weight"], "dtypes": ["float32"], "shapes": [[128]], "group_name": "probe"})
        finally:
            del engine.server.groups["probe"]
        assert response.status_code == 409 and "needs generation paused first" in response.json()["message"]


async def test_a_cancelled_caller_frees_its_engine_slot(prompts, engine):
    aborted = engine.server.scheduler.stats.aborted
    async with EngineClient(engine.url) as client:
        with anyio.move_on_after(0.5):  # the caller gives up long before 5000 tokens
            await client.generate(prompts[0], {"max_new_tokens": 5000, "ignore_eos": True})
        with anyio.fail_after(30):
            while (await client.server_info())["running"]:
                await anyio.sleep(0.01)
    assert engine.server.scheduler.stats.aborted == aborted + 1  # stopped by /abort_request, not by length


async def test_busy_reading_is_the_engines_forward_time(prompts, engine):
    from agentrl_core.train.step_metrics import pool_busy_metrics

    async with EngineClient(engine.url) as client:
        before = await client.busy()
        assert before.forward_seconds is not None and before.wall_seconds > 0 and before.requests == 0
        async with anyio.create_task_group() as tg:
            tg.start_soon(client.generate, prompts[0], {"max_new_tokens": 5000, "ignore_eos": True})
            with anyio.fail_after(30):
                while (await client.busy()).requests == 0:
                    await anyio.sleep(0.01)
            await anyio.sleep(0.3)
            during = await client.busy()
            tg.cancel_scope.cancel()  # the caller gives up: /abort_request frees the slot
        with anyio.fail_after(30):
            while (await client.server_info())["running"]:
                await anyio.sleep(0.01)
    previous = {}
    pool_busy_metrics("p", {engine.url: before}, previous)
    metrics = pool_busy_metrics("p", {engine.url: during}, previous)
    assert 0.0 < metrics["engine/p/busy_fraction"] <= 1.0 and metrics["engine/p/requests"] == 1.0
    assert during.forward_seconds > before.forward_seconds
    # busy = forward passes + sampling, both timed by the engine (the reading is the busy time)
    async with EngineClient(engine.url) as client:
        info = await client.server_info()
    assert info["sampling_seconds"] > 0.0 and info["forward_seconds"] > info["sampling_seconds"]
    assert info["busy_seconds"] == pytest.approx(info["forward_seconds"] + info["sampling_seconds"])
    assert info["busy_seconds"] >= during.forward_seconds


async def test_pool_routes_sticky_and_least_loaded(prompts, engine):
    async with EnginePool("current", [engine.url, engine.url + "/"]) as pool:
        assert len(pool.urls) == 1  # the same engine twice is one engine
    async with EnginePool("current", [engine.url, "http://127.0.0.1:9"], connect_retries=0) as pool:
        pool.in_flight["http://127.0.0.1:9"] = -5  # the dead engine looks least loaded
        result = await pool.generate("traj-1", prompts[0], {"max_new_tokens": 2})
        assert result.engine == engine.url and result.pool == "current"  # failed over
        assert pool.pick("traj-1") == engine.url  # and stuck there
        assert pool.in_flight == {engine.url: 0, "http://127.0.0.1:9": -5}
        pool.in_flight["http://127.0.0.1:9"] = 0
        with pytest.raises(EngineError, match="cannot connect"):
            await EngineClient("http://127.0.0.1:9", connect_retries=0).generate([1], {})


# ---------------------------------------------------------------------------------------
# A real engine process and a real gloo group: the test process is the learner (rank 0)


def free_port():
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.processes
async def test_distributed_update_in_buckets_between_pause_and_continue(prompts, tiny_model_dir, reference, tmp_path):
    import torch.distributed as dist

    from agentrl_core.config import EngineConfig
    from agentrl_core.engine.weight_group import init_weight_update_group
    from agentrl_core.rollout.hf_driver import HFDriver

    torch.manual_seed(5)
    new = {name: (p + torch.randn_like(p) * 0.05).contiguous() for name, p in reference.named_parameters()}
    updated = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    updated.load_state_dict(new, strict=False)
    names = list(new)
    buckets = [names[: len(names) // 2], names[len(names) // 2 :]]  # a bucket boundary inside a layer
    port = free_port()

    def send(group, bucket):
        for name in bucket:
            dist.broadcast(new[name], src=0, group=group)

    with HFDriver(EngineConfig(device="cpu"), log_dir=str(tmp_path)) as driver:
        [url] = driver.launch("current", str(tiny_model_dir), ["cpu"])
        async with EngineClient(url) as client:
            joined = {}

            async def engine_joins():
                joined["engine"] = await client.init_weights_update_group(
                    master_address="127.0.0.1", master_port=port, rank_offset=1, world_size=2,
                    group_name="wsync", backend="gloo")

            async with anyio.create_task_group() as tg:
                tg.start_soon(engine_joins)
                group = await anyio.to_thread.run_sync(lambda: init_weight_update_group(
                    backend="gloo", master_address="127.0.0.1", master_port=port, world_size=2, rank=0,
                    group_name="wsync"))
            assert joined["engine"]["success"]

            before = await client.generate(prompts[0], {"max_new_tokens": 6, "seed": 1, "ignore_eos": True})
            with pytest.raises(EngineError, match="needs generation paused first"):
                await client.update_weights_from_distributed(names=["model.norm.weight"], dtypes=["float32"],
                                                             shapes=[[128]], group_name="wsync")
            await client.pause_generation()
            for i, bucket in enumerate(buckets):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(lambda b=bucket: client.update_weights_from_distributed(
                        names=b, dtypes=["float32"] * len(b), shapes=[list(new[n].shape) for n in b],
                        group_name="wsync", weight_version=1))
                    await anyio.to_thread.run_sync(send, group, bucket)
                if i == 0:  # half the parameters are new: continuing now would mix two policies
                    with pytest.raises(EngineError, match="wrote .* parameters"):
                        await client.continue_generation()
            await client.continue_generation()
            after = await client.generate(prompts[0], {"max_new_tokens": 6, "seed": 1, "ignore_eos": True})
        dist.destroy_process_group(group)
    assert before.weight_version == 0 and after.weight_version == 1
    for result, model in ((before, reference), (after, updated)):
        expected = reference_logprobs(model, prompts[0], result.output_ids, 1.0)
        assert torch.allclose(torch.tensor(result.logprobs), expected, atol=1e-4, rtol=0)


# ---------------------------------------------------------------------------------------
# OpenAI chat with tools, end to end: a tiny model taught one tool call answers with it


CHAT = [{"role": "system", "content": "You are a careful calculator agent."},
        {"role": "user", "content": "Compute 12 + 7"}]
CALL = {"name": "calculate", "arguments": {"a": 12, "op": "+", "b": 7}}
TOOLS = [{"type": "function", "function": {"name": "calculate", "description": "one operation", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "op": {"type": "string"}, "b": {"type": "integer"}}}}}]


@pytest.fixture(scope="module")
def taught_model_dir(tiny_model_dir, tmp_path_factory):
    """The tiny model overfit (a few hundred Adam steps) to answer CHAT with one qwen25 tool call."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_model_dir)
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    prompt = tokenizer.apply_chat_template(CHAT, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    answer = f"<tool_call>\n{{\"name\": \"calculate\", \"arguments\": {json.dumps(CALL['arguments'])}}}\n</tool_call>"
    p_ids = tokenizer.encode(prompt, add_special_tokens=False)
    a_ids = tokenizer.encode(answer + "<|im_end|>", add_special_tokens=False)
    ids = torch.tensor([p_ids + a_ids])
    labels = torch.tensor([[-100] * len(p_ids) + a_ids])
    torch.manual_seed(0)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: one thread is fastest, and immune to a busy machine
    try:
        for _ in range(300):  # about 100 steps reach the threshold
            loss = model(ids, labels=labels).loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if loss.item() < 0.01:
                break
    finally:
        torch.set_num_threads(threads)
    out = tmp_path_factory.mktemp("taught")
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def test_chat_completions_parse_the_models_tool_call(taught_model_dir):
    with (BackgroundEngine(EngineServer(taught_model_dir, max_running_requests=4)) as background,
          httpx.Client(base_url=background.url, timeout=60) as http):
        body = {"messages": CHAT, "tools": TOOLS, "temperature": 0, "max_tokens": 64}
        answer = http.post("/v1/chat/completions", json=body).json()
        plain = http.post("/v1/chat/completions", json={**body, "tool_choice": "none"}).json()
    choice = answer["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    [call] = choice["message"]["tool_calls"]
    assert call["type"] == "function" and call["function"]["name"] == "calculate"
    assert json.loads(call["function"]["arguments"]) == CALL["arguments"]
    assert plain["choices"][0]["finish_reason"] == "stop" and "<tool_call>" in plain["choices"][0]["message"]["content"]
