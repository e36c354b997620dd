"""TEST DOUBLE of an SGLang 0.5.x server — not SGLang, and generates no real text.

SGLang needs GPUs and cannot be installed on the machines that run these tests, so this
small server stands in for ``python -m sglang.launch_server`` when the SGLang driver's
process handling, HTTP use and weight sync are tested. It is strict where SGLang is
(``entrypoints/http_server.py``, ``managers/io_struct.py``, ``managers/tokenizer_manager.py``
and the weight updater of 0.5.x were read for each point):

* the command line takes SGLang's argument names (unknown flags fail as argparse does);
* ``/health`` answers 503 while "starting" (``SGLANG_DOUBLE_STARTUP_S`` seconds). Like SGLang
  it then *generates* to answer: while generation is paused it waits, and after
  ``SGLANG_HEALTH_CHECK_TIMEOUT`` seconds (20, SGLang's default) it answers 503;
* ``/generate`` answers ``{text, output_ids, meta_info}`` with ``finish_reason`` as a dict,
  ``output_token_logprobs`` as ``[logprob, token_id, null]`` triples and ``weight_version``
  as a *string*; the tokens are ``(sum(input_ids) + i) % 1000``, one every 5 ms after a
  "prefill" of ``SGLANG_DOUBLE_PREFILL_S_PER_TOKEN`` (0.5 ms) per prompt token. The log-prob is -0.5, or -0.5 x
  temperature when ``SGLANG_RETURN_ORIGINAL_LOGPROB`` is true (SGLang then reports the
  log-prob before temperature scaling);
* requests arriving while paused wait for ``/continue_generation``; ``/pause_generation``
  (mode ``abort``) and ``/abort_request {rid | abort_all}`` end running requests with
  ``finish_reason: {"type": "abort"}`` and the tokens so far, and requests still waiting for
  their prefill with **no** ``output_ids`` at all (SGLang's "Abort before prefill" answer);
  mode ``retract`` sends running requests back to the queue with their tokens (prefilled
  again after ``/continue_generation``, then they go on), mode ``in_place`` freezes them
  where they are, any other mode is refused (``scheduler.pause_generation``). Like SGLang
  0.5.x, an answer carries one ``weight_version``, the server's when it answers (the
  tokenizer manager reads ``server_args.weight_version``), and no per-token
  ``weight_versions``: a request retracted across an update reports the new version for
  every token, which is why agentrl does not retract SGLang engines;
* ``/init_weights_update_group`` joins a real ``torch.distributed`` rendezvous at
  ``master_address:master_port`` as ranks ``rank_offset + tp_rank`` for every tensor-parallel
  rank (``--tp-size``), over gloo, and answers once the whole group formed (or 400 on a
  rank outside ``world_size``, a timeout, a duplicate group name, or a non-gloo backend);
* ``/update_weights_from_distributed`` refuses a group that was never initialised (400, as
  SGLang's assertion), waits for running requests like SGLang's writer lock when not
  paused, receives every tensor by broadcast from rank 0 on every TP rank, checks the
  names against the checkpoint's (after receiving, as SGLang loads after receiving), takes
  ``SGLANG_DOUBLE_LOAD_S`` seconds to "load" them, and sets the version; ``/update_weights_from_disk`` needs an existing model directory;
* ``/destroy_weights_update_group``, ``/get_model_info``, ``/flush_cache`` (400 while
  requests run, as SGLang) are served; ``/get_server_info`` answers what 0.5.4's does and no
  more: the server arguments, the scheduler's ready message (``status``,
  ``max_total_num_tokens``, ``max_req_input_len``), ``internal_states`` (one per DP rank: the
  server arguments, ``last_gen_throughput``, ``memory_usage``) and ``version`` -- no request
  counts and no busy time; ``/get_load`` answers SGLang's list of one ``GetLoadReqOutput``
  per DP rank (``rid``, ``http_worker_ipc``, ``dp_rank``, ``num_reqs`` = running + waiting,
  ``num_waiting_reqs``, ``num_tokens``), requests waiting while paused included;
* ``/release_memory_occupation {tags}`` and ``/resume_memory_occupation {tags}`` follow 0.5.x
  (``http_server.py``, ``tokenizer_communicator_mixin.py``, ``scheduler_update_weights_mixin.py``):
  the body's ``tags`` (``weights``, ``kv_cache``, ``cuda_graph``; none or ``[]``: all three)
  are added to / removed from the scheduler's ``offload_tags`` and the answer is ``null``. The
  scheduler *asserts* that no request is running or waiting when memory is released, and
  resuming a tag that was not released is a ``KeyError`` there; either kills SGLang's
  scheduler and with it the server, and so the double exits (code 70) without answering.
  Only with ``--enable-memory-saver`` is memory actually released (without it SGLang's
  adapter is a no-op and generation goes on as before). With it, a request that reaches the
  scheduler while ``kv_cache`` or ``weights`` is released would touch freed GPU memory: the
  double exits as SGLang dies of the CUDA error; a paused server holds requests back, so they
  wait. Resumed weights hold no values (torch_memory_saver maps fresh memory): SGLang would
  generate from garbage until every parameter was written by a weight update; the double
  refuses such a request with 500 instead (``stale_weights`` in ``/double/state``) -- the
  one place it is stricter than SGLang, to make the mistake visible;
* ``--api-key KEY`` makes every route but ``/health*`` (and the test-only ``/double/*``)
  answer 401 to a request without ``Authorization: Bearer KEY``, as SGLang 0.5.x's
  ``add_api_key_middleware`` does (``/health`` and ``/metrics`` stay open there; its body is
  ``{"error": "Unauthorized"}``, ours the HTTP kit's one sentence);
* LoRA as in SGLang's tokenizer manager and ``lora/lora_registry.py``: ``/load_lora_adapter
  {lora_name, lora_path}`` needs ``--enable-lora`` (and, without ``--lora-paths``,
  ``--max-lora-rank`` and ``--lora-target-modules``), refuses a name already loaded and more
  than ``--max-loaded-loras`` adapters, and answers ``{success, error_message,
  loaded_adapters}`` (200, or 400); ``/generate`` takes ``lora_path`` as an *exact* loaded
  name (else 400, "The following requested LoRA adapters are not loaded"); ``/unload_lora_adapter``
  unregisters the name at once, then *waits* until the requests running with it finished
  (SGLang's ``wait_for_unload``), then answers; ``/update_weight_version {new_version,
  abort_all_requests}`` relabels the server (aborting every running request unless
  ``abort_all_requests`` is false, SGLang's default being true);
* ``GET /double/requests`` (test-only) returns every request body received, by route,
  ``GET /double/state`` the environment, groups, received tensors, the admin calls in
  order and the tokens generated so far by each running request, and ``POST /double/config {load_s}`` sets the load time of a weight update.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from agentrl_core.http.server import App, HTTPError, Request, Response, bind_socket, json_response, serve_app

TOKEN_CAPACITY = 65536  # the double's "KV cache" in tokens (SGLang sizes it from GPU memory)
DECODE_LOG_INTERVAL = 40  # SGLang's --decode-log-interval default


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="sglang.launch_server (test double)")
    p.add_argument("--model-path", "--model", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--tp-size", "--tensor-parallel-size", type=int, default=1)
    p.add_argument("--weight-version", default="default")
    p.add_argument("--served-model-name", default=None)
    p.add_argument("--random-seed", type=int, default=None)
    p.add_argument("--skip-server-warmup", action="store_true")
    p.add_argument("--dtype", default="auto", choices=["auto", "half", "float16", "bfloat16", "float", "float32"])
    p.add_argument("--mem-fraction-static", type=float, default=None)
    p.add_argument("--context-length", type=int, default=None)
    p.add_argument("--tool-call-parser", default=None)
    p.add_argument("--chat-template", default=None)
    p.add_argument("--trust-remote-code", action="store_true")
    p.add_argument("--log-level", default="info")
    p.add_argument("--max-running-requests", type=int, default=None)
    p.add_argument("--api-key", default=None)
    p.add_argument("--enable-memory-saver", action="store_true")
    p.add_argument("--enable-lora", action="store_true")
    p.add_argument("--max-lora-rank", type=int, default=None)
    p.add_argument("--lora-target-modules", nargs="*", default=None)
    p.add_argument("--max-loras-per-batch", type=int, default=8)
    p.add_argument("--max-loaded-loras", type=int, default=None)
    return p.parse_args(argv)


def _true(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


class _Req:
    """One /generate request in flight."""

    def __init__(self, rid: str, prompt_tokens: int = 0) -> None:
        self.rid = rid
        self.prompt_tokens = prompt_tokens
        self.prefilled = False
        self.retracted = False  # sent back to the queue by a retracting pause: prefill again before going on
        self.aborted = asyncio.Event()


class _Group:
    """The TP ranks of this server in one weight-update group (one gloo group object each)."""

    def __init__(self, name: str, ranks: list[int], world_size: int, groups: list[Any]) -> None:
        self.name = name
        self.ranks = ranks
        self.world_size = world_size
        self.groups = groups


class FakeSGLang:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.weight_version = str(args.weight_version)
        self.ready_at = time.monotonic() + float(os.environ.get("SGLANG_DOUBLE_STARTUP_S", "0.5"))
        self.health_timeout = float(os.environ.get("SGLANG_HEALTH_CHECK_TIMEOUT", "20"))
        self.prefill_s = float(os.environ.get("SGLANG_DOUBLE_PREFILL_S_PER_TOKEN", "0.0005"))
        self.load_s = float(os.environ.get("SGLANG_DOUBLE_LOAD_S", "0"))
        self.paused = False
        self.updating = False
        self.gate = asyncio.Condition()  # new requests pass while neither paused nor updating
        self.idle = asyncio.Event()  # no request running (SGLang's writer lock waits for it)
        self.idle.set()
        self.running: dict[str, _Req] = {}
        self.gated = 0  # requests that arrived while paused or updating (SGLang's waiting queue holds them)
        self.gated_tokens = 0
        self.last_gen_throughput = 0.0  # tokens/s, renewed every DECODE_LOG_INTERVAL tokens like SGLang's log
        self._window = (time.monotonic(), 0)
        self.progress: dict[str, int] = {}  # tokens generated so far, per rid (test-only, in /double/state)
        self.groups: dict[str, _Group] = {}
        self.received: dict[str, list] = {}
        self.order: list[str] = []  # the routes called, in order
        self.tensors: dict[str, dict] = {}  # name -> {dtype, shape, sum} as received on TP rank 0
        self.model_params = _checkpoint_shapes(args.model_path)
        self.offload_tags: set[str] = set()  # the scheduler's offload_tags
        self.stale_weights: set[str] = set()  # parameters resumed without values, not written since
        self.loras: dict[str, str] = {}  # the LoRA registry: name -> path, for new requests
        self.lora_users: dict[str, int] = {}  # requests running with each adapter (SGLang's counters)
        self.lora_released = asyncio.Condition()
        self.app = App(name="sglang-double", token=args.api_key,
                       open_paths=("/health", "/health_generate", "/double/requests", "/double/state",
                                   "/double/config"))
        for method, path, handler in [
            ("GET", "/health", self.health), ("GET", "/health_generate", self.health),
            ("GET", "/get_model_info", self.model_info), ("GET", "/get_server_info", self.server_info),
            ("GET", "/get_load", self.load),
            ("POST", "/generate", self.generate), ("POST", "/abort_request", self.abort_request),
            ("POST", "/pause_generation", self.pause), ("POST", "/continue_generation", self.resume),
            ("POST", "/flush_cache", self.flush), ("GET", "/flush_cache", self.flush),
            ("POST", "/init_weights_update_group", self.init_group),
            ("POST", "/destroy_weights_update_group", self.destroy_group),
            ("POST", "/update_weights_from_distributed", self.update_distributed),
            ("POST", "/update_weights_from_disk", self.update_disk),
            ("POST", "/release_memory_occupation", self.release_memory),
            ("GET", "/release_memory_occupation", self.release_memory),
            ("POST", "/resume_memory_occupation", self.resume_memory),
            ("POST", "/load_lora_adapter", self.load_lora), ("POST", "/unload_lora_adapter", self.unload_lora),
            ("POST", "/update_weight_version", self.update_weight_version),
            ("GET", "/resume_memory_occupation", self.resume_memory),
            ("GET", "/double/requests", self.requests), ("GET", "/double/state", self.state),
            ("POST", "/double/config", self.configure),
        ]:
            self.app.route(method, path, handler)

    def record(self, request: Request) -> dict:
        body = request.json_object(required=False)
        self.received.setdefault(request.path, []).append(body)
        self.order.append(request.path)
        return body

    # -- state ------------------------------------------------------------------------

    async def health(self, request: Request) -> Response:
        if time.monotonic() < self.ready_at:
            return Response(b"", 503, [])
        try:  # SGLang sends a one-token generate request; while paused it waits in the tokenizer manager
            await asyncio.wait_for(self._passed_gate(), self.health_timeout)
        except asyncio.TimeoutError:
            return Response(b"", 503, [])
        self._touch_memory("the health check's generate request")
        return Response(b"", 200, [])

    async def _passed_gate(self) -> None:
        async with self.gate:
            await self.gate.wait_for(lambda: not self.paused and not self.updating)

    async def _set(self, **flags: bool) -> None:
        async with self.gate:
            for name, value in flags.items():
                setattr(self, name, value)
            self.gate.notify_all()

    async def model_info(self, request: Request) -> dict:
        return {"model_path": self.args.model_path, "tokenizer_path": self.args.model_path, "is_generation": True,
                "preferred_sampling_params": None, "weight_version": self.weight_version}

    async def server_info(self, request: Request) -> dict:
        # SGLang 0.5.4, entrypoints/http_server.py get_server_info:
        #   {**dataclasses.asdict(server_args), **scheduler_info, "internal_states": [...], "version": __version__}
        # scheduler_info is what the scheduler sent when ready (managers/scheduler.py run_scheduler_process:
        # status, max_total_num_tokens, max_req_input_len); each internal state (one per DP rank) is
        # Scheduler.get_internal_state: the server arguments plus last_gen_throughput and memory_usage
        # {weight, kvcache, token_capacity, graph}. No request counts, no busy time: those are /get_load's.
        server_args = {**vars(self.args), "weight_version": self.weight_version}
        state = {**server_args, "last_gen_throughput": self.last_gen_throughput,
                 "memory_usage": {"weight": 0.0, "kvcache": 0.0, "token_capacity": TOKEN_CAPACITY, "graph": 0.0}}
        return {**server_args, "status": "ready", "max_total_num_tokens": TOKEN_CAPACITY,
                "max_req_input_len": TOKEN_CAPACITY - 1, "internal_states": [state], "version": "0.5.4"}

    async def load(self, request: Request) -> list:
        # SGLang 0.5.4 /get_load: tokenizer_manager.get_load(), one GetLoadReqOutput per DP rank
        # (managers/io_struct.py: BaseReq's rid and http_worker_ipc, then dp_rank, num_reqs,
        # num_waiting_reqs, num_tokens); Scheduler.get_load: num_reqs = running batch + waiting queue,
        # num_tokens = KV tokens in use + the prompts waiting; dp_rank is None without data parallelism.
        waiting = [r for r in self.running.values() if not r.prefilled or r.retracted]
        tokens = sum(r.prompt_tokens + (0 if r in waiting else self.progress.get(r.rid, 0))
                     for r in self.running.values()) + self.gated_tokens
        return [{"rid": None, "http_worker_ipc": None, "dp_rank": None,
                 "num_reqs": len(self.running) + self.gated, "num_waiting_reqs": len(waiting) + self.gated,
                 "num_tokens": tokens}]

    # -- generation -------------------------------------------------------------------

    async def generate(self, request: Request) -> dict:
        body = self.record(request)
        params = body.get("sampling_params") or {}
        unknown = set(params) - {"max_new_tokens", "temperature", "top_p", "top_k", "min_p", "stop",
                                 "stop_token_ids", "ignore_eos", "sampling_seed", "skip_special_tokens"}
        if unknown:
            raise HTTPError(400, f"unknown sampling params {sorted(unknown)}")
        prompt = len(body.get("input_ids") or [])
        lora = body.get("lora_path")
        if lora is not None:  # the tokenizer manager acquires the adapter before anything is queued
            if not self.args.enable_lora:
                raise HTTPError(400, "The server is not configured to enable LoRA. Please set `--enable-lora`.")
            if lora not in self.loras:
                raise HTTPError(400, f"The following requested LoRA adapters are not loaded: {lora}\n"
                                     f"Loaded adapters: {list(self.loras)}.")
            self.lora_users[lora] = self.lora_users.get(lora, 0) + 1
        try:
            return await self._generate(body, params, prompt)
        finally:
            if lora is not None:
                async with self.lora_released:
                    self.lora_users[lora] -= 1
                    self.lora_released.notify_all()

    async def _generate(self, body: dict, params: dict, prompt: int) -> dict:
        self.gated += 1
        self.gated_tokens += prompt
        try:
            await self._passed_gate()  # paused, or a weight update holds SGLang's lock: wait
        finally:
            self.gated -= 1
            self.gated_tokens -= prompt
        self._touch_memory("a generate request")
        if self.stale_weights:
            raise HTTPError(500, f"TEST DOUBLE: the weights were resumed without values and {len(self.stale_weights)} "
                                 "parameters were not written since (SGLang would generate from garbage)")
        rid = str(body.get("rid") or id(body))
        req = self.running[rid] = _Req(rid, prompt)
        self.idle.clear()
        try:
            return await self._decode(req, body, params)
        finally:
            del self.running[rid]
            if not self.running:
                self.idle.set()

    async def _hold(self, req: _Req) -> None:
        """While paused (retract, in_place) a request makes no progress; an abort ends the wait."""
        gate, aborted = asyncio.ensure_future(self._passed_gate()), asyncio.ensure_future(req.aborted.wait())
        _, pending = await asyncio.wait({gate, aborted}, return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()

    async def _decode(self, req: _Req, body: dict, params: dict) -> dict:
        base = sum(body["input_ids"])
        max_new = int(params.get("max_new_tokens", 128))
        meta: dict[str, Any] = {"id": req.rid, "prompt_tokens": len(body["input_ids"])}
        if await _aborted_within(req, self.prefill_s * len(body["input_ids"])):  # before prefill: SGLang's bare answer
            return {"text": "", "meta_info": {**meta, "finish_reason": {"type": "abort", "message": "Abort before prefill"},
                                              "prompt_tokens": 0, "completion_tokens": 0,
                                              "weight_version": self.weight_version}}
        req.prefilled = True
        ids: list[int] = []
        reason: dict = {"type": "length", "length": max_new}
        for i in range(max_new):
            if self.paused:
                await self._hold(req)
            if req.retracted and not req.aborted.is_set():  # its KV cache was freed: prompt + tokens again
                req.retracted = False
                await _aborted_within(req, self.prefill_s * (len(body["input_ids"]) + len(ids)))
            if await _aborted_within(req, 0.005):
                reason = {"type": "abort", "message": "Abort in running batch", "status_code": None, "err_type": None}
                break
            ids.append((base + i) % 1000)
            self.progress[req.rid] = len(ids)
            self._count_token()
        logprob = -0.5 * float(params.get("temperature", 1.0)) if _true("SGLANG_RETURN_ORIGINAL_LOGPROB") else -0.5
        meta.update(finish_reason=reason, completion_tokens=len(ids), cached_tokens=0,
                    weight_version=self.weight_version)  # the server's version when it answers
        if body.get("return_logprob"):
            meta["output_token_logprobs"] = [[logprob, t, None] for t in ids]
        return {"text": " ".join(map(str, ids)), "output_ids": ids, "meta_info": meta}

    def _count_token(self) -> None:
        """SGLang renews last_gen_throughput when it logs decode stats (every 40 decode steps)."""
        start, n = self._window
        n += 1
        if n >= DECODE_LOG_INTERVAL:
            now = time.monotonic()
            self.last_gen_throughput = n / max(now - start, 1e-9)
            start, n = now, 0
        self._window = (start, n)

    async def abort_request(self, request: Request) -> Response:
        body = self.record(request)
        for rid, req in list(self.running.items()):
            if body.get("abort_all") or (body.get("rid") and rid == body["rid"]):
                req.aborted.set()
        return Response(b"", 200, [])

    async def pause(self, request: Request) -> dict:
        body = self.record(request)
        mode = body.get("mode", "abort")
        if mode not in ("abort", "retract", "in_place"):
            raise HTTPError(400, f"mode must be one of 'abort', 'retract', 'in_place', got {mode!r}")
        await self._set(paused=True)
        if mode == "abort":  # abort everything, then wait until nothing runs
            for req in self.running.values():
                req.aborted.set()
            await self.idle.wait()
        elif mode == "retract":  # back to the waiting queue with their tokens; the KV cache is freed
            for req in self.running.values():
                req.retracted = req.prefilled
        return {"message": "Generation paused successfully.", "status": "ok"}

    async def resume(self, request: Request) -> dict:
        self.record(request)
        await self._set(paused=False)
        return {"message": "Generation continued successfully.", "status": "ok"}

    async def flush(self, request: Request) -> Response:
        if self.running:
            return Response(b"Cache not flushed: requests are running.\n", 400, [(b"content-type", b"text/plain")])
        return Response(b"Cache flushed.\n", 200, [(b"content-type", b"text/plain")])

    # -- memory -------------------------------------------------------------------------

    def _released(self) -> set[str]:
        """What is really released: nothing without the memory saver (SGLang's no-op adapter)."""
        return self.offload_tags & {"weights", "kv_cache"} if self.args.enable_memory_saver else set()

    def _die(self, why: str) -> None:
        """SGLang's scheduler raised: it SIGQUITs its parent and the whole server goes."""
        print(f"Scheduler hit an exception: {why}", file=sys.stderr, flush=True)
        os._exit(70)

    def _touch_memory(self, what: str) -> None:
        released = self._released()
        if released:
            self._die(f"{what} ran with {sorted(released)} released: RuntimeError: CUDA error: an illegal memory "
                      "access was encountered")

    async def release_memory(self, request: Request) -> Any:
        body = self.record(request)
        tags = body.get("tags") or ["weights", "kv_cache", "cuda_graph"]
        waiting = self.gated if not self.paused else 0  # held by the paused tokenizer manager: not the scheduler's
        if self.running or waiting:
            self._die("AssertionError: release_memory_occupation should be called only when no ongoing request.")
        self.offload_tags.update(tags)
        return None

    async def resume_memory(self, request: Request) -> Any:
        body = self.record(request)
        tags = body.get("tags") or ["weights", "kv_cache", "cuda_graph"]
        for tag in tags:
            if tag not in self.offload_tags:
                self._die(f"KeyError: {tag!r} (offload_tags.remove in resume_memory_occupation)")
            self.offload_tags.remove(tag)
            if tag == "weights" and self.args.enable_memory_saver:
                self.stale_weights = set(self.model_params or ())
        return None

    # -- weights ------------------------------------------------------------------------

    async def init_group(self, request: Request) -> Response:
        body = self.record(request)
        missing = {"master_address", "master_port", "rank_offset", "world_size"} - set(body)
        if missing:
            return _result(False, f"missing {sorted(missing)}")
        name = str(body.get("group_name", "weight_update_group"))
        backend = str(body.get("backend", "nccl"))
        offset, world = int(body["rank_offset"]), int(body["world_size"])
        ranks = [offset + tp for tp in range(self.args.tp_size)]
        if name in self.groups:
            return _result(False, f"Failed to init custom process group: group {name!r} already exists.")
        if backend != "gloo":
            return _result(False, f"Failed to init custom process group: the test double has no {backend} (use gloo).")
        if offset < 1 or ranks[-1] >= world:
            return _result(False, f"Failed to init custom process group: ranks {ranks} (rank_offset {offset} + "
                                  f"tp_rank) do not fit a world of {world}.")
        timeout = float(os.environ.get("SGLANG_DOUBLE_GROUP_TIMEOUT_S", "60"))
        try:
            groups = await asyncio.gather(*[asyncio.to_thread(
                _join, body["master_address"], int(body["master_port"]), rank, world, name, timeout) for rank in ranks])
        except Exception as exc:
            return _result(False, f"Failed to init custom process group: {exc}.")
        self.groups[name] = _Group(name, ranks, world, groups)
        return _result(True, "Succeeded to initialize custom process group.")

    async def destroy_group(self, request: Request) -> Response:
        body = self.record(request)
        group = self.groups.pop(str(body.get("group_name", "weight_update_group")), None)
        if group is None:
            return _result(False, "The group to be destroyed does not exist.")
        return _result(True, "Succeeded to destroy custom process group.")

    async def update_distributed(self, request: Request) -> Response:
        body = self.record(request)
        names, dtypes, shapes = body.get("names", []), body.get("dtypes", []), body.get("shapes", [])
        if not (len(names) == len(dtypes) == len(shapes)):
            return _result(False, "names, dtypes and shapes differ in length")
        name = str(body.get("group_name", "weight_update_group"))
        group = self.groups.get(name)
        if group is None:
            return _result(False, f"Group {name} not in {sorted(self.groups)}. Please call "
                                  "`init_weights_update_group` first.")
        if "weights" in self._released():
            self._die("update_weights_from_distributed wrote into released weights: RuntimeError: CUDA error: an "
                      "illegal memory access was encountered")
        await self._set(updating=True)
        try:
            if not self.paused:
                await self.idle.wait()  # SGLang's writer lock: running requests finish first
            received = await asyncio.gather(*[asyncio.to_thread(_receive, g, dtypes, shapes) for g in group.groups])
            await asyncio.sleep(self.load_s)  # loading into the model
        except Exception as exc:
            return _result(False, f"Failed to update parameter online: {exc}.")
        finally:
            await self._set(updating=False)
        unknown = [n for n in names if self.model_params is not None and n not in self.model_params]
        if unknown:
            return _result(False, f"Failed to update parameter online: unknown parameters {unknown[:5]}.")
        for n, summary in zip(names, received[0], strict=True):
            self.tensors[n] = summary
            self.stale_weights.discard(n)
        if body.get("weight_version") is not None:
            self.weight_version = str(body["weight_version"])
        return _result(True, "Succeeded to update parameter online.")

    async def update_disk(self, request: Request) -> Response:
        body = self.record(request)
        path = Path(str(body.get("model_path", "")))
        if not (path / "config.json").is_file():
            return json_response({"success": False, "message": f"Failed to update weights: no model at {path}.",
                                  "num_paused_requests": 0}, 400)
        if not self.paused:
            await self.idle.wait()
        if body.get("weight_version") is not None:
            self.weight_version = str(body["weight_version"])
        return json_response({"success": True, "message": "Succeeded to update model weights.",
                              "num_paused_requests": 0})

    # -- test-only ------------------------------------------------------------------------

    # -- LoRA (tokenizer_manager / tokenizer_control_mixin, lora_registry.py) ---------------

    def _lora_answer(self, success: bool, error: str | None) -> Response:
        body = {"success": success, "error_message": error, "loaded_adapters": dict(self.loras)}
        return json_response(body, 200 if success else 400)

    async def load_lora(self, request: Request) -> Response:
        body = self.record(request)
        name, path = body.get("lora_name"), body.get("lora_path")
        if not self.args.enable_lora:
            return self._lora_answer(False, "LoRA is not enabled. Please set `--enable-lora` to enable LoRA.")
        if self.args.max_lora_rank is None or not self.args.lora_target_modules:
            return self._lora_answer(False, "TEST DOUBLE: SGLang needs --max-lora-rank and --lora-target-modules to "
                                            "load adapters at run time without --lora-paths")
        if name in self.loras:
            return self._lora_answer(False, f"LoRA with name {name} already exists. Loaded LoRAs: {list(self.loras)}")
        limit = self.args.max_loaded_loras
        if limit is not None and len(self.loras) >= limit:
            return self._lora_answer(False, "Maximum number of LoRA adapters loaded")
        try:
            config = json.loads((Path(str(path)) / "adapter_config.json").read_text())
        except (OSError, ValueError) as exc:
            return self._lora_answer(False, f"Failed to load LoRA adapter {name}: {exc}")
        if int(config.get("r", 0)) > self.args.max_lora_rank:
            return self._lora_answer(False, f"LoRA adapter {name} has rank {config.get('r')}, above --max-lora-rank "
                                            f"{self.args.max_lora_rank}")
        self.loras[str(name)] = str(path)
        return self._lora_answer(True, None)

    async def unload_lora(self, request: Request) -> Response:
        body = self.record(request)
        name = body.get("lora_name")
        if name not in self.loras:
            return self._lora_answer(False, f"LoRA with name {name} does not exist. Loaded LoRAs: {list(self.loras)}")
        del self.loras[name]  # unregistered first: no new request gets it
        async with self.lora_released:  # then SGLang waits for the requests running with it
            await self.lora_released.wait_for(lambda: self.lora_users.get(name, 0) == 0)
        self.lora_users.pop(name, None)
        return self._lora_answer(True, None)

    async def update_weight_version(self, request: Request) -> dict:
        body = self.record(request)
        if body.get("abort_all_requests", True):  # SGLang's default aborts every running request
            for req in self.running.values():
                req.aborted.set()
        self.weight_version = str(body["new_version"])
        return {"success": True, "message": f"Weight version updated to {self.weight_version}"}

    async def requests(self, request: Request) -> dict:
        return self.received

    async def configure(self, request: Request) -> dict:
        body = request.json_object()
        self.load_s = float(body.get("load_s", self.load_s))
        return {"load_s": self.load_s}

    async def state(self, request: Request) -> dict:
        env = {k: os.environ.get(k) for k in ("CUDA_VISIBLE_DEVICES", "SGLANG_RETURN_ORIGINAL_LOGPROB")}
        return {"env": env, "argv": sys.argv[1:], "paused": self.paused, "updating": self.updating,
                "weight_version": self.weight_version,
                "order": [r for r in self.order if r != "/generate"],
                "groups": {n: {"ranks": g.ranks, "world_size": g.world_size} for n, g in self.groups.items()},
                "progress": {rid: self.progress.get(rid, 0) for rid in self.running},
                "offload_tags": sorted(self.offload_tags), "released": sorted(self._released()),
                "stale_weights": len(self.stale_weights), "loras": sorted(self.loras),
                "tensors": self.tensors}


async def _aborted_within(req: _Req, seconds: float) -> bool:
    try:
        await asyncio.wait_for(req.aborted.wait(), seconds)
    except asyncio.TimeoutError:
        return False
    return True


def _result(success: bool, message: str) -> Response:
    return json_response({"success": success, "message": message}, 200 if success else 400)


def _checkpoint_shapes(model_path: str) -> dict[str, list[int]] | None:
    """Parameter names of a safetensors checkpoint (None when the path is not a real model)."""
    path = Path(model_path) / "model.safetensors"
    if not path.is_file():
        return None
    with open(path, "rb") as f:  # the header: 8-byte little-endian length, then JSON
        header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    return {name: info["shape"] for name, info in header.items() if name != "__metadata__"}


def _join(address: str, port: int, rank: int, world_size: int, group_name: str, timeout: float) -> Any:
    """One TP rank joins the learner's group: the store layout of ``weight_group.init_weight_update_group``.

    SGLang runs one process per TP rank; here the ranks are threads, so the group is built
    from its parts (rendezvous, the same prefixes ``_new_process_group_helper`` adds, gloo)
    instead of being registered twice under one name.
    """
    from datetime import timedelta

    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d
    from torch.distributed.rendezvous import rendezvous

    host = f"[{address}]" if ":" in address else address
    wait = timedelta(seconds=timeout)
    store, _, _ = next(rendezvous(f"tcp://{host}:{port}", rank, world_size, timeout=wait))
    store = c10d.PrefixStore("cpu/", c10d.PrefixStore(f"{group_name}/", c10d.PrefixStore(group_name, store)))
    return dist.ProcessGroupGloo(store, rank, world_size, wait)


def _receive(group: Any, dtypes: list[str], shapes: list[list[int]]) -> list[dict]:
    """Receive one bucket in order by broadcast from rank 0; a summary of each tensor."""
    import torch
    import torch.distributed as dist

    out = []
    for dtype, shape in zip(dtypes, shapes, strict=True):
        tensor = torch.empty([int(s) for s in shape], dtype=getattr(torch, str(dtype).removeprefix("torch.")))
        options = dist.BroadcastOptions()
        options.rootRank = 0
        group.broadcast([tensor], options).wait()
        out.append({"dtype": str(tensor.dtype).removeprefix("torch."), "shape": list(tensor.shape),
                    "sum": float(tensor.double().sum())})
    return out


def main(argv: list[str] | None = None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)

    async def run() -> None:
        server = FakeSGLang(args)
        sock = bind_socket(args.host, args.port)
        await serve_app(server.app, sock)

    asyncio.run(run())


def install_shim(directory: Path) -> Path:
    """Write a ``sglang/launch_server.py`` that runs this double; put ``directory`` on PYTHONPATH."""
    package = directory / "sglang"
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text('"""TEST DOUBLE package standing in for SGLang (tests/core/sglang_double.py)."""\n')
    (package / "launch_server.py").write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "from sglang_double import main\n"
        "main()\n"
    )
    return directory


if __name__ == "__main__":
    main()
