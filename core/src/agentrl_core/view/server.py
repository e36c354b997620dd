"""The viewer's HTTP service: the page, its script and style, and the JSON API they read.

Every page of the UI is drawn from a JSON route that tests and scripts read too:

=====================  ==============================================================
``/api/runs``          the runs under the folder (re-scanned on each call)
``/api/steps``         per kind and step: trajectories, reward, success (``run``)
``/api/tasks``         per task (``run``, optional ``kind``)
``/api/trajectories``  a filtered listing (``run`` and the filters of :data:`store.FILTER_KEYS`)
``/api/groups``        groups with their reward spread (same filters)
``/api/trajectory``    one trajectory with messages, tool calls and tokens (``run``, ``id``)
``/api/metrics``       the numeric scalars of ``metrics.jsonl`` (``run``)
=====================  ==============================================================

The store is read in a worker thread, one read-only connection per request. With a token
(``--token`` / ``AGENTRL_TOKEN``) every request needs it: as ``Authorization: Bearer``, or
once in the address (``/?token=...``), after which a cookie carries it, since a browser
cannot add a header to a page load.
"""

from __future__ import annotations

import asyncio
import functools
import hmac
import logging
import threading
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

from agentrl_core.http.auth import UNAUTHORIZED, check_bearer
from agentrl_core.http.server import App, HTTPError, Request, Response, json_response
from agentrl_core.view import store

log = logging.getLogger(__name__)

COOKIE = "agentrl_view_token"
_STATIC = {"/": ("index.html", b"text/html; charset=utf-8"),
           "/static/app.js": ("app.js", b"text/javascript; charset=utf-8"),
           "/static/style.css": ("style.css", b"text/css; charset=utf-8")}


class Tokenizers:
    """Each run's tokenizer, to show token text: ``--tokenizer``, else the run's ``final_model/``, else
    its config's ``model.path``; loaded once per folder, and None (ids only) when none loads."""

    def __init__(self, override: str | None = None) -> None:
        self.override = override
        self._loaded: dict[str, Any] = {}
        self._lock = threading.Lock()

    def folder(self, run_dir: Path) -> str | None:
        candidates = [self.override] if self.override else [str(run_dir / "final_model"), _config_model(run_dir)]
        for candidate in filter(None, candidates):
            path = Path(candidate)
            if (path / "tokenizer.json").is_file() or (path / "tokenizer_config.json").is_file():
                return str(path)
        return None

    def decoder(self, run_dir: Path) -> Callable[[list[int]], list[str]] | None:
        folder = self.folder(run_dir)
        if folder is None:
            return None
        with self._lock:
            if folder not in self._loaded:
                self._loaded[folder] = _load_tokenizer(folder)
            tokenizer = self._loaded[folder]
        if tokenizer is None:
            return None
        return lambda ids: tokenizer.batch_decode([[i] for i in ids], skip_special_tokens=False)


def _config_model(run_dir: Path) -> str | None:
    path = run_dir / "config.yaml"
    if not path.is_file():
        return None
    import yaml

    try:
        config = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError:
        return None
    model = config.get("model") if isinstance(config, dict) else None
    return model.get("path") if isinstance(model, dict) else None


def _load_tokenizer(folder: str) -> Any:
    try:
        import transformers
    except ImportError:
        log.warning("transformers is not installed: the viewer shows token ids, not their text "
                    "(pip install 'agentrl-core[torch]')")
        return None
    try:
        return transformers.AutoTokenizer.from_pretrained(folder)
    except Exception as exc:  # a broken folder must not stop the viewer: it shows ids instead
        log.warning("cannot load the tokenizer of %s, showing token ids: %s", folder, exc)
        return None


class Viewer:
    """The routes over one folder of runs (or one run)."""

    def __init__(self, root: str | Path, *, tokenizer: str | None = None) -> None:
        self.root = Path(root).resolve()
        if not self.root.is_dir():
            raise store.ViewError(f"{root} is not a folder: give a run folder (it holds trajectories.sqlite or "
                                  "metrics.jsonl) or a folder of runs")
        self.tokenizers = Tokenizers(tokenizer)

    def run_dir(self, request: Request) -> Path:
        name = request.query().get("run", "")
        runs = store.find_runs(self.root)
        if name not in runs:
            known = ", ".join(runs) or "none"
            raise HTTPError(404, f"there is no run {name!r} under {self.root} (runs: {known})")
        return runs[name]

    async def _in_thread(self, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return await asyncio.to_thread(fn, *args)
        except store.ViewError as exc:
            raise HTTPError(exc.status, str(exc)) from None

    async def runs(self, request: Request) -> Any:
        def read() -> list[dict[str, Any]]:
            return [store.run_summary(name, path) for name, path in store.find_runs(self.root).items()]

        return {"root": str(self.root), "runs": await self._in_thread(read)}

    def _with_store(self, request: Request, fn: Callable[..., Any]) -> Any:
        run_dir = self.run_dir(request)

        def read() -> Any:
            with store.open_store(run_dir) as conn:
                if conn is None:
                    raise store.ViewError(f"the run {run_dir} has no trajectory store ({store.FILENAME})")
                return fn(conn, run_dir)

        return self._in_thread(read)

    async def steps(self, request: Request) -> Any:
        return await self._with_store(request, lambda conn, _: store.steps(conn))

    async def tasks(self, request: Request) -> Any:
        kind = request.query().get("kind") or None
        return await self._with_store(request, lambda conn, _: store.tasks(conn, kind))

    async def trajectories(self, request: Request) -> Any:
        params = request.query()
        return await self._with_store(request, lambda conn, _: store.trajectories(conn, params))

    async def groups(self, request: Request) -> Any:
        params = request.query()
        return await self._with_store(request, lambda conn, _: store.groups(conn, params))

    async def trajectory(self, request: Request) -> Any:
        raw = request.query().get("id", "")
        if not raw.isdigit():
            raise HTTPError(400, f"give the trajectory's id as a number (?id=...), got {raw!r}")
        return await self._with_store(
            request, lambda conn, run_dir: store.trajectory(conn, int(raw), self.tokenizers.decoder(run_dir)))

    async def metrics(self, request: Request) -> Any:
        run_dir = self.run_dir(request)
        return await self._in_thread(store.read_metrics, run_dir)


@functools.cache
def _static(name: str) -> bytes:
    return resources.files("agentrl_core.view").joinpath("static", name).read_bytes()


def build_app(root: str | Path, *, token: str | None = None, tokenizer: str | None = None) -> ViewerApp:
    viewer = Viewer(root, tokenizer=tokenizer)
    app = App(name="trajectory viewer")
    for path, handler in (("/api/runs", viewer.runs), ("/api/steps", viewer.steps), ("/api/tasks", viewer.tasks),
                          ("/api/trajectories", viewer.trajectories), ("/api/groups", viewer.groups),
                          ("/api/trajectory", viewer.trajectory), ("/api/metrics", viewer.metrics)):
        app.route("GET", path, handler)
    for path, (name, content_type) in _STATIC.items():
        app.route("GET", path, _static_handler(name, content_type))
    return ViewerApp(app, token=token)


def _static_handler(name: str, content_type: bytes) -> Callable[[Request], Any]:
    async def handler(request: Request) -> Response:
        return Response(_static(name), headers=[(b"content-type", content_type), (b"cache-control", b"no-cache")])

    return handler


class ViewerApp:
    """The ASGI app: the route table behind the token check (a header, a cookie, or ``?token=`` once).

    ``token`` and ``name`` are what :func:`agentrl_core.http.server.serve_app` reads to refuse a
    non-loopback address to a viewer without a token.
    """

    def __init__(self, app: App, *, token: str | None) -> None:
        self.app = app
        self.name = app.name
        self.token = token or None

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http" or self.token is None:
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        if check_bearer(headers.get(b"authorization"), self.token) or self._cookie_ok(headers.get(b"cookie")):
            await self.app(scope, receive, send)
            return
        given = Request(scope, b"").query().get("token")
        if given is not None and hmac.compare_digest(given.encode(), self.token.encode()):
            # the address carried the token: keep it in a cookie and drop it from the address bar
            cookie = f"{COOKIE}={self.token}; HttpOnly; SameSite=Strict; Path=/".encode()
            await _send(send, Response(b"", 303, [(b"location", scope["path"].encode()), (b"set-cookie", cookie)]))
            return
        await _send(send, json_response({"detail": UNAUTHORIZED + ", or open the address with ?token=<token> once"},
                                        401, [(b"www-authenticate", b'Bearer realm="agentrl"')]))

    def _cookie_ok(self, raw: bytes | None) -> bool:
        assert self.token is not None
        for part in (raw or b"").decode("latin-1").split(";"):
            key, _, value = part.strip().partition("=")
            if key == COOKIE and hmac.compare_digest(value.encode(), self.token.encode()):
                return True
        return False


async def _send(send: Callable, response: Response) -> None:
    await send({"type": "http.response.start", "status": response.status,
                "headers": [*response.headers, (b"content-length", str(len(response.body)).encode())]})
    await send({"type": "http.response.body", "body": response.body})
