"""`AsyncGRPOConfig`: `GRPOConfig` with the fields and defaults of TRL 1.16's `trl.experimental.async_grpo`.

It is a `GRPOConfig`, so every field of the synchronous trainer keeps its meaning (loss types, the importance-sampling
correction, rewards, logging); the defaults TRL's asynchronous config changes are changed here too, and the
pipeline's own fields are added. A TRL field grpokit does not implement is refused when set (one line each),
never accepted and ignored.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from grpokit.config.grpo_config import GRPOConfig
from grpokit.config.rules import ConfigError, Problem


@dataclass
class AsyncGRPOConfig(GRPOConfig):
    # ---- defaults TRL 1.16's AsyncGRPOConfig changes ----
    logging_steps: float = field(
        default=1,
        metadata={"help": "Log every this many optimizer steps; a value in [0, 1) is a fraction of the total steps."},
    )
    lr_scheduler_type: str = field(
        default="constant",
        metadata={"help": "Learning-rate schedule; constant by default, as TRL's asynchronous trainer."},
    )
    ignore_data_skip: bool = field(
        default=True,
        metadata={
            "help": "Always true here: a resumed run does not replay the dataloader; the prompts still to train "
            "come from the checkpoint's rollout state (async_rollout_state.json)."
        },
    )
    max_completion_length: int | None = field(
        default=2048,
        metadata={"help": "Maximum number of tokens generated per completion."},
    )
    use_vllm: bool = field(
        default=True,
        metadata={
            "help": "Generate with a vLLM server (vllm_server_base_url), as TRL's asynchronous trainer always does. "
            "False: the rollout worker generates with its own copy of the policy (transformers), whose weights "
            "the trainer copies in at each weight sync; for CPU runs and tests."
        },
    )
    vllm_mode: str = field(
        default="server",
        metadata={"help": "Only `server`: the rollout worker streams from a separate `vllm serve` process."},
    )
    vllm_server_base_url: str | None = field(
        default="http://localhost:8000",
        metadata={"help": "Base URL of the vLLM server the rollout worker generates with."},
    )
    dtype: str = field(
        default="float32",
        metadata={
            "help": "Data type the model is loaded in when given as a path: auto, bfloat16, float16 or float32 "
            "(TRL's default float32 keeps the trainer's log-probabilities close to the server's). A `dtype` in "
            "model_init_kwargs wins.",
            "choices": ["auto", "bfloat16", "float16", "float32"],
        },
    )

    # ---- the asynchronous pipeline ----
    max_staleness: int = field(
        default=4,
        metadata={
            "help": "Most weight updates a sample may lag behind the policy it is trained with. A sample generated "
            "with policy version v is trained at a version <= v + max_staleness, else dropped (its prompt is "
            "generated again); the built-in worker never runs further ahead than this. 0: every sample is trained "
            "by the policy that generated it, as the synchronous trainer."
        },
    )
    max_inflight_tasks: int = field(
        default=-1,
        metadata={
            "help": "Most completions the rollout worker asks the generator for at once (rounded up to whole "
            "groups of num_generations). -1: a whole generation batch per request."
        },
    )
    queue_maxsize: int = field(
        default=1024,
        metadata={
            "help": "Most scored samples waiting for the trainer; a full queue blocks the worker, never the trainer."
        },
    )
    weight_sync_steps: int = field(
        default=1,
        metadata={"help": "Optimizer steps between two pushes of the policy's weights to the generator."},
    )
    heartbeat_stale_after_s: float = field(
        default=300.0,
        metadata={
            "help": "Seconds without a sign of life from the rollout worker (a generation or reward that hangs) "
            "after which the trainer stops with an error naming it."
        },
    )
    request_timeout: int = field(
        default=600,
        metadata={"help": "Seconds one generation request to the vLLM server may take before it fails the worker."},
    )
    weight_sync_timeout: int = field(
        default=1800,
        metadata={"help": "Seconds one weight transfer to the vLLM server may take before it fails the run."},
    )
    token_budget: int | None = field(
        default=None,
        metadata={
            "help": "Most tokens (prompt + completion) one training row may hold; a longer sample is dropped with a "
            "warning (batch/dropped_oversize_total). grpokit does not pack several samples into a row (TRL does): a "
            "row is one sample and micro-batches hold per_device_train_batch_size of them. Unset or <= 0: no limit."
        },
    )
    fork_threshold_tokens: int = field(
        default=1024,
        metadata={
            "help": "TRL's threshold for forking a multi-turn conversation whose re-tokenization drifted. grpokit's "
            "tool loop appends each turn's tokens as generated and never re-tokenizes, so there is no drift to "
            "reconcile; only the default is accepted."
        },
    )
    model_init_kwargs: dict[str, Any] | str | None = field(
        default=None,
        metadata={
            "help": "Keyword arguments for `from_pretrained` when the model is given as a path; `dtype` here wins "
            "over the dtype field."
        },
    )

    def __post_init__(self):
        problems = self._async_problems()
        try:
            super().__post_init__()
        except ConfigError as exc:
            raise ConfigError([*exc.problems, *problems]) from None
        if problems:
            raise ConfigError(problems)

    def _async_problems(self) -> list[Problem]:
        problems = []

        def refuse(name, message, hint=None):
            problems.append(Problem(name, message, getattr(self, name), hint=hint))

        if isinstance(self.max_staleness, int) and self.max_staleness < 0:
            refuse("max_staleness", "must be >= 0 (0: train each sample with the policy that generated it)")
        if isinstance(self.weight_sync_steps, int) and self.weight_sync_steps < 1:
            refuse("weight_sync_steps", "must be >= 1")
        if isinstance(self.queue_maxsize, int) and self.queue_maxsize < 1:
            refuse("queue_maxsize", "must be >= 1 (it bounds the memory the waiting samples take)")
        if isinstance(self.max_inflight_tasks, int) and (self.max_inflight_tasks == 0 or self.max_inflight_tasks < -1):
            refuse("max_inflight_tasks", "must be -1 (a generation batch at once) or >= 1")
        if isinstance(self.heartbeat_stale_after_s, (int, float)) and not self.heartbeat_stale_after_s > 0:
            refuse("heartbeat_stale_after_s", "must be > 0")
        if self.fork_threshold_tokens != 1024:
            refuse(
                "fork_threshold_tokens",
                "grpokit's tool loop never re-tokenizes a conversation, so there is no drift to fork on",
                "leave it at its default",
            )
        if self.use_vllm and self.vllm_mode != "server":
            refuse("vllm_mode", "the asynchronous trainer generates with a vLLM server only", "set vllm_mode: server")
        if isinstance(self.num_iterations, int) and self.num_iterations != 1:
            refuse(
                "num_iterations",
                "the asynchronous trainer trains each sample once; staleness is its off-policy knob",
                "set num_iterations: 1 and use max_staleness",
            )
        steps, accumulation = self.steps_per_generation, self.gradient_accumulation_steps
        if steps is not None and isinstance(steps, int) and steps != accumulation:
            refuse(
                "steps_per_generation",
                f"the asynchronous trainer takes one generation batch per optimizer step "
                f"(gradient_accumulation_steps={accumulation})",
                "leave steps_per_generation unset",
            )
        if self.generation_batch_size is not None:
            refuse(
                "generation_batch_size",
                "the asynchronous trainer takes one generation batch per optimizer step",
                "leave it unset: it is per_device_train_batch_size x gradient_accumulation_steps x processes",
            )
        return problems
