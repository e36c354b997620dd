"""agentrl's engine protocol (SGLang's native ``/generate``) <-> vLLM's token-in/token-out API.

Pure functions, tested without a server:

* :func:`vllm_sampling_params`: SGLang ``sampling_params`` -> vLLM ``SamplingParams`` fields
  (``max_new_tokens`` -> ``max_tokens``, ``top_k -1`` -> ``0``, ``no_stop_trim`` ->
  ``include_stop_str_in_output``, ``logprobs: 0`` = the sampled token's log-prob only).
  Penalties, ``n`` and ``min_new_tokens`` are accepted only at their neutral values, as by
  the hf engine (core/docs/engine.md section 1); unknown keys are refused.
* :func:`sglang_answer`: one choice of vLLM's ``/inference/v1/generate`` answer -> SGLang's
  ``{text, output_ids, meta_info}``.

Log-probs: the vLLM server runs with ``--logprobs-mode processed_logprobs``, so the value
of each sampled token is ``log_softmax`` of the logits after temperature (and after
top-k/top-p/min-p masking: with ``top_p < 1`` they are renormalized over the kept tokens,
where our contract is not; training uses ``top_p = 1, top_k = -1``, where both coincide).
At temperature 0 vLLM returns the unscaled log-probs, as our contract says.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

SAMPLING_KEYS = frozenset({
    "temperature", "top_p", "top_k", "min_p", "max_new_tokens", "stop", "stop_token_ids", "ignore_eos",
    "skip_special_tokens", "seed", "sampling_seed", "no_stop_trim", "n", "frequency_penalty", "presence_penalty",
    "repetition_penalty", "min_new_tokens", "spaces_between_special_tokens",
})
NEUTRAL = {"n": 1, "frequency_penalty": 0.0, "presence_penalty": 0.0, "repetition_penalty": 1.0, "min_new_tokens": 0}
DEFAULT_MAX_NEW_TOKENS = 128  # the hf engine's default, so both drivers answer the same request alike


class WireError(ValueError):
    """A request this engine refuses (HTTP 400); the message is one sentence for the caller."""


def _number(raw: Mapping[str, Any], key: str, default: float, kind: type = float) -> Any:
    value = raw.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or (kind is int and value != int(value)):
        raise WireError(f"sampling_params.{key} must be {'an integer' if kind is int else 'a number'}, got {value!r}")
    return kind(value)


def vllm_sampling_params(raw: Any, *, return_logprob: bool = True) -> dict[str, Any]:
    """SGLang ``sampling_params`` -> the ``sampling_params`` of vLLM's ``/inference/v1/generate``."""
    raw = {} if raw is None else raw
    if not isinstance(raw, Mapping):
        raise WireError("sampling_params must be a JSON object")
    unknown = sorted(set(raw) - SAMPLING_KEYS)
    if unknown:
        raise WireError(f"unknown sampling_params {unknown}; the vllm engine takes {sorted(SAMPLING_KEYS)}")
    for key, neutral in NEUTRAL.items():
        if raw.get(key) is not None and raw[key] != neutral:
            raise WireError(f"sampling_params.{key}={raw[key]!r} is not supported by agentrl's engine protocol "
                            f"(only {neutral!r})")
    temperature = _number(raw, "temperature", 1.0)
    top_p = _number(raw, "top_p", 1.0)
    top_k = _number(raw, "top_k", -1, int)
    min_p = _number(raw, "min_p", 0.0)
    max_new = _number(raw, "max_new_tokens", DEFAULT_MAX_NEW_TOKENS, int)
    if temperature < 0:
        raise WireError(f"sampling_params.temperature must be >= 0, got {temperature}")
    if not 0.0 < top_p <= 1.0:
        raise WireError(f"sampling_params.top_p must be in (0, 1], got {top_p}")
    if not 0.0 <= min_p <= 1.0:
        raise WireError(f"sampling_params.min_p must be in [0, 1], got {min_p}")
    if max_new < 1:
        raise WireError(f"sampling_params.max_new_tokens must be >= 1, got {max_new}")
    stop = raw.get("stop") or []
    stop = [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list | tuple) or not all(isinstance(s, str) and s for s in stop):
        raise WireError("sampling_params.stop must be a string or a list of non-empty strings")
    stop_ids = raw.get("stop_token_ids") or []
    if not isinstance(stop_ids, list | tuple) or not all(isinstance(t, int) and not isinstance(t, bool)
                                                         for t in stop_ids):
        raise WireError("sampling_params.stop_token_ids must be a list of token ids")
    seed = raw.get("sampling_seed", raw.get("seed"))
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise WireError(f"sampling_params.seed must be an integer, got {seed!r}")
    params: dict[str, Any] = {
        "temperature": temperature, "top_p": top_p, "top_k": top_k if top_k > 0 else 0, "min_p": min_p,
        "max_tokens": max_new, "ignore_eos": bool(raw.get("ignore_eos", False)),
        "skip_special_tokens": bool(raw.get("skip_special_tokens", True)),
        "include_stop_str_in_output": bool(raw.get("no_stop_trim", False)),
    }
    if stop:
        params["stop"] = list(stop)
    if stop_ids:
        params["stop_token_ids"] = [int(t) for t in stop_ids]
    if seed is not None:
        params["seed"] = seed
    if return_logprob:
        params["logprobs"] = 0  # the sampled token's log-prob, no alternatives
    return params


def version_value(version: Any) -> int | str:
    """vLLM labels versions with strings; ours are ints when they look like one."""
    text = str(version)
    return int(text) if text.lstrip("-").isdigit() else text


def adapter_version(name: str) -> int | str:
    """The version of a served adapter named ``<name>@v<N>`` (``N`` as an int), else the whole name."""
    _, sep, tail = name.rpartition("@v")
    return int(tail) if sep and tail.isdigit() else name


def sglang_answer(choice: Mapping[str, Any], *, rid: str, prompt_tokens: int, decode: Callable[[Sequence[int]], str],
                  no_stop_trim: bool = False, latency: float = 0.0) -> dict[str, Any]:
    """One vLLM choice -> SGLang's ``/generate`` answer (``output_ids`` include a matched stop token).

    ``weight_versions`` keeps vLLM's spans (a request paused with ``retract``, vLLM's ``keep``,
    and continued after an update holds tokens of two versions, each span tagged with its
    own); ``weight_version`` is the last span's, as SGLang reports it.
    """
    ids = [int(t) for t in choice.get("token_ids") or []]
    content = (choice.get("logprobs") or {}).get("content")
    logprobs = [float(entry["logprob"]) for entry in content] if content is not None else None
    if logprobs is not None and len(logprobs) != len(ids):
        raise ValueError(f"vLLM returned {len(ids)} tokens with {len(logprobs)} log-probs")
    spans = choice.get("weight_versions") or []
    versions = [version_value(s["version"]) for s in spans]
    kind = choice.get("finish_reason") or "stop"
    matched = choice.get("stop_reason")
    reason: dict[str, Any]
    if kind == "abort":
        reason = {"type": "abort", "message": "aborted (a weight update paused generation, or abort_request)"}
    elif kind == "length":
        reason = {"type": "length"}
    elif kind == "stop":
        if matched is None and ids:
            matched = ids[-1]  # an EOS token, which vLLM reports as stop_reason None
        reason = {"type": "stop", "matched": matched}
    else:
        reason = {"type": "abort", "message": f"vLLM finished with {kind!r}"}
    text_ids = ids
    if reason["type"] == "stop" and isinstance(matched, int) and ids and ids[-1] == matched and not no_stop_trim:
        text_ids = ids[:-1]
    text = decode(text_ids) if text_ids else ""
    if reason["type"] == "stop" and isinstance(matched, str) and not no_stop_trim:
        cut = text.find(matched)
        if cut >= 0:
            text = text[:cut]
    version = versions[-1] if versions else None
    meta: dict[str, Any] = {
        "id": rid,
        "finish_reason": reason,
        "weight_version": version,
        "weight_versions": [{"version": version_value(s["version"]), "start": s["start"], "end": s["end"]}
                            for s in spans],
        "prompt_tokens": prompt_tokens,
        "completion_tokens": len(ids),
        "cached_tokens": 0,  # vLLM reports prefix-cache hits only in aggregate metrics
        "e2e_latency": round(latency, 6),
    }
    if logprobs is not None:
        meta["output_token_logprobs"] = [[lp, tid, None] for lp, tid in zip(logprobs, ids)]
    return {"text": text, "output_ids": ids, "meta_info": meta}
