"""The scripted agent: runs the task's example solution in the shell, then answers or finishes.

* ``check`` tasks: the example runs as ``bash -c '<example>'`` from ``/root`` in the agent's
  shell, the way the checker runs it with ``docker exec`` (same working directory, same
  process tree shape, so answers like ``ps -A | wc -l`` agree). The answer is the example's
  output when the check chain compares against it (a ``null`` step) or the first check reads
  the answer; otherwise the oracle calls ``finish_action``.
* ``match`` tasks: the example (if any) runs directly in the shell, because it may need the
  shell's state (variables set by the start script, ``su``); the answer is its output, or
  the expected answer when the task has no example.

With ``error_rate`` > 0 it errs on purpose, once per episode with that probability: a wrong
answer (an integer + 1, otherwise a changed string), or finishing without doing the work.
"""

from __future__ import annotations

import random
import re
import shlex
from collections.abc import Sequence

from agentrl_core.env import assistant_tool_call
from agentrl_core.types import Message
from agentrl_env_os.recipes import IMAGE_PATH
from agentrl_env_os.tasks import Script, Task

_OUTPUT_PREFIX = "The output of the OS:\n\n"
_NOTE = re.compile(r"\n\[(?:The command|The shell|The system)[^\n]*\]$")


def _wrapped(script: Script) -> str:
    """The example as the checker runs it: a separate interpreter started in /root.

    With the environment of ``docker exec`` (the image's PATH, not the login shell's, which may
    have read an init script's ~/.bashrc already), stdin closed as there (a ``grep`` without
    files must not wait for the terminal); stderr is dropped because the checker compares
    stdout only.
    """
    exec_env = f'env -i HOME=/root PATH={IMAGE_PATH} HOSTNAME="$HOSTNAME"'
    if script.language == "python":
        return f"cd /root && {exec_env} python3 -c {shlex.quote(script.code)} </dev/null 2>/dev/null"
    return f"{exec_env} bash -c {shlex.quote('cd /root' + chr(10) + script.code)} </dev/null 2>/dev/null"


def _reads_answer(script: Script | None) -> bool:
    if script is None:
        return True
    return "argv" in script.code if script.language == "python" else bool(re.search(r"\$\{?[1@*]", script.code))


def output_of(observation: str) -> str:
    """The command output inside a bash_action observation (notes removed)."""
    text = _NOTE.sub("", observation)
    text = text[len(_OUTPUT_PREFIX) :] if text.startswith(_OUTPUT_PREFIX) else ""
    return text.strip()


def wrong(answer: str) -> str:
    try:
        return str(int(answer.strip()) + 1)
    except ValueError:
        return answer + "-wrong" if answer else "wrong"


class OSOracle:
    def __init__(self, task: Task, *, error_rate: float = 0.0, seed: int = 0) -> None:
        self.task = task
        self.err = random.Random(seed).random() < error_rate if error_rate > 0 else False
        self.command: str | None = None
        # "answer" (the command's output), "answer_if_output" (else finish), "fixed" or "finish"
        self.final = "answer"
        if task.match is not None:
            if task.example is not None:
                self.command = task.example.code
            else:
                self.final = "fixed"
        else:
            assert task.example is not None and task.check
            self.command = _wrapped(task.example)
            if task.asks_for_answer:
                self.final = "answer"
            else:
                self.final = "answer_if_output" if _reads_answer(task.check[0]) else "finish"
        if self.err and self.final == "finish":
            self.command = None  # skip the work

    def act(self, messages: Sequence[Message]) -> Message:
        turn = sum(1 for m in messages if m.get("role") == "assistant")
        if self.command is not None and turn == 0:
            return assistant_tool_call(
                "bash_action", {"script": self.command}, call_id="call_0",
                content="Run the example solution in the shell.",
            )
        if self.final == "fixed":
            answer = str(self.task.match.get("answer", "")) if self.task.match else ""
        else:
            last = next((m for m in reversed(messages) if m.get("role") == "tool"), None)
            answer = output_of(str(last.get("content", ""))) if last else ""
        if self.final == "finish" or (self.final == "answer_if_output" and not answer):
            return assistant_tool_call("finish_action", {"thought": "The task is done."}, call_id=f"call_{turn}")
        if self.err:
            answer = wrong(answer)
        return assistant_tool_call("answer_action", {"answer": answer}, call_id=f"call_{turn}")
