"""One async client for every engine (our HF server and SGLang): generate, health, weight updates.

* :class:`EngineClient` talks to one engine over a shared, pooled ``httpx.AsyncClient``.
  Every call has a whole-operation deadline (connection retries, sending, waiting and
  reading together; ``httpx``'s own timeouts only bound each read). A call is retried
  **only** when the connection could not be made (the request never left this process);
  after a connection was made it is never retried, since the engine may have processed it.
* :class:`EnginePool` routes ``generate`` calls over the engines of one named pool: a
  trajectory ``key`` sticks to the engine that served its first turn (that engine holds its
  prefix in cache), new keys go to the engine with the fewest requests in flight, and an
  engine that cannot be reached is skipped for a while (its requests move, stickiness too).
  Pool-wide calls (pause, continue, weight updates) go to every engine concurrently.
* :class:`GenerateResult` is the record the agent loop consumes: sampled ids, their
  log-probs, the finish reason (``stop``, ``length``, ``abort``), the weight version that
  produced each of them, and which engine and pool answered.
* :func:`pause_mode_for` is how a weight sync pauses a pool: ``retract`` (in-flight requests
  keep their tokens and continue under the new weights) when partial rollouts are on and
  every engine says it can, else ``abort`` (docs/architecture.md section 5).
"""

from __future__ import annotations

import collections
import itertools
import logging
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import anyio
import attrs
import httpx
from attrs import field, frozen

from agentrl_core.errors import AgentrlError
from agentrl_core.http.auth import authorization_header, env_token

log = logging.getLogger(__name__)

__all__ = ["EngineError", "EngineUnavailable", "EngineTimeout", "GenerateResult", "BusyReading", "EngineClient",
           "EnginePool", "make_http_client", "pause_mode_for", "DEFAULT_TIMEOUT", "DEFAULT_HEALTH_TIMEOUT"]

DEFAULT_TIMEOUT = 900.0  # seconds one engine call may take in all (a long generation included)
# SGLang's /health generates one token and waits up to SGLANG_HEALTH_CHECK_TIMEOUT (20 s) for it;
# a client that gives up earlier calls a busy or paused engine dead
DEFAULT_HEALTH_TIMEOUT = 30.0
CONNECT_TIMEOUT = 10.0


# model.lora: the name the engines serve the trained adapter under, one version at a time as
# policy@v<N>; a request naming the bare name runs with the newest version its engine holds
LORA_SERVED_NAME = "policy"


class EngineError(AgentrlError):
    """An engine answered with an error, or the answer was unusable."""

    def __init__(self, message: str, *, url: str = "", status: int | None = None) -> None:
        super().__init__(message)
        self.url = url
        self.status = status


class EngineUnavailable(EngineError):
    """No connection could be made to the engine (the request was never sent)."""


class EngineTimeout(EngineError):
    """The engine did not finish a call within its deadline (it may still be working on it)."""


def normalize_version(value: Any) -> int | str:
    """Weight versions are ints here; SGLang sends strings (``"3"``), non-numeric ones stay strings."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    text = str(value) if value is not None else "default"
    return int(text) if text.lstrip("-").isdigit() else text


def pause_mode_for(model_infos: Iterable[Mapping[str, Any]], partial_rollouts: bool) -> str:
    """How a weight sync pauses the engines whose ``/get_model_info`` answers are ``model_infos``.

    ``retract`` keeps in-flight work (each request keeps its tokens, is prefilled again under
    the new weights and continues; the answer tags every token with its version) and is used
    when ``partial_rollouts`` is on and every engine lists it in ``pause_modes`` (the hf
    engine and the vllm front do). Otherwise ``abort``: running requests end with the tokens
    they have, all of one version. SGLang lists no ``pause_modes``: its ``retract`` answers
    carry one ``weight_version`` per request in the released 0.5.x versions, so the tokens
    before and after the update could not be told apart; its pools are paused with
    ``abort`` and the agent loop continues each cut turn itself.
    """
    infos = list(model_infos)
    if partial_rollouts and infos and all("retract" in (info.get("pause_modes") or ()) for info in infos):
        return "retract"
    return "abort"


def token_versions(meta: Mapping[str, Any], num_tokens: int, *, engine: str = "") -> list[int | str]:
    """The weight version of each output token: from ``meta_info.weight_versions`` (runs of
    ``{version, start, end}``, SGLang's and vLLM's form) when present, else every token has
    ``meta_info.weight_version``."""
    spans = meta.get("weight_versions")
    if not spans:
        return [normalize_version(meta.get("weight_version"))] * num_tokens
    versions: list[int | str] = []
    for span in spans:
        try:
            version, start, end = normalize_version(span["version"]), int(span["start"]), int(span["end"])
        except (KeyError, TypeError, ValueError):
            raise EngineError(f"{engine}: meta_info.weight_versions holds {span!r}, not {{version, start, end}}",
                              url=engine) from None
        if start != len(versions) or end < start:
            raise EngineError(f"{engine}: meta_info.weight_versions {list(spans)} do not cover the "
                              f"{num_tokens} output tokens in order", url=engine)
        versions.extend([version] * (end - start))
    if len(versions) != num_tokens:
        raise EngineError(f"{engine}: meta_info.weight_versions cover {len(versions)} tokens, the answer has "
                          f"{num_tokens}", url=engine)
    return versions


@frozen
class GenerateResult:
    output_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" | "length" | "abort"
    weight_version: int | str  # of the last token (SGLang's convention); per token: ``versions``
    text: str = ""
    engine: str = ""
    pool: str = ""
    prompt_tokens: int = 0
    cached_tokens: int = 0
    matched_stop: int | str | None = None
    message: str | None = None  # why it was aborted
    latency: float = 0.0
    meta_info: dict[str, Any] = field(factory=dict, repr=False)
    versions: list[int | str] = field(factory=list)  # the weight version of each output token

    @property
    def aborted(self) -> bool:
        return self.finish_reason == "abort"

    @property
    def mixed_versions(self) -> bool:
        """The tokens were sampled by more than one weight version (a retracting pause in between)."""
        return len(set(self.versions)) > 1

    @classmethod
    def from_response(cls, data: Mapping[str, Any], *, engine: str = "", pool: str = "",
                      latency: float = 0.0) -> GenerateResult:
        """Read SGLang's ``/generate`` answer (``text``, ``output_ids``, ``meta_info``)."""
        meta = data.get("meta_info") or {}
        reason = meta.get("finish_reason") or {}
        if isinstance(reason, str):
            reason = {"type": reason}
        kind = str(reason.get("type") or "stop")
        pairs = meta.get("output_token_logprobs")
        ids = data.get("output_ids")
        if ids is None and pairs is not None:
            ids = [int(p[1]) for p in pairs]
        if ids is None and kind == "abort":
            # SGLang answers a request aborted in its waiting queue with text and meta_info only
            # ("Abort before prefill"): nothing was generated, the caller sends it again
            ids = []
        if ids is None:
            raise EngineError(f"{engine}: the /generate answer has no output_ids", url=engine)
        ids = [int(i) for i in ids]
        logprobs = [float(p[0]) for p in pairs] if pairs is not None else []
        if pairs is not None and [int(p[1]) for p in pairs] != ids:
            raise EngineError(f"{engine}: output_token_logprobs do not match output_ids", url=engine)
        return cls(
            output_ids=ids,
            logprobs=logprobs,
            finish_reason=kind if kind in ("stop", "length", "abort") else "stop",
            weight_version=normalize_version(meta.get("weight_version")),
            versions=token_versions(meta, len(ids), engine=engine),
            text=str(data.get("text") or ""),
            engine=engine,
            pool=pool,
            prompt_tokens=int(meta.get("prompt_tokens") or 0),
            cached_tokens=int(meta.get("cached_tokens") or 0),
            matched_stop=reason.get("matched"),
            message=reason.get("message") if kind == "abort" else None,
            latency=latency,
            meta_info=dict(meta),
        )


def make_http_client(*, timeout: float = DEFAULT_TIMEOUT, connect_timeout: float = CONNECT_TIMEOUT,
                     max_connections: int = 4096, token: str | None = None) -> httpx.AsyncClient:
    """The pooled HTTP client engines share (one per process is enough).

    Every request carries ``token`` (default: the process's ``AGENTRL_TOKEN``) as a bearer
    token, which agentrl's engines and SGLang started with ``--api-key`` require.
    """
    return httpx.AsyncClient(
        headers=authorization_header(token or env_token()),
        timeout=httpx.Timeout(timeout, connect=connect_timeout, pool=timeout),
        limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=min(max_connections, 1024),
                            keepalive_expiry=30.0),
        trust_env=False,
    )


_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout, httpx.UnsupportedProtocol)


@frozen
class BusyReading:
    """One reading of an engine's load.

    ``forward_seconds``/``wall_seconds`` are cumulative (agentrl's HF engine, the vLLM front):
    two readings give the exact busy fraction between them. ``forward_seconds`` is the engine's
    busy time: the HF engine's ``busy_seconds`` (forward passes + sampling) where it reports it. SGLang reports no forward time,
    so its reading has only the requests of the moment. ``requests`` counts running and
    waiting ones (SGLang's ``num_reqs``), ``waiting`` the waiting ones; None where not reported.
    """

    forward_seconds: float | None = None
    wall_seconds: float | None = None
    requests: int | None = None
    waiting: int | None = None


def _int_or_none(value: Any) -> int | None:
    return None if value is None else int(value)


class EngineClient:
    """One engine's HTTP API. ``http`` is shared between clients; the owner of ``http`` closes it.

    ``timeout`` is the whole-operation deadline of every call (``DEFAULT_TIMEOUT``, 900 s);
    ``health_timeout`` that of ``/health`` (30 s, above SGLang's own 20 s wait).
    """

    def __init__(self, url: str, *, http: httpx.AsyncClient | None = None, connect_retries: int = 3,
                 retry_backoff: float = 0.5, timeout: float | None = None,
                 health_timeout: float = DEFAULT_HEALTH_TIMEOUT, token: str | None = None,
                 lora: str | None = None) -> None:
        self.url = url.rstrip("/")
        # model.lora: every generate names the served adapter (the engine resolves a bare name to
        # its newest version at admission, and refuses the request when none is loaded)
        self.lora = lora
        # engines that take exact adapter names only (SGLang: no lora_adapters in /get_model_info) get
        # <lora>@v<the server's weight version>, which the learner points at the newest adapter
        self._lora_exact: bool | None = None
        self._lora_version: int | str | None = None
        self._lora_checked = 0.0
        self._own_http = http is None
        self.http = http or make_http_client(token=token)
        self.connect_retries = connect_retries
        self.retry_backoff = retry_backoff
        self.timeout = timeout
        self.health_timeout = health_timeout

    async def aclose(self) -> None:
        if self._own_http:
            await self.http.aclose()

    async def __aenter__(self) -> EngineClient:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    # ------------------------------------------------------------------------------

    async def request(self, method: str, path: str, payload: Any = None, *, timeout: float | None = None,
                      ok: Sequence[int] = (200,)) -> httpx.Response:
        """Send one request within ``timeout`` seconds in all; retried only while no connection could be made."""
        deadline = timeout if timeout is not None else self.timeout if self.timeout is not None else DEFAULT_TIMEOUT
        try:
            with anyio.fail_after(deadline):
                return await self._request(method, path, payload, deadline, ok)
        except TimeoutError:
            raise EngineTimeout(f"{method} {self.url}{path} did not finish within {deadline:g} s; the engine may "
                                "still be working on it", url=self.url) from None

    async def _request(self, method: str, path: str, payload: Any, timeout: float,
                       ok: Sequence[int]) -> httpx.Response:
        url = self.url + path
        kwargs: dict[str, Any] = {"timeout": httpx.Timeout(timeout, connect=min(timeout, CONNECT_TIMEOUT))}
        if payload is not None:
            kwargs["json"] = payload
        attempt = 0
        while True:
            try:
                response = await self.http.request(method, url, **kwargs)
                break
            except _NOT_SENT as exc:
                attempt += 1
                if attempt > self.connect_retries:
                    raise EngineUnavailable(f"cannot connect to the engine at {self.url} ({type(exc).__name__}: "
                                            f"{exc or 'no answer'}); is it running?", url=self.url) from None
                await anyio.sleep(self.retry_backoff * 2 ** (attempt - 1))
            except httpx.TimeoutException as exc:
                raise EngineTimeout(f"{method} {url} timed out ({type(exc).__name__}); the engine may still be "
                                    "working on it", url=self.url) from None
            except httpx.HTTPError as exc:
                raise EngineError(f"{method} {url} failed after the request was sent ({type(exc).__name__}: {exc})",
                                  url=self.url) from None
        if response.status_code not in ok:
            raise EngineError(f"{method} {url} answered {response.status_code}: {_detail(response)}",
                              url=self.url, status=response.status_code)
        return response

    async def _json(self, method: str, path: str, payload: Any = None, **kwargs: Any) -> Any:
        response = await self.request(method, path, payload, **kwargs)
        try:
            return response.json()
        except ValueError:
            raise EngineError(f"{method} {self.url}{path} answered non-JSON: {response.text[:200]!r}",
                              url=self.url) from None

    async def _admin(self, path: str, payload: Mapping[str, Any], **kwargs: Any) -> dict[str, Any]:
        """SGLang admin calls answer ``{success, message}`` (400 on failure)."""
        response = await self.request("POST", path, dict(payload), ok=(200, 400, 409), **kwargs)
        try:
            data = response.json()
        except ValueError:
            data = {"success": False, "message": response.text[:300]}
        if response.status_code != 200 or data.get("success") is False:
            raise EngineError(f"{self.url}{path} failed ({response.status_code}): {data.get('message') or data}",
                              url=self.url, status=response.status_code)
        return data

    # ------------------------------------------------------------------------------
    # Generation

    async def generate(self, input_ids: Sequence[int], sampling_params: Mapping[str, Any] | None = None, *,
                       return_logprob: bool = True, rid: str | None = None, pool: str = "",
                       lora: str | None = None) -> GenerateResult:
        """One completion. ``lora`` (default: the client's ``lora``): the served adapter to run with."""
        params = dict(sampling_params or {})
        if "seed" in params:  # SGLang's name; a plain "seed" would be ignored there
            params["sampling_seed"] = params.pop("seed")
        rid = rid or uuid.uuid4().hex
        payload: dict[str, Any] = {"input_ids": [int(t) for t in input_ids], "sampling_params": params,
                                   "return_logprob": return_logprob, "rid": rid}
        requested = lora or self.lora
        exact: int | str | None = None
        if requested:
            lora, exact = await self._adapter_name(requested)
            payload["lora_path"] = lora
        start = time.monotonic()
        try:
            try:
                data = await self._json("POST", "/generate", payload)
            except EngineError as exc:
                if exact is None or "@v" in str(requested) or exc.status != 400 or "not loaded" not in str(exc):
                    raise
                # the version it resolved was unloaded since: ask the engine for its newest and try once more
                lora, exact = await self._adapter_name(str(requested), refresh=True)
                payload["lora_path"] = lora
                data = await self._json("POST", "/generate", payload)
        except (anyio.get_cancelled_exc_class(), EngineTimeout):
            # the caller gave up (its trajectory was cancelled) or the deadline passed: free the slot too
            with anyio.CancelScope(shield=True), anyio.move_on_after(5):
                try:
                    await self.http.post(self.url + "/abort_request", json={"rid": rid}, timeout=5)
                except httpx.HTTPError as exc:
                    log.debug("aborting %s on %s failed: %s", rid, self.url, exc)
            raise
        result = GenerateResult.from_response(data, engine=self.url, pool=pool, latency=time.monotonic() - start)
        if exact is not None:
            # SGLang reports the server's version when it answers; the base never changes under an adapter,
            # so every token is the version of the adapter the request ran with
            self._learn_version(result.weight_version)
            result = attrs.evolve(result, weight_version=exact, versions=[exact] * len(result.output_ids))
        if return_logprob and len(result.logprobs) != len(result.output_ids):
            raise EngineError(f"{self.url}: {len(result.output_ids)} tokens came back with "
                              f"{len(result.logprobs)} log-probs", url=self.url)
        return result

    async def _adapter_name(self, lora: str, refresh: bool = False) -> tuple[str, int | str | None]:
        """``(lora_path, version)``: a bare name for engines that resolve it (version None), else
        ``<lora>@v<N>`` with ``N`` the engine's weight version, read at most once a second."""
        if "@v" in lora:
            return lora, normalize_version(lora.rpartition("@v")[2])
        now = time.monotonic()
        if self._lora_exact is None or (self._lora_exact and (refresh or now - self._lora_checked > 1.0)):
            info = await self.model_info()
            self._lora_exact = "lora_adapters" not in info
            self._lora_version = normalize_version(info.get("weight_version"))
            self._lora_checked = now
        if not self._lora_exact:
            return lora, None
        return f"{lora}@v{self._lora_version}", self._lora_version

    def _learn_version(self, version: int | str) -> None:
        if isinstance(version, int) and (not isinstance(self._lora_version, int) or version > self._lora_version):
            self._lora_version = version

    async def update_weight_version(self, new_version: Any) -> dict[str, Any]:
        """SGLang's route: label the server's weights ``new_version`` without aborting anything."""
        return await self._json("POST", "/update_weight_version", {"new_version": str(new_version),
                                                                   "abort_all_requests": False})

    async def chat_completions(self, payload: Mapping[str, Any]) -> dict[str, Any]:
        return await self._json("POST", "/v1/chat/completions", dict(payload))

    async def abort_request(self, rid: str | None = None) -> None:
        await self.request("POST", "/abort_request", {"rid": rid} if rid else {"abort_all": True})

    # ------------------------------------------------------------------------------
    # State

    async def health(self, timeout: float | None = None) -> bool:
        """``/health`` answered 200 within ``timeout`` (default ``health_timeout``).

        SGLang's ``/health`` generates a token, so it waits while generation is paused and
        answers 503 after its own 20 s; use :meth:`alive` for an engine paused on purpose.
        """
        timeout = self.health_timeout if timeout is None else timeout
        try:
            with anyio.fail_after(timeout):
                response = await self.http.get(self.url + "/health", timeout=timeout)
        except (httpx.HTTPError, TimeoutError):
            return False
        return response.status_code == 200

    async def alive(self, timeout: float | None = None) -> bool:
        """The server answers ``/get_model_info`` (it does not generate: true while paused too)."""
        timeout = self.health_timeout if timeout is None else timeout
        try:
            with anyio.fail_after(timeout):
                response = await self.http.get(self.url + "/get_model_info", timeout=timeout)
        except (httpx.HTTPError, TimeoutError):
            return False
        return response.status_code == 200

    async def wait_healthy(self, timeout: float, interval: float = 0.5) -> None:
        """Poll ``/health`` until it answers 200 (startup); EngineUnavailable after ``timeout``."""
        deadline = time.monotonic() + timeout
        while not await self.health():
            if time.monotonic() > deadline:
                raise EngineUnavailable(f"the engine at {self.url} did not become healthy within {timeout:.0f} s",
                                        url=self.url)
            await anyio.sleep(interval)

    async def model_info(self, timeout: float | None = None) -> dict[str, Any]:
        return await self._json("GET", "/get_model_info", timeout=timeout)

    async def server_info(self, timeout: float | None = None) -> dict[str, Any]:
        return await self._json("GET", "/get_server_info", timeout=timeout)

    async def busy(self, timeout: float | None = None) -> BusyReading:
        """How busy the engine is, from what its kind reports (see :class:`BusyReading`).

        Our HF engine and the vLLM front report cumulative ``forward_seconds`` and
        ``wall_seconds`` in ``/get_server_info``. SGLang 0.5.x does not (read in the sglang 0.5.4
        wheel, python/sglang/srt/...): its ``/get_server_info`` is ``{**server_args,
        **scheduler_info, "internal_states": [...], "version"}`` (``entrypoints/http_server.py``
        496-507), and each internal state is the server arguments plus ``last_gen_throughput``
        and ``memory_usage`` (``managers/scheduler.py`` 2386-2407, ``get_internal_state``): no
        request counts and no forward time. Its load is ``GET /get_load`` (``http_server.py``
        510-512): one ``GetLoadReqOutput`` per DP rank, ``{rid, http_worker_ipc, dp_rank,
        num_reqs, num_waiting_reqs, num_tokens}`` (``managers/io_struct.py`` 40-42 and
        1446-1450), where ``num_reqs`` is the running batch + the waiting queue
        (``scheduler.py`` 2341-2384, ``get_load``). core/docs/engine.md section 5 has the rest.
        """
        info = await self.server_info(timeout=timeout)
        if "forward_seconds" in info:
            running, waiting = _int_or_none(info.get("running")), _int_or_none(info.get("waiting"))
            return BusyReading(forward_seconds=float(info.get("busy_seconds", info["forward_seconds"])),
                               wall_seconds=float(info.get("wall_seconds", 0.0)),
                               requests=None if running is None else running + (waiting or 0), waiting=waiting)
        if "internal_states" in info:  # SGLang: the load is a separate route
            loads = await self._json("GET", "/get_load", timeout=timeout)
            if not isinstance(loads, list) or not all(isinstance(x, dict) and "num_reqs" in x for x in loads):
                raise EngineError(f"GET {self.url}/get_load answered {str(loads)[:200]!r}, not SGLang's list of "
                                  "{dp_rank, num_reqs, num_waiting_reqs, num_tokens}", url=self.url)
            return BusyReading(requests=sum(int(x["num_reqs"]) for x in loads),
                               waiting=sum(int(x.get("num_waiting_reqs", 0)) for x in loads))
        raise EngineError(f"GET {self.url}/get_server_info has neither forward_seconds (agentrl's engines) nor "
                          "internal_states (SGLang), so how busy the engine is cannot be read", url=self.url)

    async def flush_cache(self) -> None:
        await self.request("POST", "/flush_cache")

    async def pause_generation(self, mode: str = "abort") -> dict[str, Any]:
        """``abort`` (running requests end now) or ``retract`` (they wait with their tokens and continue)."""
        return await self._json("POST", "/pause_generation", {"mode": mode})

    async def continue_generation(self, **options: Any) -> dict[str, Any]:
        return await self._json("POST", "/continue_generation", options)

    async def release_memory_occupation(self, tags: Sequence[str] | None = None) -> None:
        """SGLang's ``/release_memory_occupation {tags}``: free ``weights`` and/or ``kv_cache``
        (None: every kind) while generation is paused and nothing runs; SGLang answers ``null``."""
        await self.request("POST", "/release_memory_occupation", {"tags": list(tags)} if tags else {})

    async def resume_memory_occupation(self, tags: Sequence[str] | None = None) -> None:
        """SGLang's ``/resume_memory_occupation {tags}``: take the memory back (None: every kind).
        SGLang's resumed weights hold no values until new weights arrive."""
        await self.request("POST", "/resume_memory_occupation", {"tags": list(tags)} if tags else {})

    # ------------------------------------------------------------------------------
    # Weight updates (docs/architecture.md section 5: pause -> all buckets -> continue)

    async def init_weights_update_group(self, *, master_address: str, master_port: int, rank_offset: int,
                                        world_size: int, group_name: str = "weight_update_group",
                                        backend: str = "gloo") -> dict[str, Any]:
        """Join the learner's group; returns once every rank joined (call it concurrently with the learner)."""
        return await self._admin("/init_weights_update_group", {
            "master_address": master_address, "master_port": int(master_port), "rank_offset": int(rank_offset),
            "world_size": int(world_size), "group_name": group_name, "backend": backend})

    async def destroy_weights_update_group(self, group_name: str = "weight_update_group") -> dict[str, Any]:
        return await self._admin("/destroy_weights_update_group", {"group_name": group_name})

    async def update_weights_from_distributed(self, *, names: Sequence[str], dtypes: Sequence[str],
                                              shapes: Sequence[Sequence[int]], group_name: str = "weight_update_group",
                                              weight_version: Any = None, flush_cache: bool = True) -> dict[str, Any]:
        """Receive one bucket; returns once the engine received it (the learner broadcasts meanwhile)."""
        payload: dict[str, Any] = {"names": list(names), "dtypes": [str(d).removeprefix("torch.") for d in dtypes],
                                   "shapes": [list(map(int, s)) for s in shapes], "group_name": group_name,
                                   "flush_cache": flush_cache}
        if weight_version is not None:
            payload["weight_version"] = str(weight_version)
        return await self._admin("/update_weights_from_distributed", payload)

    async def load_lora_adapter(self, lora_name: str, lora_path: str) -> dict[str, Any]:
        """Serve the PEFT adapter folder ``lora_path`` as ``lora_name`` (SGLang's route)."""
        return await self._admin("/load_lora_adapter", {"lora_name": lora_name, "lora_path": str(lora_path)})

    async def unload_lora_adapter(self, lora_name: str) -> dict[str, Any]:
        """Stop serving ``lora_name``; an engine that refuses (409: in use) raises :class:`EngineError`."""
        return await self._admin("/unload_lora_adapter", {"lora_name": lora_name})

    async def update_weights_from_disk(self, model_path: str, weight_version: Any = None) -> dict[str, Any]:
        payload: dict[str, Any] = {"model_path": str(model_path)}
        if weight_version is not None:
            payload["weight_version"] = str(weight_version)
        return await self._admin("/update_weights_from_disk", payload)


def _detail(response: httpx.Response) -> str:
    try:
        data = response.json()
    except ValueError:
        return response.text[:300] or response.reason_phrase
    if isinstance(data, dict):
        for key in ("detail", "message", "error"):
            if key in data:
                value = data[key]
                return str(value.get("message", value) if isinstance(value, dict) else value)[:300]
    return str(data)[:300]


class EnginePool:
    """The engines of one named pool, with sticky least-loaded routing of ``generate``.

    ``client_class`` builds each engine's client (a subclass may change the transport).
    """

    client_class: type[EngineClient] = EngineClient

    def __init__(self, name: str, urls: Sequence[str], *, http: httpx.AsyncClient | None = None,
                 connect_retries: int = 3, down_seconds: float = 10.0, max_sticky_keys: int = 100_000,
                 timeout: float | None = None, health_timeout: float = DEFAULT_HEALTH_TIMEOUT,
                 token: str | None = None, lora: str | None = None) -> None:
        if not urls:
            raise ValueError(f"engine pool {name!r} needs at least one engine URL")
        self.name = name
        self._own_http = http is None
        self.http = http or make_http_client(token=token)
        self._client_options = {"connect_retries": connect_retries, "timeout": timeout, "health_timeout": health_timeout,
                                "lora": lora}
        self.engines = {url.rstrip("/"): self.client_class(url, http=self.http, **self._client_options) for url in urls}
        self.urls = list(self.engines)
        self.in_flight: dict[str, int] = dict.fromkeys(self.urls, 0)
        self.down_seconds = down_seconds
        self._down_until: dict[str, float] = {}
        self._sticky: collections.OrderedDict[str, str] = collections.OrderedDict()
        self._max_sticky = max_sticky_keys
        self._turn = itertools.count()

    async def aclose(self) -> None:
        if self._own_http:
            await self.http.aclose()

    async def __aenter__(self) -> EnginePool:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    # ------------------------------------------------------------------------------
    # Routing

    def _up(self, url: str) -> bool:
        return self._down_until.get(url, 0.0) <= time.monotonic()

    def pick(self, key: str | None = None, *, avoid: Sequence[str] = ()) -> str:
        """The engine for ``key``: its sticky engine if up, else the least loaded one (and stick to it)."""
        if key is not None:
            url = self._sticky.get(key)
            if url is not None and url not in avoid and self._up(url):
                self._sticky.move_to_end(key)
                return url
        candidates = [u for u in self.urls if u not in avoid and self._up(u)] or \
                     [u for u in self.urls if u not in avoid] or self.urls
        least = min(self.in_flight[u] for u in candidates)
        tied = [u for u in candidates if self.in_flight[u] == least]
        url = tied[next(self._turn) % len(tied)]
        if key is not None:
            self._sticky[key] = url
            self._sticky.move_to_end(key)
            while len(self._sticky) > self._max_sticky:
                self._sticky.popitem(last=False)
        return url

    def replace_engine(self, old: str, new: str) -> None:
        """Swap a dead engine for its replacement (trajectories stuck to it move on their next turn).

        Requests still in flight on the old engine finish (or fail) on their own; they no
        longer count towards any engine's load.
        """
        old, new = old.rstrip("/"), new.rstrip("/")
        if old not in self.engines:
            raise ValueError(f"pool {self.name!r} has no engine {old}")
        del self.engines[old]
        self.engines[new] = self.client_class(new, http=self.http, **self._client_options)
        self.urls = [new if u == old else u for u in self.urls]
        self.in_flight.pop(old, None)
        self.in_flight[new] = 0
        self._down_until.pop(old, None)
        for key in [k for k, u in self._sticky.items() if u == old]:
            del self._sticky[key]

    async def generate(self, key: str | None, input_ids: Sequence[int], sampling_params: Mapping[str, Any], *,
                       return_logprob: bool = True) -> GenerateResult:
        """Generate on the sticky (or least-loaded) engine; unreachable engines are failed over."""
        tried: list[str] = []
        while True:
            url = self.pick(key, avoid=tried)
            engine = self.engines[url]
            self.in_flight[url] += 1
            try:
                return await engine.generate(input_ids, sampling_params, return_logprob=return_logprob, pool=self.name)
            except EngineUnavailable:
                self._down_until[url] = time.monotonic() + self.down_seconds
                tried.append(url)
                if key is not None:
                    self._sticky.pop(key, None)
                if len(tried) >= len(self.urls):
                    raise
                log.warning("pool %s: engine %s is unreachable; sending to another engine", self.name, url)
            finally:
                if self.engines.get(url) is engine:  # not replaced meanwhile (a new engine may reuse the URL)
                    self.in_flight[url] -= 1

    # ------------------------------------------------------------------------------
    # Pool-wide calls (concurrently on every engine)

    async def _each(self, method: str, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """``method`` on every engine at once; one EngineError naming every engine that failed."""
        results: dict[str, Any] = {}
        errors: list[EngineError] = []

        async def one(url: str) -> None:
            try:
                results[url] = await getattr(self.engines[url], method)(*args, **kwargs)
            except EngineError as exc:
                errors.append(exc)

        async with anyio.create_task_group() as tg:
            for url in self.urls:
                tg.start_soon(one, url)
        _raise_first(errors, len(self.urls))
        return results

    async def health(self) -> dict[str, bool]:
        return await self._each("health")

    async def alive(self) -> dict[str, bool]:
        return await self._each("alive")

    async def wait_healthy(self, timeout: float) -> None:
        await self._each("wait_healthy", timeout)

    async def model_info(self) -> dict[str, Any]:
        return await self._each("model_info")

    async def flush_cache(self) -> None:
        await self._each("flush_cache")

    async def pause_generation(self, mode: str = "abort") -> dict[str, Any]:
        return await self._each("pause_generation", mode)

    async def continue_generation(self) -> dict[str, Any]:
        return await self._each("continue_generation")

    async def release_memory_occupation(self, tags: Sequence[str] | None = None) -> dict[str, Any]:
        return await self._each("release_memory_occupation", tags)

    async def resume_memory_occupation(self, tags: Sequence[str] | None = None) -> dict[str, Any]:
        return await self._each("resume_memory_occupation", tags)

    async def load_lora_adapter(self, lora_name: str, lora_path: str) -> dict[str, Any]:
        """Serve the PEFT adapter folder ``lora_path`` as ``lora_name`` (SGLang's route)."""
        return await self._admin("/load_lora_adapter", {"lora_name": lora_name, "lora_path": str(lora_path)})

    async def unload_lora_adapter(self, lora_name: str) -> dict[str, Any]:
        """Stop serving ``lora_name``; an engine that refuses (409: in use) raises :class:`EngineError`."""
        return await self._admin("/unload_lora_adapter", {"lora_name": lora_name})

    async def update_weights_from_disk(self, model_path: str, weight_version: Any = None) -> dict[str, Any]:
        return await self._each("update_weights_from_disk", model_path, weight_version)

    async def update_weights_from_distributed(self, **kwargs: Any) -> dict[str, Any]:
        return await self._each("update_weights_from_distributed", **kwargs)

    async def init_weights_update_group(self, *, master_address: str, master_port: int, group_name: str,
                                        backend: str, rank_base: int = 1, ranks_per_engine: int = 1,
                                        world_size: int | None = None) -> dict[str, Any]:
        """Join every engine to the learner's group: engine i is rank ``rank_base + i * ranks_per_engine``."""
        world_size = world_size or rank_base + len(self.urls) * ranks_per_engine
        results: dict[str, Any] = {}
        errors: list[EngineError] = []

        async def one(i: int, url: str) -> None:
            try:
                results[url] = await self.engines[url].init_weights_update_group(
                    master_address=master_address, master_port=master_port,
                    rank_offset=rank_base + i * ranks_per_engine, world_size=world_size, group_name=group_name,
                    backend=backend)
            except EngineError as exc:
                errors.append(exc)

        async with anyio.create_task_group() as tg:
            for i, url in enumerate(self.urls):
                tg.start_soon(one, i, url)
        _raise_first(errors, len(self.urls))
        return results


def _raise_first(errors: list[EngineError], engines: int) -> None:
    if not errors:
        return
    first = errors[0]
    if len(errors) == 1:
        raise first
    others = "; ".join(str(e) for e in errors[1:])
    raise type(first)(f"{first} (and {len(errors) - 1} more of {engines} engines: {others})",
                      url=first.url, status=first.status)
