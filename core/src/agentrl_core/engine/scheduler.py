"""Continuous batching for the HF engine: one scheduler thread owns the model.

Every iteration of the scheduler thread

1. runs the control commands queued by the HTTP side (pause, continue, weight updates,
   cache flush) — so a command never overlaps a forward pass;
2. admits waiting requests into free KV-cache slots (FIFO, within a prefill token budget),
   reusing the longest cached prefix of a finished request (multi-turn prompts extend the
   previous turn, so a turn only prefills the new observation tokens);
3. runs **one** forward over every running request: a decoding step (one token) for each
   request that is decoding, and the next prompt chunk for each request still being
   prefilled (all chunks together within ``max_prefill_tokens``, so a long prompt takes
   several iterations and never stalls the others); every request whose last token was fed
   samples one token; finished requests leave, their slot keeps its tokens for prefix reuse.

Sampling: :mod:`~agentrl_core.engine.sampling`.

Weight versions: every sampled token records the engine's weight version at the moment it
was sampled. Weights change only while generation is paused, so a token's version names
exactly the weights that computed it, and no token is ever computed by partly updated
weights: :meth:`Scheduler.resume` refuses to continue after a distributed update that did
not write every parameter. A pause either aborts every running request (``abort``: the
answer ends with the tokens so far, all of one version) or retracts it (``retract``: the
request goes back to the front of the queue with its tokens, its keys/values are dropped
from the running set, and after the pause it re-prefills prompt + tokens so far under the
weights of that moment and continues; one answer may then hold tokens of several versions,
each tagged with its own). docs/architecture.md section 5.
"""

from __future__ import annotations

import collections
import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from attrs import define, field, frozen

from agentrl_core.engine.lora import Adapter
from agentrl_core.engine.model import EngineModel
from agentrl_core.engine.sampling import SamplingParams, sample

log = logging.getLogger(__name__)

ABORT_PAUSED = "generation was paused for a weight update; send the request again"
PAUSE_MODES = ("abort", "retract")


class EngineConflict(Exception):
    """An operation that is not allowed in the engine's current state (HTTP 409)."""


@frozen
class Completion:
    """What a finished request returns (built in the scheduler thread)."""

    rid: str
    output_ids: list[int]
    logprobs: list[float]
    finish_reason: dict[str, Any]
    weight_version: Any  # the version of the last token (of the engine at admission when there is none)
    prompt_tokens: int
    cached_tokens: int
    queue_seconds: float
    total_seconds: float
    versions: list[Any] = field(factory=list)  # the weight version that sampled each output token
    retractions: int = 0  # times a pause (mode retract) sent the request back to the queue

    def version_spans(self) -> list[dict[str, Any]]:
        """``[{version, start, end}]``: runs of output tokens sampled by one version (SGLang's form)."""
        spans: list[dict[str, Any]] = []
        for i, version in enumerate(self.versions):
            if spans and spans[-1]["version"] == version:
                spans[-1]["end"] = i + 1
            else:
                spans.append({"version": version, "start": i, "end": i + 1})
        return spans or [{"version": self.weight_version, "start": 0, "end": 0}]


@define(eq=False)
class Request:
    rid: str
    input_ids: list[int]
    params: SamplingParams
    on_finish: Callable[[Completion], None]
    arrived: float = field(factory=time.monotonic)
    admitted: float = 0.0
    output_ids: list[int] = field(factory=list)
    logprobs: list[float] = field(factory=list)
    versions: list[Any] = field(factory=list)  # per output token
    slot: int = -1
    cached_tokens: int = 0
    fed: int = 0  # tokens whose keys/values are in the slot
    version: Any = None
    generator: torch.Generator | None = None
    stop_ids: frozenset[int] = frozenset()
    finished: bool = False
    retractions: int = 0
    adapter: str | None = None  # the LoRA adapter asked for (``lora_path``): a name@vN, or a name (its newest)
    lora: Adapter | None = None  # the adapter it runs with, fixed at its first admission


@define
class EngineStats:
    generated_tokens: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    requests: int = 0
    aborted: int = 0
    retracted: int = 0  # requests sent back to the queue by a pause (mode retract)
    recomputed_tokens: int = 0  # tokens prefilled again after a retraction
    forward_seconds: float = 0.0  # model forward passes
    sampling_seconds: float = 0.0  # drawing the next tokens from the logits (with forward: the engine busy)
    forwards: int = 0  # one per scheduler iteration
    decode_steps: int = 0  # forwards with at least one decoding row
    prefill_forwards: int = 0  # forwards with at least one prompt chunk
    started: float = field(factory=time.monotonic)


class Scheduler:
    """Owns the model and the KV cache; every method not marked thread-safe runs on its thread."""

    def __init__(
        self,
        model: EngineModel,
        *,
        eos_token_ids: Sequence[int] = (),
        weight_version: Any = 0,
        max_prefill_tokens: int = 4096,
        seed: int = 0,
        prefix_cache: bool = True,
        decode_text: Callable[[list[int]], str] | None = None,
    ) -> None:
        self.model = model
        self.max_running = model.max_slots
        self.eos_token_ids = frozenset(int(t) for t in eos_token_ids)
        self.weight_version = weight_version
        self.max_prefill_tokens = max_prefill_tokens
        self.prefix_cache = prefix_cache
        self.decode_text = decode_text
        self.rng = torch.Generator().manual_seed(seed)
        self.stats = EngineStats()
        self.paused = False
        self.released: set[str] = set()  # memory given up by /release_memory_occupation: "weights", "kv_cache"
        self.pending_update: set[str] = set()  # parameters written since the last pause
        self.model_path = ""
        # owned by the scheduler thread
        self.waiting: collections.deque[Request] = collections.deque()
        # running[k] is the request in KV slot k: running requests always hold slots 0..n-1, so
        # every forward reads one contiguous block of the cache (no gather); slots n.. hold
        # cached prefixes of finished requests (LRU) or nothing
        self.running: list[Request] = []
        # slot -> (adapter name or None, *tokens): a prefix is reused only under the adapter that computed it
        self.cached: collections.OrderedDict[int, tuple[Any, ...]] = collections.OrderedDict()
        self.adapters: dict[str, Adapter] = {}  # served LoRA adapters by name (engine/lora.py)
        self.slot_len = [0] * self.max_running  # valid cache positions held by each slot
        # shared with other threads, guarded by _cond
        self._cond = threading.Condition()
        self._incoming: list[Request] = []
        self._commands: list[tuple[Callable[[], Any], concurrent.futures.Future]] = []
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None

    # ------------------------------------------------------------------------------
    # Thread-safe API

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="engine-scheduler", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self.error is None

    def submit(self, request: Request) -> None:
        """Queue a request (thread-safe); ``request.on_finish`` is called on the scheduler thread."""
        with self._cond:
            if self._stopping:
                raise EngineConflict("the engine is shutting down")
            self._incoming.append(request)
            self._cond.notify()

    def cancel(self, rid: str | None = None) -> None:
        """Abort one request (or all with ``None``) at the next step boundary (thread-safe)."""
        self.call(lambda: self._abort(lambda r: rid is None or r.rid == rid, "aborted by the client"))

    def call(self, fn: Callable[[], Any]) -> concurrent.futures.Future:
        """Run ``fn`` on the scheduler thread between steps (thread-safe); a future of its result."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self._cond:
            if self._stopping:
                future.set_exception(EngineConflict("the engine is shutting down"))
                return future
            self._commands.append((fn, future))
            self._cond.notify()
        return future

    def load(self) -> dict[str, int]:
        return {"running": len(self.running), "waiting": len(self.waiting) + len(self._incoming)}

    # ------------------------------------------------------------------------------
    # Commands (scheduler thread)

    def pause(self, mode: str = "abort") -> int:
        """Stop generating; queued requests wait. Returns how many running requests were affected.

        ``abort``: running requests finish with ``abort`` and the tokens they have.
        ``retract``: running requests go back to the front of the queue, in order, with their
        tokens, log-probs and versions; after :meth:`resume` they are prefilled again (prompt +
        tokens so far, under the weights of that moment) and continue where they stopped.
        """
        if mode not in PAUSE_MODES:
            raise ValueError(f"unknown pause mode {mode!r}; use one of {', '.join(PAUSE_MODES)}")
        if not self.paused:
            self.paused = True
            self.pending_update = set()
        if mode == "retract":
            return self._retract_running()
        return self._abort(lambda r: True, ABORT_PAUSED, waiting=False)

    def resume(self, allow_partial_update: bool = False) -> None:
        if self.released:
            raise EngineConflict(f"the engine's {' and '.join(sorted(self.released))} memory is released: POST "
                                 "/resume_memory_occupation before /continue_generation")
        if self.pending_update and not allow_partial_update:
            missing = self.model.required_names() - self.pending_update
            if missing:
                raise EngineConflict(
                    f"the weight update since the pause wrote {len(self.pending_update)} of "
                    f"{len(self.model.required_names())} parameters (missing e.g. {sorted(missing)[0]!r}); send every "
                    "parameter, reload from disk, or continue with allow_partial_update=true"
                )
        self.paused = False
        self.pending_update = set()

    def flush_cache(self) -> int:
        dropped = len(self.cached)
        for slot in self.cached:
            self.slot_len[slot] = 0
        self.cached.clear()
        return dropped

    def release_memory(self, tags: Sequence[str]) -> dict[str, int]:
        """Free the KV cache and/or offload the weights (paused only); returns the bytes freed by tag.

        Requests retracted by the pause keep their tokens and are prefilled again after
        :meth:`resume_memory` and :meth:`resume`; every cached prefix is dropped.
        """
        self.require_paused("release_memory_occupation")
        freed = {}
        if "kv_cache" in tags and "kv_cache" not in self.released:
            self.flush_cache()
            self.slot_len = [0] * self.max_running
            freed["kv_cache"] = self.model.release_kv_cache()
        if "weights" in tags and "weights" not in self.released:
            freed["weights"] = self.model.release_weights()
        self.released.update(tags)
        return freed

    def resume_memory(self, tags: Sequence[str]) -> None:
        if "weights" in tags and "weights" in self.released:
            self.model.resume_weights()
        if "kv_cache" in tags and "kv_cache" in self.released:
            self.model.resume_kv_cache()
        self.released.difference_update(tags)

    def load_adapter(self, adapter: Adapter) -> None:
        """Serve ``adapter`` under its name (a name already loaded is refused: versions are immutable)."""
        if adapter.name in self.adapters:
            raise EngineConflict(f"an adapter named {adapter.name!r} is already loaded; load a new version under a "
                                 "new name (name@vN) or unload it first")
        self.adapters[adapter.name] = adapter
        log.info("adapter %s loaded from %s (%.2f MiB)", adapter.name, adapter.path, adapter.nbytes / 2**20)

    def unload_adapter(self, name: str) -> None:
        """Stop serving ``name``; refused while a request runs with it or waits for it."""
        adapter = self.adapters.get(name)
        if adapter is None:
            raise KeyError(f"no adapter named {name!r} is loaded (loaded: {', '.join(sorted(self.adapters)) or 'none'})")
        users = sum(1 for r in [*self.running, *self.waiting] if r.lora is adapter)
        if users:
            raise EngineConflict(f"adapter {name!r} is in use by {users} requests; unload it after they finish")
        del self.adapters[name]
        for slot, cached in list(self.cached.items()):
            if cached[0] == name:
                self.cached.pop(slot)
                self.slot_len[slot] = 0
        log.info("adapter %s unloaded", name)

    def resolve_adapter(self, name: str) -> Adapter | None:
        """The adapter named ``name``, or for a bare name (no ``@v``) the newest loaded ``name@vN``."""
        if name in self.adapters:
            return self.adapters[name]
        versions = [a for a in self.adapters.values() if a.name.rpartition("@v")[0] == name
                    and isinstance(a.version, int)]
        return max(versions, key=lambda a: a.version) if versions else None

    def require_paused(self, what: str) -> None:
        if not self.paused:
            raise EngineConflict(f"{what} needs generation paused first: POST /pause_generation, update, then "
                                 "POST /continue_generation")

    def apply_weights(self, named: Sequence[tuple[str, torch.Tensor]], version: Any, *, source: str) -> None:
        """Write tensors into the model (paused); the prefix cache is always dropped."""
        if "weights" in self.released:
            raise EngineConflict("the engine's weights are released: POST /resume_memory_occupation before a weight "
                                 "update")
        self.model.load_tensors(named)
        self.pending_update.update(_canonical(self.model, name) for name, _ in named)
        self.flush_cache()
        if version is not None:
            self.weight_version = int(version) if isinstance(version, str) and version.lstrip("-").isdigit() else version
        log.info("weights updated from %s: %d tensors, version %s", source, len(named), self.weight_version)

    # ------------------------------------------------------------------------------
    # The loop

    def _run(self) -> None:
        try:
            while True:
                with self._cond:
                    while not (self._stopping or self._commands or self._incoming
                               or (not self.paused and (self.waiting or self.running))):
                        self._cond.wait()
                    if self._stopping:
                        break
                    commands, self._commands = self._commands, []
                    self.waiting.extend(self._incoming)
                    self._incoming = []
                self._run_commands(commands)
                commands = []  # a finished command keeps nothing alive (a weight update holds its group)
                if not self.paused and (self.waiting or self.running):
                    try:
                        self._step()
                    except Exception as exc:  # fail the requests in flight with the reason, keep serving
                        log.exception("engine step failed")
                        self._reset(f"engine error: {type(exc).__name__}: {exc}", 500)
        except BaseException as exc:
            self.error = exc
            log.exception("the engine scheduler stopped")
        finally:
            self._fail_everything()

    @staticmethod
    def _run_commands(commands: list[tuple[Callable[[], Any], concurrent.futures.Future]]) -> None:
        for fn, future in commands:
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn())
                except BaseException as exc:  # the caller gets the error
                    future.set_exception(exc)

    def _reset(self, message: str, status_code: int) -> None:
        """After a failed step: fail every running request and forget every slot (nothing is trusted)."""
        running, self.running = self.running, []
        self.cached.clear()
        self.slot_len = [0] * self.max_running
        for request in running:
            request.slot = -1
            self._finish(request, {"type": "abort", "message": message, "status_code": status_code})

    def _fail_everything(self) -> None:
        message = f"engine stopped: {self.error}" if self.error else "the engine is shutting down"
        self._reset(message, 503)
        with self._cond:
            self.waiting.extend(self._incoming)
            self._incoming = []
            commands, self._commands = self._commands, []
        for request in list(self.waiting):
            self._finish(request, {"type": "abort", "message": message, "status_code": 503})
        self.waiting.clear()
        for _, future in commands:
            if future.set_running_or_notify_cancel():
                future.set_exception(EngineConflict(message))

    def _step(self) -> None:
        """Admit, then one forward: a decoding step of every decoding request and prompt chunks
        (within ``max_prefill_tokens``, in slot order) of the requests still being prefilled."""
        self._admit()
        rows: list[Request] = []
        tokens: list[list[int]] = []
        budget = self.max_prefill_tokens
        decoding = prefilling = False
        for request in self.running:
            # the request's sequence is prompt + tokens so far; positions [0, fed) are in its slot
            pending = len(request.input_ids) + len(request.output_ids) - request.fed
            if pending == 1 and request.output_ids:  # decoding: feed the token sampled last
                rows.append(request)
                tokens.append([request.output_ids[-1]])
                decoding = True
            elif budget > 0:  # a prompt chunk (or, after a retraction, prompt + tokens so far)
                n = min(pending, budget)
                budget -= n
                rows.append(request)
                tokens.append(_sequence_slice(request, request.fed, request.fed + n))
                prefilling = True
        if not rows:
            return
        t0 = time.perf_counter()
        adapters = [r.lora for r in rows] if self.adapters else None
        logits = self.model.extend([r.slot for r in rows], tokens, [r.fed for r in rows], adapters)
        self.stats.forward_seconds += time.perf_counter() - t0
        self.stats.forwards += 1
        self.stats.decode_steps += decoding
        self.stats.prefill_forwards += prefilling
        ready = []
        for i, (request, fed) in enumerate(zip(rows, tokens, strict=True)):
            request.fed += len(fed)
            self.slot_len[request.slot] = request.fed  # before any finish moves slots around
            if request.fed == len(request.input_ids) + len(request.output_ids):  # its last token was fed
                ready.append(i)
        if ready:
            self._sample_and_append([rows[i] for i in ready], logits[ready] if len(ready) < len(rows) else logits)

    # ------------------------------------------------------------------------------
    # Admission and prefix reuse

    def _admit(self) -> list[Request]:
        admitted: list[Request] = []
        while self.waiting and len(self.running) < self.max_running:
            request = self.waiting[0]
            if len(request.input_ids) >= self.model.max_context or not request.input_ids:
                self.waiting.popleft()
                self._finish(request, {"type": "abort", "status_code": 400, "message": (
                    f"the prompt has {len(request.input_ids)} tokens; the engine takes 1 to "
                    f"{self.model.max_context - 1} (max_context {self.model.max_context})")})
                continue
            if request.adapter is not None and request.lora is None:
                request.lora = self.resolve_adapter(request.adapter)
                if request.lora is None:  # never silently on the base model
                    self.waiting.popleft()
                    self._finish(request, {"type": "abort", "status_code": 400, "message": (
                        f"adapter {request.adapter!r} is not loaded on this engine (loaded: "
                        f"{', '.join(sorted(self.adapters)) or 'none'}); the request was not run on the base model")})
                    continue
            sequence = request.input_ids + request.output_ids if request.output_ids else request.input_ids
            source, reuse = self._best_prefix(sequence, request.lora.name if request.lora else None)
            self.waiting.popleft()
            request.slot = self._place(source)
            self.slot_len[request.slot] = reuse  # positions past the reused prefix are stale
            request.fed = reuse
            self.running.append(request)
            admitted.append(request)
            if request.admitted:  # back after a retraction: its tokens so far are prefilled again
                self.stats.recomputed_tokens += len(sequence) - reuse
                continue
            request.cached_tokens = reuse
            request.version = request.lora.version if request.lora else self.weight_version
            request.admitted = time.monotonic()
            request.stop_ids = frozenset(request.params.stop_token_ids) | (
                frozenset() if request.params.ignore_eos else self.eos_token_ids)
            if request.params.seed is not None:
                request.generator = torch.Generator().manual_seed(int(request.params.seed))
            self.stats.requests += 1
            self.stats.prompt_tokens += len(request.input_ids)
            self.stats.cached_tokens += reuse
        return admitted

    def _best_prefix(self, tokens: list[int], adapter: str | None = None) -> tuple[int, int]:
        """The cached slot sharing the longest prefix with ``tokens`` under ``adapter`` (or -1), and how
        much to reuse."""
        best_slot, best = -1, 0
        if self.prefix_cache:
            keyed = (adapter, *tokens)
            for slot, cached in self.cached.items():
                n = _common_prefix(cached, keyed) - 1  # the adapter leads: a different one matches nothing
                if n > best:
                    best_slot, best = slot, n
        return best_slot, min(best, len(tokens) - 1)  # the last prompt token is always recomputed

    def _place(self, source: int) -> int:
        """Give the next running request slot ``n`` (the first free position), holding ``source``'s cache."""
        target = len(self.running)
        if source < 0:  # no reusable prefix: an empty slot, else evict the least recently used prefix
            empty = [s for s in range(target, self.max_running) if s not in self.cached]
            source = empty[0] if empty else next(iter(self.cached))
            self.cached.pop(source, None)
            self.slot_len[source] = 0
        else:
            self.cached.pop(source)
        self._swap(source, target)
        self.cached.pop(target, None)  # whatever moved out of the target stays cached at source
        return target

    def _swap(self, a: int, b: int) -> None:
        """Exchange the contents (cache, length, cached tokens) of slots ``a`` and ``b``."""
        if a == b:
            return
        length = max(self.slot_len[a], self.slot_len[b])
        if length:
            self.model.swap_slots(a, b, length)
        self.slot_len[a], self.slot_len[b] = self.slot_len[b], self.slot_len[a]
        tokens_a, tokens_b = self.cached.pop(a, None), self.cached.pop(b, None)
        if tokens_a is not None:
            self.cached[b] = tokens_a
        if tokens_b is not None:
            self.cached[a] = tokens_b

    # ------------------------------------------------------------------------------
    # Forward passes

    def _sample_and_append(self, requests: list[Request], logits: torch.Tensor) -> None:
        t0 = time.perf_counter()
        tokens, logprobs = sample(logits, [r.params for r in requests], [r.generator for r in requests], self.rng)
        self.stats.sampling_seconds += time.perf_counter() - t0
        for request, token, logprob in zip(requests, tokens, logprobs, strict=True):
            request.output_ids.append(token)
            request.logprobs.append(logprob)
            request.versions.append(request.lora.version if request.lora else self.weight_version)
            self.stats.generated_tokens += 1
            reason = self._finish_reason(request, token)
            if reason is not None:
                self._finish(request, reason)

    def _finish_reason(self, request: Request, token: int) -> dict[str, Any] | None:
        params = request.params
        if token in request.stop_ids:
            return {"type": "stop", "matched": token}
        if params.stop and self.decode_text is not None:
            longest = max(len(s) for s in params.stop)
            tail = self.decode_text(request.output_ids[-(4 * longest + 2):])
            for stop in params.stop:
                if stop in tail:
                    return {"type": "stop", "matched": stop}
        if len(request.output_ids) >= params.max_new_tokens:
            return {"type": "length", "length": len(request.output_ids)}
        if len(request.input_ids) + len(request.output_ids) >= self.model.max_context:
            return {"type": "length", "length": len(request.output_ids)}
        return None

    def _leave_running(self, request: Request) -> None:
        """Take ``request`` out of the running set; its slot keeps the keys/values fed so far as a
        cached prefix (valid until the weights change: every weight update flushes the cache)."""
        slot, last = request.slot, len(self.running) - 1
        if slot != last:  # keep running requests packed: the last one moves into the hole
            mover = self.running[last]
            self._swap(slot, last)
            mover.slot = slot
            self.running[slot] = mover
        self.running.pop()
        fed = _sequence_slice(request, 0, request.fed) if request.output_ids else None
        if fed and self.prefix_cache:
            self.cached[last] = (request.lora.name if request.lora else None, *fed)
            self.slot_len[last] = len(fed)
        else:
            self.slot_len[last] = 0
        request.slot = -1

    def _retract_running(self) -> int:
        """Send every running request back to the front of the queue (in order), tokens kept."""
        retracted = list(self.running)
        for request in reversed(retracted):  # the last one leaves first: no slot moves
            self._leave_running(request)
            request.retractions += 1
        self.waiting.extendleft(reversed(retracted))
        self.stats.retracted += len(retracted)
        return len(retracted)

    def _finish(self, request: Request, reason: dict[str, Any]) -> None:
        if request.finished:
            return
        request.finished = True
        if request.slot >= 0:
            self._leave_running(request)
        if reason["type"] == "abort":
            self.stats.aborted += 1
        now = time.monotonic()
        completion = Completion(
            rid=request.rid,
            output_ids=list(request.output_ids),
            logprobs=list(request.logprobs),
            finish_reason=reason,
            weight_version=request.versions[-1] if request.versions else (
                request.version if request.version is not None else self.weight_version),
            prompt_tokens=len(request.input_ids),
            cached_tokens=request.cached_tokens,
            queue_seconds=(request.admitted or now) - request.arrived,
            total_seconds=now - request.arrived,
            versions=list(request.versions),
            retractions=request.retractions,
        )
        try:
            request.on_finish(completion)
        except Exception:
            log.exception("delivering the result of request %s failed", request.rid)

    def _abort(self, which: Callable[[Request], bool], message: str, *, waiting: bool = True,
               status_code: int | None = None) -> int:
        victims = [r for r in self.running if which(r)]
        if waiting:
            queued = [r for r in self.waiting if which(r)]
            for request in queued:
                self.waiting.remove(request)
            victims += queued
        reason: dict[str, Any] = {"type": "abort", "message": message}
        if status_code is not None:
            reason["status_code"] = status_code
        for request in victims:
            self._finish(request, dict(reason))
        return len(victims)


# ---------------------------------------------------------------------------------------
# Helpers


def _sequence_slice(request: Request, start: int, end: int) -> list[int]:
    """Positions ``[start, end)`` of the request's sequence, prompt + tokens so far (no full copy)."""
    n = len(request.input_ids)
    if end <= n:
        return request.input_ids[start:end]
    if start >= n:
        return request.output_ids[start - n : end - n]
    return request.input_ids[start:] + request.output_ids[: end - n]


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the common prefix (binary search over C-speed slice comparisons)."""
    n = min(len(a), len(b))
    if n == 0 or a[0] != b[0]:
        return 0
    if list(a[:n]) == list(b[:n]):
        return n
    lo, hi = 1, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if list(a[:mid]) == list(b[:mid]):
            lo = mid
        else:
            hi = mid
    return lo


def _canonical(model: EngineModel, name: str) -> str:
    """The name under which ``named_parameters`` lists the tensor ``name`` writes."""
    if name == "lm_head.weight" and getattr(model.config, "tie_word_embeddings", False):
        return "model.embed_tokens.weight"
    return name
