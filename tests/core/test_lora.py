"""LoRA in the learner (``model.lora``): adapters alone trained, the reference is the base model,
merged weights give the learner's own log-probs, PEFT reads the exported adapter, and a
checkpoint (adapter-sized) resumes exactly, on one rank and on two gloo ranks.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.multiprocessing as mp
from test_fsdp import _free_port, make_samples, naive_logprobs

from agentrl_core.config import LoraConfig, LossConfig, OptimConfig, TrainConfig

TEMPERATURE = 0.8
LORA = LoraConfig(enabled=True, rank=4, alpha=8.0, target_modules=["q_proj", "v_proj", "down_proj"])
LOSS = LossConfig(kl_coef=0.1, entropy_coef=0.0)


def _learner(model_dir, lr=1e-2, lora=LORA):
    from agentrl_core.train.learner import Learner

    return Learner(model_dir, train=TrainConfig(device="cpu", max_tokens_per_micro_batch=200),
                   optim=OptimConfig(lr=lr), loss=LOSS, temperature=TEMPERATURE, lora=lora)


def _plain(model_dir, tensors=None):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="sdpa")
    if tensors is not None:
        missing, unexpected = model.load_state_dict(tensors, strict=False)
        assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
        model.tie_weights()
    return model.eval()


def _learner_logprobs(learner, samples):
    """The learner model's own log-probs of ``samples`` (one forward per sequence, as naive_logprobs)."""
    with torch.no_grad():
        learner.model.eval()
        try:
            return naive_logprobs(learner.model, samples)
        finally:
            learner.model.train()


def test_only_the_adapter_trains_and_the_optimizer_is_adapter_sized(tiny_model_dir, world_of_one):
    learner = _learner(tiny_model_dir)
    trained = {n for n, p in learner.model.named_parameters() if p.requires_grad}
    assert trained and all(".lora_A." in n or ".lora_B." in n for n in trained)
    # q_proj, v_proj, down_proj of every layer, A and B each
    layers = learner.model.config.num_hidden_layers
    assert len(trained) == layers * 3 * 2
    in_optimizer = sum(p.numel() for g in learner.optimizer.param_groups for p in g["params"])
    assert in_optimizer == sum(p.numel() for n, p in learner.model.named_parameters() if n in trained)
    assert in_optimizer < 0.05 * sum(p.numel() for p in learner.model.parameters())
    assert learner.ref_model is None and learner.ref_is_base  # no second copy of the weights


def test_untrained_adapter_is_the_base_model_and_merged_names_are_the_base_names(tiny_model_dir, world_of_one):
    learner = _learner(tiny_model_dir)
    base = _plain(tiny_model_dir)
    merged = dict(learner.named_full_tensors())
    assert set(merged) == {n for n, _ in base.named_parameters()}
    for name, param in base.named_parameters():
        torch.testing.assert_close(merged[name], param.detach(), rtol=0, atol=0)  # lora_B starts at 0


def test_a_step_moves_the_adapter_the_merged_weights_reproduce_it_and_the_reference_stays_the_base(
        tiny_model_dir, world_of_one, tmp_path):
    samples = make_samples(tiny_model_dir, n=6, seed=3)
    learner = _learner(tiny_model_dir)
    base = _plain(tiny_model_dir)
    with torch.no_grad():
        base_logp = naive_logprobs(base, samples)
    metrics = learner.train_step(samples)
    assert metrics["grad_norm"] > 0
    assert any(p.detach().full_tensor().abs().sum() > 0 for n, p in learner.model.named_parameters() if ".lora_B." in n)
    served = _plain(tiny_model_dir, dict(learner.named_full_tensors()))
    with torch.no_grad():
        merged_logp = naive_logprobs(served, samples)
    actor_logp = _learner_logprobs(learner, samples)
    mask = torch.zeros_like(actor_logp, dtype=torch.bool)
    for i, s in enumerate(samples):
        mask[i, 1 : len(s)] = True
    # the update changed the policy, the merged weights compute the same policy as the learner
    assert (actor_logp - base_logp)[mask].abs().max() > 1e-3
    torch.testing.assert_close(merged_logp[mask], actor_logp[mask], rtol=0, atol=2e-5)
    # the reference is the base model: adapters off, exactly (the same kernels as the actor's)
    plan = learner.plan(samples)
    ref = learner._reference(samples, plan.micro_batches[0])
    actor = learner._logprobs_of(learner.model, samples, plan.micro_batches[0])
    assert not torch.allclose(ref[0], actor[0])
    from agentrl_core.train.batching import collate
    from agentrl_core.train.logprobs import token_logprobs

    shard_base = _plain(tiny_model_dir)
    for k, idx in enumerate(plan.micro_batches[0]):
        mb = collate([samples[i] for i in idx], learner.layout, learner.pad_token_id)
        with torch.no_grad():
            expected = token_logprobs(shard_base, mb, TEMPERATURE).logprobs
        torch.testing.assert_close(ref[k], expected, rtol=0, atol=2e-5)
    # the adapter after the step trains again normally (the reference pass left it trainable)
    assert all(p.requires_grad for n, p in learner.model.named_parameters() if ".lora_" in n)
    learner.train_step(samples)


def test_exported_model_is_merged_and_peft_loads_the_adapter(tiny_model_dir, world_of_one, tmp_path):
    import json

    from peft import PeftModel

    from agentrl_core.train.checkpoint import save_hf_model

    samples = make_samples(tiny_model_dir, n=4, seed=5)
    learner = _learner(tiny_model_dir)
    learner.train_step(samples)
    out = save_hf_model(learner, tmp_path / "final_model")
    assert (out / "model.safetensors").is_file() and (out / "config.json").is_file()
    adapter = out / "adapter"
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert config["r"] == 4 and config["lora_alpha"] == 8.0 and sorted(config["target_modules"]) == \
        ["down_proj", "q_proj", "v_proj"]
    merged = _plain(out)
    with_adapter = PeftModel.from_pretrained(_plain(tiny_model_dir), str(adapter)).eval()
    with torch.no_grad():
        a = naive_logprobs(merged, samples)
        b = naive_logprobs(with_adapter, samples)
    torch.testing.assert_close(a, b, rtol=0, atol=2e-5)
    actor = _learner_logprobs(learner, samples)
    torch.testing.assert_close(a, actor, rtol=0, atol=2e-5)


def test_target_modules_that_match_nothing_are_refused(tiny_model_dir, world_of_one):
    with pytest.raises(ValueError, match="matched no layer"):
        _learner(tiny_model_dir, lora=LoraConfig(enabled=True, target_modules=["no_such_proj"]))


def lora_resume_worker(rank, world_size, port, model_dir, samples, out_dir):
    import torch.distributed as dist

    from agentrl_core.train.checkpoint import load_checkpoint, save_checkpoint

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        torch.manual_seed(1234 + rank)  # different seeds: rank 0's adapter initialisation must reach rank 1
        first = _learner(model_dir)
        first.train_step(samples)
        path = save_checkpoint(os.path.join(out_dir, "ckpt"), first, {"note": "lora"})
        first.train_step(samples)
        continued = {n: t.clone() for n, t in first.adapter_tensors()}
        merged = {n: t.clone() for n, t in first.named_full_tensors()}
        first.close()

        torch.manual_seed(99)  # a fresh adapter, then the checkpoint's
        second = _learner(model_dir)
        state = load_checkpoint(path, second)
        second.train_step(samples)
        resumed = {n: t.clone() for n, t in second.adapter_tensors()}
        if rank == 0:
            torch.save({"continued": continued, "resumed": resumed, "merged": merged, "state": state,
                        "checkpoint": str(path)}, os.path.join(out_dir, "result.pt"))
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.processes
def test_two_ranks_train_one_adapter_and_resume_restores_it_exactly(tiny_model_dir, tmp_path):
    samples = make_samples(tiny_model_dir, n=6, seed=7)
    mp.start_processes(lora_resume_worker, args=(2, _free_port(), str(tiny_model_dir), samples, str(tmp_path)),
                       nprocs=2, start_method="spawn")
    got = torch.load(tmp_path / "result.pt", weights_only=False)
    assert got["state"]["note"] == "lora"
    assert set(got["resumed"]) == set(got["continued"]) and got["continued"]
    for name, value in got["continued"].items():
        torch.testing.assert_close(got["resumed"][name], value, rtol=0, atol=1e-6, msg=name)
    # the checkpoint holds the adapter and its optimizer state, not the frozen base
    ckpt = sum(f.stat().st_size for f in (tmp_path / "ckpt").rglob("*.distcp"))
    base = sum(t.numel() * 4 for t in got["merged"].values())
    adapter = sum(t.numel() * 4 for t in got["continued"].values())
    assert ckpt < 0.25 * 3 * base, (ckpt, adapter, base)  # a full one holds the weights and two Adam moments
