"""Typed run configuration: YAML -> validated attrs objects, with ``--set`` overrides.

Defaults are the paper's (docs/architecture.md section 1). Component sections follow one shape: a
``name`` chooses the component, and a sub-section named after it configures it, e.g.::

    sampler:
      name: cross          # or the shorthand `sampler: cross`
      cross: {stale_ratio: 0.25, stale_step: 25}

Sub-sections of plugin components (environments, samplers, normalizers) are validated by
the plugin's own schema, and only when the plugin is installed: a section for a missing
plugin fails with "install agentrl-...". See :func:`load_config`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import attrs
from attrs import field, frozen

from agentrl_core.errors import ConfigError, PluginError
from agentrl_core.registry import Registry
from agentrl_core.structure import apply_override, in_range, load_yaml, structure, where
from agentrl_core.types import (
    AdvantageEstimatorSpec,
    AdvantageNormalizerSpec,
    AgentLoopSpec,
    AgentProgramSpec,
    ChatTemplateSpec,
    ComponentSpec,
    EnvironmentSpec,
    LoggerSpec,
    PolicyLossSpec,
    ReasoningParserSpec,
    RolloutEngineSpec,
    SamplerSpec,
    ToolParserSpec,
    WeightSyncTransportSpec,
)

__all__ = ["Config", "load_config", "config_from_dict", "structure", "config_to_dict"]


@frozen
class RunConfig:
    name: str = "agentrl"  # the run's name: the run folder's name ({name} in output_dir) and the trackers' run name
    # the run folder, where checkpoints, metrics and logs go; {name} is replaced by run.name
    output_dir: str = "runs/{name}"
    seed: int = 0  # seeds the task order, sampling in the engines (seed + engine index) and SFT's shuffling

    @property
    def dir(self) -> Path:
        return Path(self.output_dir.format(name=self.name))


@frozen
class LoraConfig:
    """LoRA adapters trained instead of the full weights (core/docs/lora.md); PEFT does the layers."""

    enabled: bool = False  # train LoRA adapters (pip install 'agentrl-core[lora]'); false: every weight
    rank: int = field(default=16, validator=in_range(1))  # r: the adapters' inner dimension
    alpha: float = field(default=32.0, validator=in_range(0.0, lo_open=True))  # scaling = alpha / rank
    dropout: float = field(default=0.0, validator=in_range(0.0, 1.0, hi_open=True))  # on the adapter's input
    # module names the adapters wrap (the linear layers of Qwen2/Llama attention and MLP), or ["all-linear"]
    target_modules: list[str] = field(factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj",
                                                        "gate_proj", "up_proj", "down_proj"])
    rslora: bool = False  # scaling = alpha / sqrt(rank) (rank-stabilised LoRA)


@frozen
class ModelConfig:
    path: str = ""  # the policy's Hugging Face checkpoint folder: initial weights, tokenizer and the engines' model
    # compute dtype on GPU: the learner's FSDP params, SGLang's --dtype, the weights sent (weight_sync.dtype auto)
    dtype: Literal["float32", "bfloat16", "float16"] = "bfloat16"
    # how tool calls are read from the model's text: qwen25, hermes, qwen3, qwen3_coder or a plugin's
    tool_parser: str = "qwen25"
    chat_template: str | None = None  # a .jinja file or the template text; replaces the checkpoint's
    trust_remote_code: bool = False  # tokenizer, learner and SGLang may run the checkpoint's code
    lora: LoraConfig = field(factory=LoraConfig)  # train LoRA adapters instead of every weight


@frozen
class TaskConfig:
    """One training or evaluation task: an environment and one of its index sets."""

    env: str  # the environment plugin serving the task (db, os, alfworld, ...)
    split: str = "train"  # the environment's index set (split) to draw samples from
    # training only: the share of groups from this task is weight / the sum of all tasks' weights
    weight: float = field(default=1.0, validator=in_range(0.0, lo_open=True))
    # training only: the advantage estimator sees this task's training rewards times reward_scale
    # (metrics and stored trajectories keep the environment's reward); for tasks scored on other scales
    reward_scale: float = field(default=1.0, validator=in_range(0.0, lo_open=True))
    name: str | None = None  # the task's name in metrics (task/<name>/...); None: <env>-<split>; must be unique
    indices: list[int | str] | None = None  # only these indices of the split; None: all of them
    # only the first limit indices (after indices, before shuffling); None: no limit
    limit: int | None = field(default=None, validator=in_range(1))

    @property
    def task_name(self) -> str:
        return self.name or f"{self.env}-{self.split}"

    def select_indices(self, available: Sequence[int | str], *, role: str = "task") -> list[int | str]:
        """The indices this task plays out of its split's ``available`` ones: ``indices`` (each must be
        in the split; an int also names a string index by position, as environments accept) or all of
        them, then the first ``limit``. An index the split lacks is a ConfigError naming it (``role``
        says which task it is: "task", "eval task")."""
        selected = list(available)
        if self.indices is not None:
            known = {str(i) for i in available}
            by_position = bool(available) and isinstance(available[0], str)
            missing = [i for i in self.indices if str(i) not in known
                       and not (by_position and isinstance(i, int) and 0 <= i < len(available))]
            if missing:  # one sentence now, rather than each episode an infrastructure failure later
                shown = ", ".join(map(str, missing[:5])) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
                raise ConfigError(f"{role} {self.task_name!r}: indices {shown} are not in split {self.split!r} of "
                                  f"{self.env!r} ({len(available)} indices)")
            selected = list(self.indices)
        return selected[: self.limit] if self.limit is not None else selected


@frozen
class ControllerConfig:
    """The environment control plane (docs/architecture.md section 4); every duration is in seconds."""

    url: str | None = None  # None: start an embedded controller and workers
    host: str = "127.0.0.1"  # the interface an embedded controller (url None) or `agentrl controller` listens on
    port: int = 0  # the port it listens on; 0 picks a free one
    heartbeat_interval: float = field(default=8.0, validator=in_range(0.0, lo_open=True))  # workers send
    unresponsive_after: float = field(default=11.0, validator=in_range(0.0, lo_open=True))  # no heartbeat: no new sessions
    remove_after: float = field(default=300.0, validator=in_range(0.0, lo_open=True))  # no heartbeat: forget the worker
    idle_session_timeout: float = field(default=300.0, validator=in_range(0.0, lo_open=True))  # no call: cancel
    request_timeout: float = field(default=120.0, validator=in_range(0.0, lo_open=True))  # one interact on a worker
    # task workers an embedded controller starts for each task
    workers_per_env: int = field(default=1, validator=in_range(1))
    start_timeout: float = field(default=300.0, validator=in_range(0.0, lo_open=True))  # a worker setting up a sample
    cancel_timeout: float = field(default=30.0, validator=in_range(0.0, lo_open=True))  # a worker acknowledging a cancel
    connect_timeout: float = field(default=5.0, validator=in_range(0.0, lo_open=True))  # opening a connection to a worker
    reconcile_interval: float = field(default=60.0, validator=in_range(0.0, lo_open=True))  # compare with get_sessions
    cancel_notice_timeout: float = field(default=60.0, validator=in_range(0.0, lo_open=True))  # then reconcile instead
    max_body_bytes: int = field(default=32 * 1024 * 1024, validator=in_range(1024))  # larger requests get 413
    finished_sessions_kept: int = field(default=100_000, validator=in_range(0))  # remembered for "already ended"
    # let workers register without the run's token (upstream AgentBench-FC workers cannot send one);
    # the controller then never sends the token to such a worker
    unauthenticated_workers: bool = False


@frozen
class DynamicSamplingConfig:
    """DAPO's dynamic sampling: groups whose rewards are all equal (no advantage signal) are
    filtered out before the learner, and more groups are generated to keep the batch full
    (docs/architecture.md section 6)."""

    enabled: bool = False  # filter out groups whose training rewards are all equal (needs rollout.n_samples >= 2)
    # at most this x batch_size groups completed per step beyond the batch (filtered ones included)
    max_extra_factor: float = field(default=1.0, validator=in_range(0.0))
    # the bound is hit short of the batch: fill it up with filtered groups (advantage 0: the step
    # trains as without filtering), or train the useful groups alone (filled only when there is none)
    fallback: Literal["fill", "useful"] = "fill"

    def max_extra_groups(self, batch_groups: int) -> int:
        return math.ceil(self.max_extra_factor * batch_groups)


@frozen
class RolloutConfig:
    # samples per group: the rollouts of one prompt that GRPO compares
    n_samples: int = field(default=8, validator=in_range(1))
    # groups per training step (so batch_size x n_samples trajectories)
    batch_size: int = field(default=256, validator=in_range(1))
    concurrency: int = field(default=2048, validator=in_range(1))  # episodes running at once, all tasks together
    # assistant turns per episode; reaching it ends the episode as 'task limit reached'
    max_turns: int = field(default=20, validator=in_range(1))
    # tokens per episode, prompt included; also the engines' context length
    max_total_len: int = field(default=8192, validator=in_range(16))
    # tokens one assistant turn may generate (less when max_total_len leaves less room)
    max_new_tokens: int = field(default=1024, validator=in_range(1))
    # sampling temperature of the rollouts (the learner's log-probs use the same)
    temperature: float = field(default=0.8, validator=in_range(0.0, lo_open=True))
    # nucleus sampling: keep the most likely tokens up to this probability mass; 1: off
    top_p: float = field(default=1.0, validator=in_range(0.0, 1.0, lo_open=True))
    top_k: int = -1  # keep only the k most likely tokens; -1: off
    # the training reward of an episode the agent failed (context or turn limit, invalid action)
    incomplete_punishment: float = -0.2
    agent_loop: str = "chat"  # the agent loop that plays episodes: chat (built in) or a plugin's
    # the options of a plugin agent loop, validated by its schema (the built-in chat loop takes none)
    agent_loop_options: dict[str, Any] = field(factory=dict)
    # the first step waits for this x the batch's trajectories (whole groups), to fill the pipeline
    warmup_factor: float = field(default=1.7, validator=in_range(1.0))
    # new groups wait while the buffer holds this x a batch's trajectories, not yet trained
    buffer_max_factor: float = field(default=2.0, validator=in_range(1.0))
    # re-runs of a sample after infrastructure failures before its group is dropped
    max_infra_retries: int = field(default=2, validator=in_range(0))
    # a group is trained at most this many policy versions after the one its rollouts started on (AReaL's bound); None: none
    staleness_bound: int | None = field(default=None, validator=in_range(0))
    # the circuit breaker: this many groups dropped in a row stop the run (None: twice the larger of
    # batch_size and the groups in flight, at least 8)
    max_consecutive_dropped_groups: int | None = field(default=None, validator=in_range(1))
    # interruptible generation: a weight sync pauses in-flight turns and continues them under the new
    # weights, every token tagged with the version that sampled it; false: turns cut by a sync are
    # aborted and generated again from their start (docs/architecture.md section 5)
    partial_rollouts: bool = True
    dynamic_sampling: DynamicSamplingConfig = field(factory=DynamicSamplingConfig)


@frozen
class HFEngineOptions:
    max_running_requests: int = field(default=64, validator=in_range(1))  # generations one engine batches at once
    # torch threads of an engine on CPU; None: its pinned cores' free share, else torch's default
    threads: int | None = field(default=None, validator=in_range(1))
    # the engine's weights and compute dtype; auto: the checkpoint's
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"


@frozen
class SGLangOptions:
    python: str = "python"  # the interpreter that runs sglang.launch_server (a venv with SGLang)
    tp_size: int = field(default=1, validator=in_range(1))  # GPUs (tensor-parallel ranks) per engine
    # SGLang's --mem-fraction-static (GPU memory for weights and KV cache); None: SGLang's
    mem_fraction_static: float | None = field(default=None, validator=in_range(0.0, 1.0, lo_open=True))
    extra_args: list[str] = field(factory=list)  # extra command-line arguments for sglang.launch_server
    # seconds an engine may take to load and answer /health
    startup_timeout: float = field(default=900.0, validator=in_range(0.0, lo_open=True))
    # model.lora: adapter versions in one batch (--max-loras-per-batch; --max-loaded-loras is one more, for the
    # version being loaded); at least rollout.staleness_bound + 1, the versions the learner keeps loaded
    max_loras: int = field(default=4, validator=in_range(1))


@frozen
class EngineConfig:
    __extra_sections__ = "options"  # a plugin driver's section (engine.vllm), validated by its schema

    driver: str = "hf"  # what starts the rollout engines: hf (agentrl's engine), sglang, or a plugin's (vllm)
    # the engines' device kind; auto: cuda when available (agentrl eval reads auto as cpu)
    device: Literal["auto", "cpu", "cuda"] = "auto"
    # engines per pool on CPU and in agentrl eval; on GPU a pool gets one engine per tp_size GPUs (1 for hf)
    num_engines: int = field(default=1, validator=in_range(1))
    # async mode: the share of the devices (GPUs, or CPU cores) given to the engines; the rest train
    rollout_ratio: float = field(default=0.5, validator=in_range(0.0, 1.0, lo_open=True))
    # seconds between /health probes of every engine
    health_check_interval: float = field(default=10.0, validator=in_range(0.0, lo_open=True))
    unhealthy_checks: int = field(default=3, validator=in_range(1))  # failed checks in a row: restart it
    # engine restarts allowed in a run; one more dead engine stops it
    max_restarts: int = field(default=10, validator=in_range(0))
    # one /health probe may take this long (SGLang's own wait is 20 s)
    health_timeout: float = field(default=30.0, validator=in_range(0.0, lo_open=True))
    # the deadline of every other engine call, a whole generation included
    request_timeout: float = field(default=900.0, validator=in_range(0.0, lo_open=True))
    # engines sharing a device with the learner release their memory (KV cache; weights when a sync
    # follows) while it trains, and resume it after; null (auto): on when they share a GPU
    release_memory: bool | None = None
    hf: HFEngineOptions = field(factory=HFEngineOptions)
    sglang: SGLangOptions = field(factory=SGLangOptions)
    # engine.<driver>: a plugin driver's section (engine.vllm), validated by its schema
    options: dict[str, Any] = field(factory=dict)


@frozen
class SamplerConfig:
    __shorthand__ = "name"
    __extra_sections__ = "options"

    name: str = "current"  # which engine pool generates each turn: current (the latest weights) or a plugin's (cross)
    options: dict[str, Any] = field(factory=dict)  # sampler.<name>: the sampler's section, validated by its schema


@frozen
class AdvantageConfig:
    __extra_sections__ = "options"

    estimator: str = "grpo"  # group advantage estimator: grpo, rloo, reinforce_pp_baseline or a plugin's
    normalizers: list[str] = field(factory=list)  # advantage normalizers applied in order over the batch (plugin: task)
    # advantage.<name>: an estimator's or normalizer's section, validated by its schema
    options: dict[str, Any] = field(factory=dict)


@frozen
class LossConfig:
    name: str = "ppo_dual_clip"  # the policy loss: ppo_dual_clip (built in) or a plugin's
    # PPO's clip range below 1: the ratio is clipped at 1 - clip_low
    clip_low: float = field(default=0.2, validator=in_range(0.0, lo_open=True))
    # PPO's clip range above 1: the ratio is clipped at 1 + clip_high
    clip_high: float = field(default=0.2, validator=in_range(0.0, lo_open=True))
    # dual clip: for negative advantages the loss is at most -c x advantage (c > 1)
    dual_clip_c: float = field(default=3.0, validator=in_range(1.0, lo_open=True))
    # weight of the k3 KL penalty to the frozen reference; 0: off (and train.reference may be false)
    kl_coef: float = field(default=1e-4, validator=in_range(0.0))
    # the k3 KL of each token is clamped to [-kl_clamp, kl_clamp]
    kl_clamp: float = field(default=10.0, validator=in_range(0.0, lo_open=True))
    entropy_coef: float = 0.0  # weight of the entropy bonus subtracted from the loss; 0: off
    # token-mean: over all loss tokens of the batch; seq-mean: each sequence's token mean, then over sequences
    aggregation: Literal["token-mean", "seq-mean"] = "token-mean"
    # off-policy correction: ppo = the ratio against the behaviour log-probs the engine reported;
    # decoupled = AReaL's decoupled PPO (clip against the proximal policy, the learner's weights before
    # this step's update, times the capped behaviour importance weight; docs/architecture.md section 6)
    off_policy: Literal["ppo", "decoupled"] = "ppo"
    behave_weight_cap: float | None = field(default=5.0, validator=in_range(1.0))  # decoupled only; None: no cap


@frozen
class OptimConfig:
    lr: float = field(default=1e-6, validator=in_range(0.0, lo_open=True))  # AdamW's learning rate (after warmup)
    betas: list[float] = field(factory=lambda: [0.9, 0.999])  # AdamW's beta1 and beta2
    eps: float = 1e-8  # AdamW's epsilon
    weight_decay: float = field(default=0.0, validator=in_range(0.0))  # AdamW's decoupled weight decay
    # the gradient's global norm is clipped to this
    grad_clip: float = field(default=1.0, validator=in_range(0.0, lo_open=True))
    # the learning rate rises linearly to lr over this many steps; 0: none
    warmup_steps: int = field(default=0, validator=in_range(0))


@frozen
class TrainConfig:
    # async: engines and learner on separate devices, rollouts overlap training; sync: colocated, alternating
    mode: Literal["async", "sync"] = "async"
    # training steps (one optimizer step each); a resumed run stops at the same total
    total_steps: int = field(default=100, validator=in_range(1))
    device: Literal["auto", "cpu", "cuda"] = "auto"  # where the learner and the engines run; auto: cuda if available
    # learner ranks (FSDP); one device (GPU, or set of CPU cores) each
    world_size: int = field(default=1, validator=in_range(1))
    # the token budget of one micro-batch, counted as micro_batch_layout lays it out
    max_tokens_per_micro_batch: int = field(default=8192, validator=in_range(1))
    micro_batch_layout: Literal["packed", "padded"] = "packed"  # packed: no padding (core/docs/learner.md)
    gradient_checkpointing: bool = False  # recompute activations in the backward pass: less memory, more compute
    reference: bool = True  # keep a frozen reference model (needed when kl_coef > 0)
    # save a checkpoint every N steps (and at the end); 0: never
    checkpoint_every: int = field(default=50, validator=in_range(0))
    # checkpoints kept in <run dir>/checkpoints; older ones are deleted
    keep_checkpoints: int = field(default=3, validator=in_range(1))
    save_hf_model: bool = False  # also a Hugging Face copy of the weights in every checkpoint (<checkpoint>/hf)
    final_model: bool = True  # write the trained policy as a Hugging Face folder, <run dir>/final_model, at the end
    # validate on eval_tasks every N steps (and at the end); 0: only at the end
    eval_every: int = field(default=0, validator=in_range(0))
    eval_tasks: list[TaskConfig] = field(factory=list)


@frozen
class WeightSyncConfig:
    # how weights reach the engines: collective (torch.distributed), disk, or a plugin's (vllm_nccl)
    transport: str = "collective"
    # the collective's backend; auto: nccl when CUDA is available, else gloo
    backend: Literal["auto", "gloo", "nccl"] = "auto"
    # MiB of tensors sent per broadcast bucket
    bucket_mb: float = field(default=512.0, validator=in_range(0.0, lo_open=True))
    disk_path: str | None = None  # the disk transport's folder, readable by every engine (required for disk)
    timeout_s: float = field(default=600.0, validator=in_range(0.0, lo_open=True))  # the deadline of a whole connect/sync
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"  # auto: model.dtype on GPU, float32 on CPU


@frozen
class LaunchConfig:
    address: str | None = None  # Ray cluster address; None starts a local Ray
    use_ray: bool = True  # not read: agentrl train always places its learner and engines with Ray
    # CPU cores to use (the first ones this process may run on) and Ray's CPUs; None: all
    num_cpus: int | None = field(default=None, validator=in_range(1))
    # GPUs to use (the first ones) and Ray's GPUs; None: all
    num_gpus: int | None = field(default=None, validator=in_range(0))
    # custom Ray resources every learner-rank / engine bundle also asks for, to pin them to nodes
    # that advertise them (ray start --resources '{"trainer": 8}')
    learner_resources: dict[str, float] = field(factory=dict)
    # the same for every engine bundle: engines go to nodes with these resources
    engine_resources: dict[str, float] = field(factory=dict)


@frozen
class LoggingConfig:
    __extra_sections__ = "options"

    # where each step's metrics go: jsonl (metrics.jsonl), tensorboard, or a plugin's (mlflow, wandb, trackio)
    loggers: list[str] = field(factory=lambda: ["jsonl"])
    # decoded rollouts written to samples.jsonl each step (best and worst per task); 0: none
    sample_rollouts: int = field(default=2, validator=in_range(0))
    progress: bool = True  # print a line per step and a live panel on the console
    # a step that has waited this many seconds for rollouts logs what the episodes in flight are doing
    # (per task: phase, turn, longest wait; retries, the last failure), again each as long; 0: never
    stall_report: float = field(default=120.0, validator=in_range(0.0))
    # <run dir>/trajectories.sqlite: every trained trajectory with its tokens (core/docs/observability.md)
    trajectory_store: bool = True
    trajectory_store_max_steps: int = field(default=100, validator=in_range(1))  # older steps are deleted
    options: dict[str, Any] = field(factory=dict)  # logging.<logger>: that logger's section (logging.mlflow)


@frozen
class SFTConfig:
    """``agentrl sft``: supervised cold start on demonstrations (message-level JSONL)."""

    data: list[str] = field(factory=list)  # demonstration files, e.g. written by `agentrl demos`
    epochs: int = field(default=1, validator=in_range(1))  # passes over the demonstrations
    batch_size: int = field(default=32, validator=in_range(1))  # sequences per optimizer step
    # AdamW's learning rate for SFT (the rest of optim applies)
    lr: float = field(default=1e-5, validator=in_range(0.0, lo_open=True))
    min_reward: float | None = None  # keep only demonstrations with at least this reward
    output_dir: str | None = None  # None: <run dir>/sft_model


@frozen
class EvalModelConfig:
    """One named model of an evaluation: a checkpoint to launch engines for, or running engines."""

    path: str | None = None  # a checkpoint folder to start engines for; None with no urls: model.path
    urls: list[str] = field(factory=list)  # running engines to use instead of starting some


@frozen
class EvalConfig:
    """``agentrl eval``: which tasks, how many repeats, which models, and how to combine them."""

    tasks: list[TaskConfig] = field(factory=list)  # empty: train.eval_tasks
    repeats: int = field(default=1, validator=in_range(1))  # times each index is played (per model); pass@k uses them
    # single: each model alone; mix: repeat r by model r mod M; cross: each turn's model by the cross sampler
    mode: Literal["single", "mix", "cross"] = "single"
    models: dict[str, EvalModelConfig] = field(factory=dict)  # empty: {"default": model.path}
    # episodes running at once (also train.eval_tasks' validation)
    concurrency: int = field(default=64, validator=in_range(1))
    temperature: float | None = field(default=None, validator=in_range(0.0))  # None: rollout.temperature
    output_dir: str | None = None  # None: <run dir>/eval


@frozen
class GatewayConfig:
    """The OpenAI-compatible training gateway (``agentrl gateway``; core/docs/gateway.md). Durations in seconds."""

    host: str = "127.0.0.1"  # the interface the gateway listens on
    port: int = field(default=0, validator=in_range(0, 65535))  # the port it listens on; 0 picks a free one
    served_model_name: str | None = None  # None: the model directory's name (any name is accepted in requests)
    chat_template: str = "hf"  # a chat template plugin: hf (the tokenizer's, or model.chat_template), qwen3, ...
    tool_parser: str | None = None  # None: model.tool_parser
    reasoning_parser: str | None = None  # e.g. think: <think>...</think> returned as reasoning_content
    # rollout: temperature, top_p and top_k are the run's (rollout.*), so log-probs match the learner's;
    # client: as each request asks (for serving or data collection, not for training)
    sampling: Literal["rollout", "client"] = "rollout"
    on_weight_update: Literal["hold", "reject"] = "hold"  # hold the call, or answer 429 with Retry-After
    # fork: a reply the template would show the model as other text (a reformatted tool call, a dropped
    # <think> block) starts a new sample from the template's rendering; keep_history: keep what the model
    # wrote and append (the chat loop's on_template_rewrite)
    on_template_rewrite: Literal["fork", "keep_history"] = "fork"
    # the Retry-After of a 429 while weights update (reject, or a call aborted too often under hold)
    retry_after_s: float = field(default=2.0, validator=in_range(0.0, lo_open=True))
    idle_timeout: float = field(default=300.0, validator=in_range(0.0, lo_open=True))  # no call: the session expires
    max_duration: float = field(default=3600.0, validator=in_range(0.0, lo_open=True))  # a session's whole life
    finished_ttl: float = field(default=600.0, validator=in_range(0.0))  # an ended session's record is kept
    replay_window: int = field(default=8, validator=in_range(1))  # recent calls per session a retry can replay
    max_abort_retries: int = field(default=100, validator=in_range(0))  # hold: resend a call aborted by updates
    max_body_bytes: int = field(default=64 * 1024 * 1024, validator=in_range(1024))  # larger requests get 413
    export: str | None = None  # append every ended session's record (tokens included) to this JSONL file


@frozen
class AgentConfig:
    """``agentrl train`` with an agent program: ``agent: NAME`` (a plugin) or ``agent: path/to/file.py:function``."""

    __shorthand__ = "name"
    __extra_sections__ = "options"

    name: str | None = None  # an agentrl_agent_programs name, "module:function" or "file.py:function"
    # a program written as a plain (blocking) function runs in threads; at most this many at once
    threads: int = field(default=64, validator=in_range(1))
    options: dict[str, Any] = field(factory=dict)  # agent.<name>: the agent program's section, validated by its schema

    @property
    def is_reference(self) -> bool:
        """``module:function`` or ``file.py:function`` rather than a registered program's name."""
        return self.name is not None and ":" in self.name


@frozen
class Config:
    run: RunConfig = field(factory=RunConfig)
    model: ModelConfig = field(factory=ModelConfig)
    tasks: list[TaskConfig] = field(factory=list)
    # environments.<env>: an environment's section, validated by the plugin's schema
    environments: dict[str, Any] = field(factory=dict)
    controller: ControllerConfig = field(factory=ControllerConfig)
    rollout: RolloutConfig = field(factory=RolloutConfig)
    engine: EngineConfig = field(factory=EngineConfig)
    sampler: SamplerConfig = field(factory=SamplerConfig)
    advantage: AdvantageConfig = field(factory=AdvantageConfig)
    loss: LossConfig = field(factory=LossConfig)
    optim: OptimConfig = field(factory=OptimConfig)
    train: TrainConfig = field(factory=TrainConfig)
    weight_sync: WeightSyncConfig = field(factory=WeightSyncConfig)
    launch: LaunchConfig = field(factory=LaunchConfig)
    logging: LoggingConfig = field(factory=LoggingConfig)
    eval: EvalConfig = field(factory=EvalConfig)
    sft: SFTConfig = field(factory=SFTConfig)
    gateway: GatewayConfig = field(factory=GatewayConfig)
    agent: AgentConfig = field(factory=AgentConfig)

    def environment_config(self, env: str) -> Any:
        """The validated config object of environment ``env`` (schema defaults if absent)."""
        return self.environments.get(env)


def config_from_dict(
    data: Mapping[str, Any] | None,
    *,
    marks: Mapping[str, str] | None = None,
    registry: Registry | None = None,
    validate_plugins: bool = True,
) -> Config:
    """Structure and validate a config mapping, including plugin sections."""
    config = structure(Config, dict(data or {}), marks=marks)
    if validate_plugins:
        config = validate_plugin_sections(config, registry or Registry(), marks)
    return config


def load_config(
    path: str | Path | None = None,
    overrides: Iterable[str] = (),
    *,
    registry: Registry | None = None,
    validate_plugins: bool = True,
) -> Config:
    """Load a YAML file (or nothing: all defaults) and apply ``key=value`` overrides."""
    data: dict[str, Any] = {}
    marks: dict[str, str] = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file {str(path)!r} does not exist")
        data, marks = load_yaml(path.read_text(), source=path.name)
        if not isinstance(data, dict):
            raise ConfigError(f"{path.name} must hold a mapping at the top level, got {type(data).__name__}")
    for assignment in overrides:
        apply_override(data, assignment)
        key = assignment.partition("=")[0].strip()
        for depth in range(key.count(".") + 1, 0, -1):  # the key and its parents point at --set
            marks.setdefault(".".join(key.split(".")[:depth]), f"--set {assignment}")
        marks[key] = f"--set {assignment}"
    return config_from_dict(data, marks=marks, registry=registry, validate_plugins=validate_plugins)


def validate_plugin_sections(config: Config, registry: Registry, marks: Mapping[str, str] | None = None) -> Config:
    """Validate every component choice and plugin sub-section against the registry."""

    def spec_or_error(kind: type[ComponentSpec[Any]], name: str, path: str) -> None:
        try:
            registry.spec(kind, name)
        except PluginError as exc:
            raise ConfigError(f"{path}{where(path, marks)}: {exc}") from None

    def validated(kind: type[ComponentSpec[Any]], name: str, section: Any, path: str) -> Any:
        spec_or_error(kind, name, path)
        schema = registry.config_schema(kind, name)
        if schema is None:
            if section:
                raise ConfigError(f"{path}{where(path, marks)}: {kind.kind.replace('_', ' ')} {name!r} takes no options")
            return None
        return structure(schema, section or {}, path=path, marks=marks)

    envs = {}
    all_tasks = (*config.tasks, *config.train.eval_tasks, *config.eval.tasks)
    used_envs = {t.env for t in all_tasks} | set(config.environments)
    for section, tasks in (("tasks", config.tasks), ("train.eval_tasks", config.train.eval_tasks),
                           ("eval.tasks", config.eval.tasks)):
        for i, task in enumerate(tasks):
            spec_or_error(EnvironmentSpec, task.env, f"{section}[{i}].env")
    for env in sorted(used_envs):
        envs[env] = validated(EnvironmentSpec, env, config.environments.get(env), f"environments.{env}")

    spec_or_error(SamplerSpec, config.sampler.name, "sampler.name")
    sampler_options = {
        name: validated(SamplerSpec, name, section, f"sampler.{name}") for name, section in config.sampler.options.items()
    }
    if config.sampler.name not in sampler_options:
        sampler_options[config.sampler.name] = validated(SamplerSpec, config.sampler.name, None, "sampler.name")

    spec_or_error(AdvantageEstimatorSpec, config.advantage.estimator, "advantage.estimator")
    for i, name in enumerate(config.advantage.normalizers):
        spec_or_error(AdvantageNormalizerSpec, name, f"advantage.normalizers[{i}]")
    adv_options = {}
    for name, section in config.advantage.options.items():
        kind: type[ComponentSpec[Any]] | None = None
        if name in registry.names(AdvantageNormalizerSpec):
            kind = AdvantageNormalizerSpec
        elif name in registry.names(AdvantageEstimatorSpec):
            kind = AdvantageEstimatorSpec
        adv_options[name] = validated(kind or AdvantageNormalizerSpec, name, section, f"advantage.{name}")
    for name in config.advantage.normalizers:
        adv_options.setdefault(name, validated(AdvantageNormalizerSpec, name, None, "advantage.normalizers"))

    spec_or_error(PolicyLossSpec, config.loss.name, "loss.name")
    spec_or_error(RolloutEngineSpec, config.engine.driver, "engine.driver")
    engine_options = {
        name: validated(RolloutEngineSpec, name, section, f"engine.{name}") for name, section in config.engine.options.items()
    }
    spec_or_error(WeightSyncTransportSpec, config.weight_sync.transport, "weight_sync.transport")
    spec_or_error(ToolParserSpec, config.model.tool_parser, "model.tool_parser")
    spec_or_error(AgentLoopSpec, config.rollout.agent_loop, "rollout.agent_loop")
    validated(AgentLoopSpec, config.rollout.agent_loop, config.rollout.agent_loop_options, "rollout.agent_loop_options")
    for i, name in enumerate(config.logging.loggers):
        spec_or_error(LoggerSpec, name, f"logging.loggers[{i}]")
    logger_options = {
        name: validated(LoggerSpec, name, section, f"logging.{name}") for name, section in config.logging.options.items()
    }
    spec_or_error(ChatTemplateSpec, config.gateway.chat_template, "gateway.chat_template")
    if config.gateway.tool_parser is not None:
        spec_or_error(ToolParserSpec, config.gateway.tool_parser, "gateway.tool_parser")
    if config.gateway.reasoning_parser is not None:
        spec_or_error(ReasoningParserSpec, config.gateway.reasoning_parser, "gateway.reasoning_parser")
    agent = config.agent
    agent_options = dict(agent.options)
    if agent.name is not None and not agent.is_reference:
        agent_options[agent.name] = validated(AgentProgramSpec, agent.name, agent.options.get(agent.name), "agent.name")
    elif agent.options:
        extra = ", ".join(sorted(agent.options))
        raise ConfigError(f"agent.{extra}{where('agent', marks)}: options are for a registered agent program; "
                          f"agent.name is {agent.name!r}")

    return attrs.evolve(
        config,
        agent=attrs.evolve(agent, options=agent_options),
        environments=envs,
        sampler=attrs.evolve(config.sampler, options=sampler_options),
        advantage=attrs.evolve(config.advantage, options=adv_options),
        engine=attrs.evolve(config.engine, options=engine_options),
        logging=attrs.evolve(config.logging, options=logger_options),
    )


def config_to_dict(config: Any) -> Any:
    """A plain, YAML-serializable dict of a (validated) config; ``load_config`` reads it back.

    Extra sections (``sampler.options``) are written back at their section's level, where
    the loader expects them.
    """
    if attrs.has(type(config)):
        extra = getattr(type(config), "__extra_sections__", None)
        out = {}
        for f in attrs.fields(type(config)):
            value = config_to_dict(getattr(config, f.name))
            if f.name == extra:
                out.update(value)
            else:
                out[f.alias or f.name] = value
        return out
    if isinstance(config, dict):
        return {k: config_to_dict(v) for k, v in config.items()}
    if isinstance(config, list | tuple):
        return [config_to_dict(v) for v in config]
    return config
