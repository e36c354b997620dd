"""Dual-clip PPO, k3 KL and loss aggregation against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from agentrl_core.config import LossConfig
from agentrl_core.registry import Registry
from agentrl_core.train.losses import aggregate, dual_clip_pg, k3_kl, ppo_dual_clip

# Four tokens, one per branch of dual-clip PPO (clip 0.2, c = 3):
#   A=+1, r=1.5 -> max(-1.5, -1.2)  = -1.2   upper clip (A > 0)
#   A=-1, r=0.5 -> max(0.5, 0.8)    =  0.8   lower clip (A < 0)
#   A=-1, r=4.0 -> min(max(4, 1.2), 3) = 3   dual clip
#   A=+2, r=1.1 -> max(-2.2, -2.2)  = -2.2   inside the trust region
ADV = torch.tensor([[1.0, -1.0, -1.0, 2.0]])
RATIO = torch.tensor([[1.5, 0.5, 4.0, 1.1]])
OLD = torch.tensor([[-1.0, -2.0, -0.5, -3.0]])


def _logprobs():
    return (OLD + RATIO.log()).clone().requires_grad_(True)


def test_dual_clip_branches_hand_computed():
    loss, info = dual_clip_pg(_logprobs(), OLD, ADV)
    torch.testing.assert_close(loss, torch.tensor([[-1.2, 0.8, 3.0, -2.2]]))
    assert info["clipped"].tolist() == [[1.0, 1.0, 0.0, 0.0]]
    assert info["dual_clipped"].tolist() == [[0.0, 0.0, 1.0, 0.0]]


def test_dual_clip_gradient_flows_only_inside_trust_region():
    logp = _logprobs()
    loss, _ = ppo_dual_clip(logp, OLD, None, ADV, torch.ones(1, 4), LossConfig(kl_coef=0.0))
    assert loss.item() == pytest.approx((-1.2 + 0.8 + 3.0 - 2.2) / 4)  # token-mean = 0.1
    loss.backward()
    # d(-A r)/dlogp = -A r = -2.2 on the unclipped token, / 4 tokens; clipped tokens give 0
    torch.testing.assert_close(logp.grad, torch.tensor([[0.0, 0.0, 0.0, -0.55]]))


def test_dual_clip_constant_must_exceed_one():
    with pytest.raises(ValueError, match="must be > 1"):
        dual_clip_pg(_logprobs(), OLD, ADV, dual_clip_c=1.0)
    with pytest.raises(ValueError):
        LossConfig(dual_clip_c=0.5)


def test_asymmetric_clip():
    loss, _ = dual_clip_pg(_logprobs(), OLD, ADV, clip_low=0.2, clip_high=0.28)
    assert loss[0, 0].item() == pytest.approx(-1.28)


def test_k3_hand_computed_and_clamped():
    logp = torch.tensor([-1.0, -1.0, -1.0, -1.0, -25.0])
    d = torch.tensor([0.0, math.log(2.0), -math.log(2.0), 20.0, -20.0])
    kl = k3_kl(logp, logp + d)
    expected = torch.tensor([0.0, 2 - math.log(2) - 1, 0.5 + math.log(2) - 1, 10.0, 10.0])
    torch.testing.assert_close(kl, expected)
    assert kl[1].item() == pytest.approx(0.306853, abs=1e-6)


def test_loss_adds_kl_and_entropy_terms():
    logp = torch.tensor([[-1.0, -1.0]])
    adv = torch.zeros(1, 2)
    ref = logp + torch.tensor([[math.log(2.0), 0.0]])
    entropy = torch.tensor([[2.0, 4.0]])
    cfg = LossConfig(kl_coef=0.5, entropy_coef=0.1)
    loss, metrics = ppo_dual_clip(logp, logp, ref, adv, torch.ones(1, 2), cfg, entropy=entropy)
    kl = (2 - math.log(2) - 1) / 2
    assert metrics["kl"].item() == pytest.approx(kl)
    assert metrics["entropy"].item() == pytest.approx(3.0)
    assert loss.item() == pytest.approx(0.5 * kl - 0.1 * 3.0)
    with pytest.raises(ValueError, match="entropy"):
        ppo_dual_clip(logp, logp, ref, adv, torch.ones(1, 2), cfg)


def test_default_kl_coef_is_paper_value():
    assert LossConfig().kl_coef == 1e-4 and LossConfig().kl_clamp == 10.0


def test_token_mean_and_seq_mean_hand_computed():
    values = torch.tensor([[1.0, 3.0], [5.0, 100.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    assert aggregate(values, mask, "token-mean").item() == pytest.approx(3.0)  # (1 + 3 + 5) / 3
    assert aggregate(values, mask, "seq-mean").item() == pytest.approx(3.5)  # (2 + 5) / 2
    nan_in_padding = torch.tensor([[1.0, float("nan")]])
    assert aggregate(nan_in_padding, torch.tensor([[1.0, 0.0]])).item() == 1.0


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean"])
def test_aggregation_exact_across_uneven_micro_batches_and_ranks(mode):
    torch.manual_seed(0)
    lengths = [5, 2, 7, 3, 1, 6]
    seqs = []
    for n in lengths:
        mask = (torch.rand(n) > 0.3).float()
        mask[0] = 1.0
        seqs.append((torch.randn(n), torch.randn(n), torch.randn(n), torch.randn(n), mask))
    cfg = LossConfig(aggregation=mode, kl_coef=0.1)

    def pad(rows):
        out = torch.zeros(len(rows), max(len(r) for r in rows))
        for i, r in enumerate(rows):
            out[i, : len(r)] = r
        return out

    def run(indices, **denominators):
        cols = list(zip(*[seqs[i] for i in indices], strict=True))
        logp, old, ref, adv, mask = (pad(c) for c in cols)
        return ppo_dual_clip(logp, old, ref, adv, mask, cfg, **denominators)

    whole, whole_metrics = run(range(len(lengths)))
    num_tokens = sum(s[4].sum().item() for s in seqs)
    # rank 0 gets micro-batches [0, 1] and [2]; rank 1 gets [3, 4, 5]: uneven sizes and lengths
    plan = [[[0, 1], [2]], [[3, 4, 5]]]
    parts = [run(mb, num_tokens=num_tokens, num_seqs=len(lengths)) for rank in plan for mb in rank]
    torch.testing.assert_close(sum(p[0] for p in parts), whole)
    for key in ("pg_loss", "kl", "clipfrac"):
        torch.testing.assert_close(sum(p[1][key] for p in parts), whole_metrics[key])
    # the naive mean of per-micro-batch means is a different number
    naive = sum(run(mb)[0] for rank in plan for mb in rank) / 3
    assert abs(naive.item() - whole.item()) > 1e-4


def test_registry_builds_the_loss():
    loss_fn = Registry().build("policy_loss", "ppo_dual_clip")
    loss, metrics = loss_fn(_logprobs(), OLD, None, ADV, torch.ones(1, 4), LossConfig())
    assert loss.item() == pytest.approx(0.1)
    assert metrics["dual_clipfrac"].item() == pytest.approx(0.25)


# Decoupled PPO (loss.off_policy: decoupled), three tokens, clip 0.2, c = 3, behaviour weight cap 5:
#   token  A    r = pi/pi_prox  w = pi_prox/pi_behave   per-token loss
#   1     +1    1.5             2                       max(-1.5, -1.2) * 2       = -2.4   clipped: no gradient
#   2     -1    1.1             0.5                     min(max(1.1, 1.1), 3) * 0.5 = 0.55 inside: grad 1.1 * 0.5
#   3     +2    1.0             8 > cap                 0                                  dropped
DEC_ADV = torch.tensor([[1.0, -1.0, 2.0]])
DEC_BEHAVE = torch.tensor([[-1.0, -2.0, -0.5]])
DEC_PROX = DEC_BEHAVE + torch.tensor([[2.0, 0.5, 8.0]]).log()
DEC_RATIO = torch.tensor([[1.5, 1.1, 1.0]])


def _decoupled_logprobs():
    return (DEC_PROX + DEC_RATIO.log()).clone().requires_grad_(True)


def test_decoupled_ppo_hand_computed():
    from agentrl_core.train.losses import decoupled_pg

    loss, info = decoupled_pg(_decoupled_logprobs(), DEC_PROX, DEC_BEHAVE, DEC_ADV, behave_weight_cap=5.0)
    torch.testing.assert_close(loss, torch.tensor([[-2.4, 0.55, 0.0]]))
    torch.testing.assert_close(info["behave_weight"], torch.tensor([[2.0, 0.5, 0.0]]))
    assert info["behave_capped"].tolist() == [[0.0, 0.0, 1.0]]
    assert info["clipped"].tolist() == [[1.0, 0.0, 0.0]]
    uncapped, _ = decoupled_pg(_decoupled_logprobs(), DEC_PROX, DEC_BEHAVE, DEC_ADV, behave_weight_cap=None)
    torch.testing.assert_close(uncapped, torch.tensor([[-2.4, 0.55, -2.0 * 1.0 * 8.0]]))


def test_decoupled_ppo_gradient_and_metrics():
    logp = _decoupled_logprobs()
    cfg = LossConfig(kl_coef=0.0, off_policy="decoupled", behave_weight_cap=5.0)
    loss, metrics = ppo_dual_clip(logp, DEC_BEHAVE, None, DEC_ADV, torch.ones(1, 3), cfg, proximal_logprobs=DEC_PROX)
    assert loss.item() == pytest.approx((-2.4 + 0.55 + 0.0) / 3)
    loss.backward()
    # only token 2 passes: d(-A r w)/dlogp = -A r w = 1.1 * 0.5, / 3 tokens
    torch.testing.assert_close(logp.grad, torch.tensor([[0.0, 0.55 / 3, 0.0]]))
    assert metrics["behave_weight"].item() == pytest.approx(2.5 / 3)
    assert metrics["behave_capped_frac"].item() == pytest.approx(1 / 3)
    assert metrics["clipfrac"].item() == pytest.approx(1 / 3)
    assert metrics["ratio"].item() == pytest.approx(3.6 / 3)  # against the proximal policy


def test_decoupled_ppo_proximal_defaults_to_the_weights_before_the_update():
    """One optimizer step per batch: the proximal policy is this forward's own log-probs, detached.

    The ratio is 1 and never clipped; the gradient is -A * w * grad(logp) with w = pi / pi_behave.
    """
    logp = (DEC_BEHAVE + torch.tensor([[2.0, 0.5, 8.0]]).log()).clone().requires_grad_(True)
    cfg = LossConfig(kl_coef=0.0, off_policy="decoupled", behave_weight_cap=5.0)
    loss, metrics = ppo_dual_clip(logp, DEC_BEHAVE, None, DEC_ADV, torch.ones(1, 3), cfg)
    assert loss.item() == pytest.approx((-1.0 * 2.0 + 1.0 * 0.5 + 0.0) / 3)
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[-2.0 / 3, 0.5 / 3, 0.0]]))
    assert metrics["ratio"].item() == pytest.approx(1.0) and metrics["clipfrac"].item() == 0.0


def test_decoupled_equals_ppo_when_the_proximal_policy_is_the_behaviour_policy():
    logp = _logprobs()
    ppo, _ = ppo_dual_clip(logp, OLD, None, ADV, torch.ones(1, 4), LossConfig(kl_coef=0.0))
    decoupled, _ = ppo_dual_clip(logp, OLD, None, ADV, torch.ones(1, 4),
                                 LossConfig(kl_coef=0.0, off_policy="decoupled"), proximal_logprobs=OLD)
    torch.testing.assert_close(decoupled, ppo)


def test_off_policy_config_is_checked():
    from agentrl_core.config import config_from_dict
    from agentrl_core.errors import ConfigError

    with pytest.raises(ValueError):
        LossConfig(behave_weight_cap=0.5)
    with pytest.raises(ConfigError, match="loss.off_policy must be one of 'ppo', 'decoupled', got 'areal'"):
        config_from_dict({"loss": {"off_policy": "areal"}})
    assert LossConfig().off_policy == "ppo" and LossConfig().behave_weight_cap == 5.0
    assert config_from_dict({"loss": {"behave_weight_cap": None}}).loss.behave_weight_cap is None
