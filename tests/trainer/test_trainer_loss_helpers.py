"""The torch-only helpers the trainer's loss step uses (algorithms/diagnostics.py, algorithms/entropy_control.py),
with hand-worked values."""

import math

import pytest
import torch

from grpokit.algorithms import LOSS_TYPES
from grpokit.algorithms.diagnostics import DIAGNOSTICS, MEAN, SEQ_MAX, SEQ_MIN, loss_diagnostics
from grpokit.algorithms.entropy_control import EntropyCoefficient, high_entropy_mask, masked_entropy_mean


def test_every_loss_type_has_diagnostics():
    assert set(DIAGNOSTICS) == set(LOSS_TYPES)


def test_clip_fractions_by_hand():
    # ratios exp(logps - old) = [0.5, 1.0, 1.5] for a sequence with A = -1 and for one with A = +1; eps 0.2.
    old = torch.zeros(2, 3)
    logps = torch.log(torch.tensor([[0.5, 1.0, 1.5], [0.5, 1.0, 1.5]]))
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    d = loss_diagnostics(logps, old, torch.tensor([-1.0, 1.0]), mask, loss_type="dapo")
    low, reduction = d["clip_ratio/low_mean"]
    assert reduction == MEAN and low.tolist() == [[1, 0, 0], [0, 0, 0]]  # only ratio 0.5 with A < 0
    assert d["clip_ratio/high_mean"][0].tolist() == [[0, 0, 0], [0, 0, 1]]  # ratio 1.5 with A > 0 (masked here)
    assert d["clip_ratio/low_min"][1] == SEQ_MIN and d["clip_ratio/high_max"][1] == SEQ_MAX
    assert "kl" not in d


def test_delta_caps_the_ratio_before_the_high_clip_test():
    logps = torch.log(torch.tensor([[1.5]]))
    d = loss_diagnostics(logps, torch.zeros(1, 1), torch.tensor([1.0]), torch.ones(1, 1), loss_type="grpo", delta=1.1)
    assert d["clip_ratio/high_mean"][0].item() == 0.0  # min(1.5, 1.1) = 1.1 < 1.2


def test_kl_with_and_without_bias_correction():
    logps, ref = torch.tensor([[math.log(0.5)]]), torch.tensor([[math.log(0.25)]])
    old = torch.tensor([[math.log(0.25)]])  # ratio 2
    k3 = 0.5 - math.log(0.5) - 1  # exp(ref - logps) - (ref - logps) - 1 with ref - logps = ln 0.5
    d = loss_diagnostics(logps, old, torch.tensor([1.0]), torch.ones(1, 1), loss_type="sapo", ref_logps=ref)
    assert d["kl"][0].item() == pytest.approx(2 * k3)
    d = loss_diagnostics(
        logps,
        old,
        torch.tensor([1.0]),
        torch.ones(1, 1),
        loss_type="sapo",
        ref_logps=ref,
        use_bias_correction_kl=False,
    )
    assert d["kl"][0].item() == pytest.approx(k3)


def test_cispo_and_vespo_diagnostics():
    logps = torch.log(torch.tensor([[2.0, 0.5]]))
    d = loss_diagnostics(
        logps, torch.zeros(1, 2), torch.tensor([1.0]), torch.ones(1, 2), loss_type="cispo", epsilon_high=1.5
    )
    assert d["cispo_clip_ratio"][0].tolist() == [[1.0, 0.0]]
    # VESPO on-policy: w = 1, phi(1) = e^lambda * 1 * e^-lambda = 1.
    d = loss_diagnostics(torch.zeros(2, 2), None, torch.tensor([1.0, -1.0]), torch.ones(2, 2), loss_type="vespo")
    assert d["vespo/phi_seq_mean"][0].flatten().tolist() == pytest.approx([1.0, 1.0])


def test_fixed_entropy_coefficient():
    coef = EntropyCoefficient(coef=0.3)
    coef.update(100.0)
    assert coef.enabled and coef.applied() == 0.3 and coef.coef == 0.3
    assert not EntropyCoefficient(coef=0.0).enabled


def test_adaptive_entropy_coefficient_schedule():
    coef = EntropyCoefficient(coef=0.01, adaptive=True, target=0.5, delta=0.01, coef_min=0.0, coef_max=0.025)
    assert coef.applied() == 0.0  # no measurement yet
    coef.update(0.4)  # below target: up by delta, and the bonus applies next step
    assert coef.coef == pytest.approx(0.02) and coef.applied() == pytest.approx(0.02)
    coef.update(0.3)
    assert coef.coef == pytest.approx(0.025)  # capped at coef_max
    coef.update(0.9)  # above target: down by delta, and no bonus next step
    assert coef.coef == pytest.approx(0.015) and coef.applied() == 0.0
    restored = EntropyCoefficient(coef=0.0, adaptive=True)
    restored.load_state_dict(coef.state_dict())
    assert (restored.coef, restored.last_entropy) == (coef.coef, 0.9)


def test_masked_entropy_mean():
    entropies = torch.tensor([[1.0, 2.0, 9.0], [3.0, 9.0, 9.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert masked_entropy_mean(entropies, mask).item() == pytest.approx(2.0)
    assert masked_entropy_mean(entropies, torch.zeros_like(mask)).item() == 0.0


def test_high_entropy_mask_over_a_pool():
    entropies = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    # Quantile 0.5 of the active values [1, 2, 3] is 2: keep 2 and 3, never the masked 4.
    assert high_entropy_mask(entropies, mask, 0.5).tolist() == [[False, True, True, False]]
    # Pooled with another process's entropies [5, 6, 7]: the 0.5 quantile of [1, 2, 3, 5, 6, 7] is 4.
    pooled = torch.tensor([1.0, 2.0, 3.0, 5.0, 6.0, 7.0])
    assert high_entropy_mask(entropies, mask, 0.5, pooled=pooled).tolist() == [[False, False, False, False]]
