"""The task worker, the hf engine and the training gateway fuzzed from their own OpenAPI documents.

As the controller is (test_control_plane_fuzz.py): real services, each with a run token; every
generated request carries it and must get a documented status, never a 5xx; every route the
service serves is in its document; and every route answers 401, not 5xx, to a request without
the token. Values that name things (session ids, task indices, pools) are drawn partly from
real ones so that requests get past "unknown session"; state-changing admin routes are fuzzed
last and undone.
"""

from __future__ import annotations

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import content_type_conformance, status_code_conformance
from test_control_plane_faults import TASK, plugin_env, start_controller, start_worker  # noqa: F401

from agentrl_core.http.openapi import routes_of

pytestmark = pytest.mark.processes

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance]
TOKEN = "fuzz-run-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
LAST = ("pause", "continue", "admin", "destroy", "update_weights", "init_weights")  # fuzzed last, in this order


def fuzz(base_url: str, document: dict, *, examples: int = 25, skip_unauthenticated: tuple[str, ...] = ()) -> None:
    """Fuzz every operation of ``document`` at ``base_url``; fail with every finding at once."""
    assert httpx.get(f"{base_url}/openapi.json").status_code == 401
    for path, ops in document["paths"].items():  # without the token: 401, never 5xx (and never served)
        if path.startswith(skip_unauthenticated):
            continue
        for method in ops:
            response = httpx.request(method.upper(), base_url + path.replace("{id}", "x"), json={}, timeout=30)
            assert response.status_code == 401, f"{method.upper()} {path} without the token: {response.status_code}"
    schema = schemathesis.openapi.from_dict(document)
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) == sum(len(ops) for ops in document["paths"].values())

    def rank(op) -> int:
        return next((i + 1 for i, word in enumerate(LAST) if word in op.path), 0)

    failures = []
    for operation in sorted(operations, key=rank):

        @given(case=operation.as_strategy())
        @settings(max_examples=examples, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck),
                  database=None)
        def run(case):
            response = case.call(base_url=base_url, timeout=30, headers=AUTH)
            case.validate_response(response, checks=CHECKS)

        try:
            run()
        except Exception as exc:
            failures.append(f"{operation.label}: {exc}")
    assert not failures, "\n\n".join(failures)


def set_schema(document: dict, path: str, method: str, schema: dict) -> None:
    document["paths"][path][method]["requestBody"]["content"]["application/json"]["schema"] = schema


def set_param(document: dict, name: str, schema: dict) -> None:
    for ops in document["paths"].values():
        for op in ops.values():
            for param in op.get("parameters", []):
                if param["name"] == name:
                    param["schema"] = schema


# -- the task worker ----------------------------------------------------------------------


def test_worker_api_fuzzed(plugin_env):  # noqa: F811
    controller = start_controller(env={"AGENTRL_TOKEN": TOKEN})
    worker = start_worker(controller, {**plugin_env, "AGENTRL_TOKEN": TOKEN}, "--concurrency", "8")
    try:
        base = worker.url.removesuffix("/api")
        live = []
        for i, sid in enumerate((900001, 900002, 900003)):
            response = httpx.post(f"{worker.url}/start_sample", json={"session_id": sid, "index": i}, headers=AUTH)
            assert response.status_code == 200, response.text
            live.append(sid)
        document = httpx.get(f"{base}/openapi.json", headers=AUTH).json()
        served = {(m, p) for m, p in worker_routes()}
        assert routes_of(document) == served
        ids = {"type": "integer", "enum": [*live, 999999999, 0]}
        set_param(document, "session_id", {"type": "string", "enum": [str(s) for s in live] + ["999999999"]})
        schemas = document["components"]["schemas"]
        schemas["WorkerStart"]["properties"]["session_id"] = {"oneOf": [ids, {"type": "integer", "minimum": 0}]}
        schemas["WorkerStart"]["properties"]["index"] = {"oneOf": [{"type": "integer", "enum": [0, 5, 19, 20, -1]},
                                                                   {"type": "string"}]}
        schemas["WorkerInteract"]["properties"]["session_id"] = ids
        fuzz(base, document)
    finally:
        worker.stop()
        assert controller.stop() == 0


def worker_routes() -> set[tuple[str, str]]:
    from agentrl_core.controlplane.worker import TaskWorker
    from agentrl_core.env import Environment

    class Empty(Environment):
        name = "empty"
        tools = []

        def index_sets(self):
            return {"std": [0]}

        async def open(self, split, index):  # pragma: no cover - never called
            raise NotImplementedError

    return set(TaskWorker(Empty(), "std", token=TOKEN).app.routes)


# -- the engine -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    from agentrl_core.engine.process import BackgroundEngine
    from agentrl_core.engine.server import EngineServer

    server = EngineServer(tiny_model_dir, max_running_requests=8, max_context=256, dtype="float32", token=TOKEN)
    with BackgroundEngine(server) as background:
        yield background


def test_engine_api_fuzzed(engine, tiny_model_dir):
    document = httpx.get(f"{engine.url}/openapi.json", headers=AUTH).json()
    assert routes_of(document) == set(engine.server.app.routes)
    schemas = document["components"]["schemas"]
    # bounded generations (the tiny model on CPU), and weight-update groups that never wait for peers
    schemas["SamplingParams"]["properties"]["max_new_tokens"] = {"type": "integer", "maximum": 8}
    schemas["ChatCompletion"]["properties"]["max_tokens"] = {"type": "integer", "maximum": 8}
    schemas["ChatCompletion"]["required"] = ["messages", "max_tokens"]
    schemas["InitGroup"]["properties"]["world_size"] = {"type": "integer", "maximum": 1}
    schemas["InitGroup"]["properties"]["master_address"] = {"type": "string", "enum": ["127.0.0.1", "no-such-host"]}
    set_schema(document, "/update_weights_from_disk", "post", {
        "type": "object", "required": ["model_path"], "properties": {
            "model_path": {"oneOf": [{"type": "string", "enum": [str(tiny_model_dir), "/nonexistent"]},
                                     {"type": "string"}]},
            "weight_version": {"type": "string"}}})
    try:
        fuzz(engine.url, document)
    finally:
        httpx.post(f"{engine.url}/continue_generation", json={}, headers=AUTH)
    # still serving after the fuzzing
    response = httpx.post(f"{engine.url}/generate", json={"input_ids": [1, 2, 3], "sampling_params": {
        "max_new_tokens": 2}}, headers=AUTH, timeout=30)
    assert response.status_code == 200, response.text


# -- the gateway ----------------------------------------------------------------------------


def test_gateway_api_fuzzed(engine, tiny_model_dir):
    from agentrl_core.config import config_from_dict
    from agentrl_core.gateway.process import BackgroundGateway, build_gateway

    config = config_from_dict({"model": {"path": str(tiny_model_dir)},
                               "rollout": {"max_new_tokens": 4, "max_total_len": 1024, "temperature": 1.0}})
    with BackgroundGateway(build_gateway(config, {"current": [engine.url]}, token=TOKEN)) as gateway:
        url = gateway.url
        document = httpx.get(f"{url}/openapi.json", headers=AUTH).json()
        aliases = {("POST", "/sessions/{id}/v1/chat/completions"), ("POST", "/sessions/{id}/v1/completions")}
        assert routes_of(document) - aliases == set(gateway.server.app.routes)
        live = [httpx.post(f"{url}/sessions", json={"task": "fuzz"}, headers=AUTH).json()["id"] for _ in range(4)]
        set_param(document, "id", {"type": "string", "enum": [*live, "no-such-session"]})
        set_schema(document, "/admin/pools", "post", {"type": "object", "required": ["pools"], "properties": {
            "pools": {"anyOf": [{"type": "object", "required": ["current"], "additionalProperties": False,
                                 "properties": {"current": {"type": "array", "minItems": 1, "items": {
                                     "type": "string", "enum": [engine.url]}}}},
                                {"type": "object"}]}}})
        try:
            fuzz(url, document, skip_unauthenticated=("/v1/", "/sessions/{id}/v1/"))
        finally:
            httpx.post(f"{url}/admin/pools", json={"pools": {"current": [engine.url]}}, headers=AUTH)
            httpx.post(f"{url}/admin/continue", json={}, headers=AUTH)
        session = httpx.post(f"{url}/sessions", json={}, headers=AUTH).json()
        reply = httpx.post(f"{session['base_url']}/chat/completions", json={
            "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}, timeout=30)
        assert reply.status_code == 200, reply.text


def test_engine_refuses_what_the_fuzzing_found_with_one_sentence(engine):
    # a seed past 64 bits used to fail the scheduler's step, so every request in flight got a 500
    response = httpx.post(f"{engine.url}/generate", json={"input_ids": [1, 2], "sampling_params": {
        "max_new_tokens": 2, "seed": 2**70}}, headers=AUTH, timeout=30)
    assert response.status_code == 400 and "64-bit" in response.json()["detail"]
    # a rank outside the group used to wait for its peers for the group timeout (30 min)
    response = httpx.post(f"{engine.url}/init_weights_update_group", json={
        "master_address": "127.0.0.1", "master_port": 29999, "rank_offset": 1, "world_size": 1}, headers=AUTH,
        timeout=30)
    assert response.status_code == 400 and "rank_offset < world_size" in response.json()["message"]
