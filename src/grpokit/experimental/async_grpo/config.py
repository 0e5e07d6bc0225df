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
    remove_unused_columns: bool | None = field(
        default=True,
        metadata={
            "help": "As TRL's asynchronous trainer: true. The rollout worker reads the prompts' rows whole, so reward "
            "functions still receive every dataset column (e.g. `solution`); only the trainer's own batches drop "
            "what the model does not take."
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

    async_grpo: bool = field(
        default=True,
        metadata={"help": "Always true here: this is the asynchronous trainer's configuration."},
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
        """TRL's asynchronous fields grpokit does not implement (the pipeline's own rules are `rules.async_problems`,
        shared with the YAML path)."""
        if self.fork_threshold_tokens != 1024:
            return [
                Problem(
                    "fork_threshold_tokens",
                    "grpokit's tool loop never re-tokenizes a conversation, so there is no drift to fork on",
                    self.fork_threshold_tokens,
                    hint="leave it at its default",
                )
            ]
        return []
