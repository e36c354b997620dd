"""TEST DOUBLE of an SGLang 0.5.x server — not SGLang, and generates no real text.

SGLang needs GPUs and cannot be installed on the machines that run these tests, so this
small server stands in for ``python -m sglang.launch_server`` when the SGLang driver's
process handling and HTTP use are tested. It follows SGLang's documented behaviour
(``python/sglang/srt/entrypoints/http_server.py`` and ``managers/io_struct.py`` of 0.5.x):

* the command line takes SGLang's argument names (unknown flags fail as argparse does);
* ``/health`` answers 503 while "starting" (``SGLANG_DOUBLE_STARTUP_S`` seconds), then 200;
* ``/generate`` answers ``{text, output_ids, meta_info}`` with ``finish_reason`` as a dict,
  ``output_token_logprobs`` as ``[logprob, token_id, null]`` triples and ``weight_version``
  as a *string* (``--weight-version``, default ``"default"``); the tokens are a fixed function
  of the prompt (``(sum(input_ids) + i) % 1000``) with log-prob -0.5, one every 5 ms;
* ``/pause_generation`` (mode ``abort``) ends in-flight requests with ``finish_reason``
  ``{"type": "abort"}``; requests arriving while paused wait for ``/continue_generation``;
* weight-update endpoints answer ``{success, message}`` (400 when ``success`` is false);
  ``/init_weights_update_group`` only records the request (no torch group is formed);
  ``/update_weights_from_distributed`` and ``/update_weights_from_disk`` set the version;
* ``GET /double/requests`` (test-only) returns every request body received, by route.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path

from agentrl_core.env._http import App, HTTPError, Request, Response, bind_socket, json_response, serve_app


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="sglang.launch_server (test double)")
    p.add_argument("--model-path", "--model", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--tp-size", "--tensor-parallel-size", type=int, default=1)
    p.add_argument("--weight-version", default="default")
    p.add_argument("--served-model-name", default=None)
    p.add_argument("--random-seed", type=int, default=None)
    p.add_argument("--skip-server-warmup", action="store_true")
    p.add_argument("--dtype", default="auto", choices=["auto", "half", "float16", "bfloat16", "float", "float32"])
    p.add_argument("--mem-fraction-static", type=float, default=None)
    p.add_argument("--context-length", type=int, default=None)
    p.add_argument("--tool-call-parser", default=None)
    p.add_argument("--trust-remote-code", action="store_true")
    p.add_argument("--log-level", default="info")
    p.add_argument("--max-running-requests", type=int, default=None)
    return p.parse_args(argv)


class FakeSGLang:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.weight_version = str(args.weight_version)
        self.ready_at = time.monotonic() + float(os.environ.get("SGLANG_DOUBLE_STARTUP_S", "0.5"))
        self.paused = False
        self.resumed = asyncio.Event()
        self.resumed.set()
        self.abort_epoch = 0
        self.received: dict[str, list] = {}
        self.app = App(name="sglang-double")
        for method, path, handler in [
            ("GET", "/health", self.health), ("GET", "/get_model_info", self.model_info),
            ("POST", "/generate", self.generate), ("POST", "/pause_generation", self.pause),
            ("POST", "/continue_generation", self.resume), ("POST", "/flush_cache", self.flush),
            ("POST", "/init_weights_update_group", self.init_group),
            ("POST", "/update_weights_from_distributed", self.update_distributed),
            ("POST", "/update_weights_from_disk", self.update_disk), ("GET", "/double/requests", self.requests),
        ]:
            self.app.route(method, path, handler)

    def record(self, request: Request) -> dict:
        body = request.json_object(required=False)
        self.received.setdefault(request.path, []).append(body)
        return body

    async def health(self, request: Request) -> Response:
        return Response(b"", 200 if time.monotonic() >= self.ready_at else 503, [])

    async def model_info(self, request: Request):
        return {"model_path": self.args.model_path, "tokenizer_path": self.args.model_path, "is_generation": True,
                "weight_version": self.weight_version, "served_model_name": self.args.served_model_name,
                "tool_call_parser": self.args.tool_call_parser}

    async def generate(self, request: Request):
        body = self.record(request)
        params = body.get("sampling_params") or {}
        unknown = set(params) - {"max_new_tokens", "temperature", "top_p", "top_k", "min_p", "stop",
                                 "stop_token_ids", "ignore_eos", "sampling_seed", "skip_special_tokens"}
        if unknown:
            raise HTTPError(400, f"unknown sampling params {sorted(unknown)}")
        await self.resumed.wait()
        epoch, version = self.abort_epoch, self.weight_version
        ids, base = [], sum(body["input_ids"])
        reason: dict = {"type": "length", "length": int(params.get("max_new_tokens", 128))}
        for i in range(int(params.get("max_new_tokens", 128))):
            await asyncio.sleep(0.005)
            if self.abort_epoch != epoch:
                reason = {"type": "abort", "message": "Abort in waiting queue", "status_code": None, "err_type": None}
                break
            ids.append((base + i) % 1000)
        meta = {"id": body.get("rid"), "finish_reason": reason, "prompt_tokens": len(body["input_ids"]),
                "completion_tokens": len(ids), "cached_tokens": 0, "weight_version": version}
        if body.get("return_logprob"):
            meta["output_token_logprobs"] = [[-0.5, t, None] for t in ids]
        return {"text": " ".join(map(str, ids)), "output_ids": ids, "meta_info": meta}

    async def pause(self, request: Request):
        body = self.record(request)
        if body.get("mode", "abort") == "abort":
            self.abort_epoch += 1
        self.paused = True
        self.resumed.clear()
        return {"message": "Generation paused successfully.", "status": "ok"}

    async def resume(self, request: Request):
        self.record(request)
        self.paused = False
        self.resumed.set()
        return {"message": "Generation continued successfully.", "status": "ok"}

    async def flush(self, request: Request) -> Response:
        return Response(b"Cache flushed.\n", 200, [(b"content-type", b"text/plain")])

    async def init_group(self, request: Request) -> Response:
        body = self.record(request)
        missing = {"master_address", "master_port", "rank_offset", "world_size"} - set(body)
        if missing:
            return json_response({"success": False, "message": f"missing {sorted(missing)}"}, 400)
        return json_response({"success": True, "message": "Succeeded to initialize custom process group."})

    async def update_distributed(self, request: Request) -> Response:
        body = self.record(request)
        if not (len(body.get("names", [])) == len(body.get("dtypes", [])) == len(body.get("shapes", []))):
            return json_response({"success": False, "message": "names, dtypes and shapes differ in length"}, 400)
        if body.get("weight_version") is not None:
            self.weight_version = str(body["weight_version"])
        return json_response({"success": True, "message": "Succeeded to update parameter online."})

    async def update_disk(self, request: Request) -> Response:
        body = self.record(request)
        if body.get("weight_version") is not None:
            self.weight_version = str(body["weight_version"])
        return json_response({"success": True, "message": "Succeeded to update model weights.",
                              "num_paused_requests": 0})

    async def requests(self, request: Request):
        return self.received


def main(argv: list[str] | None = None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)

    async def run() -> None:
        server = FakeSGLang(args)
        sock = bind_socket(args.host, args.port)
        await serve_app(server.app, sock)

    asyncio.run(run())


def install_shim(directory: Path) -> Path:
    """Write a ``sglang/launch_server.py`` that runs this double; put ``directory`` on PYTHONPATH."""
    package = directory / "sglang"
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text('"""TEST DOUBLE package standing in for SGLang (tests/core/sglang_double.py)."""\n')
    (package / "launch_server.py").write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "from sglang_double import main\n"
        "main()\n"
    )
    return directory


if __name__ == "__main__":
    main()
