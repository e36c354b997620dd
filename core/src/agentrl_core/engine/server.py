"""``agentrl engine serve``: the HF engine's HTTP server (SGLang's native API subset + OpenAI chat).

Routes (the wire contract is documented in ``core/docs/engine.md``):

=================================  =========================================================
``POST /generate``                 ``{input_ids | text, sampling_params, return_logprob, rid}``
``GET /health``, ``/health_generate``  200 while the scheduler runs
``GET /get_model_info``            model path, weight version, architecture, limits
``GET /get_server_info``           load and counters (busy fraction, tokens, aborts)
``GET|POST /flush_cache``          drop the prefix cache
``POST /abort_request``            ``{rid}`` or ``{abort_all: true}``
``POST /pause_generation``         ``{mode: "abort" | "retract"}``: running requests end with ``abort``,
                                   or go back to the queue with their tokens and continue later
``POST /continue_generation``      resume (refused after an incomplete weight update)
``POST /init_weights_update_group``  join the learner's group as rank ``rank_offset``
``POST /update_weights_from_distributed``  receive tensors by broadcast from rank 0 (paused)
``POST /update_weights_from_disk`` ``{model_path, weight_version}``
``POST /load_lora_adapter``        ``{lora_name, lora_path}``: serve a PEFT LoRA folder (``/generate`` picks it
                                   with ``lora_path``; :mod:`~agentrl_core.engine.lora`)
``POST /unload_lora_adapter``      ``{lora_name}`` (refused while a request uses it)
``POST /v1/chat/completions``      OpenAI chat with tools (chat template + tool parser)
``GET /v1/models``
=================================  =========================================================

With a ``token`` (``--token`` / ``AGENTRL_TOKEN``) every route answers 401 to a request
without ``Authorization: Bearer <token>``, as SGLang does with ``--api-key``; without one
the engine only listens on a loopback address.

The model runs on the scheduler thread (:mod:`~agentrl_core.engine.scheduler`);
handlers only validate, queue and await, so the event loop never runs a forward pass.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentrl_core.engine.sampling import SamplingParams, parse_sampling_params
from agentrl_core.engine.scheduler import PAUSE_MODES, Completion, EngineConflict, Scheduler
from agentrl_core.engine.scheduler import Request as EngineRequest
from agentrl_core.http.server import (
    App,
    HTTPError,
    Request,
    Response,
    bind_socket,
    check_bind,
    json_response,
    serve_app,
)
from agentrl_core.types import ToolParserSpec

log = logging.getLogger(__name__)

_TORCH_DTYPES = {"float32", "float", "bfloat16", "float16", "half", "float64", "int64", "int32", "uint8", "int8", "bool"}


def _weight_response(success: bool, message: str, status: int | None = None, **extra: Any) -> Response:
    return json_response({"success": success, "message": message, **extra},
                         status if status is not None else (200 if success else 400))


class EngineServer:
    """One engine: tokenizer, model, scheduler and the HTTP app around them."""

    def __init__(
        self,
        model_path: str | os.PathLike,
        *,
        device: str = "cpu",
        dtype: str = "auto",
        max_running_requests: int = 64,
        max_context: int | None = None,
        max_prefill_tokens: int = 4096,
        tool_parser: str = "qwen25",
        weight_version: Any = 0,
        seed: int = 0,
        served_model_name: str | None = None,
        prefix_cache: bool = True,
        token: str | None = None,
    ) -> None:
        from transformers import AutoTokenizer, GenerationConfig

        from agentrl_core.engine.model import EngineModel, load_hf_model
        from agentrl_core.registry import Registry

        self.model_path = str(model_path)
        self.token = token or None
        self.device = device
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        hf_model = load_hf_model(self.model_path, dtype=dtype, device=device)
        context = max_context or min(int(hf_model.config.max_position_embeddings), 32768)
        self.model = EngineModel(hf_model, max_slots=max_running_requests, max_context=context)
        eos = set()
        try:
            generation = GenerationConfig.from_pretrained(self.model_path)
            ids = generation.eos_token_id
            eos.update(ids if isinstance(ids, list) else [ids] if ids is not None else [])
        except OSError:
            pass
        if self.tokenizer.eos_token_id is not None:
            eos.add(self.tokenizer.eos_token_id)
        self.eos_token_ids = sorted(int(t) for t in eos)
        self.scheduler = Scheduler(
            self.model, eos_token_ids=self.eos_token_ids, weight_version=weight_version,
            max_prefill_tokens=max_prefill_tokens, seed=seed, prefix_cache=prefix_cache,
            decode_text=lambda ids: self.tokenizer.decode(ids, skip_special_tokens=False),
        )
        self.scheduler.model_path = self.model_path
        self.tool_parser_name = tool_parser
        self.tool_parser = Registry().build(ToolParserSpec, tool_parser)
        self.served_model_name = served_model_name or Path(self.model_path).name
        self.groups: dict[str, Any] = {}
        self.started = time.time()
        self.app = self._build_app()

    # ------------------------------------------------------------------------------
    # Lifecycle

    def start(self) -> None:
        self.scheduler.start()

    def close(self) -> None:
        self.scheduler.stop()
        for group in self.groups.values():
            _destroy_group(group)
        self.groups.clear()

    async def serve(self, host: str = "127.0.0.1", port: int = 0, *, stop: asyncio.Event | None = None,
                    on_listening: Callable[[str], None] | None = None) -> None:
        sock = bind_socket(host, port)
        check_bind(sock, self.app)
        bound = sock.getsockname()
        url = f"http://{_url_host(host)}:{bound[1]}"
        self.start()
        try:
            if on_listening is not None:
                on_listening(url)
            log.info("engine serving %s at %s", self.model_path, url)
            await serve_app(self.app, sock, stop=stop)
        finally:
            sock.close()
            self.close()

    # ------------------------------------------------------------------------------
    # Routes

    def _build_app(self) -> App:
        app = App(name="engine", max_body_bytes=256 * 1024 * 1024, token=self.token)
        for method, path, handler in [
            ("POST", "/generate", self.generate),
            ("GET", "/health", self.health),
            ("GET", "/health_generate", self.health),
            ("GET", "/get_model_info", self.model_info),
            ("GET", "/model_info", self.model_info),
            ("GET", "/get_server_info", self.server_info),
            ("GET", "/server_info", self.server_info),
            ("GET", "/flush_cache", self.flush_cache),
            ("POST", "/flush_cache", self.flush_cache),
            ("POST", "/abort_request", self.abort_request),
            ("POST", "/pause_generation", self.pause_generation),
            ("POST", "/continue_generation", self.continue_generation),
            ("POST", "/release_memory_occupation", self.release_memory_occupation),
            ("POST", "/resume_memory_occupation", self.resume_memory_occupation),
            ("POST", "/init_weights_update_group", self.init_weights_update_group),
            ("POST", "/destroy_weights_update_group", self.destroy_weights_update_group),
            ("POST", "/update_weights_from_distributed", self.update_weights_from_distributed),
            ("POST", "/update_weights_from_disk", self.update_weights_from_disk),
            ("POST", "/load_lora_adapter", self.load_lora_adapter),
            ("POST", "/unload_lora_adapter", self.unload_lora_adapter),
        ]:
            app.route(method, path, handler)
        from agentrl_core.engine import openai_api

        app.route("POST", "/v1/chat/completions", lambda request: openai_api.chat_completions(self, request))
        app.route("GET", "/v1/models", lambda request: openai_api.list_models(self, request))
        app.route("GET", "/openapi.json", self.openapi)
        return app

    async def openapi(self, request: Request) -> Response:
        from agentrl_core._version import __version__
        from agentrl_core.engine.openapi import engine_openapi

        return json_response(engine_openapi(__version__))

    async def _command(self, fn: Callable[[], Any]) -> Any:
        return await asyncio.wrap_future(self.scheduler.call(fn))

    async def complete(self, rid: str, input_ids: list[int], params: SamplingParams,
                       adapter: str | None = None) -> Completion:
        loop = asyncio.get_running_loop()
        future: asyncio.Future = loop.create_future()

        def deliver(completion: Completion) -> None:
            loop.call_soon_threadsafe(lambda: future.done() or future.set_result(completion))

        try:
            self.scheduler.submit(EngineRequest(rid=rid, input_ids=input_ids, params=params, on_finish=deliver,
                                                adapter=adapter))
        except EngineConflict as exc:
            raise HTTPError(503, str(exc)) from None
        try:
            return await future
        except asyncio.CancelledError:
            self.scheduler.cancel(rid)
            raise

    def check_ids(self, ids: Any, what: str) -> list[int]:
        vocab = self.model.vocab_size
        if not isinstance(ids, list) or not ids:
            raise HTTPError(400, f"{what} must be a non-empty list of token ids")
        if isinstance(ids[0], list):
            raise HTTPError(400, f"{what} holds a batch; send one request per call")
        for token in ids:
            if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < vocab:
                raise HTTPError(400, f"{what} holds {token!r}, not a token id in [0, {vocab})")
        if len(ids) >= self.model.max_context:
            raise HTTPError(400, f"the prompt has {len(ids)} tokens; the engine's max_context is "
                                 f"{self.model.max_context} (start it with a larger --max-context)")
        return ids

    def output_text(self, completion: Completion, params: SamplingParams, no_stop_trim: bool) -> str:
        ids = completion.output_ids
        reason = completion.finish_reason
        matched = reason.get("matched")
        if reason.get("type") == "stop" and isinstance(matched, int) and not no_stop_trim:
            ids = ids[:-1]
        text = self.tokenizer.decode(ids, skip_special_tokens=params.skip_special_tokens)
        if isinstance(matched, str) and not no_stop_trim and matched in text:
            text = text[: text.index(matched)]
        return text

    async def generate(self, request: Request) -> Any:
        body = request.json_object()
        params, no_stop_trim = parse_sampling_params(body.get("sampling_params"))
        if body.get("stream"):
            raise HTTPError(400, "streaming is not supported by the hf engine; send stream=false")
        if "input_ids" in body and body["input_ids"] is not None:
            input_ids = self.check_ids(body["input_ids"], "input_ids")
        elif isinstance(body.get("text"), str):
            input_ids = self.check_ids(self.tokenizer.encode(body["text"], add_special_tokens=False), "text")
        else:
            raise HTTPError(400, "send input_ids (a list of token ids) or text")
        rid = str(body.get("rid") or uuid.uuid4().hex)
        adapter = body.get("lora_path")
        if adapter is not None and not (isinstance(adapter, str) and adapter):
            raise HTTPError(400, "lora_path must name one loaded adapter (POST /load_lora_adapter first)")
        completion = await self.complete(rid, input_ids, params, adapter)
        reason = completion.finish_reason
        if reason.get("status_code"):
            raise HTTPError(int(reason["status_code"]), reason.get("message", "the request failed"))
        meta: dict[str, Any] = {
            "id": rid,
            "finish_reason": reason,
            "prompt_tokens": completion.prompt_tokens,
            "completion_tokens": len(completion.output_ids),
            "cached_tokens": completion.cached_tokens,
            # SGLang's per-token form: runs of tokens sampled by one version; weight_version is the last one's
            "weight_version": completion.weight_version,
            "weight_versions": completion.version_spans(),
            "num_retractions": completion.retractions,
            "e2e_latency": completion.total_seconds,
            "queue_time": completion.queue_seconds,
        }
        if body.get("return_logprob"):
            meta["output_token_logprobs"] = [[lp, tok, None] for lp, tok in zip(
                completion.logprobs, completion.output_ids, strict=True)]
        return {"text": self.output_text(completion, params, no_stop_trim), "output_ids": completion.output_ids,
                "meta_info": meta}

    async def health(self, request: Request) -> Response:
        if self.scheduler.alive:
            return Response(b"", 200, [])
        raise HTTPError(503, f"the engine scheduler is not running ({self.scheduler.error or 'stopped'})")

    async def model_info(self, request: Request) -> Any:
        config = self.model.config
        return {
            "model_path": self.scheduler.model_path,
            "tokenizer_path": self.model_path,
            "served_model_name": self.served_model_name,
            "is_generation": True,
            "weight_version": self.scheduler.weight_version,
            "model_type": config.model_type,
            "architectures": getattr(config, "architectures", None),
            "engine": "agentrl-hf",
            "device": str(self.model.device),
            "dtype": str(self.model.dtype).removeprefix("torch."),
            "max_context": self.model.max_context,
            "max_running_requests": self.model.max_slots,
            "eos_token_ids": self.eos_token_ids,
            "tool_call_parser": self.tool_parser_name,
            "paused": self.scheduler.paused,
            "lora_adapters": sorted(self.scheduler.adapters),
            # pause modes /pause_generation takes; "retract" answers report per-token versions
            # (meta_info.weight_versions), which is what lets a weight sync keep in-flight work
            "pause_modes": list(PAUSE_MODES),
        }

    async def server_info(self, request: Request) -> Any:
        stats = self.scheduler.stats
        wall = max(time.monotonic() - stats.started, 1e-9)
        return {
            **self.scheduler.load(),
            "paused": self.scheduler.paused,
            "released_memory": sorted(self.scheduler.released),
            "weight_version": self.scheduler.weight_version,
            "generated_tokens": stats.generated_tokens,
            "prompt_tokens": stats.prompt_tokens,
            "cached_tokens": stats.cached_tokens,
            "requests": stats.requests,
            "aborted": stats.aborted,
            "retracted": stats.retracted,
            "recomputed_tokens": stats.recomputed_tokens,
            "decode_steps": stats.decode_steps,
            "prefill_forwards": stats.prefill_forwards,
            # busy = forward passes + sampling (what vLLM's and SGLang's model step includes); cumulative,
            # for exact busy fractions between two readings
            "busy_fraction": (stats.forward_seconds + stats.sampling_seconds) / wall,
            "busy_seconds": stats.forward_seconds + stats.sampling_seconds,
            "forward_seconds": stats.forward_seconds,
            "sampling_seconds": stats.sampling_seconds,
            "wall_seconds": wall,
            "kv_cache_bytes": self.model.cache_bytes(),
            "uptime_s": time.time() - self.started,
        }

    async def flush_cache(self, request: Request) -> Response:
        dropped = await self._command(self.scheduler.flush_cache)
        return Response(f"Cache flushed ({dropped} cached prefixes dropped).\n".encode(), 200,
                        [(b"content-type", b"text/plain")])

    async def abort_request(self, request: Request) -> Any:
        body = request.json_object(required=False)
        if body.get("abort_all"):
            self.scheduler.cancel(None)
        elif body.get("rid"):
            self.scheduler.cancel(str(body["rid"]))
        else:
            raise HTTPError(400, "send {\"rid\": ...} or {\"abort_all\": true}")
        return {"success": True}

    async def pause_generation(self, request: Request) -> Any:
        body = request.json_object(required=False)
        mode = body.get("mode", "abort")
        if mode not in PAUSE_MODES:
            why = (" (running requests would keep keys/values computed by the old weights and attend to them "
                   "with the new ones)" if mode == "in_place" else "")
            raise HTTPError(400, f"pause mode {mode!r} is not supported by the hf engine{why}; use 'abort' "
                                 "(in-flight requests end with finish_reason abort) or 'retract' (they keep their "
                                 "tokens, are prefilled again after the update and continue)")
        affected = await self._command(lambda: self.scheduler.pause(mode))
        return {"message": "Generation paused successfully.", "status": "ok", "mode": mode,
                "aborted" if mode == "abort" else "retracted": affected}

    async def continue_generation(self, request: Request) -> Any:
        body = request.json_object(required=False)
        allow = bool(body.get("allow_partial_update", False))
        try:
            await self._command(lambda: self.scheduler.resume(allow_partial_update=allow))
        except EngineConflict as exc:
            raise HTTPError(409, str(exc)) from None
        return {"message": "Generation continued successfully.", "status": "ok",
                "weight_version": self.scheduler.weight_version}

    async def release_memory_occupation(self, request: Request) -> Any:
        """SGLang's route: ``{tags}`` (``weights``, ``kv_cache``; none: both), only while paused.

        The KV cache is freed; on a GPU the weights are offloaded to host memory and come back
        unchanged on resume (SGLang drops them until a weight update). Answers ``null`` as SGLang.
        """
        tags = _memory_tags(request)
        try:
            freed = await self._command(lambda: self.scheduler.release_memory(tags))
        except EngineConflict as exc:
            raise HTTPError(409, str(exc)) from None
        log.info("released %s memory (%s)", "+".join(tags), ", ".join(f"{k} {v / 2**20:.1f} MiB" for k, v in freed.items()))
        return None

    async def resume_memory_occupation(self, request: Request) -> Any:
        tags = _memory_tags(request)
        await self._command(lambda: self.scheduler.resume_memory(tags))
        return None

    # ------------------------------------------------------------------------------
    # LoRA adapters (SGLang's routes and answers)

    def _adapter_response(self, success: bool, message: str | None, status: int = 200) -> Response:
        loaded = {name: adapter.path for name, adapter in self.scheduler.adapters.items()}
        return json_response({"success": success, "error_message": message, "loaded_adapters": loaded}, status)

    async def load_lora_adapter(self, request: Request) -> Response:
        from agentrl_core.engine.lora import load_adapter

        body = request.json_object()
        name, path = body.get("lora_name"), body.get("lora_path")
        if not (isinstance(name, str) and name and isinstance(path, str) and path):
            return self._adapter_response(False, "load_lora_adapter needs lora_name and lora_path", 400)
        try:
            adapter = await asyncio.to_thread(load_adapter, name, path, model=self.model)
            await self._command(lambda: self.scheduler.load_adapter(adapter))
        except EngineConflict as exc:
            return self._adapter_response(False, str(exc), 409)
        except ValueError as exc:
            return self._adapter_response(False, f"Failed to load LoRA adapter {name!r}: {exc}", 400)
        return self._adapter_response(True, None)

    async def unload_lora_adapter(self, request: Request) -> Response:
        body = request.json_object()
        name = body.get("lora_name")
        if not (isinstance(name, str) and name):
            return self._adapter_response(False, "unload_lora_adapter needs lora_name", 400)
        try:
            await self._command(lambda: self.scheduler.unload_adapter(name))
        except EngineConflict as exc:
            return self._adapter_response(False, str(exc), 409)
        except KeyError as exc:
            return self._adapter_response(False, str(exc.args[0]), 400)
        return self._adapter_response(True, None)

    # ------------------------------------------------------------------------------
    # Weight updates

    async def init_weights_update_group(self, request: Request) -> Response:
        from agentrl_core.engine.weight_group import init_weight_update_group

        body = request.json_object()
        try:
            address = str(body["master_address"])
            port = int(body["master_port"])
            rank = int(body["rank_offset"])
            world_size = int(body["world_size"])
        except (KeyError, TypeError, ValueError) as exc:
            return _weight_response(False, f"init_weights_update_group needs master_address, master_port, "
                                           f"rank_offset and world_size ({type(exc).__name__}: {exc})")
        if not 1 <= port <= 65535 or world_size < 1 or not 0 <= rank < world_size:
            # checked here: a rank outside the group would wait for its peers for the group timeout
            return _weight_response(False, f"init_weights_update_group needs 1 <= master_port <= 65535 and "
                                           f"0 <= rank_offset < world_size, got port {port}, rank_offset {rank}, "
                                           f"world_size {world_size}")
        name = str(body.get("group_name") or "weight_update_group")
        backend = str(body.get("backend") or ("nccl" if self.model.device.type == "cuda" else "gloo"))
        if name in self.groups:
            return _weight_response(False, f"weight-update group {name!r} exists; destroy it first")
        try:
            group = await asyncio.to_thread(
                init_weight_update_group, backend=backend, master_address=address, master_port=port,
                world_size=world_size, rank=rank, group_name=name)
        except Exception as exc:
            log.warning("joining weight-update group %s failed: %s", name, exc)
            return _weight_response(False, f"Failed to initialize custom process group: {exc}.")
        self.groups[name] = group
        return _weight_response(True, f"Succeeded to initialize custom process group {name!r} as rank {rank} of "
                                      f"{world_size} ({backend}).")

    async def destroy_weights_update_group(self, request: Request) -> Response:
        body = request.json_object(required=False)
        name = str(body.get("group_name") or "weight_update_group")
        group = self.groups.pop(name, None)
        if group is None:
            return _weight_response(False, "The group to be destroyed does not exist.")
        await asyncio.to_thread(_destroy_group, group)
        # gloo closes the group's connections only when the group object is freed, and only
        # that releases the peers waiting for this engine in a broadcast it refused to join
        # (an update that failed keeps the group in reference cycles of its traceback)
        del group
        await asyncio.to_thread(gc.collect)
        return _weight_response(True, "Succeeded to destroy custom process group.")

    async def update_weights_from_distributed(self, request: Request) -> Response:
        body = request.json_object()
        names, dtypes, shapes = body.get("names"), body.get("dtypes"), body.get("shapes")
        if not (isinstance(names, list) and isinstance(dtypes, list) and isinstance(shapes, list)
                and len(names) == len(dtypes) == len(shapes)):
            return _weight_response(False, "names, dtypes and shapes must be lists of the same length")
        bad = [d for d in dtypes if str(d).removeprefix("torch.") not in _TORCH_DTYPES]
        if bad:
            return _weight_response(False, f"unknown dtypes {sorted(set(map(str, bad)))}")
        name = str(body.get("group_name") or "weight_update_group")
        group = self.groups.get(name)
        if group is None:
            return _weight_response(False, f"no weight-update group {name!r}; call /init_weights_update_group "
                                           "first")
        version = body.get("weight_version")
        scheduler = self.scheduler

        def receive() -> None:
            import torch
            import torch.distributed as dist

            scheduler.require_paused("update_weights_from_distributed")
            received = []
            for tensor_name, dtype, shape in zip(names, dtypes, shapes, strict=True):
                tensor = torch.empty([int(s) for s in shape], dtype=getattr(torch, str(dtype).removeprefix("torch.")),
                                     device=self.model.device)
                dist.broadcast(tensor, src=0, group=group)
                received.append((str(tensor_name), tensor))
            _check_tensors(self.model, received)  # after receiving: the sender is never left hanging
            scheduler.apply_weights(received, version, source=f"group {name}")

        try:
            await self._command(receive)
        except EngineConflict as exc:
            return _weight_response(False, str(exc), 409)
        except (ValueError, RuntimeError) as exc:
            return _weight_response(False, f"Failed to update weights: {exc}")
        return _weight_response(True, f"Succeeded to update {len(names)} tensors; weight version "
                                      f"{scheduler.weight_version}.")

    async def update_weights_from_disk(self, request: Request) -> Response:
        body = request.json_object()
        path = body.get("model_path")
        if not isinstance(path, str) or not path:
            return _weight_response(False, "update_weights_from_disk needs model_path")
        version = body.get("weight_version")
        try:
            tensors = await asyncio.to_thread(read_checkpoint, path)
            _check_tensors(self.model, tensors, complete=True)
        except (OSError, ValueError) as exc:
            return _weight_response(False, f"Failed to update weights: {exc}")
        scheduler = self.scheduler

        def apply() -> int:
            was_paused = scheduler.paused
            aborted = 0 if was_paused else scheduler.pause()
            scheduler.apply_weights(tensors, version, source=path)
            scheduler.model_path = path
            if not was_paused:
                scheduler.resume()
            return aborted

        aborted = await self._command(apply)
        return _weight_response(True, f"Succeeded to update model weights from {path}; weight version "
                                      f"{scheduler.weight_version}.", num_paused_requests=aborted)

# ---------------------------------------------------------------------------------------
# Checkpoints and checks


def read_checkpoint(path: str | os.PathLike) -> list[tuple[str, Any]]:
    """All tensors of a safetensors checkpoint (a file, or a directory of ``*.safetensors``)."""
    from safetensors.torch import load_file

    path = Path(path)
    files = sorted(path.glob("*.safetensors")) if path.is_dir() else [path]
    if not files or not all(f.is_file() for f in files):
        raise OSError(f"no safetensors weights at {path} (expected a model directory or a .safetensors file)")
    tensors: list[tuple[str, Any]] = []
    for file in files:
        tensors.extend(load_file(str(file)).items())
    return tensors


def _check_tensors(model: Any, named: list[tuple[str, Any]], *, complete: bool = False) -> None:
    table = model.parameter_table()
    unknown = [n for n, _ in named if n not in table]
    if unknown:
        raise ValueError(f"{len(unknown)} tensor names are not parameters of the model, e.g. {unknown[0]!r}")
    wrong = [(n, tuple(t.shape), tuple(table[n].shape)) for n, t in named if tuple(t.shape) != tuple(table[n].shape)]
    if wrong:
        n, got, want = wrong[0]
        raise ValueError(f"{n} has shape {got}, the model's is {want}")
    if complete:
        from agentrl_core.engine.scheduler import _canonical

        missing = model.required_names() - {_canonical(model, n) for n, _ in named}
        if missing:
            raise ValueError(f"the checkpoint lacks {len(missing)} parameters, e.g. {sorted(missing)[0]!r}")


def _destroy_group(group: Any) -> None:
    try:
        from agentrl_core.engine.weight_group import destroy_weight_update_group

        destroy_weight_update_group(group)
    except Exception as exc:  # best effort at shutdown
        log.warning("destroying a weight-update group failed: %s", exc)


MEMORY_TAGS = ("weights", "kv_cache")


def _memory_tags(request: Request) -> list[str]:
    """The ``tags`` of a release/resume body: SGLang's ``weights`` and ``kv_cache`` (none or []: both)."""
    tags = request.json_object(required=False).get("tags") or list(MEMORY_TAGS)
    if not isinstance(tags, list) or any(t not in MEMORY_TAGS for t in tags):
        raise HTTPError(400, f"tags must be a list of {', '.join(MEMORY_TAGS)}, got {tags!r}")
    return tags


def _url_host(host: str) -> str:
    if host in ("0.0.0.0", "::", ""):
        return "127.0.0.1"
    return f"[{host}]" if ":" in host else host
