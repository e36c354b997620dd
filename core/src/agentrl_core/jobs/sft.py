"""``agentrl sft``: supervised cold start on demonstrations, with the same learner as RL.

Demonstrations (docs/architecture.md section 3; ``agentrl demos`` writes them from an environment's
oracle) are encoded exactly as rollouts are (:mod:`agentrl_core.train.sft_data`); the loss
(:func:`agentrl_core.train.losses.sft_nll_loss`) is the token-mean negative log-likelihood of the assistant tokens (loss_mask 1), computed
by the FSDP2 :class:`~agentrl_core.train.learner.Learner` at temperature 1, so SFT and RL
share micro-batching, sharding and checkpoint formats. Run it in one process, or with
``torchrun --nproc-per-node N -m agentrl_core.cli.main sft ...`` on several ranks.
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
import time
from pathlib import Path
from typing import Any

import attrs

from agentrl_core.config import Config
from agentrl_core.errors import ConfigError
from agentrl_core.jobs.progress import PhaseProgress
from agentrl_core.train.losses import sft_nll_loss

log = logging.getLogger(__name__)


def run_sft(config: Config, *, echo: Any = print) -> Path:
    """Train ``config.model.path`` on ``config.sft.data``; returns the saved model directory."""
    from agentrl_core.env.episodes import read_demonstrations
    from agentrl_core.rollout.tokenizer import load_tokenizer
    from agentrl_core.train.batching import TrainSample
    from agentrl_core.train.checkpoint import save_hf_model
    from agentrl_core.train.learner import Learner, compute_dtype, init_distributed
    from agentrl_core.train.sft_data import encode_demonstrations

    s = config.sft
    if not config.model.path:
        raise ConfigError("model.path is empty: the model to fine-tune")
    if not s.data:
        raise ConfigError("sft.data is empty: list demonstration files (agentrl demos writes them)")
    rank, world, device = init_distributed(config.train.device)
    if str(device).startswith("cpu"):  # the free cores, shared by the ranks of this machine
        from agentrl_core.cpu_threads import free_cores, set_torch_threads

        local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        threads = set_torch_threads(threads=max(1, free_cores() // local_ranks))
        if rank == 0:
            echo(f"sft: {threads} torch thread(s) per rank on CPU (the cores the machine's load leaves free)")
    tokenizer = load_tokenizer(config.model.path, config.model)
    records = [r for path in s.data for r in read_demonstrations(path)]
    sequences = encode_demonstrations(tokenizer, records, max_total_len=config.rollout.max_total_len,
                                      min_reward=s.min_reward)
    if not sequences:
        raise ConfigError(f"no demonstration left to train on ({len(records)} read; sft.min_reward={s.min_reward})")
    learner = Learner(
        config.model.path,
        train=attrs.evolve(config.train, reference=False),
        optim=attrs.evolve(config.optim, lr=s.lr),
        loss=attrs.evolve(config.loss, kl_coef=0.0, entropy_coef=0.0),
        temperature=1.0,
        loss_fn=sft_nll_loss,
        param_dtype=compute_dtype(config.model.dtype),
        trust_remote_code=config.model.trust_remote_code,
        lora=config.model.lora,
    )
    out_dir = Path(s.output_dir or config.run.dir / "sft_model")
    log_path = config.run.dir / "sft_metrics.jsonl"
    if rank == 0:
        config.run.dir.mkdir(parents=True, exist_ok=True)
        log_path.write_text("")
        below = ("" if s.min_reward is None else
                 f" ({sum(1 for r in records if float(r.get('reward', 0.0)) < s.min_reward)} below "
                 f"sft.min_reward {s.min_reward:g} left out)")
        echo(f"sft: {len(sequences)} sequences ({sum(sum(q.loss_mask) for q in sequences)} assistant tokens) "
             f"from {len(records)} demonstrations{below}, {s.epochs} epoch(s), batch {s.batch_size}, world {world}")
    rng = random.Random(config.run.seed)
    t0 = time.monotonic()
    step = 0
    steps_per_epoch = math.ceil(len(sequences) / s.batch_size)
    progress = PhaseProgress("sft", s.epochs * steps_per_epoch, echo=echo)
    for epoch in range(s.epochs):
        order = list(range(len(sequences)))
        rng.shuffle(order)
        for start in range(0, len(order), s.batch_size):
            batch = [sequences[i] for i in order[start:start + s.batch_size]]
            samples = [TrainSample(q.input_ids, q.loss_mask, [0.0] * len(q.input_ids), [1.0] * len(q.input_ids))
                       for q in batch]
            metrics = learner.train_step(samples)
            step += 1
            if rank == 0:
                with open(log_path, "a") as f:
                    f.write(json.dumps({"step": step, "epoch": epoch, **metrics}) + "\n")
                progress.update(step, tokens=float(metrics.get("num_tokens", 0.0)),
                                extra=f"epoch {epoch + 1}/{s.epochs}  nll {metrics.get('nll', 0.0):.4f}")
    save_hf_model(learner, out_dir)
    if rank == 0:
        echo(f"sft done in {time.monotonic() - t0:.1f} s; model saved to {out_dir}")
    learner.close()
    return out_dir
