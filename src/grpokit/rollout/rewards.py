"""Calling reward functions and reward models on a batch of completions.

Reward functions use TRL's signature: `fn(prompts=..., completions=..., completion_ids=..., **columns,
trainer_state=..., log_extra=..., log_metric=...)` returning one float, or None ("no opinion"), per completion.
Coroutine functions run concurrently. Reward models are sequence classifiers scoring prompt + completion.

A function that raises, returns the wrong number of rewards, or returns something that is not a number stops the
run with an error naming the function and the sample; nothing is silently scored 0.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from grpokit.generation.tokens import is_conversational

# Columns the trainer fills itself; a dataset column of that name is not forwarded to reward functions.
RESERVED_COLUMNS = ("prompt", "completion", "completion_ids")


class RewardError(RuntimeError):
    """A reward function failed or returned something unusable; the message names the function and the sample."""


def reward_name(func: Any) -> str:
    """TRL's naming: a model's name is its checkpoint's last path component, a function's its `__name__`."""
    if isinstance(func, torch.nn.Module):
        return str(getattr(func.config, "_name_or_path", "") or type(func).__name__).rstrip("/").split("/")[-1]
    name = getattr(func, "__name__", None)
    if name is None and hasattr(func, "func"):  # functools.partial
        name = getattr(func.func, "__name__", None)
    return name or type(func).__name__


def is_async_callable(func: Any) -> bool:
    return inspect.iscoroutinefunction(func) or (callable(func) and inspect.iscoroutinefunction(type(func).__call__))


def _short(value: Any, limit: int = 200) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _sample(prompts: Sequence, completions: Sequence, index: int) -> str:
    return f"sample {index} (prompt={_short(prompts[index])}, completion={_short(completions[index])})"


class _BackgroundLoop:
    """One event loop in a daemon thread, shared by all async reward calls (clients bound to a loop keep working,
    and it works even when the caller already runs an event loop, e.g. in a notebook)."""

    _loop: asyncio.AbstractEventLoop | None = None
    _lock = threading.Lock()

    @classmethod
    def run(cls, coroutine):
        with cls._lock:
            if cls._loop is None:
                cls._loop = asyncio.new_event_loop()
                threading.Thread(target=cls._loop.run_forever, daemon=True, name="grpokit-rewards").start()
        return asyncio.run_coroutine_threadsafe(coroutine, cls._loop).result()


@dataclass
class RewardFunctions:
    """The reward functions and models of a run, called together on a batch: `(N, F)` rewards with NaN for None.

    Args:
        funcs: callables (sync or async) and/or `PreTrainedModel` sequence classifiers.
        processing_classes: one per func; the tokenizer of each reward model (ignored for callables).
        chat_template_kwargs: for rendering conversations for reward models.
    """

    funcs: list[Any]
    processing_classes: list[Any] = field(default_factory=list)
    chat_template_kwargs: dict = field(default_factory=dict)

    def __post_init__(self):
        if not self.processing_classes:
            self.processing_classes = [None] * len(self.funcs)
        self.names = [reward_name(f) for f in self.funcs]

    def __len__(self) -> int:
        return len(self.funcs)

    def __call__(
        self,
        prompts: list,
        completions: list,
        completion_ids: list[list[int]],
        columns: dict[str, list] | None = None,
        **extra_kwargs: Any,
    ) -> Tensor:
        """Rewards `(N, F)` float32 on the CPU; NaN where a function returned None.

        Args:
            prompts, completions, completion_ids: N each (one per completion; prompts repeated per generation).
            columns: dataset columns other than the prompt, N values each, passed to functions as keywords.
            extra_kwargs: also passed to reward functions (e.g. `trainer_state`, `log_extra`, `log_metric`).
        """
        n = len(prompts)
        rewards = torch.full((n, len(self.funcs)), float("nan"), dtype=torch.float32)
        kwargs = {k: v for k, v in (columns or {}).items() if k not in RESERVED_COLUMNS}
        kwargs.update(extra_kwargs)
        batch = dict(prompts=prompts, completions=completions, completion_ids=completion_ids)
        pending = []
        for i, func in enumerate(self.funcs):
            if isinstance(func, torch.nn.Module):
                rewards[:, i] = self._score_with_model(func, self.processing_classes[i], prompts, completions)
            elif is_async_callable(func):
                pending.append(i)
            else:
                try:
                    output = func(**batch, **kwargs)
                except Exception as error:
                    raise self._locate_failure(i, error, batch, kwargs) from error
                rewards[:, i] = self._to_column(i, output, prompts, completions)
        if pending:
            outputs = _BackgroundLoop.run(self._gather_async(pending, batch, kwargs))
            for i, output in zip(pending, outputs, strict=True):
                if isinstance(output, BaseException):
                    raise self._locate_failure(i, output, batch, kwargs) from output
                rewards[:, i] = self._to_column(i, output, prompts, completions)
        return rewards

    async def _gather_async(self, indices: list[int], batch: dict, kwargs: dict) -> list:
        coroutines = [self.funcs[i](**batch, **kwargs) for i in indices]
        return await asyncio.gather(*coroutines, return_exceptions=True)

    def _to_column(self, i: int, output: Any, prompts: list, completions: list) -> Tensor:
        name, n = self.names[i], len(prompts)
        try:
            values = list(output)
        except TypeError:
            raise RewardError(
                f"reward function {name!r} returned {_short(output)} ({type(output).__name__}); expected a list of "
                f"{n} floats (or None), one per completion; the batch starts with {_sample(prompts, completions, 0)}"
            ) from None
        if len(values) != n:
            raise RewardError(
                f"reward function {name!r} returned {len(values)} rewards for {n} completions; expected exactly one "
                f"per completion; the batch starts with {_sample(prompts, completions, 0)}"
            )
        column = torch.empty(n, dtype=torch.float32)
        for j, value in enumerate(values):
            if value is None:
                column[j] = math.nan
                continue
            try:
                column[j] = float(value)
            except (TypeError, ValueError):
                raise RewardError(
                    f"reward function {name!r} returned {_short(value)} ({type(value).__name__}) for "
                    f"{_sample(prompts, completions, j)}; expected a float or None"
                ) from None
        return column

    def _locate_failure(self, i: int, error: BaseException, batch: dict, kwargs: dict) -> RewardError:
        """Find which sample makes reward function `i` raise by calling it on each sample alone (error path only)."""
        name, func = self.names[i], self.funcs[i]
        prompts, completions = batch["prompts"], batch["completions"]
        n = len(prompts)
        for j in range(n):
            single = {k: [v[j]] for k, v in batch.items()}
            single.update({k: [v[j]] if _per_sample(v, n) else v for k, v in kwargs.items()})
            try:
                result = func(**single)
                if inspect.isawaitable(result):
                    _BackgroundLoop.run(_await(result))
            except Exception as sample_error:
                return RewardError(
                    f"reward function {name!r} raised {type(sample_error).__name__}: {sample_error} on "
                    f"{_sample(prompts, completions, j)}"
                )
        return RewardError(
            f"reward function {name!r} raised {type(error).__name__}: {error} on a batch of {n} completions (each "
            f"sample alone succeeds); the batch starts with {_sample(prompts, completions, 0)}"
        )

    @torch.inference_mode()
    def _score_with_model(self, model, tokenizer, prompts: list, completions: list) -> Tensor:
        if is_conversational(prompts[0]):
            texts = [
                tokenizer.apply_chat_template(p + c, tokenize=False, **self.chat_template_kwargs)
                for p, c in zip(prompts, completions, strict=True)
            ]
        else:
            texts = [p + c for p, c in zip(prompts, completions, strict=True)]
        inputs = tokenizer(texts, return_tensors="pt", padding=True, padding_side="right", add_special_tokens=False)
        inputs = {k: v.to(model.device) for k, v in inputs.items()}
        return model(**inputs).logits[:, 0].float().cpu()  # (N,)


def _per_sample(value: Any, n: int) -> bool:
    return isinstance(value, list) and len(value) == n


async def _await(awaitable):
    return await awaitable


def column_values(rows: list[dict]) -> dict[str, list]:
    """Dataset columns of the rows (other than the reserved ones), as lists, for reward keyword arguments."""
    keys = [k for k in rows[0] if k not in RESERVED_COLUMNS]
    return {k: [row[k] for row in rows] for k in keys}


RewardCallable = Callable[..., list]


def build_reward_functions(
    reward_funcs: Sequence[Any],
    processing_classes: Sequence[Any] | None = None,
    *,
    model_init_kwargs: dict | None = None,
    trust_remote_code: bool = False,
    max_completion_length: int | None = None,
    chat_template_kwargs: dict | None = None,
) -> RewardFunctions:
    """Turn what a user passes as `reward_funcs` into `RewardFunctions`.

    Each entry is a callable, a sequence-classification `PreTrainedModel`, or a string: a local directory or a hub id
    (`org/name`) is loaded as a reward model with its tokenizer; any other string, or a `{"name", "kwargs"}`
    mapping, is a built-in reward name or dotted path resolved by `grpokit.rewards.resolve_reward`.
    """
    from transformers import PreTrainedModel

    from grpokit import models
    from grpokit.rewards import resolve_reward

    classes = list(processing_classes or [None] * len(reward_funcs))
    if len(classes) != len(reward_funcs):
        raise ValueError(
            f"got {len(classes)} reward_processing_classes for {len(reward_funcs)} reward functions; pass one per "
            "reward function (None for callables)"
        )
    funcs = []
    for i, spec in enumerate(reward_funcs):
        if isinstance(spec, str) and _is_model_reference(spec):
            spec, tokenizer = models.load_reward_model(spec, model_init_kwargs, trust_remote_code)
            classes[i] = classes[i] or tokenizer
        elif isinstance(spec, (str, Mapping)):
            spec = resolve_reward(spec, defaults={"max_completion_len": max_completion_length})
        if isinstance(spec, PreTrainedModel):
            if classes[i] is None:
                classes[i] = models.load_tokenizer(models.model_id(spec), trust_remote_code=trust_remote_code)
            models.prepare_reward_tokenizer(spec, classes[i])
        funcs.append(spec)
    return RewardFunctions(funcs, classes, chat_template_kwargs=dict(chat_template_kwargs or {}))


def _is_model_reference(spec: str) -> bool:
    """A local directory, or a hub id `org/name` (a dotted path has no slash)."""
    import os

    return os.path.isdir(spec) or ("/" in spec and not spec.startswith("/") and "." not in spec.split("/")[0])
