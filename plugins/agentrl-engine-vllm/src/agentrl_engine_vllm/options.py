"""``engine.vllm``: the options of the vllm driver (validated by core's config loader).

```yaml
engine:
  driver: vllm
  vllm: {dtype: float32, max_num_seqs: 64, extra_args: [--max-num-batched-tokens, "4096"]}
```
"""

from __future__ import annotations

from typing import Any, Literal

from attrs import field, frozen

from agentrl_core.structure import in_range


@frozen
class VLLMOptions:
    python: str | None = None  # interpreter with vllm installed; None: the one running the driver
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    max_num_seqs: int = field(default=64, validator=in_range(1))  # vLLM's concurrent requests
    max_model_len: int | None = field(default=None, validator=in_range(16))
    enforce_eager: bool | None = None  # None: eager on CPU (compiling costs minutes there), graphs on GPU
    gpu_memory_utilization: float | None = field(default=None, validator=in_range(0.0, 1.0, lo_open=True))
    cpu_kv_cache_gib: int = field(default=1, validator=in_range(1))  # VLLM_CPU_KVCACHE_SPACE
    seed: int = 0
    verify_weights: bool = True  # after each weight update: engine weights == sent weights, bit for bit
    startup_timeout: float = field(default=600.0, validator=in_range(0.0, lo_open=True))
    extra_args: list[str] = field(factory=list)  # appended to vLLM's command line
    # model.lora: adapter versions vLLM holds at once (--max-loras, --max-cpu-loras); at least
    # rollout.staleness_bound + 1, the versions the learner keeps loaded
    max_loras: int = field(default=4, validator=in_range(1))


def options_from(engine: Any, default: VLLMOptions | None = None) -> VLLMOptions:
    """The ``engine.vllm`` section of an EngineConfig (a VLLMOptions, a plain mapping or absent)."""
    section = (getattr(engine, "options", None) or {}).get("vllm")
    if isinstance(section, VLLMOptions):
        return section
    if section is not None:
        from agentrl_core.config import structure

        return structure(VLLMOptions, section, path="engine.vllm")
    return default or VLLMOptions()
