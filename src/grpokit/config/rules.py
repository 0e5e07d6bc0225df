"""Validation rules over config values: one source of truth for errors, the plan and the JSON schema.

Rules work on plain mappings of field name -> value, so the same code judges a single dataclass built in Python
(`GRPOConfig(...)` raises `ConfigError`, a `ValueError`) and the merged values of every dataclass that the parser
resolves (every problem reported at once, before anything heavy is loaded).
"""

from __future__ import annotations

import dataclasses
import enum
import math
import os
import warnings
from dataclasses import dataclass
from typing import Any

from .asynchronous import async_problems
from .migrations import DEPRECATED_FIELDS, RENAMED_KEYS, legacy_scale_rewards

_UNSET = object()


@dataclass
class Problem:
    """One thing wrong with a configuration, rendered as one line."""

    field: str
    message: str
    value: Any = _UNSET
    hint: str | None = None
    source: str | None = None
    # Batch geometry only: the smallest process counts at which the geometry holds (`valid_process_counts`), when
    # the number of processes alone is what breaks it.
    processes: tuple[int, ...] = ()

    def line(self) -> str:
        where = self.field
        if self.value is not _UNSET:
            where += f"={self.value!r}"
        if self.source and self.source != "default":
            where += f" ({self.source})"
        text = f"{where}: {self.message}"
        return f"{text}; {self.hint}" if self.hint else text


class ConfigError(ValueError):
    """Invalid configuration: carries every problem found, one line each."""

    def __init__(self, problems: list[Problem]):
        self.problems = list(problems)
        super().__init__("\n".join(p.line() for p in self.problems))


# ---- Ranges: (low, low inclusive, high, high inclusive); None means unbounded on that side. ----
RANGES: dict[str, tuple[float | None, bool, float | None, bool]] = {
    # GRPOConfig
    "num_generations": (2, True, None, False),
    "num_generations_eval": (1, True, None, False),
    "max_completion_length": (1, True, None, False),
    "max_prompt_length": (1, True, None, False),
    "pad_to_multiple_of": (1, True, None, False),
    "generation_batch_size": (1, True, None, False),
    "steps_per_generation": (1, True, None, False),
    "num_iterations": (1, True, None, False),
    "temperature": (0, False, None, False),
    "top_p": (0, False, 1, True),
    "top_k": (0, True, None, False),
    "min_p": (0, True, 1, True),
    "repetition_penalty": (0, False, None, False),
    "beta": (0, True, None, False),
    "epsilon": (0, True, None, False),
    "epsilon_high": (0, True, None, False),
    "delta": (1, False, None, False),
    "sapo_temperature_pos": (0, False, None, False),
    "sapo_temperature_neg": (0, False, None, False),
    "vespo_k_pos": (0, False, None, False),
    "vespo_lambda_pos": (0, False, None, False),
    "vespo_k_neg": (0, False, None, False),
    "vespo_lambda_neg": (0, False, None, False),
    "top_entropy_quantile": (0, False, 1, True),
    "off_policy_mask_threshold": (0, False, None, False),
    "entropy_coef": (0, True, None, False),
    "entropy_coef_min": (0, True, None, False),
    "entropy_coef_delta": (0, True, None, False),
    "ref_model_mixup_alpha": (0, True, 1, True),
    "ref_model_sync_steps": (1, True, None, False),
    "max_nonfinite_steps": (1, True, None, False),
    "num_completions_to_print": (0, True, None, False),
    "vllm_gpu_memory_utilization": (0, False, 1, True),
    "vllm_tensor_parallel_size": (1, True, None, False),
    "vllm_server_port": (1, True, 65535, True),
    "vllm_group_port": (1, True, 65535, True),
    "vllm_server_timeout": (0, False, None, False),
    "vllm_max_model_length": (1, True, None, False),
    "vllm_importance_sampling_clip_min": (0, True, None, False),
    "vllm_importance_sampling_clip_max": (0, False, None, False),
    "sampler_kl_threshold": (0, False, None, False),
    "sampler_token_veto": (0, False, 1, False),
    "max_tool_calling_iterations": (0, True, None, False),  # 0: calls are parsed, never run (TRL)
    "reward_timeout": (0, False, None, False),
    "tool_timeout": (0, False, None, False),
    "tool_round_timeout": (0, False, None, False),
    "max_tool_result_chars": (1, True, None, False),
    "max_unscorable_rounds": (1, True, None, False),
    "max_staleness": (0, True, None, False),
    "queue_maxsize": (1, True, None, False),
    "weight_sync_steps": (1, True, None, False),
    "heartbeat_stale_after_s": (0, False, None, False),
    "request_timeout": (0, False, None, False),
    "weight_sync_timeout": (0, False, None, False),
    "dynamic_sampling_min_reward_std": (0, True, None, False),
    "dynamic_sampling_max_rounds": (1, True, None, False),
    # TrainingArguments
    "per_device_train_batch_size": (1, True, None, False),
    "per_device_eval_batch_size": (1, True, None, False),
    "gradient_accumulation_steps": (1, True, None, False),
    "learning_rate": (0, True, None, False),
    "weight_decay": (0, True, None, False),
    "max_grad_norm": (0, True, None, False),
    "num_train_epochs": (0, False, None, False),
    "max_steps": (-1, True, None, False),
    "warmup_steps": (0, True, None, False),
    "logging_steps": (0, True, None, False),
    "save_total_limit": (0, True, None, False),
    "dataloader_num_workers": (0, True, None, False),
    # ModelConfig
    "lora_r": (1, True, None, False),
    "lora_alpha": (0, False, None, False),
    "lora_dropout": (0, True, 1, False),
    # DatasetMixtureConfig / DatasetConfig
    "test_split_size": (0, False, None, False),
    "fraction": (0, False, 1, True),
}

MAPPING_FIELDS = (
    "generation_kwargs",
    "chat_template_kwargs",
    "model_init_kwargs",
    "transformers_continuous_batching_config",
)


def _range_text(low, low_inc, high, high_inc) -> str:
    parts = []
    if low is not None:
        parts.append(f"{'>=' if low_inc else '>'} {low}")
    if high is not None:
        parts.append(f"{'<=' if high_inc else '<'} {high}")
    return "must be " + " and ".join(parts)


def range_problem(name: str, value, default=None) -> Problem | None:
    """A Problem when `value` lies outside the range of `name`, with the nearest valid value as hint."""
    if name not in RANGES or value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    low, low_inc, high, high_inc = RANGES[name]
    if isinstance(value, float) and math.isinf(value):
        return Problem(
            name, "must be a finite number", value, f"for example {default} (the default)" if default else None
        )
    too_low = low is not None and (value < low or (value == low and not low_inc))
    too_high = high is not None and (value > high or (value == high and not high_inc))
    if not (too_low or too_high) and not (isinstance(value, float) and math.isnan(value)):
        return None
    bound, inclusive = (low, low_inc) if too_low else (high, high_inc)
    if inclusive:
        nearest = bound
    elif isinstance(value, int):
        nearest = bound + 1 if too_low else bound - 1
    else:
        nearest = None
    if nearest is not None:
        hint = f"nearest valid value: {nearest}"
    elif default is not None and range_problem(name, default) is None:
        hint = f"for example {default} (the default)"
    else:
        hint = None
    return Problem(name, _range_text(low, low_inc, high, high_inc), value, hint)


def type_problems(values: dict[str, Any], cls) -> tuple[dict[str, Any], list[Problem]]:
    """Coerce each value of a dataclass built in Python to its field type: (coerced values, problems)."""
    from .types import MAPPING_ITEM_FIELDS, CoercionError, coerce, field_types

    hints = field_types(cls)
    coerced, problems = {}, []
    for f in dataclasses.fields(cls):
        if f.name not in values or not f.init:
            continue
        value = values[f.name]
        if value is not None and not isinstance(value, (str, int, float, list, dict, enum.Enum)):
            coerced[f.name] = value  # an object built in Python (e.g. AcceleratorConfig): its class checks it
            continue
        try:
            coerced[f.name] = coerce(values[f.name], hints[f.name], mapping_items=f.name in MAPPING_ITEM_FIELDS)
        except CoercionError as exc:
            hint = f"did you mean {exc.suggestion!r}?" if exc.suggestion is not None else None
            problems.append(Problem(f.name, str(exc), hint=hint))
    return coerced, problems


def report_to_names(value) -> list[str]:
    """The integrations `report_to` names (a name, a comma-separated string or a list); "all"/"none" as given."""
    if value is None:
        return []
    names = value.split(",") if isinstance(value, str) else list(value)
    return [str(n).strip() for n in names if str(n).strip()]


def _report_to_problems(value) -> list[Problem]:
    """A `report_to` name transformers does not know is refused here, with "did you mean" (transformers would only
    fail once the model has loaded). The names transformers knows (its INTEGRATION_TO_CALLBACK) are read from the
    field table, generated from transformers (`field_table.py`), so that checking needs no transformers import."""
    from .field_data import TABLE
    from .suggest import closest

    known = sorted(TABLE["integrations"]) + ["all", "none"]
    problems = []
    for name in report_to_names(value):
        if name not in known:
            near = closest(name, known)
            problems.append(
                Problem(
                    "report_to",
                    f"{name!r} is not an integration transformers knows ({', '.join(known)})",
                    value,
                    f"did you mean {near!r}?" if near else "use one of those",
                )
            )
    return problems


def check_fields(values: dict[str, Any], defaults: dict[str, Any] | None = None) -> list[Problem]:
    """Rules that need only the values themselves (ranges and combinations of fields), every problem at once."""
    defaults = defaults or {}
    get = values.get
    problems = [p for name, v in values.items() if (p := range_problem(name, v, defaults.get(name)))]
    for name in MAPPING_FIELDS:
        v = get(name)
        if v is not None and not isinstance(v, dict):
            problems.append(Problem(name, "must be a mapping (in YAML a nested block, on the command line JSON)", v))
    if get("generation_batch_size") is not None and get("steps_per_generation") is not None:
        problems.append(
            Problem(
                "generation_batch_size",
                "generation_batch_size and steps_per_generation cannot both be set (one is derived from the other)",
                get("generation_batch_size"),
                f"set only one; steps_per_generation={get('steps_per_generation')} alone, for example",
            )
        )
    if get("auto_find_batch_size"):
        problems.append(
            Problem(
                "auto_find_batch_size",
                "not supported by GRPO: shrinking the batch on out-of-memory breaks whole groups of num_generations",
                True,
                "set it to false and lower per_device_train_batch_size",
            )
        )
    if get("fp16") and get("bf16"):
        problems.append(Problem("bf16", "fp16 and bf16 cannot both be true", True, "keep one of them"))
    problems += _report_to_problems(get("report_to"))
    lo, hi = get("entropy_coef_min"), get("entropy_coef_max")
    if _num(lo) and _num(hi) and lo > hi:
        problems.append(Problem("entropy_coef_min", f"must be <= entropy_coef_max ({hi})", lo, f"nearest valid: {hi}"))
    lo, hi = get("vllm_importance_sampling_clip_min"), get("vllm_importance_sampling_clip_max")
    if _num(lo) and _num(hi) and lo >= hi:
        problems.append(
            Problem("vllm_importance_sampling_clip_min", f"must be < vllm_importance_sampling_clip_max ({hi})", lo)
        )
    if (
        get("vllm_importance_sampling_correction")
        and str(get("vllm_importance_sampling_mode", "")).endswith("_truncate")
        and lo is None
        and hi is None
        and "vllm_importance_sampling_clip_max" in values
    ):
        problems.append(
            Problem(
                "vllm_importance_sampling_mode",
                "a *_truncate mode needs vllm_importance_sampling_clip_min or _clip_max",
                get("vllm_importance_sampling_mode"),
                "set vllm_importance_sampling_clip_max: 3.0",
            )
        )
    problems += _vllm_problems(values)
    problems += _sampler_correction_problems(values)
    problems += _routing_replay_problems(values)
    problems += continuous_batching_problems(values)
    pad = get("pad_to_multiple_of")
    if isinstance(pad, str) and pad != "auto":  # `int | str` only so that 'auto' can be written
        problems.append(
            Problem("pad_to_multiple_of", "must be a positive integer, 'auto' or null", pad, "did you mean 'auto'?")
        )
    if get("log_completions_hub_repo") is not None and not get("log_completions"):
        problems.append(
            Problem("log_completions_hub_repo", "needs log_completions: true", get("log_completions_hub_repo"))
        )
    problems += _dynamic_sampling_problems(values, defaults)
    problems += [Problem(*found) for found in async_problems(values, defaults)]
    problems += reference_problems(values)
    if get("load_in_8bit") and get("load_in_4bit"):
        problems.append(Problem("load_in_4bit", "load_in_8bit and load_in_4bit cannot both be true", True))
    problems += _quantization_problems(values)
    return problems


def _dynamic_sampling_problems(values: dict[str, Any], defaults: dict[str, Any]) -> list[Problem]:
    """dynamic_sampling's settings mean nothing without it: set to another value than the default, they are refused."""
    if values.get("dynamic_sampling"):
        return []
    return [
        Problem(name, "has no effect without dynamic_sampling: true", values[name], "set dynamic_sampling: true")
        for name in ("dynamic_sampling_min_reward_std", "dynamic_sampling_max_rounds")
        if name in values and name in defaults and values[name] != defaults[name]
    ]


def _quantization_problems(values: dict[str, Any]) -> list[Problem]:
    """QLoRA's rules where ModelConfig's fields are among the values (the command's configuration): a quantised base
    trains only with LoRA adapters, and the quantisation is given in one place, as TRL refuses it."""
    get = values.get
    kwargs = get("model_init_kwargs")
    in_kwargs = isinstance(kwargs, dict) and kwargs.get("quantization_config") is not None
    flag = "load_in_4bit" if get("load_in_4bit") else "load_in_8bit" if get("load_in_8bit") else None
    problems = []
    if flag and in_kwargs:
        problems.append(
            Problem(flag, "model_init_kwargs sets quantization_config too; set the quantisation in one place", True)
        )
    if "use_peft" in values and not get("use_peft") and (flag or in_kwargs):
        problems.append(
            Problem(
                flag or "model_init_kwargs",
                "a quantised base model cannot be trained in full (its weights are frozen integers)",
                True if flag else kwargs,
                "set use_peft: true to train LoRA adapters on it (QLoRA)",
            )
        )
    return problems


def quantization_warnings(values: dict[str, Any]) -> list[str]:
    """The 4-bit options set where they have no effect (without load_in_4bit), so that none is a silent no-op."""
    if values.get("load_in_4bit") or "load_in_4bit" not in values:
        return []
    set_ = {
        "bnb_4bit_quant_type": values.get("bnb_4bit_quant_type") not in (None, "nf4"),
        "use_bnb_nested_quant": bool(values.get("use_bnb_nested_quant")),
        "bnb_4bit_quant_storage": values.get("bnb_4bit_quant_storage") is not None,
    }
    return [f"{name}={values[name]!r} has no effect without load_in_4bit: true" for name, on in set_.items() if on]


def reference_problems(values: dict[str, Any]) -> list[Problem]:
    """The reference model's rule: sync_ref_model needs one, and beta=0 loads none. Also run by GRPOTrainer on the
    config it is given, whose fields may have been assigned after it was built."""
    if values.get("sync_ref_model") and values.get("beta") == 0.0:
        return [
            Problem(
                "sync_ref_model",
                "needs a reference model, and beta=0 loads none",
                True,
                "set beta > 0 (e.g. 0.04) or sync_ref_model: false",
            )
        ]
    return []


def _sampler_correction_problems(values: dict[str, Any]) -> list[Problem]:
    """grpokit's sampler corrections act on the importance-sampling correction's weights: each needs that correction
    with sampler log-probabilities (vLLM, or async_grpo's sampler), the geometric mean a sequence mode, and the KL
    estimator and reduction a KL threshold."""
    problems = []
    corrected = values.get("vllm_importance_sampling_correction", True) and (
        values.get("use_vllm") or values.get("async_grpo")
    )
    set_fields = {
        "sampler_sequence_geometric": values.get("sampler_sequence_geometric") is True,
        "sampler_kl_threshold": values.get("sampler_kl_threshold") is not None,
        "sampler_token_veto": values.get("sampler_token_veto") is not None,
    }
    for name in (name for name, on in set_fields.items() if on):
        if not corrected:
            problems.append(
                Problem(
                    name,
                    "needs the importance-sampling correction (use_vllm or async_grpo, with "
                    "vllm_importance_sampling_correction: true): without the sampler's log-probabilities it does nothing",
                    values.get(name),
                )
            )
    mode = values.get("vllm_importance_sampling_mode", "sequence_mask")
    if set_fields["sampler_sequence_geometric"] and corrected and not str(mode).startswith("sequence_"):
        problems.append(
            Problem(
                "sampler_sequence_geometric",
                f"applies to the sequence modes; vllm_importance_sampling_mode is {mode}",
                True,
                "set vllm_importance_sampling_mode: sequence_mask",
            )
        )
    for name, default in (("sampler_kl_estimator", "k3"), ("sampler_kl_reduction", "mean")):
        if values.get(name, default) != default and not set_fields["sampler_kl_threshold"]:
            problems.append(Problem(name, "has no effect without sampler_kl_threshold", values.get(name)))
    return problems


def _routing_replay_problems(values: dict[str, Any]) -> list[Problem]:
    """routing_replay records routes in transformers' own generate and replays them in one forward per chunk."""
    if not values.get("routing_replay"):
        return []
    others = {
        "use_vllm": "vLLM's routed experts are not read yet",
        "use_transformers_continuous_batching": "continuous batching does not record routes",
        "async_grpo": "the asynchronous worker's samples do not carry routes yet",
    }
    return [
        Problem("routing_replay", f"cannot be used with {name}: {why}", True, f"set {name}: false")
        for name, why in others.items()
        if values.get(name)
    ]


def _vllm_problems(values: dict[str, Any]) -> list[Problem]:
    """The vLLM settings that can be judged from their values: the regex compiles, the server URL is an http(s) URL."""
    problems = []
    regex = values.get("vllm_structured_outputs_regex")
    if isinstance(regex, str):
        import re

        try:
            re.compile(regex)
        except re.error as error:
            problems.append(
                Problem("vllm_structured_outputs_regex", f"is not a valid regular expression ({error})", regex)
            )
    url = values.get("vllm_server_base_url")
    if isinstance(url, str):
        from urllib.parse import urlsplit

        parts = urlsplit(url)
        try:
            parts.port  # noqa: B018 (raises on a bad port)
            port_ok = True
        except ValueError:
            port_ok = False
        if parts.scheme not in ("http", "https") or not parts.hostname or not port_ok:
            problems.append(
                Problem(
                    "vllm_server_base_url",
                    "must be an http(s) URL with a host, e.g. http://127.0.0.1:8000",
                    url,
                )
            )
    return problems


# generation_kwargs transformers' continuous batching honours: the logits processors that read only the scores, and
# what generate_batch itself reads (see grpokit.generation.continuous).
CONTINUOUS_BATCHING_GENERATION_KWARGS = (
    "bos_token_id",
    "do_sample",
    "eos_token_id",
    "epsilon_cutoff",
    "eta_cutoff",
    "max_new_tokens",
    "min_p",
    "pad_token_id",
    "remove_invalid_values",
    "renormalize_logits",
    "suppress_tokens",
    "temperature",
    "top_k",
    "top_p",
    "typical_p",
)
CONTINUOUS_WITH_VLLM = "use_transformers_continuous_batching and use_vllm are two generation backends; keep one"


def continuous_batching_problems(values: dict[str, Any]) -> list[Problem]:
    """With use_transformers_continuous_batching: what transformers' `generate_batch` would not apply (its logits
    processors see only each row's last token, and it runs its own paged cache and no stopping criteria)."""
    if not values.get("use_transformers_continuous_batching"):
        return []
    name = "use_transformers_continuous_batching"
    problems = []
    if values.get("use_vllm"):
        problems.append(Problem(name, CONTINUOUS_WITH_VLLM, True))
    kwargs = values.get("generation_kwargs") if isinstance(values.get("generation_kwargs"), dict) else {}
    penalty = kwargs.get("repetition_penalty", values.get("repetition_penalty"))
    if _num(penalty) and penalty != 1.0:
        problems.append(
            Problem(
                "repetition_penalty",
                "transformers' continuous batching drops the repetition penalty (its processor needs each row's "
                "history)",
                penalty,
                "set it to 1.0, or turn use_transformers_continuous_batching off",
            )
        )
    cache = kwargs.get("cache_implementation", values.get("cache_implementation"))
    if cache is not None:
        problems.append(
            Problem(
                "cache_implementation",
                "has no effect with use_transformers_continuous_batching (it pages its own KV cache)",
                cache,
                "leave it unset",
            )
        )
    ignored = sorted(
        set(kwargs) - set(CONTINUOUS_BATCHING_GENERATION_KWARGS) - {"repetition_penalty", "cache_implementation"}
    )
    if ignored:
        problems.append(
            Problem(
                "generation_kwargs",
                f"transformers' continuous batching does not apply {', '.join(ignored)} (it honours "
                f"{', '.join(CONTINUOUS_BATCHING_GENERATION_KWARGS)})",
                kwargs,
                "drop them, or turn use_transformers_continuous_batching off",
            )
        )
    return problems


def vllm_mode_warnings(values: dict[str, Any], defaults: dict[str, Any]) -> list[str]:
    """vLLM fields set to non-defaults where they have no effect (without use_vllm, or of the other vLLM mode), so
    that none is a silent no-op."""
    if not values.get("use_vllm"):
        return [
            f"{name}={values[name]!r} has no effect without use_vllm: true"
            for name in sorted(values)
            if name.startswith("vllm_") and name in defaults and values[name] != defaults[name]
        ]
    mode = values.get("vllm_mode", "colocate")
    other = SERVER_ONLY if mode == "colocate" else COLOCATE_ONLY
    where = "the server (grpokit vllm-serve flags)" if mode == "server" else "server mode"
    return [
        f"{name}={values[name]!r} has no effect with vllm_mode={mode!r}: it belongs to {where}"
        for name in other
        if name in values and values[name] != defaults.get(name)
    ]


COLOCATE_ONLY = (
    "vllm_gpu_memory_utilization",
    "vllm_max_model_length",
    "vllm_model_impl",
    "vllm_enable_sleep_mode",
)
SERVER_ONLY = (
    "vllm_server_base_url",
    "vllm_server_host",
    "vllm_server_port",
    "vllm_server_timeout",
    "vllm_group_port",
)


def _num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


# ---- Batch geometry ----


def num_processes_from_env() -> int:
    """Processes of the launch this config runs under (accelerate/torchrun set WORLD_SIZE); 1 otherwise."""
    try:
        return max(1, int(os.environ.get("WORLD_SIZE", "1")))
    except ValueError:
        return 1


def _nearest_multiples(value: int, step: int) -> list[int]:
    """The multiples of `step` nearest to `value` (below and above; positive only)."""
    below = (value // step) * step
    above = below + step if below != value else value
    return sorted({m for m in (below, above) if m > 0})


def _divisors_at_least_2(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(max(n, 0)) + 1) if n % d == 0]
    return [d for d in sorted(set(small + [n // d for d in small])) if d >= 2]


# The process counts searched for those at which a broken batch geometry holds, and how many of them are named.
PROCESS_COUNTS_SEARCHED = 1024
PROCESS_COUNTS_NAMED = 3


def valid_process_counts(values: dict[str, Any]) -> list[int]:
    """The smallest process counts (up to PROCESS_COUNTS_NAMED, within 1..PROCESS_COUNTS_SEARCHED) at which every
    batch-geometry rule holds. With the generation batch derived (per_device x processes x steps), N processes
    make whole groups from N = num_generations / gcd(num_generations, per_device x steps) on, so some count exists
    unless a rule the process count cannot mend also fails (e.g. an explicit generation_batch_size that is not a
    multiple of num_generations)."""
    counts = []
    for n in range(1, PROCESS_COUNTS_SEARCHED + 1):
        if not _geometry(values, n, explain=False)[1]:
            counts.append(n)
            if len(counts) == PROCESS_COUNTS_NAMED:
                break
    return counts


def _or_list(items) -> str:
    items = [str(i) for i in items]
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} or {items[-1]}"


def check_geometry(values: dict[str, Any], num_processes: int) -> tuple[dict[str, int], list[Problem]]:
    """TRL's batch-geometry rules. Returns (derived steps_per_generation and generation_batch_size, problems).
    When another process count would mend every problem, each problem names the smallest such counts (in its hint,
    and in `Problem.processes`)."""
    derived, problems = _geometry(values, num_processes)
    counts = valid_process_counts(values) if problems else []
    if counts:
        also = f"or {_or_list(counts)} processes"
        problems = [
            dataclasses.replace(p, hint=f"{p.hint}; {also}" if p.hint else also, processes=tuple(counts))
            for p in problems
        ]
    return derived, problems


def process_count_note(problem: Problem, processes: int) -> str:
    """The note that stands for a geometry problem caused only by the process count, when no count was given (no
    --num_processes, accelerate config with num_processes, or WORLD_SIZE): `grpokit config` assumes `processes`."""
    line = dataclasses.replace(problem, hint=None).line()
    return (
        f"no process count given, so checked at {processes} process{'es' if processes != 1 else ''}: {line}; the "
        f"batch geometry holds at {_or_list(problem.processes)} processes (pass --num_processes N to check one)"
    )


def _geometry(values: dict[str, Any], num_processes: int, explain=True) -> tuple[dict[str, int], list[Problem]]:
    """`check_geometry` at one count. `explain=False` (searching counts): only whether the group rule fails, without
    working out its nearest valid values, which can take long for a large generation batch."""
    per_device = values.get("per_device_train_batch_size")
    grad_accum = values.get("gradient_accumulation_steps")
    num_gen = values.get("num_generations")
    gen_batch = values.get("generation_batch_size")
    steps = values.get("steps_per_generation")
    if not all(_num(v) and v >= 1 for v in (per_device, grad_accum)) or not (_num(num_gen) and num_gen >= 2):
        return {}, []  # already reported as range problems
    if gen_batch is not None and steps is not None:
        return {}, []  # reported by check_fields
    global_batch = per_device * num_processes
    problems = []
    tp = values.get("vllm_tensor_parallel_size")
    if values.get("use_vllm") and _num(tp) and tp >= 1:
        if values.get("vllm_mode", "colocate") == "server" and tp != 1:
            problems.append(
                Problem(
                    "vllm_tensor_parallel_size",
                    "applies to colocate mode; a server's tensor parallelism is set where it starts",
                    tp,
                    f"unset it and start the server with grpokit vllm-serve MODEL --tensor-parallel-size {tp}",
                )
            )
        elif num_processes % tp != 0:
            problems.append(
                Problem(
                    "vllm_tensor_parallel_size",
                    f"must divide the number of training processes ({num_processes}): each group of "
                    f"{tp} processes shares one vLLM engine",
                    tp,
                    f"valid here: {', '.join(str(d) for d in range(1, num_processes + 1) if num_processes % d == 0)}",
                )
            )
    if gen_batch is None:
        steps = steps if steps is not None else grad_accum
        gen_batch = global_batch * steps
    elif gen_batch % global_batch != 0:
        problems.append(
            Problem(
                "generation_batch_size",
                f"must be divisible by the global batch per_device_train_batch_size x processes = "
                f"{per_device} x {num_processes} = {global_batch}",
                gen_batch,
                "nearest valid values: " + " or ".join(map(str, _nearest_multiples(gen_batch, global_batch))),
            )
        )
        return {}, problems
    else:
        steps = gen_batch // global_batch
    if gen_batch % num_gen != 0:
        problems.append(
            _group_problem(values, gen_batch, num_gen, global_batch, num_processes)
            if explain
            else Problem("num_generations", "does not divide the generation batch")
        )
    elif values.get("dynamic_sampling") and (gen_batch // num_processes) % num_gen != 0:
        problems.append(
            Problem(
                "dynamic_sampling",
                f"needs whole groups on each process: the generation batch per process {gen_batch // num_processes} "
                f"(per_device_train_batch_size x steps_per_generation) must be divisible by num_generations = "
                f"{num_gen}, since each process keeps or drops its own groups",
                True,
                f"make per_device_train_batch_size x steps_per_generation a multiple of {num_gen}, or set "
                "dynamic_sampling: false",
            )
        )
    derived = {"steps_per_generation": steps, "generation_batch_size": gen_batch}
    eval_strategy = getattr(values.get("eval_strategy"), "value", values.get("eval_strategy"))  # enum or str
    if eval_strategy not in (None, "no"):  # TrainingArguments turns do_eval on whenever evaluation is scheduled
        num_gen_eval = values.get("num_generations_eval") or num_gen
        eval_batch = values.get("per_device_eval_batch_size")
        if _num(eval_batch) and eval_batch >= 1 and (eval_batch * num_processes) % num_gen_eval != 0:
            step = num_gen_eval // math.gcd(num_gen_eval, num_processes)
            problems.append(
                Problem(
                    "per_device_eval_batch_size",
                    f"the global eval batch per_device_eval_batch_size x processes = {eval_batch} x {num_processes} "
                    f"must be divisible by the evaluation group size {num_gen_eval}",
                    eval_batch,
                    "nearest valid values: " + " or ".join(map(str, _nearest_multiples(eval_batch, step))),
                )
            )
    return derived, problems


def _group_problem(values, gen_batch, num_gen, global_batch, num_processes) -> Problem:
    explicit = values.get("generation_batch_size") is not None
    name = "generation_batch_size" if explicit else "num_generations"
    how = (
        ""
        if explicit
        else (
            f" (per_device_train_batch_size x processes x steps_per_generation = {global_batch // num_processes} x "
            f"{num_processes} x {gen_batch // global_batch})"
        )
    )
    options = [
        "generation_batch_size "
        + " or ".join(map(str, _nearest_multiples(gen_batch, math.lcm(num_gen, global_batch))))
    ]
    if not explicit:
        per_device = values["per_device_train_batch_size"]
        steps = gen_batch // global_batch
        step = num_gen // math.gcd(num_gen, num_processes * steps)
        options.insert(0, "per_device_train_batch_size " + " or ".join(map(str, _nearest_multiples(per_device, step))))
    near_g = min(_divisors_at_least_2(gen_batch) or [2], key=lambda d: (abs(d - num_gen), -d))
    options.append(f"num_generations {near_g}")
    return Problem(
        name,
        f"the generation batch {gen_batch}{how} must be divisible by num_generations = {num_gen}, so that it "
        "holds whole groups",
        values.get(name),
        "nearest valid: " + "; ".join(options),
    )


def derive_batch_geometry(values: dict[str, Any], *, num_processes: int, noted: bool = False) -> dict[str, int]:
    """The derived batch geometry at `num_processes`; its problems raise, unless `noted`: the caller has told the
    user of them already, as notes (`grpokit config` given no process count)."""
    derived, problems = check_geometry(values, num_processes)
    if problems and not noted:
        raise ConfigError(problems)
    return derived


# ---- Migration of deprecated fields on instances built in Python ----


def migrate_in_place(obj) -> None:
    """Move deprecated fields' values to their new names, with a FutureWarning, as TRL does."""
    for old in DEPRECATED_FIELDS:
        value = getattr(obj, old, None)
        if value not in (None, False):
            new, why = RENAMED_KEYS[old]
            warnings.warn(f"{old} is deprecated: {why}", FutureWarning, stacklevel=4)
            setattr(obj, new, value)
            setattr(obj, old, None if value is not True else False)
    if hasattr(obj, "scale_rewards"):
        legacy = legacy_scale_rewards(obj.scale_rewards)
        if legacy is not None:
            obj.scale_rewards = legacy


def validate_instance(obj) -> None:
    """What every config dataclass runs in `__post_init__`: migrate, coerce types, check rules; raise once."""
    migrate_in_place(obj)
    values = {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj) if f.init}
    coerced, problems = type_problems(values, type(obj))
    for name, value in coerced.items():
        if value is not values[name]:
            setattr(obj, name, value)
    defaults = {f.name: f.default for f in dataclasses.fields(obj) if f.default is not dataclasses.MISSING}
    problems += check_fields(coerced, defaults)
    if problems:
        raise ConfigError(problems)
