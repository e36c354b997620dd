"""The run's token (agentrl_core.http.auth): every route of the controller, the task worker, the
engine and the gateway's trainer side refuses a request without it or with a wrong one and
serves one with it; a service without a token refuses a non-loopback address; upstream workers
register only where the controller opts in, and never receive the token.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest
from test_control_plane import EchoEnv

from agentrl_core.config import ControllerConfig, config_from_dict
from agentrl_core.controlplane.client import ControllerClient
from agentrl_core.controlplane.controller import Controller
from agentrl_core.engine.process import BackgroundEngine
from agentrl_core.engine.server import EngineServer
from agentrl_core.errors import ConfigError
from agentrl_core.gateway.process import BackgroundGateway, build_gateway
from agentrl_core.gateway.server import AGENT_PATHS
from agentrl_core.http import auth
from agentrl_core.http.client import Pool
from agentrl_core.http.server import App, bind_socket, serve_app
from agentrl_core.rollout.engine_client import EngineClient
from agentrl_core.rollout.sglang_driver import SGLangDriver
from agentrl_core.testing.controlplane import local_control_plane

TOKEN = "s3cret-run-token"
WRONG = [{}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {TOKEN}"},
         {"Authorization": f"Bearer {TOKEN}x"}, {"Authorization": TOKEN}]
GOOD = {"Authorization": f"Bearer {TOKEN}"}

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


# -- the kit ----------------------------------------------------------------------------------


def test_bearer_check_and_loopback():
    assert auth.check_bearer(f"Bearer {TOKEN}", TOKEN)
    assert auth.check_bearer(f"bearer  {TOKEN} ".encode(), TOKEN)
    for header in [None, "", TOKEN, f"Bearer {TOKEN[:-1]}", f"Token {TOKEN}", "Bearer "]:
        assert not auth.check_bearer(header, TOKEN), header
    assert all(auth.is_loopback(h) for h in ["127.0.0.1", "127.8.0.1", "::1", "[::1]", "localhost"])
    assert not any(auth.is_loopback(h) for h in ["", "0.0.0.0", "::", "10.0.0.5", "node-3", "192.168.1.2"])


def test_token_from_flag_then_environment(monkeypatch):
    monkeypatch.delenv(auth.TOKEN_ENV, raising=False)
    assert auth.resolve_token(None) is None
    monkeypatch.setenv(auth.TOKEN_ENV, " from-env ")
    assert auth.resolve_token(None) == "from-env"
    assert auth.resolve_token("from-flag") == "from-flag"


def test_a_run_generates_a_token_and_keeps_the_users(monkeypatch):
    monkeypatch.delenv(auth.TOKEN_ENV, raising=False)
    with auth.run_token() as first:
        assert len(first) >= 40 and auth.env_token() == first
    assert auth.env_token() is None  # removed after the run
    with auth.run_token() as second:
        assert second != first
    monkeypatch.setenv(auth.TOKEN_ENV, "users-own")
    with auth.run_token() as kept:
        assert kept == "users-own"
    assert auth.env_token() == "users-own"


def test_no_token_no_public_address():
    with pytest.raises(ConfigError, match=r"^refusing to serve the controller on 0\.0\.0\.0 without a token"):
        auth.require_token_to_bind("0.0.0.0", None, service="controller")
    auth.require_token_to_bind("0.0.0.0", TOKEN, service="controller")
    auth.require_token_to_bind("127.0.0.1", None, service="controller")


async def test_serve_app_refuses_a_public_socket_without_a_token():
    sock = bind_socket("0.0.0.0", 0)
    with pytest.raises(ConfigError, match="without a token: set AGENTRL_TOKEN or pass --token"):
        await serve_app(App(name="engine"), sock, stop=asyncio.Event())
    assert sock.fileno() == -1  # closed


async def test_controller_refuses_a_public_address_without_a_token():
    with pytest.raises(ConfigError, match="refusing to serve the controller on 0.0.0.0"):
        await Controller(ControllerConfig()).serve(host="0.0.0.0", port=0, stop=asyncio.Event())
    stop = asyncio.Event()
    ready = asyncio.Event()
    served = asyncio.ensure_future(Controller(ControllerConfig(), token=TOKEN).serve(
        host="0.0.0.0", port=0, stop=stop, on_ready=lambda _: ready.set()))
    await asyncio.wait_for(ready.wait(), 10)  # with a token it listens everywhere
    stop.set()
    await served


def test_the_cli_refuses_a_public_address_without_a_token(monkeypatch, capsys):
    from agentrl_core.cli.main import main

    monkeypatch.delenv(auth.TOKEN_ENV, raising=False)
    for argv, service in [(["controller", "--host", "0.0.0.0"], "controller"),
                          (["worker", "--env", "x", "--controller", "http://127.0.0.1:1/api", "--host", "10.1.2.3"],
                           "task worker")]:
        code = main(argv)
        assert code != 0
        assert f"refusing to serve the {service} on" in capsys.readouterr().err


# -- the control plane --------------------------------------------------------------------------


async def _refused_everywhere(base: str, app: App) -> int:
    """Every route of ``app`` answers 401 to each wrong credential and anything else to the token."""
    async with httpx.AsyncClient(base_url=base, timeout=30) as http:
        for method, path in sorted(app.routes):
            if "{" in path:
                path = path.replace("{id}", "nope")
            for headers in WRONG:
                response = await http.request(method, path, headers=headers, json={})
                assert response.status_code == 401, (method, path, headers, response.text)
                assert response.json() == {"detail": auth.UNAUTHORIZED}
                assert response.headers["www-authenticate"].startswith("Bearer")
            response = await http.request(method, path, headers=GOOD, json={})
            assert response.status_code != 401, (method, path, response.text)
        # an unknown path says nothing about the routes to a stranger
        assert (await http.get("/nowhere")).status_code == 401
        assert (await http.get("/nowhere", headers=GOOD)).status_code == 404
    return len(app.routes)


async def test_every_controller_and_worker_route_needs_the_token():
    async with local_control_plane(token=TOKEN) as plane:
        worker = await plane.add_worker(EchoEnv(), "std", concurrency=2)  # registered: it sent the token
        assert plane.controller.state.find_worker(worker.task_name, worker.address).authenticated
        root = plane.url.removesuffix("/api")
        assert await _refused_everywhere(root, plane.controller.app) == 17
        assert await _refused_everywhere(worker.address.removesuffix("/api"), worker.app) == 12  # 11 of upstream + /openapi.json
        async with ControllerClient(plane.url, token=TOKEN) as client:  # the episode path works with it
            started = await client.start(worker.task_name, 0)
            assert await client.cancel(started.session_id)
        async with ControllerClient(plane.url, token="wrong") as client:
            with pytest.raises(Exception, match="401|token"):
                await client.get_indices(worker.task_name)


async def _heartbeat(url: str, address: str, headers: dict) -> httpx.Response:
    body = {"name": "up-std", "address": address, "concurrency": 2, "indices": [0, 1, 2]}
    async with httpx.AsyncClient(timeout=10) as http:
        return await http.post(f"{url}/receive_heartbeat", json=body, headers=headers)


async def test_upstream_workers_register_only_where_the_controller_opts_in():
    async with local_control_plane(token=TOKEN) as plane:
        response = await _heartbeat(plane.url, "http://127.0.0.1:9/api", {})
        assert response.status_code == 401
        assert plane.controller.state.find_worker("up-std", "http://127.0.0.1:9/api") is None

    async with local_control_plane(ControllerConfig(unauthenticated_workers=True), token=TOKEN) as plane:
        # an upstream worker, standing in: a task worker without a token (it accepts any caller)
        upstream = await plane.add_worker(EchoEnv(), "std", concurrency=2, task_name="up-std", token=None)
        entry = plane.controller.state.find_worker("up-std", upstream.address)
        assert entry is not None and not entry.authenticated
        seen = []
        start = upstream.app.routes[("POST", "/api/start_sample")]

        async def recording(request):
            seen.append(request.header(b"authorization"))
            return await start(request)

        upstream.app.routes[("POST", "/api/start_sample")] = recording
        async with ControllerClient(plane.url, token=TOKEN) as client:
            started = await client.start("up-std", 1)
            await client.cancel(started.session_id)
        assert seen == [None]  # the controller never hands the token to an unauthenticated worker
        # only the worker routes are open: the clients' routes still need the token
        async with httpx.AsyncClient(timeout=10) as http:
            assert (await http.get(f"{plane.url}/list_workers")).status_code == 401
            listed = (await http.get(f"{plane.url}/list_workers", headers=GOOD)).json()
        assert listed["up-std"]["workers"][str(entry.id)]["authenticated"] is False


def test_controller_cli_flag_opts_in(tmp_path):
    import argparse

    from agentrl_core.cli.controller import add_parser

    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    args = parser.parse_args(["controller", "--unauthenticated-workers", "--token", "t"])
    assert args.unauthenticated_workers is True and args.token == "t"
    assert parser.parse_args(["controller"]).unauthenticated_workers is None


# -- the engine and the gateway -----------------------------------------------------------------


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    with BackgroundEngine(EngineServer(tiny_model_dir, max_running_requests=8, dtype="float32",
                                       token=TOKEN)) as background:
        yield background


async def test_every_engine_route_needs_the_token(engine):
    assert await _refused_everywhere(engine.url, engine.server.app) == len(engine.server.app.routes) >= 17
    # the sweep paused the engine (POST /pause_generation with the token worked): resume it
    assert httpx.post(engine.url + "/continue_generation", headers=GOOD, json={}).status_code == 200
    async with EngineClient(engine.url, token=TOKEN) as client:
        result = await client.generate([1, 2, 3], {"max_new_tokens": 2, "temperature": 1.0})
        assert len(result.output_ids) == 2
    async with EngineClient(engine.url, token="wrong") as client:
        with pytest.raises(Exception, match="401|token"):
            await client.generate([1, 2, 3], {"max_new_tokens": 2})


def test_gateway_admin_routes_need_the_token_and_the_engines_get_it(tiny_model_dir, engine):
    config = config_from_dict({"model": {"path": str(tiny_model_dir)},
                               "rollout": {"max_new_tokens": 4, "max_total_len": 512}})
    with BackgroundGateway(build_gateway(config, {"current": [engine.url]}, token=TOKEN)) as gateway:
        trainer_routes = {key for key in gateway.server.app.routes if key[1] not in AGENT_PATHS}
        assert {("POST", "/admin/pools"), ("POST", "/sessions"), ("GET", "/health")} <= trainer_routes
        for method, path in sorted(trainer_routes):
            for headers in WRONG:
                response = httpx.request(method, gateway.url + path.replace("{id}", "x"), headers=headers, json={})
                assert response.status_code == 401, (method, path, headers)
            response = httpx.request(method, gateway.url + path.replace("{id}", "x"), headers=GOOD, json={})
            assert response.status_code != 401, (method, path, response.text)
        # the sweep announced a weight update (POST /admin/pause with the token worked): end it
        assert httpx.post(gateway.url + "/admin/continue", headers=GOOD, json={}).status_code == 200
        # the agent's OpenAI routes answer to the session's key, not the run's token
        response = httpx.post(gateway.url + "/v1/chat/completions", json={"messages": []}, headers=GOOD)
        assert response.status_code == 401 and "session" in response.text
        opened = httpx.post(gateway.url + "/sessions", json={"task": "t"}, headers=GOOD, timeout=30).json()
        reply = httpx.post(opened["base_url"] + "/chat/completions", timeout=60,
                           json={"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
        assert reply.status_code == 200, reply.text  # the gateway sent the token to the engine
        closed = httpx.post(f"{gateway.url}/sessions/{opened['id']}/close", headers=GOOD, timeout=30)
        assert closed.status_code == 200 and closed.json()["sample_records"]


# -- what drivers start --------------------------------------------------------------------------


def test_sglang_gets_the_token_as_its_api_key(monkeypatch, tmp_path):
    from agentrl_core.rollout.drivers import redact

    monkeypatch.setenv(auth.TOKEN_ENV, TOKEN)
    cmd = SGLangDriver(log_dir=str(tmp_path)).command(str(tmp_path), 30000, 1, "current-0", 0)
    assert cmd[cmd.index("--api-key") + 1] == TOKEN
    assert TOKEN not in " ".join(redact(cmd))
    monkeypatch.delenv(auth.TOKEN_ENV)
    assert "--api-key" not in SGLangDriver(log_dir=str(tmp_path)).command(str(tmp_path), 30000, 1, "current-0", 0)


async def test_the_kits_pool_sends_the_token():
    seen = []

    async def record(request):
        seen.append(request.authenticated)
        return {}

    app = App(name="probe", token=TOKEN)
    app.route("GET", "/x", record)
    sock = bind_socket("127.0.0.1", 0)
    stop = asyncio.Event()
    served = asyncio.ensure_future(serve_app(app, sock, stop=stop))
    pool = Pool("127.0.0.1", sock.getsockname()[1], token=TOKEN)
    bare = Pool("127.0.0.1", sock.getsockname()[1])
    try:
        for _ in range(50):  # the server may not be accepting yet
            try:
                assert (await pool.request("GET", "/x")).status == 200
                break
            except Exception:
                await asyncio.sleep(0.05)
        assert (await bare.request("GET", "/x")).status == 401
        assert seen == [True]
    finally:
        pool.close()
        bare.close()
        stop.set()
        await served
