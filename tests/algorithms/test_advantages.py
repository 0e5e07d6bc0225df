"""Group-relative advantages: every mode worked out by hand on tiny batches with NaN rewards."""

import math

import pytest
import torch

from grpokit.algorithms import (
    MULTI_OBJECTIVE_AGGREGATIONS,
    SCALE_REWARDS,
    group_advantages,
    group_reward_stats,
    nanstd,
    reward_metrics,
    weighted_reward_sum,
)

NAN = float("nan")
EPS = 1e-4


def _std(values):
    # Sample std with Bessel's correction, spelled out.
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


# Case A: N=4, num_generations=2, F=2, weights (2, 1).
#   row 0: [1, 1]     -> 2*1 + 1*1 = 3
#   row 1: [nan, 2]   -> 1*2       = 2   (partly NaN: the NaN adds nothing)
#   row 2: [nan, nan] -> unscorable (NaN), advantage 0, out of every statistic
#   row 3: [3, 1]     -> 2*3 + 1*1 = 7   (the only scorable row of group 2)
REWARDS_A = torch.tensor([[1.0, 1.0], [NAN, 2.0], [NAN, NAN], [3.0, 1.0]], dtype=torch.float64)
WEIGHTS_A = [2.0, 1.0]

# Case B: N=6, num_generations=3, F=2, weights (1, 2).
#   group 1: [1, nan] -> 1 ; [nan, nan] -> unscorable ; [3, 1] -> 3 + 2 = 5
#   group 2: [0, 1]   -> 2 ; [2, nan]   -> 2           ; [1, 0] -> 1
REWARDS_B = torch.tensor([[1.0, NAN], [NAN, NAN], [3.0, 1.0], [0.0, 1.0], [2.0, NAN], [1.0, 0.0]], dtype=torch.float64)
WEIGHTS_B = [1.0, 2.0]


def test_weighted_sum_keeps_unscorable_rows_nan():
    summed = weighted_reward_sum(REWARDS_A, WEIGHTS_A)
    assert summed[[0, 1, 3]].tolist() == [3.0, 2.0, 7.0]
    assert math.isnan(summed[2])


@pytest.mark.parametrize(
    "scale_rewards, expected",
    [
        # group 1: {3, 2}, mean 2.5, std sqrt((0.5^2 + 0.5^2) / 1) = sqrt(0.5)
        # group 2: {7} alone -> std NaN -> advantage NaN -> 0; row 2 unscorable -> 0
        ("group", [0.5 / (math.sqrt(0.5) + EPS), -0.5 / (math.sqrt(0.5) + EPS), 0.0, 0.0]),
        # batch std over the scorable rows {3, 2, 7}: mean 4, squares 1 + 4 + 9 = 14, / 2 -> sqrt(7).
        # Centring stays per group: row 3 is 7 - 7 = 0.
        ("batch", [0.5 / (math.sqrt(7) + EPS), -0.5 / (math.sqrt(7) + EPS), 0.0, 0.0]),
        # no division: 3 - 2.5, 2 - 2.5, unscorable 0, 7 - 7
        ("none", [0.5, -0.5, 0.0, 0.0]),
    ],
)
def test_sum_then_normalize_with_nan_rows(scale_rewards, expected):
    advantages = group_advantages(REWARDS_A, 2, reward_weights=WEIGHTS_A, scale_rewards=scale_rewards)
    torch.testing.assert_close(advantages, torch.tensor(expected, dtype=torch.float64))


@pytest.mark.parametrize(
    "scale_rewards, expected",
    [
        # group 1 scorable {1, 5}: mean 3, std sqrt((4 + 4) / 1) = sqrt(8); group 2 {2, 2, 1}: mean 5/3,
        # squares (1/3)^2 + (1/3)^2 + (2/3)^2 = 6/9, / 2 = 1/3 -> std sqrt(1/3)
        (
            "group",
            [
                -2 / (math.sqrt(8) + EPS),
                0.0,
                2 / (math.sqrt(8) + EPS),
                (1 / 3) / (math.sqrt(1 / 3) + EPS),
                (1 / 3) / (math.sqrt(1 / 3) + EPS),
                (-2 / 3) / (math.sqrt(1 / 3) + EPS),
            ],
        ),
        # batch over {1, 5, 2, 2, 1}: mean 2.2, squares 1.44 + 7.84 + 0.04 + 0.04 + 1.44 = 10.8, / 4 -> sqrt(2.7)
        (
            "batch",
            [
                -2 / (math.sqrt(2.7) + EPS),
                0.0,
                2 / (math.sqrt(2.7) + EPS),
                (1 / 3) / (math.sqrt(2.7) + EPS),
                (1 / 3) / (math.sqrt(2.7) + EPS),
                (-2 / 3) / (math.sqrt(2.7) + EPS),
            ],
        ),
        ("none", [-2.0, 0.0, 2.0, 1 / 3, 1 / 3, -2 / 3]),
    ],
)
def test_sum_then_normalize_groups_of_three(scale_rewards, expected):
    advantages = group_advantages(REWARDS_B, 3, reward_weights=WEIGHTS_B, scale_rewards=scale_rewards)
    torch.testing.assert_close(advantages, torch.tensor(expected, dtype=torch.float64))


def test_normalize_then_sum_lone_row_sums_to_zero_and_still_counts():
    # Group 1 (rows 0, 1): f0 = {1, nan} -> one value -> std NaN -> z NaN for the whole group;
    #   f1 = {1, 2}: mean 1.5, std sqrt(0.5) -> z = -a, +a with a = 0.5 / (sqrt(0.5) + 1e-4).
    # Group 2 (rows 2, 3): every function has one value -> all z NaN; row 2 is unscorable (NaN) but row 3 is
    #   scorable, so its nansum over all-NaN z is 0, and 0 takes part in the batch statistics.
    # Weighted sums (f1 weight 1): s = [-a, +a, NaN, 0]; batch mean 0, std sqrt((a^2 + a^2 + 0) / 2) = a.
    a = 0.5 / (math.sqrt(0.5) + EPS)
    expected = [-a / (a + EPS), a / (a + EPS), 0.0, 0.0]
    for scale_rewards in SCALE_REWARDS:  # scale_rewards plays no part in this mode
        advantages = group_advantages(
            REWARDS_A,
            2,
            reward_weights=WEIGHTS_A,
            scale_rewards=scale_rewards,
            multi_objective_aggregation="normalize_then_sum",
        )
        torch.testing.assert_close(advantages, torch.tensor(expected, dtype=torch.float64))


def test_normalize_then_sum_groups_of_three():
    # Group 1: f0 = {1, -, 3}: mean 2, std sqrt(2) -> z = -b, NaN, +b with b = 1 / (sqrt(2) + 1e-4);
    #          f1 = {-, -, 1}: one value -> NaN. Sums (f0 weight 1): -b, NaN (unscorable), +b.
    # Group 2: f0 = {0, 2, 1}: mean 1, std sqrt((1 + 1 + 0) / 2) = 1 -> z = -c, +c, 0 with c = 1 / (1 + 1e-4);
    #          f1 = {1, -, 0}: mean 0.5, std sqrt(0.5) -> z = +a, NaN, -a with a = 0.5 / (sqrt(0.5) + 1e-4).
    #          Sums (f1 weight 2): -c + 2a, c, -2a.
    a = 0.5 / (math.sqrt(0.5) + EPS)
    b = 1 / (math.sqrt(2) + EPS)
    c = 1 / (1 + EPS)
    sums = [-b, b, -c + 2 * a, c, -2 * a]  # the five scorable rows, in order
    mean, std = sum(sums) / 5, _std(sums)
    z = [(s - mean) / (std + EPS) for s in sums]
    expected = [z[0], 0.0, z[1], z[2], z[3], z[4]]
    advantages = group_advantages(
        REWARDS_B, 3, reward_weights=WEIGHTS_B, multi_objective_aggregation="normalize_then_sum"
    )
    torch.testing.assert_close(advantages, torch.tensor(expected, dtype=torch.float64))


def test_default_weights_are_one():
    # Weights (1, 1) on case A: sums 2, 2, NaN, 4 -> group 1 has zero std -> advantages 0 / (0 + 1e-4) = 0.
    advantages = group_advantages(REWARDS_A, 2)
    assert advantages.tolist() == [0.0, 0.0, 0.0, 0.0]
    explicit = group_advantages(REWARDS_B, 3, reward_weights=[1.0, 1.0])
    torch.testing.assert_close(group_advantages(REWARDS_B, 3), explicit)


def test_single_function_vector_and_zero_std_group():
    # (N,) rewards = one function. Group 1 {1, 0}: mean 0.5, std sqrt(0.5); group 2 {1, 1}: std 0 -> 0 / 1e-4 = 0.
    advantages = group_advantages(torch.tensor([1.0, 0.0, 1.0, 1.0]), 2)
    scale = 0.5 / (math.sqrt(0.5) + EPS)
    torch.testing.assert_close(advantages, torch.tensor([scale, -scale, 0.0, 0.0]))


def test_num_generations_one_gives_zero_advantages():
    # Each row is its own group: centred reward 0, and TRL uses std 0 (not NaN) here.
    for mode in ("group", "none"):
        advantages = group_advantages(torch.tensor([[1.0], [5.0]]), 1, scale_rewards=mode)
        assert advantages.tolist() == [0.0, 0.0]


def test_group_reward_stats():
    # Case A sums: [3, 2, NaN, 7]. Group 1: mean 2.5, std sqrt(0.5); group 2: mean 7, std NaN (one value).
    mean, std, is_zero = group_reward_stats(weighted_reward_sum(REWARDS_A, WEIGHTS_A), 2)
    torch.testing.assert_close(mean, torch.tensor([2.5, 2.5, 7.0, 7.0], dtype=torch.float64))
    torch.testing.assert_close(std[:2], torch.full((2,), math.sqrt(0.5), dtype=torch.float64))
    assert torch.isnan(std[2:]).all()
    assert is_zero.tolist() == [False, False, False, False]  # a NaN std is not a zero std
    _, std, is_zero = group_reward_stats(torch.tensor([1.0, 1.0, 0.0, 2.0]), 2)
    assert is_zero.tolist() == [True, True, False, False]


def test_reward_metrics():
    # Case B sums over scorable rows {1, 5, 2, 2, 1}: mean 2.2, std sqrt(2.7).
    # Group stds: sqrt(8), sqrt(1/3) -> nothing is zero -> frac 0. Per function: f0 {1, 3, 0, 2, 1} mean 7/5;
    # f1 {1, 1, 0} mean 2/3.
    metrics = reward_metrics(REWARDS_B, 3, reward_weights=WEIGHTS_B)
    assert metrics["reward"].item() == pytest.approx(2.2)
    assert metrics["reward_std"].item() == pytest.approx(math.sqrt(2.7))
    assert metrics["frac_reward_zero_std"].item() == 0.0
    torch.testing.assert_close(metrics["per_function_mean"], torch.tensor([7 / 5, 2 / 3], dtype=torch.float64))
    torch.testing.assert_close(
        metrics["per_function_std"], torch.tensor([_std([1, 3, 0, 2, 1]), _std([1, 1, 0])], dtype=torch.float64)
    )
    # Groups {1, 1} (std 0) and {0, 2}: half the rows have zero group std; the batch std is not zero.
    flat = torch.tensor([[1.0], [1.0], [0.0], [2.0]])
    assert reward_metrics(flat, 2)["frac_reward_zero_std"].item() == 0.5
    assert reward_metrics(flat, 2, scale_rewards="batch")["frac_reward_zero_std"].item() == 0.0


def test_nanstd_matches_torch_std_without_nan():
    x = torch.tensor([[1.0, 4.0, 2.0], [0.0, NAN, 3.0]])
    torch.testing.assert_close(nanstd(x[0]), torch.std(x[0]))
    torch.testing.assert_close(nanstd(x, dim=1), torch.stack([torch.std(x[0]), torch.std(x[1, [0, 2]])]))
    assert torch.isnan(nanstd(torch.tensor([2.0, NAN])))  # a single value has no sample std


@pytest.mark.parametrize("mode", MULTI_OBJECTIVE_AGGREGATIONS)
def test_all_unscorable_batch_gives_zeros(mode):
    rewards = torch.full((4, 2), NAN)
    advantages = group_advantages(rewards, 2, multi_objective_aggregation=mode)
    assert advantages.tolist() == [0.0] * 4


def test_bad_arguments():
    with pytest.raises(ValueError):
        group_advantages(torch.zeros(3, 1), 2)
    with pytest.raises(ValueError):
        group_advantages(torch.zeros(4, 2), 2, reward_weights=[1.0])
    with pytest.raises(ValueError):
        group_advantages(torch.zeros(4, 1), 2, scale_rewards="global")
    with pytest.raises(ValueError):
        group_advantages(torch.zeros(4, 1), 2, multi_objective_aggregation="mean")


def test_huge_rewards_keep_their_advantages():
    # rewards 1e20 and 3e20 in one group: mean 2e20, deviations -/+1e20, Bessel std sqrt(2e40 / 1) = 1.41421e20, so
    # the advantages are -/+1/sqrt(2). In float32 the squared deviations (1e40) overflow to inf: advantages 0.
    from grpokit.algorithms import group_advantages, reward_metrics

    rewards = torch.tensor([[1e20], [3e20]], dtype=torch.float32)
    advantages = group_advantages(rewards, 2)
    assert advantages.dtype == torch.float32
    assert advantages.tolist() == pytest.approx([-(0.5**0.5), 0.5**0.5], rel=1e-6)
    metrics = reward_metrics(rewards, 2)
    assert metrics["reward"].item() == pytest.approx(2e20, rel=1e-6)
    assert metrics["reward_std"].item() == pytest.approx(2**0.5 * 1e20, rel=1e-6)
    assert metrics["frac_reward_zero_std"].item() == 0.0
