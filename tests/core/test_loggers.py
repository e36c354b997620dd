"""The jsonl and tensorboard loggers, built through the registry as the pipeline does."""

from __future__ import annotations

import json

import torch

from agentrl_core.registry import Registry
from agentrl_core.train.loggers import flatten_metrics

METRICS = {
    "loss": torch.tensor(0.25),
    "task": {"db-std": {"reward": 0.5, "success": 1}},
    "grad_norm": float("nan"),
    "samples": ["<|im_start|>user ...", "<|im_start|>assistant ..."],
}


def test_flatten_joins_nested_keys_and_converts_tensors():
    flat = dict(flatten_metrics(METRICS))
    assert flat["loss"] == 0.25 and isinstance(flat["loss"], float)
    assert flat["task/db-std/reward"] == 0.5 and flat["task/db-std/success"] == 1


def test_jsonl_appends_one_record_per_step(tmp_path):
    logger = Registry().build("logger", "jsonl", None, run_dir=tmp_path)
    logger.log(1, METRICS)
    logger.log(2, {"loss": 0.125})
    logger.close()
    again = Registry().build("logger", "jsonl", None, run_dir=tmp_path)  # a resumed run appends
    again.log(3, {"loss": 0.0625})
    again.close()
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [1, 2, 3]
    assert lines[0]["task/db-std/reward"] == 0.5 and lines[0]["grad_norm"] == "nan"
    assert lines[0]["samples"][1].startswith("<|im_start|>assistant")
    assert lines[2]["loss"] == 0.0625


def test_tensorboard_writes_scalars_and_text(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with Registry().build("logger", "tensorboard", None, run_dir=tmp_path) as logger:
        logger.log(1, METRICS)
        logger.log(2, {"loss": 0.5, "task": {"db-std": {"reward": 0.75}}})
    events = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"tensors": 0, "scalars": 0})
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("loss")] == [(1, 0.25), (2, 0.5)]
    assert [e.value for e in events.Scalars("task/db-std/reward")] == [0.5, 0.75]
    assert "samples/text_summary" in events.Tags()["tensors"]
