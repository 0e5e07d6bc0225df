"""Policy losses: one hand-computed value per loss type, plus the properties the objectives must have."""

import math

import pytest
import torch

from grpokit.algorithms import (
    LOSS_TYPES,
    LOSSES,
    cispo_clip_fraction,
    clip_fractions,
    entropy_from_logits,
    entropy_mask,
    importance_ratio,
    kl_k3,
    masked_mean,
    off_policy_mask,
    policy_loss,
    vespo_weights,
)

# The shared tiny batch: B=2, T=3, the last token of row 1 is padding.
#   ratios      row 0: [1.0, 1.5, 0.5]     row 1: [1.1, 0.7, (3.0 masked)]
#   advantages  row 0: +1                  row 1: -2
LOGPS = [[-1.0, -0.5, -2.0], [-0.3, -1.2, -0.7]]
RATIOS = [[1.0, 1.5, 0.5], [1.1, 0.7, 3.0]]
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])
ADVANTAGES = torch.tensor([1.0, -2.0], dtype=torch.float64)


def _batch():
    logps = torch.tensor(LOGPS, dtype=torch.float64, requires_grad=True)
    old_logps = torch.tensor(LOGPS, dtype=torch.float64) - torch.tensor(RATIOS, dtype=torch.float64).log()
    return logps, old_logps


def _loss(loss_type, **kwargs):
    logps, old_logps = _batch()
    return policy_loss(logps, old_logps, ADVANTAGES, MASK, loss_type=loss_type, **kwargs).item()


# Clipped per-token losses -min(r A, clip(r, 0.8, 1.2) A):
#   row 0 (A=+1): r=1 -> -1 ; r=1.5 -> -min(1.5, 1.2) = -1.2 ; r=0.5 -> -min(0.5, 0.8) = -0.5   sum -2.7
#   row 1 (A=-2): r=1.1 -> -min(-2.2, -2.2) = 2.2 ; r=0.7 -> -min(-1.4, -1.6) = 1.6          sum 3.8
# Active tokens: 5; all active sum: 1.1.
SAPO_ROW1 = 2 * (4 / 1.05) * (1 / (1 + math.exp(-1.05 * 0.1)) + 1 / (1 + math.exp(1.05 * 0.3)))
PHI_ROW0 = math.exp(3 + 2 * math.log(0.75) - 3 * 0.75)  # w = 1 * 1.5 * 0.5 = 0.75, A >= 0: k=2, lambda=3
PHI_ROW1 = math.exp(2 + 3 * math.log(0.77) - 2 * 0.77)  # w = 1.1 * 0.7 = 0.77, A < 0: k=3, lambda=2


@pytest.mark.parametrize(
    "loss_type, kwargs, expected",
    [
        # per-sequence means -2.7/3 = -0.9 and 3.8/2 = 1.9, then the mean over sequences
        ("grpo", {}, (-0.9 + 1.9) / 2),
        # mean over the 5 active tokens
        ("bnpo", {}, 1.1 / 5),
        # sum / (B * max_completion_length), max_completion_length defaulting to T = 3
        ("dr_grpo", {}, 1.1 / (2 * 3)),
        ("dr_grpo", {"max_completion_length": 4}, 1.1 / (2 * 4)),
        # sum / num_items_in_batch, defaulting to the 5 active tokens
        ("dapo", {}, 1.1 / 5),
        ("dapo", {"num_items_in_batch": 10}, 1.1 / 10),
        # sum per sequence, mean over sequences
        ("luspo", {}, (-2.7 + 3.8) / 2),
        # -min(r, 1.2) A logp:  row 0: 1*1.0 + 1.2*0.5 + 0.5*2.0 = 2.6 ; row 1: -(1.1*2*0.3) - (0.7*2*1.2) = -2.34
        ("cispo", {"epsilon_high": 1.2}, (2.6 - 2.34) / 5),
        # with the default epsilon_high 0.2 every weight is capped at 0.2:  0.2 * (3.5 - 3.0) over 5 tokens
        ("cispo", {}, 0.2 * (1 * 3.5 - 2 * 1.5) / 5),
        # row 0 (tau 1): -4 (sigmoid(0) + sigmoid(0.5) + sigmoid(-0.5)) = -4 * 1.5 = -6, mean -2
        # row 1 (tau 1.05): 2 * 4/1.05 * (sigmoid(1.05*0.1) + sigmoid(-1.05*0.3)), mean over 2 tokens
        ("sapo", {}, (-2.0 + SAPO_ROW1 / 2) / 2),
        # -phi A logp:  row 0: phi0 * 3.5 ; row 1: -2 * phi1 * 1.5 = -3 phi1 ; over 5 tokens
        ("vespo", {}, (3.5 * PHI_ROW0 - 3.0 * PHI_ROW1) / 5),
    ],
)
def test_token_level_values(loss_type, kwargs, expected):
    assert _loss(loss_type, **kwargs) == pytest.approx(expected, rel=1e-12)


# Sequence level: r0 = (1 * 1.5 * 0.5)^(1/3) = 0.75^(1/3), r1 = (1.1 * 0.7)^(1/2) = 0.77^(1/2), both inside
# [0.8, 1.2] and unclipped, so the per-sequence loss is -r A: -r0 and +2 r1.
R0, R1 = 0.75 ** (1 / 3), 0.77**0.5


@pytest.mark.parametrize(
    "loss_type, expected",
    [
        ("grpo", (-R0 + 2 * R1) / 2),
        ("bnpo", (-3 * R0 + 2 * 2 * R1) / 5),  # the sequence value is broadcast to each active token
        ("luspo", (-3 * R0 + 2 * 2 * R1) / 2),
        ("sapo", (-4 * (1 / (1 + math.exp(-(R0 - 1)))) + 2 * (4 / 1.05) / (1 + math.exp(-1.05 * (R1 - 1)))) / 2),
        # vespo ignores the sequence ratio: same as token level
        ("vespo", (3.5 * PHI_ROW0 - 3.0 * PHI_ROW1) / 5),
    ],
)
def test_sequence_level_values(loss_type, expected):
    assert _loss(loss_type, importance_sampling_level="sequence") == pytest.approx(expected, rel=1e-12)


def test_sequence_ratio_is_geometric_mean():
    logps, old_logps = _batch()
    ratio = importance_ratio(logps, old_logps, MASK, "sequence")
    torch.testing.assert_close(ratio, torch.tensor([[R0], [R1]], dtype=torch.float64))


def _one_token(log_ratio, advantage, **kwargs):
    logps = torch.tensor([[-1.0]], dtype=torch.float64, requires_grad=True)
    old_logps = logps.detach() - log_ratio
    loss = policy_loss(logps, old_logps, torch.tensor([advantage]), torch.ones(1, 1), loss_type="grpo", **kwargs)
    (grad,) = torch.autograd.grad(loss, logps)
    return loss.item(), grad.item()


def test_delta_caps_the_unclipped_ratio():
    # r = 2, A = -1: -min(2 * -1, 1.2 * -1) = 2, gradient d(r)/d(logp) = r = 2.
    assert _one_token(math.log(2), -1.0) == pytest.approx((2.0, 2.0))
    # delta = 1.5: -min(1.5 * -1, 1.2 * -1) = 1.5, capped -> no gradient.
    assert _one_token(math.log(2), -1.0, delta=1.5) == pytest.approx((1.5, 0.0))
    # Below delta nothing changes: r = 1.1, A = -1 -> 1.1 both ways, gradient 1.1.
    assert _one_token(math.log(1.1), -1.0, delta=1.5) == pytest.approx((1.1, 1.1))
    # Positive advantages are already capped by the clip: r = 2, A = +1 -> -1.2 and no gradient, delta or not.
    assert _one_token(math.log(2), 1.0, delta=1.5) == pytest.approx((-1.2, 0.0))


def test_kl_term_value_and_gradient():
    # On-policy single token, A = 0 (no policy term), ref - logp = ln 2:
    # k3 = e^{ln 2} - ln 2 - 1 = 1 - ln 2.
    logps = torch.tensor([[-1.0]], dtype=torch.float64, requires_grad=True)
    ref_logps = logps.detach() + math.log(2)
    zero = torch.zeros(1, dtype=torch.float64)
    kwargs = {"loss_type": "grpo", "ref_logps": ref_logps, "beta": 0.5}
    loss = policy_loss(logps, None, zero, torch.ones(1, 1), **kwargs)
    (grad,) = torch.autograd.grad(loss, logps)
    assert loss.item() == pytest.approx(0.5 * (1 - math.log(2)))
    # With the bias correction, d(ratio * k3)/dlogp = ratio' k3 + k3' = k3 + (1 - e^{ref - logp}) = (1 - ln 2) - 1.
    assert grad.item() == pytest.approx(0.5 * -math.log(2))
    loss = policy_loss(logps, None, zero, torch.ones(1, 1), use_bias_correction_kl=False, **kwargs)
    (grad,) = torch.autograd.grad(loss, logps)
    assert loss.item() == pytest.approx(0.5 * (1 - math.log(2)))
    assert grad.item() == pytest.approx(0.5 * (1 - 2))  # k3' = 1 - e^{ln 2}


def test_kl_term_is_added_per_token_before_the_reduction():
    # grpo reduction of (policy + beta * k3): per-sequence means of the sum, so adding beta * masked_mean of k3
    # per sequence to the beta = 0 loss.
    logps, old_logps = _batch()
    ref_logps = logps.detach() + torch.tensor([[0.1, -0.2, 0.3], [0.0, 0.5, 9.0]], dtype=torch.float64)
    base = policy_loss(logps, old_logps, ADVANTAGES, MASK, loss_type="grpo")
    with_kl = policy_loss(
        logps,
        old_logps,
        ADVANTAGES,
        MASK,
        loss_type="grpo",
        ref_logps=ref_logps,
        beta=0.1,
        use_bias_correction_kl=False,
    )
    kl_rows = masked_mean(kl_k3(logps, ref_logps), MASK, dim=-1)
    torch.testing.assert_close(with_kl, base + 0.1 * kl_rows.mean())


def test_kl_k3():
    # exp(d) - d - 1 for d = ref - logp in {0, ln 2, -1}
    d = torch.tensor([0.0, math.log(2), -1.0], dtype=torch.float64)
    expected = torch.tensor([0.0, 1 - math.log(2), math.exp(-1)], dtype=torch.float64)
    torch.testing.assert_close(kl_k3(torch.zeros(3, dtype=torch.float64), d), expected)


@pytest.mark.parametrize("loss_type", ["dapo", "cispo", "vespo"])
def test_num_items_in_batch_scales_the_loss(loss_type):
    default = _loss(loss_type)  # normalised by the 5 active tokens
    assert _loss(loss_type, num_items_in_batch=torch.tensor(20.0)) == pytest.approx(default * 5 / 20)
    assert _loss(loss_type, num_items_in_batch=2.5) == pytest.approx(default * 2)


def _grad(loss_type, logps, old_logps=None, **kwargs):
    logps = logps.detach().requires_grad_(True)
    loss = policy_loss(logps, old_logps, ADVANTAGES, MASK, loss_type=loss_type, **kwargs)
    (grad,) = torch.autograd.grad(loss, logps)
    return grad


@pytest.mark.parametrize("importance_sampling_level", ["token", "sequence"])
def test_on_policy_gradients_agree(importance_sampling_level):
    logps, _ = _batch()
    kw = {"importance_sampling_level": importance_sampling_level}
    grpo = _grad("grpo", logps, **kw)
    # The soft gate has slope (4/tau) * tau * sigmoid'(0) = 1 at ratio 1, whatever tau: same gradient as grpo.
    torch.testing.assert_close(_grad("sapo", logps, **kw), grpo)
    # Token-summed family: cispo (weight min(1, eps_high) = 1 when eps_high >= 1) and vespo (phi(1) = 1) follow dapo.
    dapo = _grad("dapo", logps, **kw)
    torch.testing.assert_close(_grad("cispo", logps, epsilon_high=5.0, **kw), dapo)
    torch.testing.assert_close(_grad("vespo", logps, **kw), dapo)
    # ... but cispo's cap is absolute: with the default epsilon_high = 0.2 the step is 0.2 times smaller.
    torch.testing.assert_close(_grad("cispo", logps, **kw), 0.2 * dapo)
    # The values differ: grpo -A averaged, sapo -2A/tau averaged.
    assert policy_loss(logps, None, ADVANTAGES, MASK, loss_type="grpo", **kw).item() == pytest.approx((-1 + 2) / 2)


def test_on_policy_sequence_level_gradient_equals_token_level():
    # d/dlogp_t of -A exp(mean_t log r) at r = 1 is -A / |o|, exactly grpo's per-token gradient.
    logps, _ = _batch()
    torch.testing.assert_close(_grad("grpo", logps, importance_sampling_level="sequence"), _grad("grpo", logps))


ALL_CASES = [(loss_type, level) for loss_type in LOSS_TYPES for level in ("token", "sequence")]


@pytest.mark.parametrize("loss_type, level", ALL_CASES)
def test_masked_tokens_never_contribute(loss_type, level):
    logps, old_logps = _batch()
    ref_logps = logps.detach() - 0.3
    kwargs = {"loss_type": loss_type, "importance_sampling_level": level, "ref_logps": ref_logps, "beta": 0.05}
    if loss_type in ("grpo", "dapo"):
        kwargs["delta"] = 1.4
    grad = _grad(loss_type, logps, old_logps, **{k: v for k, v in kwargs.items() if k != "loss_type"})
    loss = policy_loss(logps, old_logps, ADVANTAGES, MASK, **kwargs)
    # Change everything at the padded position (1, 2).
    bump = torch.zeros(2, 3, dtype=torch.float64)
    bump[1, 2] = 1.7
    logps2 = (logps.detach() - bump).requires_grad_(True)
    kwargs["ref_logps"] = ref_logps + 2 * bump
    loss2 = policy_loss(logps2, old_logps + bump, ADVANTAGES, MASK, **kwargs)
    (grad2,) = torch.autograd.grad(loss2, logps2)
    torch.testing.assert_close(loss2, loss.detach())
    torch.testing.assert_close(grad2, grad)
    assert grad2[1, 2] == 0.0


@pytest.mark.parametrize("loss_type, level", ALL_CASES)
def test_extra_padding_columns_change_nothing(loss_type, level):
    # With max_completion_length fixed (dr_grpo) and the default token count, padding the batch is invisible.
    logps, old_logps = _batch()
    kwargs = {"loss_type": loss_type, "importance_sampling_level": level, "max_completion_length": 8}
    loss = policy_loss(logps, old_logps, ADVANTAGES, MASK, **kwargs)
    pad = torch.randn(2, 4, dtype=torch.float64)
    wide_logps = torch.cat([logps, pad], dim=1)
    wide_old = torch.cat([old_logps, pad + 0.5], dim=1)
    wide_mask = torch.cat([MASK, torch.zeros(2, 4, dtype=MASK.dtype)], dim=1)
    torch.testing.assert_close(policy_loss(wide_logps, wide_old, ADVANTAGES, wide_mask, **kwargs), loss)


def test_dr_grpo_depends_on_max_completion_length_not_on_padding():
    assert _loss("dr_grpo", max_completion_length=6) == pytest.approx(1.1 / 12)


def test_optional_masks_silence_the_policy_term_only():
    logps, old_logps = _batch()
    # Dropping sequence 1 leaves the grpo mean over both sequences: (-0.9 + 0) / 2.
    keep = torch.tensor([[1.0], [0.0]], dtype=torch.float64)
    assert policy_loss(logps, old_logps, ADVANTAGES, MASK, loss_type="grpo", off_policy_mask=keep).item() == (
        pytest.approx(-0.45)
    )
    # Keeping only token (0, 1) (loss -1.2) under bnpo still divides by all 5 active tokens.
    tokens = torch.zeros(2, 3, dtype=torch.bool)
    tokens[0, 1] = True
    assert policy_loss(logps, old_logps, ADVANTAGES, MASK, loss_type="bnpo", entropy_mask=tokens).item() == (
        pytest.approx(-1.2 / 5)
    )
    # A sampler correction of 0.5 everywhere halves the policy term.
    half = torch.full((2, 3), 0.5, dtype=torch.float64)
    assert policy_loss(
        logps, old_logps, ADVANTAGES, MASK, loss_type="bnpo", importance_sampling_ratio=half
    ).item() == (pytest.approx(1.1 / 5 / 2))


def test_registry():
    assert LOSS_TYPES == ("grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo", "luspo", "vespo")
    assert set(LOSSES) == set(LOSS_TYPES)
    assert all(callable(objective) and callable(reduction) for objective, reduction in LOSSES.values())
    logps, old_logps = _batch()
    with pytest.raises(ValueError):
        policy_loss(logps, old_logps, ADVANTAGES, MASK, loss_type="ppo")
    with pytest.raises(ValueError):
        policy_loss(logps, old_logps, ADVANTAGES, MASK, loss_type="grpo", beta=0.1)
    with pytest.raises(ValueError):
        policy_loss(logps, old_logps, ADVANTAGES, MASK, loss_type="grpo", importance_sampling_level="tok")


def test_vespo_weight_is_one_at_ratio_one_and_has_no_gradient():
    log_ratio = torch.zeros(2, 3, requires_grad=True)
    phi = vespo_weights(torch.tensor([1.0, -1.0]), log_ratio, MASK)
    assert phi.tolist() == [[1.0], [1.0]] and not phi.requires_grad
    # w = 0.75 for A >= 0: e^3 * 0.75^2 * e^{-3 * 0.75}
    phi = vespo_weights(torch.tensor([1.0]), torch.log(torch.tensor([[1.0, 1.5, 0.5]])), torch.ones(1, 3))
    assert phi.item() == pytest.approx(PHI_ROW0, rel=1e-6)


def test_clip_fractions():
    # Token level, eps 0.2: row 0 (A>0) r=1.5 is clipped high; row 1 (A<0) r=0.7 is clipped low, the padded r=3
    # does not count. Low 1/5, high 1/5, region 2/5; per sequence low (0, 1/2) -> min 0, high (1/3, 0) -> max 1/3.
    logps, old_logps = _batch()
    ratio = importance_ratio(logps, old_logps, MASK)
    metrics = clip_fractions(ratio, ADVANTAGES, MASK, 0.2, 0.2)
    expected = {"low_mean": 0.2, "high_mean": 0.2, "region_mean": 0.4, "low_min": 0.0, "high_max": 1 / 3}
    assert {k.split("/")[1]: pytest.approx(v.item()) for k, v in metrics.items()} == expected
    # Sequence level: one ratio per sequence, fractions over sequences. r1 = 0.877 < 0.9 with A < 0: low.
    seq = clip_fractions(importance_ratio(logps, old_logps, MASK, "sequence"), ADVANTAGES, MASK, 0.1, 0.1)
    assert seq["clip_ratio/low_mean"].item() == 0.5 and seq["clip_ratio/high_mean"].item() == 0.0
    # delta = 1.3 caps r=1.5 at 1.3, still above 1.2; delta = 1.1 would hide it.
    assert clip_fractions(ratio, ADVANTAGES, MASK, 0.2, 0.2, delta=1.1)["clip_ratio/high_mean"].item() == 0.0
    # cispo caps where r > eps_high and A > 0: only r=1.5 (the padded 3.0 sits in an A<0 row anyway).
    assert cispo_clip_fraction(ratio, ADVANTAGES, MASK, 1.2).item() == pytest.approx(0.2)


def test_entropy_mask():
    # Active entropies {0, 1, 2, 3, 4}; the 0.5 quantile is 2 -> keep entropies >= 2; the padded 9 never counts.
    entropies = torch.tensor([[0.0, 3.0, 1.0], [4.0, 2.0, 9.0]])
    kept = entropy_mask(entropies, MASK, 0.5)
    assert kept.tolist() == [[False, True, False], [True, True, False]]
    # Quantile 0 keeps every active token; no active token keeps nothing.
    assert entropy_mask(entropies, MASK, 0.0).tolist() == MASK.bool().tolist()
    assert not entropy_mask(entropies, torch.zeros(2, 3), 0.5).any()


def test_off_policy_mask():
    # Mean KL from the sampler over active tokens: row 0 (0.1 + 0.2 + 0.3) / 3 = 0.2, row 1 (0.6 + 0.8) / 2 = 0.7.
    logps = torch.zeros(2, 3)
    sampling = torch.tensor([[0.1, 0.2, 0.3], [0.6, 0.8, 5.0]])
    advantages = torch.tensor([-1.0, -1.0])
    assert off_policy_mask(advantages, logps, sampling, MASK, 0.5).tolist() == [[1.0], [0.0]]
    # A non-negative advantage is always kept; a NaN sampler logp counts as zero KL (row 1: 0.6 / 2 = 0.3).
    assert off_policy_mask(torch.tensor([-1.0, 0.0]), logps, sampling, MASK, 0.5).tolist() == [[1.0], [1.0]]
    sampling[1, 1] = float("nan")
    assert off_policy_mask(advantages, logps, sampling, MASK, 0.5).tolist() == [[1.0], [1.0]]


def test_entropy_from_logits_and_masked_mean():
    logits = torch.tensor([[0.0, 0.0, 0.0, 0.0], [0.0, float("-inf"), 0.0, float("-inf")]])
    torch.testing.assert_close(entropy_from_logits(logits), torch.tensor([math.log(4), math.log(2)]))
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 100.0]])
    assert masked_mean(x, MASK).item() == pytest.approx(15 / 5)
    torch.testing.assert_close(masked_mean(x, MASK, dim=-1), torch.tensor([2.0, 4.5]))
