"""Served LoRA adapters on a real vLLM server (CPU build): vLLM's own runtime LoRA loading.

The front loads PEFT folders with vLLM's ``/v1/load_lora_adapter`` and runs a request that
names one as vLLM's LoRARequest (``model: policy@vN`` on the token route). A request keeps
its adapter version across a load of the next one; an adapter in use is not unloaded; a
request without its adapter fails loudly. Log-probs equal a transformers forward of the
merged weights ``W + alpha / r * B @ A``.
"""

from __future__ import annotations

import json

import anyio
import pytest
import torch
from conftest import LONG, needs_vllm, wait_until

from agentrl_core.config import EngineConfig, LoraConfig, ModelConfig
from agentrl_core.rollout.engine_client import EngineClient, EngineError

pytestmark = [needs_vllm, pytest.mark.vllm, pytest.mark.processes]

RANK, ALPHA = 8, 16.0
MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@pytest.fixture(scope="module")
def engine(tiny_model_dir, tmp_path_factory):
    from agentrl_engine_vllm.driver import VLLMDriver

    config = EngineConfig(driver="vllm", device="cpu",
                          options={"vllm": {"dtype": "float32", "max_model_len": LONG + 8, "max_num_seqs": 8,
                                            "max_loras": 2}})
    model = ModelConfig(lora=LoraConfig(enabled=True, rank=RANK, alpha=ALPHA, target_modules=list(MODULES)))
    with VLLMDriver(engine=config, model=model, log_dir=str(tmp_path_factory.mktemp("vllm-lora-logs"))) as driver:
        [url] = driver.launch("current", str(tiny_model_dir), [])
        yield url


def write_adapter(model_dir, folder, seed):
    """A PEFT LoRA folder with random A and B (as PEFT saves them), and the merged transformers model."""
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    with torch.no_grad():
        for index, layer in enumerate(model.model.layers):
            for module in MODULES:
                owner = layer.self_attn if module.endswith(("q_proj", "k_proj", "v_proj", "o_proj")) else layer.mlp
                linear = getattr(owner, module)
                out_features, in_features = linear.weight.shape
                a = torch.randn(RANK, in_features, generator=generator) * 0.05
                b = torch.randn(out_features, RANK, generator=generator) * 0.05
                prefix = f"base_model.model.model.layers.{index}.{'self_attn' if owner is layer.self_attn else 'mlp'}"
                tensors[f"{prefix}.{module}.lora_A.weight"] = a
                tensors[f"{prefix}.{module}.lora_B.weight"] = b
                linear.weight += (ALPHA / RANK) * b @ a
    folder.mkdir(parents=True)
    save_file(tensors, str(folder / "adapter_model.safetensors"), metadata={"format": "pt"})
    (folder / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": RANK, "lora_alpha": ALPHA, "lora_dropout": 0.0,
        "target_modules": sorted(MODULES), "bias": "none", "use_rslora": False, "use_dora": False,
        "base_model_name_or_path": str(model_dir), "fan_in_fan_out": False, "modules_to_save": None}))
    return model


def reference_logprobs(model, prompt, output, temperature=1.0):
    with torch.no_grad():
        logits = model(torch.tensor([prompt + output])).logits[0, len(prompt) - 1:-1].float()
    return torch.log_softmax(logits / temperature, dim=-1).gather(-1, torch.tensor(output)[:, None])[:, 0]


def worst(result, model, prompt):
    return float((torch.tensor(result.logprobs) - reference_logprobs(model, prompt, result.output_ids)).abs().max())


def test_a_request_without_its_adapter_fails_loudly(engine):
    async def main():
        async with EngineClient(engine, lora="policy") as client:
            with pytest.raises(EngineError, match="adapter 'policy' is not loaded.*not run on the base model") as info:
                await client.generate([1, 2, 3], {"max_new_tokens": 2})
            assert info.value.status == 400
            with pytest.raises(EngineError, match="vLLM could not load 'policy@v9'"):
                await client.load_lora_adapter("policy@v9", "/nonexistent")
            assert (await client.model_info())["lora_adapters"] == []

    anyio.run(main)


def test_adapters_serve_by_version_and_a_running_request_keeps_its_own(engine, tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    v1 = write_adapter(tiny_model_dir, tmp_path / "policy@v1", seed=1)
    v2 = write_adapter(tiny_model_dir, tmp_path / "policy@v2", seed=2)
    prompt = [5, 6, 7, 8]
    params = {"temperature": 1.0, "ignore_eos": True}

    async def main():
        out = {}
        async with EngineClient(engine, lora="policy") as client, EngineClient(engine) as plain:
            await client.load_lora_adapter("policy@v1", str(tmp_path / "policy@v1"))
            out["v1"] = await client.generate(prompt, {**params, "max_new_tokens": 24, "sampling_seed": 1})
            out["base"] = await plain.generate(prompt, {**params, "max_new_tokens": 24, "sampling_seed": 1})

            async def long_request():
                out["long"] = await client.generate(prompt, {**params, "max_new_tokens": LONG, "sampling_seed": 2},
                                                    rid="long-one")

            async with anyio.create_task_group() as tg:
                tg.start_soon(long_request)
                start = (await plain.server_info())["generated_tokens"]

                async def generating():
                    return (await plain.server_info())["generated_tokens"] > start + 5

                await wait_until(generating, what="the long request to generate tokens")
                # the next version while it runs: no pause; v1 cannot go while the request uses it
                await client.load_lora_adapter("policy@v2", str(tmp_path / "policy@v2"))
                with pytest.raises(EngineError, match="'policy@v1' is in use by 1 requests") as info:
                    await client.unload_lora_adapter("policy@v1")
                out["busy_status"] = info.value.status
                out["v2"] = await client.generate(prompt, {**params, "max_new_tokens": 24, "sampling_seed": 3})
                out["still_running"] = (await plain.server_info())["in_flight"]
                await client.abort_request("long-one")
            await client.unload_lora_adapter("policy@v1")
            out["info"] = await client.model_info()
        return out

    out = anyio.run(main)
    assert out["busy_status"] == 409 and out["still_running"] == 1
    assert out["info"]["lora_adapters"] == ["policy@v2"]
    assert out["v1"].versions == [1] * 24 and out["v2"].versions == [2] * 24
    assert out["base"].versions == [0] * 24
    long = out["long"]
    assert long.finish_reason == "abort" and 20 < len(long.output_ids) < LONG  # many after v2 was loaded
    assert long.versions == [1] * len(long.output_ids)
    # every request's log-probs are those of its own merged weights, and not the other's
    for key, model, other in (("v1", v1, base), ("v2", v2, v1), ("long", v1, v2), ("base", base, v1)):
        assert worst(out[key], model, prompt) < 1e-4, key
        assert worst(out[key], other, prompt) > 1e-3, key
