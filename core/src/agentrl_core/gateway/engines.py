"""The gateway's side of the engines: pool choice, weight-update windows, aborted turns.

Each call goes to the pool the run's sampler picks for that turn (``current``, or ``stale``
with the cross sampler; the same :class:`~agentrl_core.types.TurnContext` as the chat loop
uses), and within it to the session's sticky engine (its prefix is cached there).

A weight update pauses the engines. An engine that retracts (hf, vllm) keeps a running
request's tokens and continues it under the new weights, tagging each token with its
version; one that can only abort (SGLang) ends it with ``finish_reason: abort``. With
``on_weight_update: hold`` (the default) a call is the chat loop's turn
(:func:`~agentrl_core.rollout.agent_loop.generate_turn`): an aborted reply is continued from
its tokens with ``rollout.partial_rollouts``, else generated again from its start, and the
client only sees a slower answer; calls that arrive while the trainer has announced an update
(``POST /admin/pause``) wait for its end. With ``reject`` an aborted reply, and a call that
arrives during an announced update, is answered 429 with ``Retry-After``, which the OpenAI SDK
waits out and retries by itself. Never a 5xx.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from attrs import evolve, frozen

from agentrl_core.gateway.protocol import OpenAIError
from agentrl_core.http.client import ConnectFailed, Pool, RequestTimeout, TransportError
from agentrl_core.rollout.agent_loop import InfraFailure, generate_turn
from agentrl_core.rollout.engine_client import (
    DEFAULT_TIMEOUT,
    EngineClient,
    EngineError,
    EnginePool,
    EngineTimeout,
    EngineUnavailable,
    GenerateResult,
)
from agentrl_core.rollout.sampler import CurrentSampler, turn_rng
from agentrl_core.types import TurnContext

log = logging.getLogger(__name__)

__all__ = ["EngineRouter", "Generated"]


class LeanEngineClient(EngineClient):
    """An engine client whose ``/generate`` goes over the HTTP kit's keep-alive pool.

    httpx's connection pool scans every connection for every request: with 64 calls in flight
    that cost about 12 ms of CPU per call in the gateway (profiled), more than everything else
    the gateway does. Every other engine call stays on httpx. The semantics are the
    :class:`EngineClient`'s: connection failures are retried (the request never left), nothing
    else is, and a caller that gives up aborts its request on the engine.
    """

    def __init__(self, url: str, **kwargs: Any) -> None:
        super().__init__(url, **kwargs)
        auth = self.http.headers.get("authorization", "")  # the run's token, as the shared client sends it
        self._pool, self._path = Pool.for_url(self.url, token=auth[7:] if auth[:7].lower() == "bearer " else None)

    async def aclose(self) -> None:
        self._pool.close()
        await super().aclose()

    async def generate(self, input_ids: Sequence[int], sampling_params: Mapping[str, Any] | None = None, *,
                       return_logprob: bool = True, rid: str | None = None, pool: str = "",
                       lora: str | None = None) -> GenerateResult:
        params = dict(sampling_params or {})
        if "seed" in params:
            params["sampling_seed"] = params.pop("seed")
        rid = rid or uuid.uuid4().hex
        payload: dict[str, Any] = {"input_ids": [int(t) for t in input_ids], "sampling_params": params,
                                   "return_logprob": return_logprob, "rid": rid}
        requested = lora or self.lora
        exact: int | str | None = None
        if requested:  # model.lora: the served adapter, named as EngineClient.generate names it
            payload["lora_path"], exact = await self._adapter_name(requested)
        deadline = self.timeout if self.timeout is not None else DEFAULT_TIMEOUT
        start = time.monotonic()
        response = await self._generate_once(payload, rid, deadline)
        if (response.status == 400 and exact is not None and "@v" not in str(requested)
                and "not loaded" in response.detail()):  # the version it resolved was unloaded since
            payload["lora_path"], exact = await self._adapter_name(str(requested), refresh=True)
            response = await self._generate_once(payload, rid, deadline)
        if response.status != 200:
            raise EngineError(f"POST {self.url}/generate answered {response.status}: {response.detail()}",
                              url=self.url, status=response.status)
        try:
            data = response.json()
        except ValueError:
            raise EngineError(f"POST {self.url}/generate answered non-JSON", url=self.url) from None
        result = GenerateResult.from_response(data, engine=self.url, pool=pool, latency=time.monotonic() - start)
        if exact is not None:  # every token is the version of the adapter it ran with (EngineClient.generate)
            self._learn_version(result.weight_version)
            result = evolve(result, weight_version=exact, versions=[exact] * len(result.output_ids))
        if return_logprob and len(result.logprobs) != len(result.output_ids):
            raise EngineError(f"{self.url}: {len(result.output_ids)} tokens came back with "
                              f"{len(result.logprobs)} log-probs", url=self.url)
        return result

    async def _generate_once(self, payload: dict[str, Any], rid: str, deadline: float) -> Any:
        try:
            return await asyncio.wait_for(self._send(payload, deadline), deadline)
        except (asyncio.CancelledError, asyncio.TimeoutError, RequestTimeout) as exc:
            await asyncio.shield(self._abort(rid))
            if isinstance(exc, asyncio.CancelledError):
                raise
            raise EngineTimeout(f"POST {self.url}/generate did not finish within {deadline:g} s", url=self.url) from None

    async def _send(self, payload: dict[str, Any], deadline: float) -> Any:
        attempt = 0
        while True:
            try:
                return await self._pool.request_json("POST", self._path + "/generate", payload, timeout=deadline)
            except ConnectFailed as exc:
                attempt += 1
                if attempt > self.connect_retries:
                    raise EngineUnavailable(f"cannot connect to the engine at {self.url} ({exc}); is it running?",
                                            url=self.url) from None
                await asyncio.sleep(self.retry_backoff * 2 ** (attempt - 1))
            except RequestTimeout:
                raise
            except TransportError as exc:
                raise EngineError(f"POST {self.url}/generate failed after the request was sent ({exc})",
                                  url=self.url) from None

    async def _abort(self, rid: str) -> None:
        try:
            await asyncio.wait_for(self._pool.request_json("POST", self._path + "/abort_request", {"rid": rid},
                                                           timeout=5), 5)
        except (TransportError, asyncio.TimeoutError) as exc:
            log.debug("aborting %s on %s failed: %s", rid, self.url, exc)


class LeanEnginePool(EnginePool):
    client_class = LeanEngineClient


@frozen
class Generated:
    """A finished reply: every sampled token with its log-prob and version, and where it came from."""

    ids: list[int]
    logprobs: list[float]
    versions: list[int]
    finish_reason: str  # stop | length
    engine: str
    pool: str
    aborted: int  # answers cut short by an abort (then continued, or regenerated)
    interrupted: bool  # paused by a weight sync and continued
    mixed: bool  # tokens of more than one version
    seconds: float


class EngineRouter:
    def __init__(self, pools: Mapping[str, Sequence[str]], *, sampler: Any = None, seed: int = 0,
                 on_weight_update: str = "hold", retry_after_s: float = 2.0, max_abort_retries: int = 100,
                 request_timeout: float | None = None, token: str | None = None, lora: str | None = None) -> None:
        self.sampler = sampler or CurrentSampler()
        self.lora = lora  # model.lora: the served adapter every generate names (engine_client.LORA_SERVED_NAME)
        self.token = token  # the engines' token (None: the process's AGENTRL_TOKEN)
        self.seed = seed
        self.on_weight_update = on_weight_update
        self.retry_after_s = retry_after_s
        self.max_abort_retries = max_abort_retries
        self.request_timeout = request_timeout
        self.pools: dict[str, EnginePool] = {}
        self.set_pools(pools)
        self.paused = False
        self._resumed = asyncio.Event()  # the gateway serves on asyncio (uvicorn)
        self._resumed.set()
        self.global_step = 0
        self.aborted_calls = 0
        self.rejected_calls = 0

    def set_pools(self, pools: Mapping[str, Sequence[str]]) -> None:
        """Replace the engines (an engine restarted at a new URL keeps serving its pool)."""
        missing = {p.name for p in self.sampler.pools()} - set(pools)
        if missing:
            raise ValueError(f"the sampler needs engine pools {sorted(missing)}, got {sorted(pools)}")
        old = self.pools
        self.pools = {}
        for name, urls in pools.items():
            pool = old.get(name)
            if pool is not None and pool.urls == [u.rstrip("/") for u in urls]:
                self.pools[name] = pool
            else:
                self.pools[name] = LeanEnginePool(name, list(urls), timeout=self.request_timeout, token=self.token,
                                                  lora=self.lora)
        self._retired = [p for name, p in old.items() if self.pools.get(name) is not p]

    async def aclose(self) -> None:
        for pool in [*self.pools.values(), *getattr(self, "_retired", [])]:
            for engine in pool.engines.values():
                await engine.aclose()
            await pool.aclose()

    # -- weight-update windows (announced by the trainer) ----------------------------------

    def pause(self) -> None:
        if not self.paused:
            self.paused = True
            self._resumed.clear()

    def resume(self, global_step: int | None = None) -> None:
        if global_step is not None:
            self.global_step = int(global_step)
        self.paused = False
        self._resumed.set()

    def _reject(self) -> OpenAIError:
        self.rejected_calls += 1
        seconds = max(1, round(self.retry_after_s))
        return OpenAIError(429, f"the model's weights are being updated; retry in {seconds} s",
                           type="rate_limit_error", code="weights_updating",
                           headers=[(b"retry-after", str(seconds).encode()),
                                    (b"retry-after-ms", str(int(self.retry_after_s * 1000)).encode())])

    # -- generation ----------------------------------------------------------------------

    def choose_pool(self, *, group_id: str, sample: int, turn: int, task: str) -> str:
        context = TurnContext(group_id=group_id, sample=sample, turn=turn, task=task,
                              rng=turn_rng(self.seed, group_id, sample, turn), global_step=self.global_step)
        return self.sampler.choose(context)

    async def generate(self, key: str, input_ids: Sequence[int], params: Mapping[str, Any], *, pool_name: str,
                       wait_limit: float, stop_token_ids: Sequence[int] = (), partial_rollouts: bool = True) -> Generated:
        """One reply from the engines; held or 429 during weight updates, 503 when no engine answers.

        ``hold``: :func:`~agentrl_core.rollout.agent_loop.generate_turn`, the chat loop's own
        turn: a reply an engine retracts comes back whole with each token's version, and one cut
        by an abort is continued from its tokens (``rollout.partial_rollouts``) or generated
        again. ``reject``: a reply cut by an abort is answered 429 and nothing is recorded.
        """
        pool = self.pools.get(pool_name)
        if pool is None:
            raise OpenAIError(500, f"the sampler chose engine pool {pool_name!r}, which does not exist",
                              type="server_error")
        start = time.monotonic()
        if self.paused:
            if self.on_weight_update == "reject":
                raise self._reject()
            try:
                await asyncio.wait_for(self._resumed.wait(), wait_limit)
            except asyncio.TimeoutError:
                log.warning("the weight update announced %.0f s ago has not ended; generating anyway", wait_limit)
        if self.on_weight_update == "reject":
            out = await self._engine_call(pool.generate(key, input_ids, params), pool_name)
            if out.aborted:
                self.aborted_calls += 1
                raise self._reject()
            versions = [_int(v) for v in (out.versions or [out.weight_version] * len(out.output_ids))]
            return Generated(list(out.output_ids), list(out.logprobs), versions, out.finish_reason, out.engine,
                             pool_name, 0, len(set(versions)) > 1, len(set(versions)) > 1, time.monotonic() - start)
        try:
            turn = await generate_turn(pool, key, input_ids, params, stop_token_ids=stop_token_ids,
                                       partial_rollouts=partial_rollouts, max_abort_retries=self.max_abort_retries)
        except InfraFailure as exc:
            cause = exc.__cause__
            if isinstance(cause, EngineError):
                raise self._engine_error(cause, pool_name) from None
            if "times in a row" in str(exc):
                raise OpenAIError(429, f"this call was interrupted by {self.max_abort_retries + 1} weight updates in "
                                  "a row; retry it", type="rate_limit_error", code="weights_updating",
                                  headers=[(b"retry-after", str(max(1, round(self.retry_after_s))).encode())]) from None
            raise OpenAIError(502, f"the engine failed this call: {exc}", type="server_error") from None
        self.aborted_calls += turn.aborted
        return Generated(turn.ids, turn.logprobs, turn.versions, turn.finish_reason, turn.engine, pool_name,
                         turn.aborted, turn.interrupted, turn.mixed, time.monotonic() - start)

    async def _engine_call(self, call: Any, pool_name: str) -> Any:
        try:
            return await call
        except EngineError as exc:
            raise self._engine_error(exc, pool_name) from None

    @staticmethod
    def _engine_error(exc: EngineError, pool_name: str) -> OpenAIError:
        if isinstance(exc, EngineUnavailable):
            return OpenAIError(503, f"no engine of pool {pool_name!r} can be reached ({exc})", type="server_error",
                               code="engine_unavailable", headers=[(b"retry-after", b"5")])
        status = exc.status if exc.status in (400, 413) else 502
        return OpenAIError(status, f"the engine failed this call: {exc}",
                           type="invalid_request_error" if status < 500 else "server_error")


def _int(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return -1
