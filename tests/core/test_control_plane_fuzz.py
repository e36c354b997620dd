"""The controller API fuzzed from its own OpenAPI document (schemathesis, bounded).

A real controller and worker run as processes, sharing a run token as ``agentrl train``
starts them; every generated request carries it and must get a documented status with a
JSON (or text, for metrics) body matching the document, and never a 5xx.
"""

from __future__ import annotations

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from test_control_plane_faults import TASK, plugin_env, start_controller, start_worker, wait_alive  # noqa: F401

pytestmark = pytest.mark.processes

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
TOKEN = "fuzz-run-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def fuzzed_controller(plugin_env):  # noqa: F811
    # a short connect timeout: fuzzed heartbeats register workers at addresses that do not exist
    controller = start_controller("--max-body-bytes", "65536", "--connect-timeout", "0.5",
                                  env={"AGENTRL_TOKEN": TOKEN})
    worker = start_worker(controller, {**plugin_env, "AGENTRL_TOKEN": TOKEN}, "--concurrency", "8")
    wait_alive(controller.url, headers=AUTH)
    yield controller
    worker.stop()
    assert controller.stop() == 0, "the controller did not survive the fuzzing"


def focus(document: dict, live_sessions: list[int]) -> dict:
    """Point a share of the generated values at real things, so requests get past "unknown task".

    Task names are drawn from (the real task, a missing one), session ids from live sessions
    plus an unknown one; every other field stays as random as the document allows.
    """
    names = {"type": "string", "enum": [TASK, "missing-task"]}
    ids = [str(s) for s in live_sessions] + ["999999999"]
    for ops in document["paths"].values():
        for op in ops.values():
            for param in op.get("parameters", []):
                if param["name"] == "name":
                    param["schema"] = names
                elif param["name"] == "session_id":
                    param["schema"] = {"type": "string", "enum": ids}
    schemas = document["components"]["schemas"]
    schemas["StartSample"]["properties"]["name"] = names
    schemas["MarkStale"]["properties"]["name"] = names
    return document


def test_controller_api_fuzzed(fuzzed_controller):
    # schemathesis' pytest plugin does not run under pytest 9 yet, so drive hypothesis per operation
    root = fuzzed_controller.url.removesuffix("/api")
    live = [int(httpx.post(f"{fuzzed_controller.url}/start_sample", json={"name": TASK, "index": i},
                           headers=AUTH).headers["session_id"]) for i in range(3)]
    assert httpx.get(f"{root}/openapi.json").status_code == 401
    document = focus(httpx.get(f"{root}/openapi.json", headers=AUTH).json(), live)
    schema = schemathesis.openapi.from_dict(document)
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) == 17, sorted(op.label for op in operations)
    failures = []
    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(max_examples=30, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck),
                  database=None)
        def fuzz(case):
            response = case.call(base_url=root, timeout=15, headers=AUTH)
            case.validate_response(response, checks=CHECKS)

        try:
            fuzz()
        except Exception as exc:
            failures.append(f"{operation.label}: {exc}")
    assert not failures, "\n\n".join(failures)
