"""Generation with transformers' continuous batching (`use_transformers_continuous_batching`): the policy's own
`generate_batch`, which schedules every completion of a round over a paged KV cache and refills the batch as rows
finish, instead of `generate` on one padded batch.

The contract is the transformers backend's: completion ids end at (and include) the first EOS and hold at most
`max_new_tokens` tokens. Prompts repeated once per completion (GRPO's groups) are sent once, with
`num_return_sequences` = the group size: transformers prefills the shared prompt once and forks its cache to each
completion before the last prompt token, so every completion still samples its first token on its own. Greedy
decoding sends each prompt once and repeats its completion.

What `generate_batch` honours of a `GenerationConfig`: `max_new_tokens`, `eos_token_id`, `do_sample`, and the logits
processors that read only the scores (temperature, top-k, top-p, min-p, typical-p, epsilon/eta cutoffs, suppressed
tokens, renormalisation: `grpokit.config.rules.CONTINUOUS_BATCHING_GENERATION_KWARGS`). It drops the repetition penalty and `min_new_tokens` (their processors need each row's
history, and transformers passes them the last token only) and ignores stopping criteria and the cache settings:
`grpokit.config.rules` refuses those with it, so none is a silent no-op.

With `return_logprobs: true` in `transformers_continuous_batching_config`, `Generated.logprobs` holds transformers'
log-probabilities of the sampled tokens under the processed distribution they were drawn from (after temperature,
top-k/p): the sampler's own log-probabilities (TRL discards them).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch

from ..sharding import is_sharded
from .base import Generated, GenerationError
from .tokens import cut_after_eos

MAX_BATCH_TOKENS = 8192  # transformers' default

# Processors transformers has not classified for continuous batching but that read only the scores: its warning
# about them ("might not be supported") is dropped for these.
_SCORES_ONLY_PROCESSORS = (
    "MinPLogitsWarper",
    "TypicalLogitsWarper",
    "EpsilonLogitsWarper",
    "EtaLogitsWarper",
    "SuppressTokensLogitsProcessor",
    "LogitNormalization",
    "InfNanRemoveLogitsProcessor",
)


def continuous_batching_config_class():
    """transformers' `ContinuousBatchingConfig`; a one-line error naming the installed version where it is missing."""
    import transformers

    try:
        from transformers.generation import ContinuousBatchingConfig
        from transformers.generation.continuous_batching import ContinuousMixin  # noqa: F401
    except ImportError:
        raise ValueError(
            f"use_transformers_continuous_batching needs transformers' continuous batching (transformers >= 5.8); "
            f"transformers {transformers.__version__} is installed"
        ) from None
    return ContinuousBatchingConfig


def check_config_keys(settings: dict) -> None:
    """A one-line error for a `transformers_continuous_batching_config` key `ContinuousBatchingConfig` does not take."""
    import dataclasses
    import inspect

    cls = continuous_batching_config_class()
    if dataclasses.is_dataclass(cls):
        known = {f.name for f in dataclasses.fields(cls)}
    else:
        known = set(inspect.signature(cls).parameters) - {"self", "kwargs"}
    unknown = sorted(set(settings) - known)
    if unknown:
        raise ValueError(
            f"transformers_continuous_batching_config: {', '.join(map(repr, unknown))} "
            f"{'is not a setting' if len(unknown) == 1 else 'are not settings'} of transformers' "
            f"ContinuousBatchingConfig (known: {', '.join(sorted(known))})"
        )


class ContinuousBatchingGenerator:
    """Generation with the policy's `generate_batch` (transformers' continuous batching).

    Args:
        model_context: a callable returning a context manager that yields the model to generate with; or a plain
            model.
        generation_config: a `transformers.GenerationConfig` (sampling settings, max_new_tokens, eos and pad ids).
        eos_token_ids: every id that ends a completion.
        settings: `transformers_continuous_batching_config`, the keywords of transformers' `ContinuousBatchingConfig`.
            Unless it sets `num_blocks` or `max_memory_percent`, the KV cache is sized to hold the round's rows
            (prompt + `max_new_tokens` each), instead of a share of the device's free memory (on CPU, of the RAM);
            unless it sets `max_batch_tokens`, a batch holds the round's prompts (at least 64 tokens, at most 8192).
    """

    def __init__(
        self,
        model_context: Callable[[], AbstractContextManager] | Any,
        generation_config,
        *,
        eos_token_ids: Sequence[int],
        settings: dict | None = None,
    ):
        self.model_context = model_context
        self.generation_config = generation_config
        self.eos_token_ids = list(eos_token_ids)
        self.settings = dict(settings or {})
        check_config_keys(self.settings)

    def _context(self) -> AbstractContextManager:
        if isinstance(self.model_context, torch.nn.Module):
            return nullcontext(self.model_context)
        return self.model_context()

    def sync_weights(self, model) -> None:
        """Nothing to push: `generate_batch` runs the live policy."""

    @torch.no_grad()
    def generate(self, prompt_ids: list[list[int]], vision=None) -> Generated:
        """Completions of every prompt, in prompt order."""
        if vision is not None:
            raise GenerationError(
                "use_transformers_continuous_batching generates from text prompts only; train a vision-language "
                "model without it"
            )
        if not prompt_ids:
            return Generated([])
        group = _group_size(prompt_ids)
        inputs = [list(ids) for ids in prompt_ids[::group]]
        greedy = not self.generation_config.do_sample
        config = self.generation_config
        if group > 1 and not greedy:
            config = _with(config, num_return_sequences=group)
        with self._context() as model:
            if not hasattr(model, "generate_batch"):
                raise GenerationError(
                    f"use_transformers_continuous_batching needs a transformers model with `generate_batch`; "
                    f"{type(model).__name__} has none"
                )
            if is_sharded(model):
                raise GenerationError(
                    "use_transformers_continuous_batching cannot generate with sharded parameters (FSDP, or ZeRO-3 "
                    "without ds3_gather_for_generation): each process schedules its own rows, so the processes' "
                    "forward calls do not line up; turn it off, or set ds3_gather_for_generation: true under ZeRO-3"
                )
            cb_config = self._cb_config(inputs, 1 if greedy else group)
            was_training = model.training
            try:
                with _quiet_about_scores_only_processors():
                    outputs = model.generate_batch(
                        inputs, generation_config=config, continuous_batching_config=cb_config, progress_bar=False
                    )
            finally:
                model.train(was_training)  # generate_batch leaves the model in eval mode
        results = list(outputs.values())
        expected = len(inputs) * (1 if greedy else group)
        failed = [r for r in results if r.error is not None]
        if len(results) != expected or failed:
            reason = failed[0].error if failed else "see the error transformers logged above"
            raise GenerationError(
                f"transformers' continuous batching returned {len(results) - len(failed)} of {expected} completions "
                f"({reason})"
            )
        if greedy:
            results = [r for r in results for _ in range(group)]
        completions = [cut_after_eos(r.generated_tokens, self.eos_token_ids) for r in results]
        logprobs = None
        if self.settings.get("return_logprobs"):
            logprobs = [list(r.logprobs[: len(ids)]) for r, ids in zip(results, completions, strict=True)]
        return Generated(completions, logprobs)

    def _cb_config(self, inputs: list[list[int]], copies: int):
        cls = continuous_batching_config_class()
        settings = dict(self.settings)
        if settings.get("num_blocks") is None and settings.get("max_memory_percent") is None:
            page = settings.get("page_size") or _default(cls, "page_size", 256)
            new = self.generation_config.max_new_tokens or 0
            # Every row at full length, each in whole pages, plus one page per row for the forks' partial pages.
            settings["num_blocks"] = sum(copies * (math.ceil((len(ids) + new) / page) + 1) for ids in inputs)
        if settings.get("max_batch_tokens") is None:
            # One batch prefills every prompt of the round, or holds a decode step of every row. transformers'
            # default (8192 tokens) allocates its per-batch tensors and attention mask for that many tokens.
            rows = len(inputs) * copies
            settings["max_batch_tokens"] = min(MAX_BATCH_TOKENS, max(64, sum(map(len, inputs)), rows))
        return cls(**settings)


def _group_size(prompt_ids: list[list[int]]) -> int:
    """The largest k such that the rows are runs of k equal prompts in a row (GRPO's groups); 1 when there is none."""
    runs, start = [], 0
    for i in range(1, len(prompt_ids) + 1):
        if i == len(prompt_ids) or prompt_ids[i] != prompt_ids[start]:
            runs.append(i - start)
            start = i
    return math.gcd(*runs)


def _with(generation_config, **changes):
    import copy

    config = copy.deepcopy(generation_config)
    for name, value in changes.items():
        setattr(config, name, value)
    return config


def _default(cls, name: str, fallback):
    import dataclasses

    for f in dataclasses.fields(cls) if dataclasses.is_dataclass(cls) else ():
        if f.name == name and f.default is not dataclasses.MISSING:
            return f.default
    return fallback


class _DropScoresOnlyWarnings(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not (
            "might not be supported by CB" in message and any(name in message for name in _SCORES_ONLY_PROCESSORS)
        )


class _quiet_about_scores_only_processors:
    """Within this context transformers' continuous-batching logger drops its "might not be supported" warning for
    the processors of `_SCORES_ONLY_PROCESSORS` (they read only the scores, so they apply unchanged)."""

    def __enter__(self):
        self.filter = _DropScoresOnlyWarnings()
        self.logger = logging.getLogger("ContinuousBatchingLogger")
        self.logger.addFilter(self.filter)
        return self

    def __exit__(self, *exc):
        self.logger.removeFilter(self.filter)
