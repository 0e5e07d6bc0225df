"""The asynchronous trainer's rules (`async_grpo` and TRL's AsyncGRPOConfig pipeline fields), for `rules.check_fields`:
every config path (Python, YAML, `grpokit config validate`) judges them the same."""

from __future__ import annotations

from typing import Any

ASYNC_FIELDS = (
    "max_staleness",
    "max_inflight_tasks",
    "queue_maxsize",
    "weight_sync_steps",
    "heartbeat_stale_after_s",
    "request_timeout",
    "weight_sync_timeout",
)


def async_problems(values: dict[str, Any], defaults: dict[str, Any]) -> list[tuple]:
    """The asynchronous pipeline's fields mean nothing without async_grpo (set to another value than the default,
    they are refused); with it, what the asynchronous trainer cannot do. Each problem as `Problem`'s arguments
    (field, message, value[, hint])."""
    get = values.get
    if not get("async_grpo"):
        return [
            (name, "has no effect without async_grpo: true", values[name], "set async_grpo: true")
            for name in ASYNC_FIELDS
            if name in values and name in defaults and values[name] != defaults[name]
        ]
    problems = []
    inflight = get("max_inflight_tasks")
    if isinstance(inflight, int) and (inflight == 0 or inflight < -1):
        problems.append(("max_inflight_tasks", "must be -1 (a generation batch at once) or >= 1", inflight))
    if isinstance(get("num_iterations"), int) and get("num_iterations") != 1:
        problems.append(
            (
                "num_iterations",
                "the asynchronous trainer trains each sample once; staleness is its off-policy knob",
                get("num_iterations"),
                "set num_iterations: 1 and use max_staleness",
            )
        )
    steps, accumulation = get("steps_per_generation"), get("gradient_accumulation_steps", 1)
    if isinstance(steps, int) and steps != accumulation:
        problems.append(
            (
                "steps_per_generation",
                f"the asynchronous trainer takes one generation batch per optimizer step "
                f"(gradient_accumulation_steps={accumulation})",
                steps,
                "leave steps_per_generation unset",
            )
        )
    if get("generation_batch_size") is not None:
        problems.append(
            (
                "generation_batch_size",
                "the asynchronous trainer takes one generation batch per optimizer step",
                get("generation_batch_size"),
                "leave it unset: it is per_device_train_batch_size x gradient_accumulation_steps x processes",
            )
        )
    if get("use_vllm") and get("vllm_mode", "server") != "server":
        problems.append(
            (
                "vllm_mode",
                "the asynchronous trainer generates with a vLLM server only",
                get("vllm_mode"),
                "set vllm_mode: server",
            )
        )
    if get("use_transformers_continuous_batching") and get("use_vllm", True):
        problems.append(
            (
                "use_transformers_continuous_batching",
                "the rollout worker generates with the vLLM server, which batches requests itself",
                True,
                "set use_vllm: false to generate with the worker's own copy of the policy",
            )
        )
    return problems
