"""vLLM sampler/trainer importance-sampling correction: hand-computed weights for the four modes, and the metrics."""

import dataclasses
import math
import typing

import pytest
import torch

from grpokit.algorithms import (
    VLLM_IMPORTANCE_SAMPLING_MODES,
    kl_k3,
    policy_loss,
    vllm_importance_weights,
    vllm_sampling_metrics,
)
from grpokit.config.grpo_config import GRPOConfig
from grpokit.config.types import field_types

# The shared batch: B=2, C=3, the last token of row 1 is padding (its values are junk and must not count:
# unmasked, -4.0 - 0.0 would give exp(-4) = 0.0183).
#   old - sampling   row 0: [0.1, -0.2, 0.0]     row 1: [0.2, 0.2, (-4.0 masked -> 0)]
OLD = [[-1.0, -2.0, -0.5], [-0.3, -1.0, -4.0]]
SAMPLING = [[-1.1, -1.8, -0.5], [-0.5, -1.2, 0.0]]
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])

E_P01 = math.exp(0.1)  # 1.105170918...
E_M02 = math.exp(-0.2)  # 0.818730753...
E_P02 = math.exp(0.2)  # 1.221402758...
SEQ0 = math.exp(0.1 - 0.2 + 0.0)  # exp(-0.1) = 0.904837418...
SEQ1 = math.exp(0.2 + 0.2)  # exp(0.4) = 1.491824698...


def _logps():
    return torch.tensor(OLD, dtype=torch.float64), torch.tensor(SAMPLING, dtype=torch.float64)


def _weights(mode, **bounds):
    old, sampling = _logps()
    return vllm_importance_weights(old, sampling, MASK, mode=mode, **bounds)


def _assert_weights(weights, expected):
    torch.testing.assert_close(weights, torch.tensor(expected, dtype=torch.float64))


@pytest.mark.parametrize(
    "mode, expected",
    [
        # clamp into [0.9, 1.2]: 0.8187 -> 0.9, 1.2214 -> 1.2; padding exp(0) = 1 is inside
        ("token_truncate", [[E_P01, 0.9, 1.0], [1.2, 1.2, 1.0]]),
        # zero outside [0.9, 1.2]: 0.8187 and both 1.2214 -> 0
        ("token_mask", [[E_P01, 0.0, 1.0], [0.0, 0.0, 1.0]]),
        # one weight per row: exp(-0.1) = 0.9048 kept, exp(0.4) = 1.4918 clamped to 1.2
        ("sequence_truncate", [[SEQ0], [1.2]]),
        # exp(0.4) = 1.4918 > 1.2 -> 0
        ("sequence_mask", [[SEQ0], [0.0]]),
    ],
)
def test_modes_with_both_bounds(mode, expected):
    weights = _weights(mode, clip_min=0.9, clip_max=1.2)
    assert weights.shape == ((2, 1) if mode.startswith("sequence") else (2, 3))
    _assert_weights(weights, expected)


@pytest.mark.parametrize(
    "mode, expected",
    [
        # no lower bound: 0.8187 stays
        ("token_truncate", [[E_P01, E_M02, 1.0], [1.2, 1.2, 1.0]]),
        ("token_mask", [[E_P01, E_M02, 1.0], [0.0, 0.0, 1.0]]),
        ("sequence_truncate", [[SEQ0], [1.2]]),
        ("sequence_mask", [[SEQ0], [0.0]]),
    ],
)
def test_no_lower_bound(mode, expected):
    _assert_weights(_weights(mode, clip_min=None, clip_max=1.2), expected)


@pytest.mark.parametrize(
    "mode, expected",
    [
        # lower bound 0.95, no upper bound: 0.8187 -> 0.95 (truncate) or 0 (mask); 1.2214 stays
        ("token_truncate", [[E_P01, 0.95, 1.0], [E_P02, E_P02, 1.0]]),
        ("token_mask", [[E_P01, 0.0, 1.0], [E_P02, E_P02, 1.0]]),
        # 0.9048 < 0.95 -> 0.95 (truncate) or 0 (mask); 1.4918 stays
        ("sequence_truncate", [[0.95], [SEQ1]]),
        ("sequence_mask", [[0.0], [SEQ1]]),
    ],
)
def test_no_upper_bound(mode, expected):
    _assert_weights(_weights(mode, clip_min=0.95, clip_max=None), expected)


def test_mask_modes_without_bounds_are_the_raw_ratios():
    _assert_weights(_weights("token_mask", clip_min=None, clip_max=None), [[E_P01, E_M02, 1.0], [E_P02, E_P02, 1.0]])
    _assert_weights(_weights("sequence_mask", clip_min=None, clip_max=None), [[SEQ0], [SEQ1]])


def test_defaults_are_trls_sequence_mask_with_clip_max_3():
    # Both sequence weights lie in (-inf, 3]: kept as they are.
    _assert_weights(_weights("sequence_mask"), [[SEQ0], [SEQ1]])
    old, sampling = _logps()
    _assert_weights(vllm_importance_weights(old, sampling, MASK), [[SEQ0], [SEQ1]])


def test_a_weight_equal_to_a_bound_is_kept_by_the_mask_modes():
    old = torch.tensor([[math.log(3.0)]], dtype=torch.float64)
    sampling = torch.zeros(1, 1, dtype=torch.float64)
    # exp(log 3 - 0) = 3 (up to rounding); use the computed value itself as the bound
    bound = vllm_importance_weights(old, sampling, torch.ones(1, 1), mode="token_mask", clip_max=None).item()
    kept = vllm_importance_weights(old, sampling, torch.ones(1, 1), mode="token_mask", clip_max=bound)
    assert kept.item() == bound


@pytest.mark.parametrize("mode", VLLM_IMPORTANCE_SAMPLING_MODES)
def test_on_policy_weights_are_exactly_one(mode):
    old, _ = _logps()
    weights = vllm_importance_weights(old, old.clone(), MASK, mode=mode, clip_min=0.5, clip_max=2.0)
    assert torch.equal(weights, torch.ones_like(weights))


@pytest.mark.parametrize("mode", VLLM_IMPORTANCE_SAMPLING_MODES)
def test_padding_never_counts(mode):
    # Changing the padded token's values (even to NaN or inf) changes nothing.
    old, sampling = _logps()
    reference = vllm_importance_weights(old, sampling, MASK, mode=mode, clip_min=0.9, clip_max=1.2)
    for junk_old, junk_sampling in [(100.0, -100.0), (float("nan"), 0.0), (0.0, float("nan")), (0.0, -math.inf)]:
        old[1, 2], sampling[1, 2] = junk_old, junk_sampling
        weights = vllm_importance_weights(old, sampling, MASK, mode=mode, clip_min=0.9, clip_max=1.2)
        torch.testing.assert_close(weights, reference)


def test_nan_sampling_logp_weighs_one():
    # vLLM could not score token (0, 1): its difference counts as 0, i.e. weight 1 / nothing added to the sum.
    old, sampling = _logps()
    sampling[0, 1] = float("nan")
    bounds = dict(clip_min=None, clip_max=None)
    token = vllm_importance_weights(old, sampling, MASK, mode="token_mask", **bounds)
    _assert_weights(token, [[E_P01, 1.0, 1.0], [E_P02, E_P02, 1.0]])
    sequence = vllm_importance_weights(old, sampling, MASK, mode="sequence_mask", **bounds)
    _assert_weights(sequence, [[E_P01], [SEQ1]])  # row 0: exp(0.1 + 0 + 0)


def test_all_masked_row_weighs_one():
    old, sampling = _logps()
    mask = torch.tensor([[1, 1, 1], [0, 0, 0]])
    weights = vllm_importance_weights(old, sampling, mask, mode="sequence_truncate", clip_max=3.0)
    _assert_weights(weights, [[SEQ0], [1.0]])


def test_no_gradient_and_dtype():
    old, sampling = _logps()
    old.requires_grad_(True)
    weights = vllm_importance_weights(old, sampling, MASK.bool(), mode="token_truncate", clip_max=3.0)
    assert not weights.requires_grad and weights.dtype == torch.float64


def test_bad_arguments():
    old, sampling = _logps()
    with pytest.raises(ValueError):
        vllm_importance_weights(old, sampling, MASK, mode="token")
    for mode in ("token_truncate", "sequence_truncate"):
        with pytest.raises(ValueError):
            vllm_importance_weights(old, sampling, MASK, mode=mode, clip_min=None, clip_max=None)
    with pytest.raises(ValueError):
        vllm_sampling_metrics(old, sampling, MASK, torch.ones(2, 3), mode="sequence")


def _metrics(mode, weights, old=None, sampling=None, mask=MASK):
    if old is None:
        old, sampling = _logps()
    metrics = vllm_sampling_metrics(old, sampling, mask, weights, mode=mode)
    return {name: (value.item(), reduction) for name, (value, reduction) in metrics.items()}


def test_metrics_token_mode():
    # |old - sampling| over the 5 active tokens: 0.1, 0.2, 0.0, 0.2, 0.2 -> mean 0.7 / 5 = 0.14, max 0.2.
    # token_truncate [0.9, 1.2] weights over the active tokens: 1.1052, 0.9, 1.0, 1.2, 1.2
    #   -> min 0.9, mean (1.105170918 + 0.9 + 1.0 + 1.2 + 1.2) / 5 = 1.081034184, max 1.2 (padding's 1.0 left out).
    weights = _weights("token_truncate", clip_min=0.9, clip_max=1.2)
    assert _metrics("token_truncate", weights) == {
        "sampling/sampling_logp_difference/mean": (pytest.approx(0.14), "mean"),
        "sampling/sampling_logp_difference/max": (pytest.approx(0.2), "max"),
        "sampling/importance_sampling_ratio/min": (pytest.approx(0.9), "min"),
        "sampling/importance_sampling_ratio/mean": (pytest.approx((E_P01 + 0.9 + 1.0 + 1.2 + 1.2) / 5), "mean"),
        "sampling/importance_sampling_ratio/max": (pytest.approx(1.2), "max"),
    }


def test_metrics_token_mask_counts_the_zeroed_weights():
    # token_mask [0.9, 1.2] over active tokens: 1.1052, 0, 1.0, 0, 0 -> min 0, mean 2.105170918 / 5, max 1.1052.
    weights = _weights("token_mask", clip_min=0.9, clip_max=1.2)
    metrics = _metrics("token_mask", weights)
    assert metrics["sampling/importance_sampling_ratio/min"][0] == 0.0
    assert metrics["sampling/importance_sampling_ratio/mean"][0] == pytest.approx((E_P01 + 1.0) / 5)
    assert metrics["sampling/importance_sampling_ratio/max"][0] == pytest.approx(E_P01)


def test_metrics_sequence_mode_are_over_sequences():
    # sequence_mask [0.9, 1.2]: weights (0.904837418, 0) -> min 0, mean 0.452418709, max 0.904837418.
    weights = _weights("sequence_mask", clip_min=0.9, clip_max=1.2)
    metrics = _metrics("sequence_mask", weights)
    assert metrics["sampling/importance_sampling_ratio/min"] == (0.0, "min")
    assert metrics["sampling/importance_sampling_ratio/mean"] == (pytest.approx(SEQ0 / 2), "mean")
    assert metrics["sampling/importance_sampling_ratio/max"] == (pytest.approx(SEQ0), "max")
    # The log-prob gap is per token whatever the mode.
    assert metrics["sampling/sampling_logp_difference/mean"] == (pytest.approx(0.14), "mean")


def test_metrics_leave_out_nan_gaps_but_keep_their_weights():
    # Token (0, 1) unscored: the gap is over 0.1, 0.0, 0.2, 0.2 (mean 0.125, max 0.2); its weight 1 counts:
    # token_mask, no bounds: 1.1052, 1.0, 1.0, 1.2214, 1.2214 -> mean 5.548 / 5.
    old, sampling = _logps()
    sampling[0, 1] = float("nan")
    weights = vllm_importance_weights(old, sampling, MASK, mode="token_mask", clip_max=None)
    metrics = _metrics("token_mask", weights, old, sampling)
    assert metrics["sampling/sampling_logp_difference/mean"][0] == pytest.approx(0.5 / 4)
    assert metrics["sampling/sampling_logp_difference/max"][0] == pytest.approx(0.2)
    assert metrics["sampling/importance_sampling_ratio/mean"][0] == pytest.approx((E_P01 + 2.0 + 2 * E_P02) / 5)
    assert metrics["sampling/importance_sampling_ratio/min"][0] == 1.0


def test_metrics_of_a_process_with_no_active_token_are_zero():
    old, sampling = _logps()
    mask = torch.zeros(2, 3)
    token = _metrics(
        "token_truncate", vllm_importance_weights(old, sampling, mask, mode="token_truncate"), old, sampling, mask
    )
    assert {name: value for name, (value, _) in token.items()} == dict.fromkeys(token, 0.0)
    # Sequence modes still have B weights, each exp(0) = 1.
    sequence = _metrics("sequence_mask", vllm_importance_weights(old, sampling, mask), old, sampling, mask)
    assert sequence["sampling/importance_sampling_ratio/mean"][0] == 1.0
    assert sequence["sampling/sampling_logp_difference/max"][0] == 0.0


def test_metric_values_are_0_dim_and_detached():
    old, sampling = _logps()
    old.requires_grad_(True)
    weights = vllm_importance_weights(old, sampling, MASK, mode="token_truncate")
    for value, reduction in vllm_sampling_metrics(old, sampling, MASK, weights, mode="token_truncate").values():
        assert value.dim() == 0 and not value.requires_grad and reduction in ("mean", "min", "max")


def test_config_modes_match_the_function():
    tp = field_types(GRPOConfig)["vllm_importance_sampling_mode"]
    assert typing.get_origin(tp) is typing.Literal
    assert tuple(typing.get_args(tp)) == VLLM_IMPORTANCE_SAMPLING_MODES
    defaults = {f.name: f.default for f in dataclasses.fields(GRPOConfig)}
    # The function's defaults are the config's (TRL's): sequence_mask, clip_min None, clip_max 3.0.
    assert defaults["vllm_importance_sampling_mode"] == "sequence_mask"
    assert defaults["vllm_importance_sampling_clip_min"] is None
    assert defaults["vllm_importance_sampling_clip_max"] == 3.0


def test_policy_loss_weights_the_policy_term_but_not_the_kl():
    # TRL 1.16 multiplies per_token_loss by the weights after the off-policy / entropy masks and before adding
    # beta * KL. On-policy (ratio 1), A = (+1, -2), weights [[0.5, 2.0], [1.0, 0.0]], ref - logps = ln 2 so
    # k3 = 2 - ln 2 - 1 = 0.306853 on every token, beta = 0.1, grpo (mean per sequence, then over sequences):
    #   row 0: (-0.5 - 2.0) / 2 = -1.25     row 1: (2.0 * 1.0 + 2.0 * 0.0) / 2 = 1.0
    #   loss = (-1.25 + 1.0) / 2 + 0.1 * 0.306853 = -0.0943147
    logps = torch.tensor([[-1.0, -0.5], [-0.3, -1.2]], dtype=torch.float64, requires_grad=True)
    ref_logps = logps.detach() + math.log(2.0)
    weights = torch.tensor([[0.5, 2.0], [1.0, 0.0]], dtype=torch.float64)
    advantages = torch.tensor([1.0, -2.0], dtype=torch.float64)
    kl = 2 - math.log(2.0) - 1
    assert kl_k3(logps, ref_logps)[0, 0].item() == pytest.approx(kl)
    common = dict(loss_type="grpo", ref_logps=ref_logps, beta=0.1, importance_sampling_ratio=weights)
    loss = policy_loss(logps, None, advantages, torch.ones(2, 2), **common)
    assert loss.item() == pytest.approx(-0.125 + 0.1 * kl)
    # A per-sequence (B, 1) weight broadcasts over the tokens: weights (0.5, 0) -> row 0: -0.5, row 1: 0.
    common["importance_sampling_ratio"] = torch.tensor([[0.5], [0.0]], dtype=torch.float64)
    loss = policy_loss(logps, None, advantages, torch.ones(2, 2), **common)
    assert loss.item() == pytest.approx(-0.25 + 0.1 * kl)


def _mismatch_inputs():
    """Known differences old - sampling: 0.1, -0.2 (row 0), 0.0 and 0.5 (row 1; its second token's sampling logprob
    is NaN: unknown, left out; row 0's third token is padding)."""
    old = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, -0.7, -1.0]], dtype=torch.float64)
    sampling = torch.tensor([[-1.1, -1.8, 5.0], [-0.5, float("nan"), -1.5]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    return old, sampling, mask


def test_sampler_mismatch_by_hand():
    from grpokit.algorithms.importance_sampling import sampler_mismatch, sampler_mismatch_metrics

    old, sampling, mask = _mismatch_inputs()
    sums, log_ratios = sampler_mismatch(old, sampling, mask)
    assert sums.tolist() == pytest.approx([4, 0.8, 0.4, 2, 0])  # 4 tokens, 2 sequences, nothing outside: no mode
    assert sorted(log_ratios.tolist()) == pytest.approx([-0.2, 0.0, 0.1, 0.5])
    metrics = sampler_mismatch_metrics(sums, log_ratios, None)
    assert metrics["sampler/logprob_gap"] == pytest.approx(0.2)
    assert metrics["sampler/logprob_bias"] == pytest.approx(0.1)
    # linear quantiles of (-0.2, 0, 0.1, 0.5): positions 0.15, 1.5, 2.85 -> -0.17, 0.05, 0.44
    assert metrics["sampler/ratio/p05"] == pytest.approx(math.exp(-0.17))
    assert metrics["sampler/ratio/p50"] == pytest.approx(math.exp(0.05))
    assert metrics["sampler/ratio/p95"] == pytest.approx(math.exp(0.44))
    assert "sampler/masked_fraction" not in metrics and "sampler/clipped_fraction" not in metrics


def test_sampler_mismatch_counts_what_the_correction_drops_or_clamps():
    from grpokit.algorithms.importance_sampling import sampler_mismatch, sampler_mismatch_metrics

    old, sampling, mask = _mismatch_inputs()
    # token_mask in [0.9, 1.5]: exp(-0.2) = 0.819 and exp(0.5) = 1.649 fall outside: 2 of 4 tokens
    sums, log_ratios = sampler_mismatch(old, sampling, mask, mode="token_mask", clip_min=0.9, clip_max=1.5)
    assert sampler_mismatch_metrics(sums, log_ratios, "token_mask")["sampler/masked_fraction"] == pytest.approx(0.5)
    # sequence_truncate, clip_max 1.5: rows sum to -0.1 (0.905) and 0.5 (1.649): 1 of 2 sequences clamped
    sums, log_ratios = sampler_mismatch(old, sampling, mask, mode="sequence_truncate", clip_max=1.5)
    metrics = sampler_mismatch_metrics(sums, log_ratios, "sequence_truncate")
    assert metrics["sampler/clipped_fraction"] == pytest.approx(0.5)
    empty = sampler_mismatch(old, sampling, torch.zeros_like(mask))
    assert sampler_mismatch_metrics(*empty, None) == {}


def test_geometric_sequence_weights_take_the_mean_not_the_sum():
    """Rows' known differences: (0.1, -0.2) and (0.0, 0.5): mean -0.05 and 0.25 (sum -0.1 and 0.5)."""
    from grpokit.algorithms.importance_sampling import vllm_importance_weights

    old, sampling, mask = _mismatch_inputs()
    geometric = vllm_importance_weights(old, sampling, mask, mode="sequence_truncate", clip_max=10.0, geometric=True)
    assert geometric.flatten().tolist() == pytest.approx([math.exp(-0.05), math.exp(0.25)])
    product = vllm_importance_weights(old, sampling, mask, mode="sequence_truncate", clip_max=10.0)
    assert product.flatten().tolist() == pytest.approx([math.exp(-0.1), math.exp(0.5)])
    # masked outside [0.9, 1.2]: exp(0.25) = 1.284 goes
    masked = vllm_importance_weights(
        old, sampling, mask, mode="sequence_mask", clip_min=0.9, clip_max=1.2, geometric=True
    )
    assert masked.flatten().tolist() == pytest.approx([math.exp(-0.05), 0.0])


def test_sequence_rejections_by_hand():
    """k3 per token exp(d) - 1 - d: row 0 (0.005171, 0.018731), mean 0.011951, max 0.018731; row 1 (0, 0.148721),
    mean 0.074361. k1 = -d: row 0 (-0.1, 0.2), max 0.2; row 1 (0, -0.5), max 0."""
    from grpokit.algorithms.importance_sampling import sequence_rejections

    old, sampling, mask = _mismatch_inputs()
    keep, kl, veto = sequence_rejections(old, sampling, mask, kl_threshold=0.05)  # k3, mean
    assert keep.flatten().tolist() == [1.0, 0.0] and kl.tolist() == [False, True] and veto.tolist() == [False, False]
    keep, kl, _ = sequence_rejections(old, sampling, mask, kl_threshold=0.015, kl_reduction="max")
    assert kl.tolist() == [True, True]  # 0.018731 and 0.148721 both above
    keep, kl, _ = sequence_rejections(old, sampling, mask, kl_threshold=0.1, kl_estimator="k1", kl_reduction="max")
    assert kl.tolist() == [True, False]
    keep, _, veto = sequence_rejections(old, sampling, mask, token_veto=0.85)  # ratio exp(-0.2) = 0.819 < 0.85
    assert veto.tolist() == [True, False] and keep.flatten().tolist() == [0.0, 1.0]
    keep, _, veto = sequence_rejections(old, sampling, mask, token_veto=0.7)
    assert veto.tolist() == [False, False] and keep.flatten().tolist() == [1.0, 1.0]
    with pytest.raises(ValueError, match="kl_estimator"):
        sequence_rejections(old, sampling, mask, kl_threshold=0.1, kl_estimator="k2")


def test_sampler_mismatch_counts_geometric_sequence_weights_as_the_correction_weighs_them():
    """Bounds [0.92, 1.2]: geometric weights exp(-0.05) = 0.951 (in) and exp(0.25) = 1.284 (out): half masked; the
    products exp(-0.1) = 0.905 and exp(0.5) = 1.649 would both be out."""
    from grpokit.algorithms.importance_sampling import sampler_mismatch, sampler_mismatch_metrics

    old, sampling, mask = _mismatch_inputs()
    bounds = dict(mode="sequence_mask", clip_min=0.92, clip_max=1.2)
    sums, log_ratios = sampler_mismatch(old, sampling, mask, geometric=True, **bounds)
    assert sampler_mismatch_metrics(sums, log_ratios, "sequence_mask")["sampler/masked_fraction"] == pytest.approx(0.5)
    sums, log_ratios = sampler_mismatch(old, sampling, mask, **bounds)
    assert sampler_mismatch_metrics(sums, log_ratios, "sequence_mask")["sampler/masked_fraction"] == pytest.approx(1.0)
