"""Keys that TRL or transformers renamed or removed: one table, used by the parser and by the dataclasses."""

from __future__ import annotations

from dataclasses import dataclass

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
}

# GRPO keys TRL renamed or removed since 0.14 (its first GRPOConfig): old key -> TRLKeyChange. A renamed key is
# migrated with a warning, like the rows above; a removed key is an error naming the version and what to do, or a
# warning when dropping its value changes nothing that matters (`harmless`). Keys TRL dropped that grpokit keeps as
# fields (`max_prompt_length`) are not here. Versions: TRL's changelog and pull requests (numbers in the comments).


@dataclass(frozen=True)
class TRLKeyChange:
    version: str  # the TRL release where the key changed
    new: str | None  # the key now; None when it is gone
    action: str  # what to do now
    harmless: bool = False  # a removed key whose value can be dropped with a warning
    harmless_values: tuple = ()  # values of a removed key that ask for what grpokit does anyway: a warning too


TRL_KEY_CHANGES: dict[str, TRLKeyChange] = {
    # The in-process vLLM engine of TRL 0.14/0.15 gave way to `trl vllm-serve` in 0.16 (#3094), where these four
    # became deprecated; they were removed in 0.18, which added colocate mode and `vllm_max_model_length`.
    # `auto` (open-r1's recipes) asked vLLM to pick its device, which is what both modes do now: only a warning.
    "vllm_device": TRLKeyChange(
        "0.18",
        None,
        "vLLM's device is chosen for you (as `auto` asked): each training process's own (vllm_mode: colocate) or a "
        "separate server's (vllm_mode: server, started with `grpokit vllm-serve` on the GPUs you choose); delete the key",
        harmless_values=("auto",),
    ),
    "vllm_dtype": TRLKeyChange("0.18", None, "vLLM runs in the model's dtype (dtype / model_init_kwargs)", True),
    "vllm_enable_prefix_caching": TRLKeyChange("0.18", None, "vLLM's prefix caching stays at its default (on)", True),
    "vllm_max_model_len": TRLKeyChange("0.18", "vllm_max_model_length", "use vllm_max_model_length"),
    # vLLM's guided decoding became structured outputs (#4117, #4797).
    "vllm_guided_decoding_regex": TRLKeyChange(
        "0.27", "vllm_structured_outputs_regex", "use vllm_structured_outputs_regex"
    ),
    "use_liger_loss": TRLKeyChange("0.22", "use_liger_kernel", "use use_liger_kernel"),
    # #4508: deprecated in 0.26, removed in 0.27. open-r1's GRPOConfig declares it too (default True).
    "wandb_log_unique_prompts": TRLKeyChange("0.26", "log_unique_prompts", "use log_unique_prompts"),
}


def _trl_why(old: str, change: TRLKeyChange) -> str:
    if change.new is not None:
        return f"renamed to {change.new} in TRL {change.version}"
    return f"removed in TRL {change.version}: {change.action}" + ("; its value is ignored" if change.harmless else "")


RENAMED_KEYS.update({old: (change.new, _trl_why(old, change)) for old, change in TRL_KEY_CHANGES.items()})
# Removed keys that stop the run (the other removed keys are dropped with a warning), unless set to one of their
# `harmless_values` (see `removed_key_is_error`).
REMOVED_KEY_ERRORS = frozenset(o for o, c in TRL_KEY_CHANGES.items() if c.new is None and not c.harmless)


def removed_key_is_error(key: str, value) -> bool:
    """Whether the removed `key` set to `value` stops the run; False for a key that is not removed, a harmless one,
    or one of its `harmless_values` (compared case-insensitively: `vllm_device: AUTO` is `auto`), which the parser
    drops with a warning instead."""
    if key not in REMOVED_KEY_ERRORS:
        return False
    if isinstance(value, str):
        value = value.strip().lower()
    return value not in TRL_KEY_CHANGES[key].harmless_values


# Defaults whose meaning changed across TRL releases: a config that leaves them unset trains differently from the
# same file under an older TRL. `grpokit config` notes each one left unset: field -> (note, only when this is true).
CHANGED_DEFAULTS: dict[str, tuple[str, str | None]] = {
    "beta": (
        "beta is unset: 0.0 (no KL term, no reference model), TRL's default since 0.19; recipes written for "
        "older TRL expect 0.04",
        None,
    ),
    "loss_type": (
        "loss_type is unset: 'dapo' (normalised by the tokens of the whole batch), TRL's default since #3938 "
        "(2025); older TRL used 'bnpo'",
        None,
    ),
    "vllm_mode": (
        "vllm_mode is unset: 'colocate' (vLLM inside each training process), TRL's default since 1.0 (#5255); "
        "older TRL connected to a server ('server')",
        "use_vllm",
    ),
}


def changed_default_notes(values: dict, sources: dict) -> list[str]:
    """A note for each default that changed meaning and that the resolved config leaves unset."""
    return [
        note
        for name, (note, only_if) in CHANGED_DEFAULTS.items()
        if name in values and sources.get(name, "default") == "default" and (only_if is None or values.get(only_if))
    ]


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
