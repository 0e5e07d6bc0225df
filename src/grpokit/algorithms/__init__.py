"""Pure GRPO math (torch only): advantages, per-token objectives and their reductions, KL, masks, metrics."""

from .advantages import (
    MULTI_OBJECTIVE_AGGREGATIONS,
    SCALE_REWARDS,
    group_advantages,
    group_reward_stats,
    nanstd,
    reward_metrics,
    unscorable_rows,
    weighted_reward_sum,
)
from .importance_sampling import (
    VLLM_IMPORTANCE_SAMPLING_MODES,
    vllm_importance_weights,
    vllm_sampling_metrics,
)
from .kl import kl_k3
from .loss_settings import LossSettings
from .losses import (
    IMPORTANCE_SAMPLING_LEVELS,
    LOSS_TYPES,
    LOSSES,
    PolicyLoss,
    RatioTerms,
    cispo_clip_fraction,
    clip_fractions,
    entropy_from_logits,
    importance_ratio,
    masked_mean,
    policy_loss,
    ratio_terms,
    vespo_weights,
)
from .masks import entropy_mask, off_policy_mask

__all__ = [
    "IMPORTANCE_SAMPLING_LEVELS",
    "LOSSES",
    "LOSS_TYPES",
    "LossSettings",
    "MULTI_OBJECTIVE_AGGREGATIONS",
    "SCALE_REWARDS",
    "VLLM_IMPORTANCE_SAMPLING_MODES",
    "PolicyLoss",
    "RatioTerms",
    "cispo_clip_fraction",
    "clip_fractions",
    "entropy_from_logits",
    "entropy_mask",
    "group_advantages",
    "group_reward_stats",
    "importance_ratio",
    "kl_k3",
    "masked_mean",
    "nanstd",
    "off_policy_mask",
    "policy_loss",
    "ratio_terms",
    "reward_metrics",
    "unscorable_rows",
    "vespo_weights",
    "vllm_importance_weights",
    "vllm_sampling_metrics",
    "weighted_reward_sum",
]
