"""The ``os`` environment: AgentBench OS interaction (FC) with one Docker container per episode.

An episode: a container from the task's image starts (no network, memory/CPU/pid limits),
the init scripts run with ``docker exec`` (a failure is an infrastructure error: the worker
reports ``task error``), an interactive bash starts and runs the optional start script, and
the agent gets upstream's system prompt and the problem. Each turn the first tool call is
used: ``bash_action(script)`` types the script into the persistent shell and returns
``The output of the OS:\\n\\n<output>`` (truncated past 800 characters); ``answer_action`` and
``finish_action`` end the episode and evaluate (``finish_action``'s thought is the answer,
as upstream). 8 rounds. The container is removed when the session closes, whatever happened.

Tool arguments (``tool_arguments`` in the config): ``upstream`` (default for std and dev) reads
a turn as upstream's task does (:mod:`agentrl_env_os.upstream`: the first argument value
whatever its key; ``finish_action {}`` commits no answer and is scored); ``strict`` (default for
the training sets) checks the arguments against the schemas and answers a call that breaks
them with the reason.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import anyio

from agentrl_core.env import BadTurn, Environment, Status, Step, ToolCall, ToolSession, function_tool
from agentrl_core.errors import EnvError
from agentrl_core.types import Index, Message
from agentrl_env_os import upstream
from agentrl_env_os.config import OSConfig
from agentrl_env_os.docker_backend import DockerBackend
from agentrl_env_os.evaluate import ScriptTimeout, evaluate, run_script
from agentrl_env_os.images import image_ref
from agentrl_env_os.pool import WarmPool
from agentrl_env_os.shell import InteractiveShell, ShellResult, clean_output
from agentrl_env_os.tasks import SPLITS, Task, load_split

log = logging.getLogger(__name__)

SYSTEM_PROMPT = """You are an assistant that will act like a person. I will play the role of a Linux (Ubuntu) operating system.
Your goal is to implement the operations required by me or answer the questions proposed by me.
For each of your turns, you should first think about what you should do, and then call exactly one of the provided tools according to the situation.
If you think the output is too long, I will truncate it. The truncated output is not complete. You have to deal with the truncating problem by yourself.
Attention, your bash code should not contain any input operation. Once again, you should use one tool in each turn, and should not respond without function calling.
Note that if you think the task has been finished, or there is some message missing to completely complete the task, you should respond with calling the function "finish_action", as no additional information will be provided.
Also, note that if you have gotten the answer to the question, you should call the "answer_action" tool instead of simply writing your answer in your response.
Your answers should be exact and precise (for example, a single number), do not answer with full sentences or phrases.
Always use a tool provided instead of simply responding with content."""

USER_PROMPT = "Now, I will start a new problem in a new OS. My problem is:\n\n{description}"
NO_TOOL_CALL = "No executable tool calls found. Please call a tool instead"
UPSTREAM_SPLITS = frozenset({"std", "dev"})  # tool_arguments "auto" reads these turns as upstream

TOOLS = [
    function_tool(
        "bash_action",
        "Execute bash code to perform an operation in the Linux environment.",
        {"script": {"type": "string", "description": "The bash script to be executed."}},
        required=["script"],
    ),
    function_tool(
        "finish_action",
        "Indicate that the task has been finished or need some additional information to be finished.",
        {"thought": {"type": "string", "description": "The thought or reason indicating the task is finished."}},
        required=["thought"],
    ),
    function_tool(
        "answer_action",
        "Provide the answer to the question.",
        {"answer": {"type": "string", "description": "The answer to the question."}},
        required=["answer"],
    ),
]


class InitScriptFailed(EnvError):
    """A task's init or start script failed: the sample cannot be set up (infrastructure failure)."""


def format_observation(result: ShellResult, config: OSConfig) -> str:
    """The tool message for a bash_action, as upstream, plus a note when something unusual happened."""
    text = clean_output(result.output)
    if text is None:
        text = "OS Environment output cannot be decoded as UTF-8"
    if len(text) > config.output_limit:
        text = text[: config.output_keep] + "\n[truncated because the output is too long]"
    body = f"The output of the OS:\n\n{text}" if text else "The output of the OS is empty."
    limit = f"{config.command_timeout_s:g} seconds"
    reset = "the working directory, variables and user are back to their initial state"
    notes = []
    if result.timed_out:
        how = {
            "interrupt": "was interrupted with Ctrl-C",
            "kill": "was killed",
            "restart": f"could not be stopped, so the shell was restarted: {reset}",
        }[result.stopped_by or "restart"]
        notes.append(f"[The command did not finish within {limit} and {how}.]")
    elif result.shell_exited:
        notes.append(f"[The shell exited; a new shell was started: {reset}.]")
    if result.unresponsive:
        notes.append("[The system is not responding: no new process can start (its process or memory limit is exhausted).]")
    if notes:  # the newline bash prints after Ctrl-C would leave a blank line before the note
        body = body.rstrip("\n")
    return "\n".join([body, *notes])


class OSSession(ToolSession):
    """One episode: its container, its shell, and the evaluation at the end."""

    def __init__(self, env: OSEnvironment, task: Task) -> None:
        super().__init__(TOOLS, max_rounds=env.config.round_limit)
        self.env = env
        self.task = task
        self.name = f"agentrl-os-{uuid.uuid4().hex[:16]}"  # container name: found again even if creation is cancelled
        self.container_id: str | None = None
        self.shell: InteractiveShell | None = None
        self.stats: dict[str, Any] = {"commands": 0, "command_timeouts": 0, "lenient_calls": 0}
        mode = env.config.tool_arguments
        self.upstream = mode == "upstream" or (mode == "auto" and task.split in UPSTREAM_SPLITS)

    def metrics(self) -> dict[str, Any]:
        extra = {"shell_restarts": self.shell.restarts if self.shell else 0}
        return {**super().metrics(), **self.stats, **extra}

    async def on_start(self) -> Step:
        env, task, cfg = self.env, self.task, self.env.config
        image = await env.image_for(task.image)
        t0 = time.monotonic()
        env.live[self.name] = None  # known before creation, so a cancelled start is still cleaned up
        self.container_id = env.pool.take(image)
        self.stats["warm_container"] = self.container_id is not None
        if self.container_id is not None:
            # Named after the session like every other in-use container; idle ones keep "pool" names.
            await env.backend.call(env.backend.api.rename, self.container_id, self.name)
        else:
            self.container_id = await env.backend.call(
                lambda: env.backend.create(image, name=self.name, session=self.name, task=f"{task.split}/{task.index}")
            )
        env.live[self.name] = self.container_id
        self.stats["container_ready_s"] = round(time.monotonic() - t0, 4)
        t1 = time.monotonic()
        for i, script in enumerate(task.init):
            try:
                run = await run_script(env.backend, self.container_id, script, timeout=cfg.script_timeout_s)
            except ScriptTimeout as exc:
                raise InitScriptFailed(f"os {task.split}/{task.index}: init script {i} failed: {exc}") from None
            if run.exit_code != 0:
                err = (run.stderr or run.stdout).decode("utf-8", errors="replace").strip()[-400:]
                raise InitScriptFailed(
                    f"os {task.split}/{task.index}: init script {i} exited with {run.exit_code}: {err}"
                )
        # The agent's login shell starts after the init scripts, as upstream's (which opens it at
        # its first command): it reads the ~/.bashrc or /etc/profile an init script wrote.
        self.shell = InteractiveShell(
            env.backend, self.container_id, command_timeout=cfg.command_timeout_s, interrupt_grace=cfg.interrupt_grace_s
        )
        await self.shell.open()
        if task.start is not None:
            # Upstream types the start script into the agent's shell and ignores its status.
            result = await self.shell.run(task.start.code)
            if result.timed_out or result.unresponsive:
                raise InitScriptFailed(f"os {task.split}/{task.index}: the start script did not finish")
        self.stats["setup_s"] = round(time.monotonic() - t1, 4)
        return Step(
            [
                {"role": "system", "content": SYSTEM_PROMPT},
                {"role": "user", "content": USER_PROMPT.format(description=task.description)},
            ]
        )

    async def on_tool_call(self, call: ToolCall, message: Message) -> Step:
        if call.name == "bash_action":
            return await self._bash(call.id, call.arguments["script"])
        answer = call.arguments["answer"] if call.name == "answer_action" else call.arguments["thought"]
        return await self._commit(call.name, answer)

    async def on_bad_turn(self, bad: BadTurn, message: Message) -> Step:
        if isinstance(message, Mapping) and not message.get("tool_calls"):
            return Step([{"role": "user", "content": NO_TOOL_CALL}])
        if not self.upstream or not isinstance(message, Mapping) or message.get("role", "assistant") != "assistant":
            return Step(bad.observation)
        action = upstream.read_turn(message)
        if isinstance(action, upstream.Reply):
            return Step([{"role": "tool", "tool_call_id": action.call_id, "content": action.content}])
        if isinstance(action, upstream.Crash) or action is None:
            return self._upstream_task_error(action.error if action else "no tool call")
        if isinstance(action, upstream.Bash) and not isinstance(action.script, str):
            return await self._bash(action.call_id, action.script)  # runs nothing: still a bad turn
        # Upstream acts on this call as if it had followed the schema: not a bad turn after all.
        self.invalid_turns -= 1
        self.stats["lenient_calls"] += 1
        if isinstance(action, upstream.Bash):
            return await self._bash(action.call_id, action.script)
        return await self._commit(action.name, action.answer)

    async def _bash(self, call_id: str, script: Any) -> Step:
        assert self.shell is not None
        if not isinstance(script, str):  # upstream's Container.execute runs nothing for these
            return Step([{"role": "tool", "tool_call_id": call_id, "content": "The output of the OS is empty."}])
        result = await self.shell.run(script)
        self.stats["commands"] += 1
        self.stats["command_timeouts"] += int(result.timed_out)
        return Step([{"role": "tool", "tool_call_id": call_id, "content": format_observation(result, self.env.config)}])

    async def _commit(self, final_action: str, answer: Any) -> Step:
        assert self.container_id is not None
        if self.task.match is not None and upstream.match_crashes(answer, self.task.match):
            return self._upstream_task_error(f"re.search on an answer of type {type(answer).__name__}")
        verdict = await evaluate(
            answer, self.task, self.env.backend, self.container_id, timeout=self.env.config.script_timeout_s
        )
        return Step(
            [],  # upstream sends nothing after the final action
            status=Status.COMPLETED,
            reward=1.0 if verdict.success else 0.0,
            metrics={"evaluation": self.task.evaluation_type, "verdict": verdict.detail, "final_action": final_action},
        )

    def _upstream_task_error(self, why: str) -> Step:
        """A turn upstream's task raises on (``task error`` there, reward 0).

        Here the episode ends the same way but as the agent failure it is: in agentrl ``task
        error`` means broken infrastructure, which evaluation leaves out of its denominators.
        """
        return Step(
            [],
            status=Status.AGENT_INVALID_ACTION,
            reward=0.0,
            metrics={"evaluation": self.task.evaluation_type, "upstream_status": "task error", "upstream_error": why},
        )

    async def on_close(self) -> None:
        with anyio.CancelScope(shield=True):
            if self.shell is not None:
                await self.shell.close()
            target = self.container_id or self.name
            try:
                await self.env.backend.call(self.env.backend.remove, target)
            except Exception as exc:  # retried by aclose; the sweeper and the lifetime are the backstops
                log.warning("could not remove container %s: %s", target, exc)
                self.env.orphans.add(target)
                raise
            finally:
                self.env.live.pop(self.name, None)


class OSEnvironment(Environment):
    name = "os"
    tools = TOOLS

    def __init__(self, config: OSConfig | None = None) -> None:
        super().__init__(config or OSConfig())
        self.concurrency = self.config.concurrency
        if self.config.output_keep > self.config.output_limit:
            raise ValueError("environments.os: output_keep must be <= output_limit")
        self.backend = DockerBackend(self.config)
        self.pool = WarmPool(self.backend, self.config.warm_pool, self.config.container_lifetime_s / 2)
        self.live: dict[str, str | None] = {}  # session name -> container id (None while creating)
        self.orphans: set[str] = set()  # containers whose removal failed at close
        self._checked_images: dict[str, str] = {}
        self._lock = anyio.Lock()
        self._prepared = False

    # -- tasks ----------------------------------------------------------------------------

    def tasks(self, split: str) -> tuple[Task, ...]:
        return load_split(split, self.config.data_dir)

    def index_sets(self) -> dict[str, Sequence[Index]]:
        return {split: list(range(len(self.tasks(split)))) for split in SPLITS}

    def task(self, split: str, index: Index) -> Task:
        index = self.check_index(split, index)
        return self.tasks(split)[int(index)]

    # -- sessions -------------------------------------------------------------------------

    async def prepare(self) -> None:
        """Connect to Docker and sweep containers of dead workers (once)."""
        async with self._lock:
            if self._prepared:
                return
            await self.backend.call(lambda: self.backend.api)
            if self.config.sweep_on_start:
                removed = await self.backend.call(self.backend.sweep)
                if removed:
                    log.info("removed %d container(s) left by dead workers", removed)
            if self.config.warm_pool:
                self.pool.fill(await self.image_for("default"))  # 142 of the 144 std tasks use it
            self._prepared = True

    async def image_for(self, name: str) -> str:
        if name not in self._checked_images:
            ref = image_ref(name, self.config.image_prefix, self.config.image_tag, self.config.distro)
            await self.backend.call(self.backend.require_image, ref)
            self._checked_images[name] = ref
        return self._checked_images[name]

    async def open(self, split: str, index: Index) -> OSSession:
        task = self.task(split, index)
        await self.prepare()
        return OSSession(self, task)

    def oracle(self, split: str, index: Index, *, error_rate: float = 0.0, seed: int = 0) -> Any:
        from agentrl_env_os.oracle import OSOracle

        return OSOracle(self.task(split, index), error_rate=error_rate, seed=seed)

    def resource_count(self) -> int:
        """Containers of sessions not yet closed, plus any whose removal failed."""
        return len(self.live) + len(self.orphans)

    async def aclose(self) -> None:
        with anyio.CancelScope(shield=True):
            await self.backend.call(self.pool.close)
            leftovers = [cid or name for name, cid in self.live.items()] + list(self.orphans)  # never closed / failed
            for target in leftovers:
                await self.backend.call(self.backend.remove, target)
            self.live.clear()
            self.orphans.clear()
            await self.backend.call(self.backend.close)
