"""The gateway with real clients: the ``openai`` SDK against a real gateway on real hf engines (tiny model).

Nothing on the client side is a double: the calls are the OpenAI SDK's (its retries, its
streaming parser, its errors), and a client that dies is a real process killed with SIGKILL.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from contextlib import contextmanager

import httpx
import openai
import pytest
import torch
import transformers

from agentrl_core.config import config_from_dict
from agentrl_core.engine.process import BackgroundEngine
from agentrl_core.engine.server import EngineServer
from agentrl_core.gateway.process import BackgroundGateway, build_gateway
from agentrl_core.rollout.chat_templates import Qwen3ChatTemplate
from agentrl_core.train.batching import TrainSample, collate
from agentrl_core.train.logprobs import token_logprobs

pytestmark = pytest.mark.anyio

TOOLS = [{"type": "function", "function": {"name": "add", "description": "add two integers", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}]


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    with BackgroundEngine(EngineServer(tiny_model_dir, max_running_requests=64, dtype="float32")) as background:
        yield background


def gateway_config(model_dir, *, rollout=None, **gateway):
    rollout = {"max_new_tokens": 8, "max_total_len": 1536, "temperature": 1.0, **(rollout or {})}
    return config_from_dict({"model": {"path": str(model_dir)}, "rollout": rollout, "gateway": gateway})


@contextmanager
def running_gateway(model_dir, engine_urls, **options):
    config = gateway_config(model_dir, **options)
    with BackgroundGateway(build_gateway(config, {"current": list(engine_urls)})) as background:
        yield background


@pytest.fixture(scope="module")
def gateway(tiny_model_dir, engine):
    with running_gateway(tiny_model_dir, [engine.url]) as background:
        yield background


def open_session(gateway, **info):
    response = httpx.post(gateway.url + "/sessions", json=info, timeout=30)
    assert response.status_code == 200, response.text
    return response.json()


def close_session(gateway, session_id):
    response = httpx.post(f"{gateway.url}/sessions/{session_id}/close", timeout=30)
    assert response.status_code == 200, response.text
    return response.json()


def recomputed_logprobs(model_dir, records, temperature):
    """The learner's log-probs (train.logprobs.token_logprobs on collated samples) vs the captured ones."""
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    samples = [TrainSample(s["input_ids"], s["loss_mask"], s["rollout_logprobs"], [0.0] * len(s["input_ids"]))
               for r in records for s in r["sample_records"]]
    worst = 0.0
    with torch.no_grad():
        for start in range(0, len(samples), 16):
            mb = collate(samples[start : start + 16], "padded")
            learner = token_logprobs(model, mb, temperature).logprobs
            mask = mb.loss_mask.bool()
            worst = max(worst, (learner[mask] - mb.old_logprobs[mask]).abs().max().item())
    return worst, len(samples)


def next_messages(messages, message, turn):
    """The conversation after a reply, as an agent would grow it: tool results for calls, else a user turn."""
    grown = [*messages, message]
    if message.get("tool_calls"):
        grown += [{"role": "tool", "tool_call_id": c["id"], "content": str(turn)} for c in message["tool_calls"]]
    else:
        grown.append({"role": "user", "content": f"turn {turn}: go on"})
    return grown


async def test_64_concurrent_sdk_clients_five_turns_each_are_captured_exactly(gateway, engine, tiny_model_dir):
    """64 AsyncOpenAI clients, 5 turns each, half bound by base URL and half by bearer key, half with tools."""
    sessions = [open_session(gateway, task="concurrent", uid=f"u{i}") for i in range(64)]
    seen: dict[int, list[list[float]]] = {}

    async def play(i, session):
        bound_by_url = i % 2 == 0
        client = openai.AsyncOpenAI(base_url=session["base_url"] if bound_by_url else gateway.url + "/v1",
                                    api_key="unused" if bound_by_url else session["key"], max_retries=0, timeout=120)
        messages = [{"role": "system", "content": "You add numbers."},
                    {"role": "user", "content": f"session-{i:03d}: what is {i} + 1?"}]
        seen[i] = []
        async with client:
            for turn in range(5):
                response = await client.chat.completions.create(
                    model=session["model"], messages=messages, tools=TOOLS if i % 4 < 2 else openai.NOT_GIVEN,
                    logprobs=True, max_tokens=6)
                choice = response.choices[0]
                seen[i].append([t.logprob for t in choice.logprobs.content])
                assert response.usage.completion_tokens == len(choice.logprobs.content)
                messages = next_messages(messages, choice.message.model_dump(exclude_none=True), turn)

    await asyncio.gather(*(play(i, s) for i, s in enumerate(sessions)))
    records = [close_session(gateway, s["id"]) for s in sessions]
    for i, record in enumerate(records):
        counts = record["counts"]
        assert record["calls"] == 5 and counts["new"] == 1
        assert counts["new"] + counts["append"] + counts["realign"] + counts["fork"] == 5
        assert len(record["sample_records"]) == 1 + counts["fork"]
        # every sampled token is the one this session's client received, in order: nothing crossed sessions
        captured = [lp for s in record["sample_records"] for lp, m in zip(s["rollout_logprobs"], s["loss_mask"]) if m]
        assert captured == [lp for call in seen[i] for lp in call], i
        text = gateway.server.renderer.decode(record["sample_records"][0]["input_ids"])
        assert f"session-{i:03d}:" in text
        others = [f"session-{j:03d}:" for j in range(64) if j != i]
        assert not any(marker in text for sample in record["sample_records"]
                       for marker in others if marker in gateway.server.renderer.decode(sample["input_ids"]))
        for sample in record["sample_records"]:
            n = len(sample["input_ids"])
            assert len(sample["loss_mask"]) == len(sample["rollout_logprobs"]) == len(sample["versions"]) == n
            assert sample["loss_mask"][0] == 0 and sample["prompt_length"] > 0
            assert all(v == 0 for v, m in zip(sample["versions"], sample["loss_mask"]) if m)
    worst, n = recomputed_logprobs(tiny_model_dir, records, temperature=1.0)
    assert worst < 1e-4, f"learner and captured log-probs differ by {worst} over {n} samples"


async def test_streamed_and_plain_calls_record_the_same_tokens(gateway):
    records, texts = [], []
    for stream in (False, True):
        session = open_session(gateway, task="stream")
        client = openai.AsyncOpenAI(base_url=session["base_url"], api_key="unused", max_retries=0)
        messages = [{"role": "system", "content": "You add numbers."}, {"role": "user", "content": "What is 2 + 3?"}]
        said = []
        async with client:
            for turn in range(3):
                kwargs = dict(model=session["model"], messages=messages, tools=TOOLS, seed=100 + turn)
                if stream:
                    content, calls, finish = "", {}, None
                    async for chunk in await client.chat.completions.create(stream=True, **kwargs):
                        delta = chunk.choices[0].delta
                        content += delta.content or ""
                        for call in delta.tool_calls or []:
                            calls.setdefault(call.index, {"id": call.id, "type": "function",
                                                          "function": {"name": "", "arguments": ""}})
                            calls[call.index]["function"]["name"] += call.function.name or ""
                            calls[call.index]["function"]["arguments"] += call.function.arguments or ""
                        finish = chunk.choices[0].finish_reason or finish
                    message = {"role": "assistant", "content": content or None}
                    if calls:
                        message["tool_calls"] = [calls[k] for k in sorted(calls)]
                else:
                    choice = (await client.chat.completions.create(**kwargs)).choices[0]
                    message, finish = choice.message.model_dump(exclude_none=True), choice.finish_reason
                said.append((message.get("content"), json.dumps(message.get("tool_calls")), finish))
                messages = next_messages(messages, message, turn)
        texts.append(said)
        records.append(close_session(gateway, session["id"]))
    assert texts[0] == texts[1]
    plain, streamed = ([(s["input_ids"], s["loss_mask"], s["versions"]) for s in r["sample_records"]] for r in records)
    assert plain == streamed
    for a, b in zip(records[0]["sample_records"], records[1]["sample_records"]):
        assert a["rollout_logprobs"] == pytest.approx(b["rollout_logprobs"], abs=1e-5)


class DroppingProxy:
    """A TCP proxy that forwards each HTTP request to the gateway and, once, drops the connection
    after the gateway answered, without passing the answer on (a network failure the client sees)."""

    def __init__(self, upstream: str) -> None:
        host, port = upstream.removeprefix("http://").split(":")
        self.upstream = (host, int(port))
        self.server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.server.getsockname()[1]}"
        self.dropped = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    @staticmethod
    def _read_message(sock: socket.socket) -> bytes:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                return data
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        while len(body) < length:
            body += sock.recv(65536)
        return head + b"\r\n\r\n" + body

    def _serve(self, client: socket.socket) -> None:
        with client:
            while True:
                request = self._read_message(client)
                if not request:
                    return
                with socket.create_connection(self.upstream) as upstream:
                    upstream.sendall(request)
                    response = self._read_message(upstream)
                if b"/chat/completions" in request.split(b"\r\n", 1)[0] and not self.dropped.is_set():
                    self.dropped.set()
                    return  # the answer never reaches the client
                client.sendall(response)

    def close(self) -> None:
        self.server.close()


async def test_a_replayed_sdk_retry_is_recorded_once(gateway):
    session = open_session(gateway, task="retry")
    proxy = DroppingProxy(gateway.url)
    try:
        base = proxy.url + session["base_url"].removeprefix(gateway.url)
        async with openai.AsyncOpenAI(base_url=base, api_key="unused", max_retries=2) as client:
            response = await client.chat.completions.create(
                model=session["model"], messages=[{"role": "user", "content": "What is 2 + 3?"}], logprobs=True)
    finally:
        proxy.close()
    assert proxy.dropped.is_set()  # the first answer was lost: the SDK sent the request again
    record = close_session(gateway, session["id"])
    assert record["calls"] == 1 and record["counts"]["replay"] == 1
    [sample] = record["sample_records"]
    assert [lp for lp, m in zip(sample["rollout_logprobs"], sample["loss_mask"]) if m] == \
        [t.logprob for t in response.choices[0].logprobs.content]


async def test_unknown_and_ended_keys_get_401_in_openais_shape(gateway):
    session = open_session(gateway, task="keys")
    async with openai.AsyncOpenAI(base_url=gateway.url + "/v1", api_key="sk-not-a-session", max_retries=0) as bad:
        with pytest.raises(openai.AuthenticationError) as info:
            await bad.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert info.value.status_code == 401 and "unknown session key" in info.value.message
    close_session(gateway, session["id"])
    for base, key in ((gateway.url + "/v1", session["key"]), (session["base_url"], "unused")):
        async with openai.AsyncOpenAI(base_url=base, api_key=key, max_retries=0) as ended:
            with pytest.raises(openai.AuthenticationError, match="has ended"):
                await ended.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    answer = httpx.post(gateway.url + "/v1/chat/completions", json={"messages": []},
                        headers={"authorization": f"Bearer {open_session(gateway)['key']}"})
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "messages"


async def test_rewards_and_completions_and_models(gateway):
    session = open_session(gateway, task="text")
    async with openai.AsyncOpenAI(base_url=session["base_url"], api_key="unused", max_retries=0) as client:
        models = await client.models.list()
        assert [m.id for m in models.data] == [session["model"]]
        first = await client.completions.create(model=session["model"], prompt="Question: 2 + 3 =", logprobs=1)
        text = "Question: 2 + 3 =" + first.choices[0].text + " Question: 4 + 4 ="
        await client.completions.create(model=session["model"], prompt=text)
    bad = httpx.post(f"{gateway.url}/sessions/{session['id']}/reward", json={"reward": "high"})
    assert bad.status_code == 400 and "reward must be a finite number" in bad.json()["detail"]
    httpx.post(f"{gateway.url}/sessions/{session['id']}/reward", json={"reward": 0.75, "metrics": {"judge": 1}})
    record = close_session(gateway, session["id"])
    assert (record["status"], record["reward"], record["failure"]) == ("completed", 0.75, "none")
    assert record["calls"] == 2 and record["counts"]["new"] == 1 and record["outcome_metrics"] == {"judge": 1}


def engine_running(url):
    return httpx.get(url + "/get_server_info", timeout=10).json().get("running", 0) > 0


async def call_through_a_weight_update(gateway, engine, *, stream=False):
    """A long call; once it runs, the engine is paused (as a weight sync does) and continued."""
    session = open_session(gateway, task="update")
    async with openai.AsyncOpenAI(base_url=session["base_url"], api_key="unused", max_retries=0) as client:
        task = asyncio.ensure_future(client.chat.completions.create(
            model=session["model"], messages=[{"role": "user", "content": "Tell a long story."}], stream=stream))
        aborted = 0
        deadline = time.monotonic() + 60
        while not aborted and not task.done() and time.monotonic() < deadline:
            if await asyncio.to_thread(engine_running, engine.url):
                paused = (await asyncio.to_thread(httpx.post, engine.url + "/pause_generation", json={})).json()
                aborted = paused["aborted"]
                await asyncio.to_thread(httpx.post, engine.url + "/continue_generation", json={})
            else:
                await asyncio.sleep(0.005)
        try:
            result = await task
        except openai.APIStatusError as exc:
            result = exc
    return session, aborted, result


async def test_weight_updates_hold_calls_or_answer_429_never_5xx(tiny_model_dir, engine):
    long = {"max_new_tokens": 3000, "max_total_len": 4096}
    for mode in ("hold", "reject"):
        with running_gateway(tiny_model_dir, [engine.url], rollout=long, on_weight_update=mode,
                             retry_after_s=3) as gateway:
            aborted = 0
            for _attempt in range(5):  # the random model may end its answer before the pause lands
                session, aborted, result = await call_through_a_weight_update(gateway, engine)
                if aborted:
                    break
            assert aborted, "no call was running when the engine paused"
            record = close_session(gateway, session["id"])
            if mode == "hold":
                assert isinstance(result, openai.types.chat.ChatCompletion)
                [turn] = record["turns"]
                assert turn["aborted_retries"] >= 1 and record["calls"] == 1
            else:
                assert isinstance(result, openai.RateLimitError), result
                assert result.response.headers["retry-after"] == "3"
                assert result.body["code"] == "weights_updating" and record["calls"] == 0
            # announced by the trainer: reject answers at once, hold waits for the end of the update
            httpx.post(gateway.url + "/admin/pause")
            s = open_session(gateway)
            async with openai.AsyncOpenAI(base_url=s["base_url"], api_key="unused", max_retries=0) as client:
                call = asyncio.ensure_future(client.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=2))
                if mode == "reject":
                    with pytest.raises(openai.RateLimitError):
                        await call
                else:
                    done, _ = await asyncio.wait({call}, timeout=0.5)
                    assert not done  # held while the update runs
                    httpx.post(gateway.url + "/admin/continue", json={"global_step": 1})
                    assert (await call).choices[0].finish_reason in ("stop", "length")
            httpx.post(gateway.url + "/admin/continue", json={})


CLIENT = textwrap.dedent("""
    import json, sys, time, httpx, openai
    session = httpx.post(sys.argv[1] + "/sessions", json={"task": "crash", "idle_timeout": 1.0}).json()
    client = openai.OpenAI(base_url=session["base_url"], api_key="unused", max_retries=0)
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hello"}], max_tokens=2)
    print(json.dumps(session), flush=True)
    time.sleep(600)
""")


async def test_a_killed_clients_session_is_reclaimed(gateway):
    """A client process opens a session, calls once and is killed; the session expires as an infra failure."""
    child = subprocess.Popen([sys.executable, "-c", CLIENT, gateway.url], stdout=subprocess.PIPE, text=True)
    try:
        session = json.loads(child.stdout.readline())
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    deadline = time.monotonic() + 30
    state = {}
    while time.monotonic() < deadline:
        state = httpx.get(f"{gateway.url}/sessions/{session['id']}").json()
        if state["state"] == "ended":
            break
        await asyncio.sleep(0.1)
    assert state["state"] == "ended" and "idle" in state["end_reason"]
    assert (state["status"], state["failure"], state["calls"]) == ("cancelled", "infra", 1)
    assert session["id"] not in {s["id"] for s in httpx.get(gateway.url + "/sessions").json()["sessions"]}
    async with openai.AsyncOpenAI(base_url=session["base_url"], api_key="unused", max_retries=0) as late:
        with pytest.raises(openai.AuthenticationError, match="has ended"):
            await late.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])


THINK_CHAT = [{"role": "system", "content": "You add numbers."}, {"role": "user", "content": "What is 2 + 3?"}]
THINK_REPLY = "<think>\nI add 2 and 3.\n</think>\n\nThe answer is 5."


@pytest.fixture(scope="module")
def thinking_model_dir(tiny_model_dir, tmp_path_factory):
    """The tiny model overfit to answer every question with a <think> block, in Qwen3's format."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_model_dir)
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    template = Qwen3ChatTemplate(tokenizer=tokenizer)
    answer = tokenizer.encode(THINK_REPLY + "<|im_end|>", add_special_tokens=False)
    first_reply = {"role": "assistant", "content": "The answer is 5.", "reasoning_content": "I add 2 and 3."}
    conversations = [THINK_CHAT, [*THINK_CHAT, first_reply, {"role": "user", "content": "And now 4 + 4?"}]]
    examples = [(template.render(c, None, add_generation_prompt=True), answer) for c in conversations]
    torch.manual_seed(0)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for _ in range(400):
            total = 0.0
            for prompt, target in examples:
                loss = model(torch.tensor([prompt + target]), labels=torch.tensor([[-100] * len(prompt) + target])).loss
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                total += loss.item()
            if total / len(examples) < 0.01:
                break
    finally:
        torch.set_num_threads(threads)
    out = tmp_path_factory.mktemp("thinking")
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


async def test_a_template_that_drops_earlier_think_blocks_forks_and_samples_stay_exact(thinking_model_dir):
    with BackgroundEngine(EngineServer(thinking_model_dir, max_running_requests=4, dtype="float32")) as engine, \
            running_gateway(thinking_model_dir, [engine.url], chat_template="qwen3", reasoning_parser="think",
                            rollout={"max_new_tokens": 48, "temperature": 0.5}) as gateway:
        session = open_session(gateway, task="think")
        async with openai.AsyncOpenAI(base_url=session["base_url"], api_key="unused", max_retries=0) as client:
            messages = list(THINK_CHAT)
            replies = []
            for question in ("And now 4 + 4?", "Then 1 + 1?"):  # the second question is never sent
                message = (await client.chat.completions.create(model="m", messages=messages)).choices[0].message
                replies.append(message)
                messages += [message.model_dump(exclude_none=True), {"role": "user", "content": question}]
        record = close_session(gateway, session["id"])
    assert [r.content for r in replies] == ["The answer is 5."] * 2
    assert [getattr(r, "reasoning_content", None) for r in replies] == ["I add 2 and 3."] * 2
    assert record["counts"]["fork"] == 1 and len(record["sample_records"]) == 2
    assert "rewrote an earlier turn" in next(iter(record["fork_reasons"]))
    first, second = record["sample_records"]
    tokenizer = gateway.server.renderer.tokenizer
    assert "I add 2 and 3." in tokenizer.decode(first["input_ids"])  # what the model wrote, kept in the first sample
    rendered = Qwen3ChatTemplate(tokenizer=tokenizer).render(messages[:4], None, add_generation_prompt=True)
    assert second["input_ids"][: second["prompt_length"]] == rendered  # what the template shows the model next
    assert "I add 2 and 3." not in tokenizer.decode(rendered)
    worst, n = recomputed_logprobs(thinking_model_dir, [record], temperature=0.5)
    assert n == 2 and worst < 1e-4


def test_the_command_line_serves_and_exports_sessions(tiny_model_dir, engine, tmp_path):
    """``agentrl gateway --model DIR --engine URL --export FILE`` as its own process."""
    from agentrl_core.processes import ServiceProcess, agentrl_command

    export = tmp_path / "sessions.jsonl"
    service = ServiceProcess("gateway", agentrl_command("gateway", "--model", str(tiny_model_dir), "--engine", engine.url,
                                                       "--export", str(export), "--set", "rollout.max_new_tokens=4"),
                             log_path=tmp_path / "gateway.log")
    url = service.start(timeout=120)
    try:
        session = httpx.post(url + "/sessions", json={"task": "cli"}).json()
        client = openai.OpenAI(base_url=url + "/v1", api_key=session["key"], max_retries=0)
        reply = client.chat.completions.create(model="any", messages=[{"role": "user", "content": "hi"}])
        assert reply.usage.completion_tokens <= 4
        httpx.post(f"{url}/sessions/{session['id']}/close")
    finally:
        service.stop()
    [line] = export.read_text().splitlines()
    record = json.loads(line)
    assert record["id"] == session["id"] and record["calls"] == 1 and len(record["sample_records"]) == 1


async def test_an_unreachable_engine_is_a_503_the_sdk_can_retry(tiny_model_dir):
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{probe.getsockname()[1]}"
    with running_gateway(tiny_model_dir, [dead]) as gateway:
        session = open_session(gateway)
        async with openai.AsyncOpenAI(base_url=session["base_url"], api_key="unused", max_retries=0) as client:
            with pytest.raises(openai.InternalServerError) as info:
                await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        assert info.value.status_code == 503 and "cannot connect" in info.value.message
        assert close_session(gateway, session["id"])["calls"] == 0


async def test_a_call_retracted_by_a_weight_update_keeps_every_tokens_version(gateway, engine, tiny_model_dir,
                                                                               monkeypatch):
    """The trainer's partial-rollout sync (pause with retract, new weights, continue) in the middle of a call:
    the reply keeps its first tokens, continues under the new version, and the sample records both."""
    from agentrl_core.rollout.engine_client import EngineClient

    scheduler = engine.server.scheduler
    paused = threading.Event()
    sample = scheduler._sample_and_append

    def sample_then_maybe_pause(requests, logits):  # retract at an exact token, whatever the load
        sample(requests, logits)
        if not paused.is_set() and any(len(r.output_ids) >= 2 for r in scheduler.running):
            scheduler.pause("retract")
            paused.set()

    monkeypatch.setattr(scheduler, "_sample_and_append", sample_then_maybe_pause)
    session = open_session(gateway, task="retract")
    async with EngineClient(engine.url) as admin, \
            openai.AsyncOpenAI(base_url=session["base_url"], api_key="unused", max_retries=0) as client:
        try:
            call = asyncio.ensure_future(client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "Tell a story."}], max_tokens=8, seed=5))
            assert await asyncio.to_thread(paused.wait, 60), "the call never reached its second token"
            await admin.update_weights_from_disk(str(tiny_model_dir), weight_version=1)
            await admin.continue_generation()
            response = await call
        finally:
            await admin.update_weights_from_disk(str(tiny_model_dir), weight_version=0)
    record = close_session(gateway, session["id"])
    [sample_record] = record["sample_records"]
    versions = [v for v, m in zip(sample_record["versions"], sample_record["loss_mask"]) if m]
    k = versions.count(0)
    assert k >= 2 and versions == [0] * k + [1] * (len(versions) - k), versions
    assert len(versions) == response.usage.completion_tokens
    [turn] = record["turns"]
    assert turn["interrupted"] and turn["aborted_retries"] == 0 and turn["version"] == 0
