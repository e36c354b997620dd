"""Scripts run with ``docker exec`` (init, check, example) and the evaluation of an answer.

Evaluation follows upstream ``OSInteraction._evaluate_answer``:

* ``match``: the answer (stripped when ``strip``) equals ``answer``, or ``regex`` is found in it;
* ``check``: a chain of scripts; each gets the answer and the stdout of every earlier step as
  arguments (``bash -c code -- args...`` / ``python3 -c code args...``); a ``null`` step runs
  the task's example solution (in the container as the agent left it), so the next step can
  compare the agent's answer with the example's output. Any non-zero exit fails the answer.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import anyio
from attrs import frozen

from agentrl_core.errors import EnvError
from agentrl_env_os.docker_backend import DockerBackend, ExecRefused
from agentrl_env_os.tasks import Script, Task


class ScriptTimeout(EnvError):
    """A script run with ``docker exec`` did not finish in time."""


@frozen
class ScriptRun:
    exit_code: int
    stdout: bytes
    stderr: bytes


def script_argv(script: Script, params: Sequence[str] = ()) -> list[str]:
    """The command upstream's ``execute_independent`` runs for a script."""
    if script.language == "bash":
        return ["bash", "-c", script.code, *(["--", *params] if params else [])]
    if script.language == "python":
        return ["python3", "-c", script.code, *params]
    raise EnvError(f"cannot run a {script.language!r} script")  # tasks.py rejects these on load


async def run_script(
    backend: DockerBackend, container_id: str, script: Script, params: Sequence[str] = (), *, timeout: float
) -> ScriptRun:
    argv = script_argv(script, params)
    with anyio.move_on_after(timeout):
        code, out, err = await anyio.to_thread.run_sync(
            backend.exec_script, container_id, argv, limiter=backend.limiter, abandon_on_cancel=True
        )
        return ScriptRun(code, out, err)
    raise ScriptTimeout(f"a {script.language} script did not finish within {timeout:.0f} s")


@frozen
class Verdict:
    success: bool
    detail: str  # why, for metrics and logs


def match_answer(answer: str | None, match: dict) -> Verdict:
    if answer is None:
        return Verdict(False, "no answer")
    if isinstance(answer, str) and match.get("strip", False):
        answer = answer.strip()
    if "answer" in match:
        ok = answer == match["answer"]
        return Verdict(ok, "answer matches" if ok else "answer differs")
    if "regex" in match:
        ok = re.search(match["regex"], answer) is not None
        return Verdict(ok, "regex found" if ok else "regex not found")
    return Verdict(False, "match has neither answer nor regex")


async def check_answer(
    answer: str | None, task: Task, backend: DockerBackend, container_id: str, *, timeout: float
) -> Verdict:
    """Run the check chain; a script that times out or cannot start fails the answer."""
    params = [str(answer)]
    for step, script in enumerate(task.check or ()):
        if script is None:
            script = task.example
            assert script is not None  # tasks.py guarantees it
        try:
            run = await run_script(backend, container_id, script, params, timeout=timeout)
        except ScriptTimeout:
            return Verdict(False, f"check step {step} timed out")
        except ExecRefused:
            return Verdict(False, f"check step {step} could not start (the container's limits are exhausted)")
        if run.exit_code != 0:
            return Verdict(False, f"check step {step} exited {run.exit_code}")
        params.append(run.stdout.decode("utf-8", errors="replace"))
    return Verdict(True, f"{len(task.check or ())} check step(s) passed")


async def evaluate(
    answer: str | None, task: Task, backend: DockerBackend, container_id: str, *, timeout: float
) -> Verdict:
    if task.match is not None:
        return match_answer(answer, task.match)
    return await check_answer(answer, task, backend, container_id, timeout=timeout)
