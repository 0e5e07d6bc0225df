"""Keys that TRL or transformers renamed or removed: one table, used by the parser and by the dataclasses."""

from __future__ import annotations

# old key -> (new key or None when the key is gone, why)
RENAMED_KEYS: dict[str, tuple[str | None, str]] = {
    "torch_dtype": ("dtype", "renamed to dtype in transformers 5"),
    "evaluation_strategy": ("eval_strategy", "renamed to eval_strategy in transformers 4.46"),
    "use_transformers_paged": (
        "use_transformers_continuous_batching",
        "renamed to use_transformers_continuous_batching in TRL",
    ),
    "vllm_importance_sampling_cap": (
        "vllm_importance_sampling_clip_max",
        "renamed to vllm_importance_sampling_clip_max in TRL",
    ),
    "warmup_ratio": (
        "warmup_steps",
        "removed in transformers 5, where a warmup_steps value below 1 is a fraction of the training steps",
    ),
    "overwrite_output_dir": (None, "removed in transformers 5; it has no effect and is ignored"),
}

# Deprecated keys that are still fields (TRL 1.16 keeps them): their value moves to the new field.
DEPRECATED_FIELDS = {"use_transformers_paged", "vllm_importance_sampling_cap"}

# Legacy boolean spellings of scale_rewards.
LEGACY_SCALE_REWARDS = {True: "group", False: "none"}


def legacy_scale_rewards(value):
    """`scale_rewards: true/false` (older TRL) -> 'group'/'none'; None when `value` is not a legacy spelling."""
    if isinstance(value, bool):
        return LEGACY_SCALE_REWARDS[value]
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return LEGACY_SCALE_REWARDS[value.strip().lower() == "true"]
    return None
