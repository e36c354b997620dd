"""The OpenAI endpoints of the gateway: one handler per endpoint.

Each call: find the session (401 if none), answer a replayed retry from its first answer,
plan the prompt against the session's captured tokens (:mod:`.capture`), generate on the
engine pool the sampler picks, commit the sampled tokens, and answer in OpenAI's format
(a JSON body, or server-sent events when ``stream`` is set; both record the same tokens).
"""

from __future__ import annotations

import time
import uuid
from typing import TYPE_CHECKING, Any

from agentrl_core.gateway.capture import Plan, Sampled, commit, plan_chat, plan_text
from agentrl_core.gateway.protocol import (
    OpenAIError,
    Reply,
    SamplingRequest,
    chat_body,
    chat_stream,
    completion_body,
    completion_stream,
    models_body,
    now,
    parse_chat_request,
    parse_completion_request,
)
from agentrl_core.http.server import Request, Response, json_response

if TYPE_CHECKING:
    from agentrl_core.gateway.server import GatewayServer
    from agentrl_core.gateway.sessions import GatewaySession


async def list_models(gateway: GatewayServer, request: Request) -> Any:
    return models_body(gateway.served_model_name, gateway.model_path, gateway.started)


async def chat_completions(gateway: GatewayServer, request: Request) -> Response:
    session = gateway.session_for_call(request)
    return await gateway.once(session, request, lambda: _chat(gateway, session, request))


async def completions(gateway: GatewayServer, request: Request) -> Response:
    session = gateway.session_for_call(request)
    return await gateway.once(session, request, lambda: _completion(gateway, session, request))


async def _chat(gateway: GatewayServer, session: GatewaySession, request: Request) -> Response:
    t0 = time.monotonic()
    req = parse_chat_request(request.json_object())
    conv = session.conversation
    plan = plan_chat(conv, gateway.renderer, req.messages, req.tools, req.template_kwargs,
                     keep_history=gateway.config.on_template_rewrite == "keep_history")
    encoder, _ = gateway.renderer.encoder(plan.key, req.tools, req.template_kwargs)
    generated = await _generate(gateway, session, plan, req.sampling, stop_token_ids=encoder.stop_token_ids)
    ids = list(generated.ids)
    ended = bool(ids) and ids[-1] in encoder.stop_token_ids
    text = _text(gateway, ids[:-1] if ended else ids, req.sampling.stop)
    reasoning, content = gateway.reasoning_parser.parse(text) if gateway.reasoning_parser else (None, text)
    calls: list[dict[str, Any]] = []
    if req.tools and req.tool_choice != "none":
        calls, normal, error = gateway.tool_parser.parse(content, req.tools)
        if calls:
            content = normal
        if error:
            session.counters["tool_parse_errors"] += 1
    finish = "tool_calls" if calls else generated.finish_reason
    reply_message: dict[str, Any] = {"role": "assistant", "content": content if (content or not calls) else None}
    if calls:
        reply_message["tool_calls"] = calls
    if reasoning is not None:
        reply_message["reasoning_content"] = reasoning
    kind = commit(conv, plan, Sampled(ids, list(generated.logprobs), list(generated.versions), ended),
                  reply=reply_message, reasoning=reasoning, close_turn_id=encoder.eot_id)
    _record(gateway, session, plan, kind, generated, len(ids), t0)
    reply = Reply(
        id=f"chatcmpl-{uuid.uuid4().hex}", model=req.model or gateway.served_model_name, created=now(), text=content,
        reasoning=reasoning, tool_calls=calls, finish_reason=finish,
        token_pieces=_pieces(gateway, ids) if req.logprobs else [], logprobs=list(generated.logprobs),
        prompt_tokens=len(plan.prompt_ids), completion_tokens=len(ids),
        weight_version=generated.versions[-1] if generated.versions else None,
    )
    response = (chat_stream(reply, logprobs=req.logprobs, include_usage=req.include_usage) if req.stream
                else json_response(chat_body(reply, logprobs=req.logprobs)))
    gateway.latency.add(time.monotonic() - t0, generated.seconds)
    return response


async def _completion(gateway: GatewayServer, session: GatewaySession, request: Request) -> Response:
    t0 = time.monotonic()
    req = parse_completion_request(request.json_object())
    prompt_ids = req.prompt if isinstance(req.prompt, list) else gateway.renderer.tokenize(req.prompt)
    if not prompt_ids:
        raise OpenAIError(400, "the prompt has no tokens", param="prompt")
    plan = plan_text(session.conversation, gateway.renderer, prompt_ids)
    generated = await _generate(gateway, session, plan, req.sampling, stop_token_ids=None)
    ids = list(generated.ids)
    text = _text(gateway, ids, req.sampling.stop)
    kind = commit(session.conversation, plan, Sampled(ids, list(generated.logprobs), list(generated.versions), True),
                  reply=None, reasoning=None, close_turn_id=None)
    _record(gateway, session, plan, kind, generated, len(ids), t0)
    reply = Reply(
        id=f"cmpl-{uuid.uuid4().hex}", model=req.model or gateway.served_model_name, created=now(), text=text,
        reasoning=None, tool_calls=[], finish_reason=generated.finish_reason,
        token_pieces=_pieces(gateway, ids) if req.logprobs else [], logprobs=list(generated.logprobs),
        prompt_tokens=len(plan.prompt_ids), completion_tokens=len(ids),
        weight_version=generated.versions[-1] if generated.versions else None,
    )
    echo = (req.prompt if isinstance(req.prompt, str) else gateway.renderer.decode(req.prompt)) if req.echo else None
    response = (completion_stream(reply, logprobs=req.logprobs, include_usage=req.include_usage, prompt_text=echo)
                if req.stream else json_response(completion_body(reply, logprobs=req.logprobs, prompt_text=echo)))
    gateway.latency.add(time.monotonic() - t0, generated.seconds)
    return response


async def _generate(gateway: GatewayServer, session: GatewaySession, plan: Plan, sampling: SamplingRequest, *,
                    stop_token_ids: list[int] | None) -> Any:
    rollout = gateway.rollout
    room = rollout.max_total_len - len(plan.prompt_ids)
    if room <= 0:
        session.context_limit = True
        session.counters["context_limit"] += 1
        raise OpenAIError(400, f"this prompt has {len(plan.prompt_ids)} tokens; a sample holds at most "
                          f"{rollout.max_total_len} (rollout.max_total_len)", param="messages",
                          code="context_length_exceeded")
    max_new = min(sampling.max_tokens or rollout.max_new_tokens, rollout.max_new_tokens, room)
    params: dict[str, Any] = {"max_new_tokens": max_new}
    if gateway.config.sampling == "rollout":
        params.update(temperature=rollout.temperature, top_p=rollout.top_p, top_k=rollout.top_k)
    else:
        params["temperature"] = 1.0 if sampling.temperature is None else sampling.temperature
        for name in ("top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty"):
            value = getattr(sampling, name)
            if value is not None:
                params[name] = value
    if sampling.stop:
        params["stop"] = list(sampling.stop)
    if sampling.seed is not None:
        params["seed"] = sampling.seed
    if stop_token_ids:
        params["stop_token_ids"] = list(stop_token_ids)
    pool = gateway.router.choose_pool(group_id=session.group_id or session.id, sample=session.sample,
                                      turn=session.calls, task=session.task)
    session.call_started()
    try:
        return await gateway.router.generate(session.id, plan.prompt_ids, params, pool_name=pool,
                                             wait_limit=gateway.config.max_duration,
                                             stop_token_ids=stop_token_ids or (),
                                             partial_rollouts=rollout.partial_rollouts)
    except OpenAIError as exc:
        if exc.status == 429:
            session.counters["rejected"] += 1
        raise
    finally:  # nothing awaits between here and the commit, so a settled session has every token filed
        session.call_ended()


def _record(gateway: GatewayServer, session: GatewaySession, plan: Plan, kind: str, generated: Any, n: int,
            started: float) -> None:
    overhead_ms = max(0.0, (time.monotonic() - started - generated.seconds) * 1000)
    session.calls += 1
    session.last_active = time.monotonic()
    session.turns.append({"kind": kind, "pool": generated.pool, "engine": generated.engine,
                          "version": generated.versions[0] if generated.versions else -1, "num_tokens": n,
                          "prompt_tokens": len(plan.prompt_ids), "finish_reason": generated.finish_reason,
                          "aborted_retries": generated.aborted, "interrupted": generated.interrupted,
                          "mixed_versions": generated.mixed, "gateway_ms": round(overhead_ms, 3)})
    gateway.counters["calls"] += 1
    gateway.counters[f"calls/{kind}"] += 1


def _text(gateway: GatewayServer, ids: list[int], stop: list[str]) -> str:
    """The reply's text, cut before the first stop string (the tokens keep it: they were sampled)."""
    text = gateway.renderer.decode(ids)
    cuts = [text.index(s) for s in stop if s and s in text]
    return text[: min(cuts)] if cuts else text


def _pieces(gateway: GatewayServer, ids: list[int]) -> list[str]:
    return [gateway.renderer.decode([t]) for t in ids]
