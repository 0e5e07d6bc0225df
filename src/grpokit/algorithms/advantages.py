"""Group-relative advantages for GRPO.

Completions come in consecutive groups of `num_generations` (all answers to one prompt). Each completion is scored by
F reward functions; a function that returns None for a completion is recorded as NaN. The advantage of a completion is
its (weighted) reward centred on its group's mean and, optionally, scaled by a standard deviation.

The arithmetic, including the treatment of NaN, follows TRL 1.16's `GRPOTrainer` exactly:

* A row where *every* function is NaN is unscorable: it is left out of all means and standard deviations and its
  advantage is 0.
* Standard deviations are NaN-aware and use Bessel's correction (divide by n - 1). With fewer than two scorable values
  the std is NaN, so the advantages it scales become NaN and are then set to 0. A group with a single scorable
  completion therefore contributes no learning signal, whatever `scale_rewards` is (with `"none"` the centred reward of
  a lone completion is 0 anyway).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

SCALE_REWARDS = ("group", "batch", "none")
MULTI_OBJECTIVE_AGGREGATIONS = ("sum_then_normalize", "normalize_then_sum")

# Added to every std before dividing, so that a zero-std group gives finite (zero) advantages.
STD_EPS = 1e-4


def nanstd(x: Tensor, dim: int | None = None, keepdim: bool = False) -> Tensor:
    """Standard deviation ignoring NaNs, with Bessel's correction; NaN where fewer than two values are not NaN.

    Args:
        x: any shape.
        dim: dimension to reduce; None reduces over all elements.
        keepdim: keep the reduced dimension (size 1).
    """
    if dim is None:
        flat = nanstd(x.reshape(-1), dim=0)
        return flat.reshape([1] * x.dim()) if keepdim else flat
    mean = torch.nanmean(x, dim=dim, keepdim=True)
    variance = torch.nanmean((x - mean) ** 2, dim=dim, keepdim=True)
    count = (~torch.isnan(x)).sum(dim=dim, keepdim=True).to(variance.dtype)
    correction = torch.where(count > 1, count / (count - 1), torch.full_like(count, float("nan")))
    std = torch.sqrt(variance * correction)
    return std if keepdim else std.squeeze(dim)


def _as_matrix(rewards: Tensor, num_generations: int) -> Tensor:
    if rewards.dim() == 1:
        rewards = rewards.unsqueeze(1)
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be (N, F) or (N,), got shape {tuple(rewards.shape)}")
    if num_generations < 1 or rewards.size(0) % num_generations != 0:
        raise ValueError(f"{rewards.size(0)} rows cannot be split into groups of num_generations={num_generations}")
    return rewards


def _weights(rewards: Tensor, reward_weights: Sequence[float] | Tensor | None) -> Tensor:
    num_funcs = rewards.size(1)
    if reward_weights is None:
        return torch.ones(num_funcs, dtype=rewards.dtype, device=rewards.device)
    weights = torch.as_tensor(reward_weights, dtype=rewards.dtype, device=rewards.device).reshape(-1)
    if weights.numel() != num_funcs:
        raise ValueError(f"got {weights.numel()} reward_weights for {num_funcs} reward functions")
    return weights


def unscorable_rows(rewards: Tensor) -> Tensor:
    """Bool `(N,)`: True where every reward function returned None (NaN) for the completion.

    Args:
        rewards: `(N, F)`.
    """
    return torch.isnan(rewards).all(dim=1)


def weighted_reward_sum(rewards: Tensor, reward_weights: Sequence[float] | Tensor | None = None) -> Tensor:
    """Weighted NaN-aware sum over reward functions, `(N, F) -> (N,)`; NaN for unscorable rows.

    NaN entries count as missing (they add nothing); a row where all entries are NaN stays NaN rather than becoming 0,
    so that it can be left out of group statistics.

    Args:
        rewards: `(N, F)` (or `(N,)` for a single function).
        reward_weights: F weights, default all 1.
    """
    rewards = _as_matrix(rewards, 1)
    summed = (rewards * _weights(rewards, reward_weights).unsqueeze(0)).nansum(dim=1)
    return summed.masked_fill(unscorable_rows(rewards), float("nan"))


def group_reward_stats(rewards_summed: Tensor, num_generations: int) -> tuple[Tensor, Tensor, Tensor]:
    """Per-group mean and std of already-summed rewards, repeated onto each row.

    NaN rewards (unscorable rows) are ignored. The std uses Bessel's correction and is NaN for a group with fewer than
    two scorable rows; with `num_generations == 1` the std is 0 (TRL's convention).

    Args:
        rewards_summed: `(N,)`, e.g. from `weighted_reward_sum`.
        num_generations: group size G; N must be a multiple of G.

    Returns:
        `(mean, std, is_std_zero)`, each `(N,)`. `is_std_zero` (bool) is what TRL averages into
        `frac_reward_zero_std` when `scale_rewards` is `"group"` or `"none"`; it is False for a NaN std.
    """
    grouped = _as_matrix(rewards_summed, num_generations)[:, 0].view(-1, num_generations)
    mean = torch.nanmean(grouped, dim=1).repeat_interleave(num_generations)
    if num_generations > 1:
        std = nanstd(grouped, dim=1).repeat_interleave(num_generations)
    else:
        std = torch.zeros_like(mean)
    return mean, std, torch.isclose(std, torch.zeros_like(std))


def _advantages_and_std(
    rewards: Tensor,
    num_generations: int,
    reward_weights: Sequence[float] | Tensor | None,
    scale_rewards: str,
    multi_objective_aggregation: str,
) -> tuple[Tensor, Tensor]:
    """Advantages `(N,)` (NaN not yet zeroed) and the std `(N,)` they were scaled by (TRL's `std_rewards`), computed
    in float64: rewards of any float32 magnitude (up to ~3e38) have a finite variance there, where float32 would
    overflow past ~1e19 and silently give zero advantages."""
    rewards = _as_matrix(rewards, num_generations).double()
    if scale_rewards not in SCALE_REWARDS:
        raise ValueError(f"scale_rewards must be one of {SCALE_REWARDS}, got {scale_rewards!r}")
    weights = _weights(rewards, reward_weights)

    if multi_objective_aggregation == "sum_then_normalize":
        summed = weighted_reward_sum(rewards, weights)
        mean, std, _ = group_reward_stats(summed, num_generations)
        if scale_rewards == "batch":
            std = nanstd(summed).expand_as(summed) if summed.numel() > 1 else torch.zeros_like(summed)
        advantages = summed - mean
        if scale_rewards != "none":
            advantages = advantages / (std + STD_EPS)
        return advantages, std

    if multi_objective_aggregation == "normalize_then_sum":
        # `scale_rewards` plays no part here: each function is normalised within its group, the weighted sum is then
        # normalised over the whole batch. A (function, group) pair with fewer than two scorable values has a NaN std,
        # so that function drops out of the nansum for the group; a scorable row whose every function dropped out
        # sums to 0 (not NaN) and so does take part in the batch statistics.
        num_funcs = rewards.size(1)
        grouped = rewards.view(-1, num_generations, num_funcs)
        mean_k = torch.nanmean(grouped, dim=1, keepdim=True)
        std_k = nanstd(grouped, dim=1, keepdim=True) if num_generations > 1 else torch.zeros_like(mean_k)
        normalised = ((grouped - mean_k) / (std_k + STD_EPS)).view(-1, num_funcs)
        summed = (normalised * weights.unsqueeze(0)).nansum(dim=1)
        summed = summed.masked_fill(unscorable_rows(rewards), float("nan"))
        std = nanstd(summed).expand_as(summed) if summed.numel() > 1 else torch.zeros_like(summed)
        return (summed - torch.nanmean(summed)) / (std + STD_EPS), std

    raise ValueError(
        f"multi_objective_aggregation must be one of {MULTI_OBJECTIVE_AGGREGATIONS}, got {multi_objective_aggregation!r}"
    )


def group_advantages(
    rewards: Tensor,
    num_generations: int,
    *,
    reward_weights: Sequence[float] | Tensor | None = None,
    scale_rewards: str = "group",
    multi_objective_aggregation: str = "sum_then_normalize",
) -> Tensor:
    """GRPO advantages, `(N, F) -> (N,)`, identical to TRL 1.16.

    `sum_then_normalize` (default): r = sum_f w_f * rewards[:, f] (NaN entries skipped), A = r - mean_group(r), then
    `scale_rewards="group"` divides by std_group(r) + 1e-4, `"batch"` by std over all N rows + 1e-4 (the centring stays
    per group), `"none"` does not divide.

    `normalize_then_sum`: each function is first normalised within its group, z_f = (r_f - mean_group) /
    (std_group + 1e-4); then s = sum_f w_f * z_f and A = (s - mean_batch(s)) / (std_batch(s) + 1e-4).
    `scale_rewards` is ignored in this mode (as in TRL).

    Unscorable rows (every function NaN) are excluded from every statistic and get advantage 0; any other NaN
    advantage (e.g. a group with one scorable row, whose std is NaN) is also set to 0.

    Args:
        rewards: `(N, F)` rewards, NaN where a function returned None; N = num_prompts * num_generations, groups are
            consecutive rows. A `(N,)` tensor is treated as F = 1.
        num_generations: group size G.
        reward_weights: F weights, default all 1.
        scale_rewards: `"group"`, `"batch"` or `"none"`.
        multi_objective_aggregation: `"sum_then_normalize"` or `"normalize_then_sum"`.

    Returns:
        `(N,)` advantages.
    """
    advantages, _ = _advantages_and_std(
        rewards, num_generations, reward_weights, scale_rewards, multi_objective_aggregation
    )
    return torch.nan_to_num(advantages, nan=0.0).to(rewards.dtype)  # float64 inside, the rewards' dtype out


def reward_metrics(
    rewards: Tensor,
    num_generations: int,
    *,
    reward_weights: Sequence[float] | Tensor | None = None,
    scale_rewards: str = "group",
    multi_objective_aggregation: str = "sum_then_normalize",
) -> dict[str, Tensor]:
    """The reward statistics TRL 1.16 logs for one generation batch (scalars unless noted).

    * `reward`, `reward_std`: NaN-aware mean / std of the weighted reward sum over all scorable rows (the raw sum,
      whatever the aggregation mode).
    * `frac_reward_zero_std`: fraction of rows whose scaling std is (close to) 0: the group std for `scale_rewards`
      `"group"`/`"none"`, the batch std for `"batch"` and for `normalize_then_sum` (so there it is 0 or 1). Rows with
      a NaN std (fewer than two scorable rewards) do not count as zero-std.
    * `per_function_mean`, `per_function_std`: `(F,)`, NaN-aware, over rows where that function returned a value.

    Args: as for `group_advantages`.
    """
    dtype = rewards.dtype
    rewards = _as_matrix(rewards, num_generations).double()  # float64 inside (see _advantages_and_std)
    _, std = _advantages_and_std(rewards, num_generations, reward_weights, scale_rewards, multi_objective_aggregation)
    summed = weighted_reward_sum(rewards, reward_weights)
    return {
        "reward": torch.nanmean(summed).to(dtype),
        "reward_std": nanstd(summed).to(dtype),
        "frac_reward_zero_std": torch.isclose(std, torch.zeros_like(std)).float().mean(),
        "per_function_mean": torch.nanmean(rewards, dim=0).to(dtype),
        "per_function_std": nanstd(rewards, dim=0).to(dtype),
    }
