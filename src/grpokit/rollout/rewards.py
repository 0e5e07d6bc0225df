"""Calling reward functions and reward models on a batch of completions.

Reward functions use TRL's signature: `fn(prompts=..., completions=..., completion_ids=..., **columns,
trainer_state=..., log_extra=..., log_metric=...)` returning one float, or None ("no opinion"), per completion.
Coroutine functions run concurrently. Reward models are sequence classifiers scoring prompt + completion.

A function that raises, returns the wrong number of rewards, or returns something that is not a number, or an
infinite one, stops the run with an error naming the function and the sample; nothing is silently scored 0.

With a `timeout`, each call (one function or model on one batch) that has not returned after that many seconds stops
the run too. An async function is cancelled. A sync function or a reward model runs in a daemon worker thread that
is abandoned on expiry: Python cannot stop a thread, so it keeps running until the function returns (or the process
exits).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import copy
import functools
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


class _RewardTimeout(RewardError):
    """A reward call did not return within the timeout."""


_TIMED_OUT = object()  # the output of an async call cancelled at its timeout
_FLOAT32_MAX = torch.finfo(torch.float32).max


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
    def run(cls, coroutine, timeout: float | None = None):
        """The coroutine's result; `TimeoutError` after `timeout` seconds, when the loop itself is stuck (a coroutine
        that blocks it, e.g. `time.sleep` in an `async def`): that loop is then abandoned and the next call starts
        another."""
        with cls._lock:
            if cls._loop is None:
                cls._loop = asyncio.new_event_loop()
                threading.Thread(target=cls._loop.run_forever, daemon=True, name="grpokit-rewards").start()
            loop = cls._loop
        future = asyncio.run_coroutine_threadsafe(coroutine, loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            with cls._lock:
                if cls._loop is loop:
                    cls._loop = None
            raise TimeoutError from None


@dataclass
class RewardFunctions:
    """The reward functions and models of a run, called together on a batch: `(N, F)` rewards with NaN for None.

    Args:
        funcs: callables (sync or async) and/or `PreTrainedModel` sequence classifiers.
        processing_classes: one per func; the tokenizer of each reward model (ignored for callables).
        chat_template_kwargs: for rendering conversations for reward models.
        timeout: seconds each call (one function or model on one batch) may take; None waits forever.
    """

    funcs: list[Any]
    processing_classes: list[Any] = field(default_factory=list)
    chat_template_kwargs: dict = field(default_factory=dict)
    timeout: float | None = None

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
                score = functools.partial(
                    self._score_with_model, func, self.processing_classes[i], prompts, completions
                )
                rewards[:, i] = self._check_finite(i, self._within_timeout(i, batch, score), prompts, completions)
            elif is_async_callable(func):
                pending.append(i)
            else:
                own = _own_copy(batch, kwargs, extra_kwargs)
                try:
                    output = self._within_timeout(i, batch, functools.partial(func, **own))
                except _RewardTimeout:
                    raise
                except SystemExit as exit_:
                    raise self._exit_error(i, exit_, batch) from None
                except Exception as error:
                    raise self._locate_failure(i, error, batch, kwargs) from error
                rewards[:, i] = self._to_column(i, output, prompts, completions)
        if pending:
            outputs = self._run_async([(i, _own_copy(batch, kwargs, extra_kwargs)) for i in pending])
            for i, output in zip(pending, outputs, strict=True):
                if output is _TIMED_OUT:
                    raise self._timeout_error(i, batch)
                if isinstance(output, SystemExit):
                    raise self._exit_error(i, output, batch) from None
                if isinstance(output, BaseException):
                    raise self._locate_failure(i, output, batch, kwargs) from output
                rewards[:, i] = self._to_column(i, output, prompts, completions)
        return rewards

    def _within_timeout(self, i: int, batch: dict, call: Callable[[], Any]) -> Any:
        """`call()` in a daemon worker thread, waited for at most `timeout` seconds (RewardError after that; the
        thread is abandoned, still running). Without a timeout, `call()` in this thread."""
        if self.timeout is None:
            return call()
        outcome: dict[str, Any] = {}
        finished = threading.Event()
        work = _in_caller_state(call)

        def target():
            try:
                outcome["value"] = work()
            except BaseException as error:  # handed to the waiting thread, which raises it
                outcome["error"] = error
            finally:
                finished.set()

        context = contextvars.copy_context()
        threading.Thread(target=context.run, args=(target,), daemon=True, name=f"grpokit-reward-{i}").start()
        if not finished.wait(self.timeout):
            raise self._timeout_error(i, batch)
        if "error" in outcome:
            raise outcome["error"]
        return outcome["value"]

    def _run_async(self, calls: list[tuple[int, dict]]) -> list:
        """Async functions called together, `(index, keyword arguments)` each: their outputs, each a value, an
        exception, or `_TIMED_OUT` for one cancelled after `timeout` seconds."""
        finished: set[int] = set()
        # Past the deadline plus a grace, the event loop itself is stuck (a function blocks it): every call not
        # finished by then counts as timed out.
        grace = None if self.timeout is None else self.timeout + max(1.0, 0.1 * self.timeout)
        try:
            return _BackgroundLoop.run(self._gather_async(calls, finished), timeout=grace)
        except TimeoutError:
            return [None if k in finished else _TIMED_OUT for k in range(len(calls))]

    async def _gather_async(self, calls: list[tuple[int, dict]], finished: set[int]) -> list:
        async def guarded(i, call_kwargs):
            # SystemExit is caught here, inside the coroutine: escaping a Task it would stop the event loop itself.
            try:
                return await self.funcs[i](**call_kwargs)
            except SystemExit as exit_:
                return exit_

        async def one(k, i, call_kwargs):
            try:
                task = asyncio.ensure_future(guarded(i, call_kwargs))
                done, _ = await asyncio.wait({task}, timeout=self.timeout)
                if not done:
                    task.cancel()
                    return _TIMED_OUT
                return task.result()
            finally:
                finished.add(k)

        return await asyncio.gather(*(one(k, *call) for k, call in enumerate(calls)), return_exceptions=True)

    def _exit_error(self, i: int, exit_: SystemExit, batch: dict) -> RewardError:
        """A reward that called sys.exit: the run must not end as if it had finished (or with a traceback)."""
        return RewardError(
            f"{self._kind(i)} {self.names[i]!r} called sys.exit({exit_.code!r}) on a batch of "
            f"{len(batch['prompts'])} completions; a reward returns scores and must not end the run"
        )

    def _timeout_error(self, i: int, batch: dict) -> RewardError:
        prompts, completions = batch["prompts"], batch["completions"]
        return _RewardTimeout(
            f"{self._kind(i)} {self.names[i]!r} did not return within {float(self.timeout)} s (reward_timeout) on a "
            f"batch of {len(prompts)} completions; the batch starts with {_sample(prompts, completions, 0)}; raise "
            "reward_timeout, or set it to null to wait forever"
        )

    def _kind(self, i: int) -> str:
        return "reward model" if isinstance(self.funcs[i], torch.nn.Module) else "reward function"

    def _check_finite(self, i: int, column: Tensor, prompts: list, completions: list) -> Tensor:
        infinite = torch.isinf(column).nonzero().flatten().tolist()
        if infinite:
            j = infinite[0]
            raise RewardError(
                f"{self._kind(i)} {self.names[i]!r} returned {column[j].item()} for {_sample(prompts, completions, j)}"
                f"{f' (and {len(infinite) - 1} other samples)' if len(infinite) > 1 else ''}; rewards must be finite"
                " float32 numbers (None for no opinion)"
            )
        return column

    def _to_column(self, i: int, output: Any, prompts: list, completions: list) -> Tensor:
        name, n = self.names[i], len(prompts)
        values = _as_sequence(output)
        if values is None:
            raise RewardError(
                f"reward function {name!r} returned {_short(output)} ({type(output).__name__}); expected a list of "
                f"{n} floats (or None), one per completion; the batch starts with {_sample(prompts, completions, 0)}"
            )
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
            number = _as_number(value)
            if number is None:
                raise RewardError(
                    f"reward function {name!r} returned {_short(value)} ({type(value).__name__}) for "
                    f"{_sample(prompts, completions, j)}; expected a float or None"
                )
            if abs(number) > _FLOAT32_MAX:  # inf, -inf, or beyond float32 (NaN, like None, is "no opinion")
                raise RewardError(
                    f"reward function {name!r} returned {_short(value)} for {_sample(prompts, completions, j)}; "
                    "rewards must be finite float32 numbers (None for no opinion)"
                )
            column[j] = number
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
                if is_async_callable(func):
                    [output] = self._run_async([(i, single)])
                    if output is _TIMED_OUT:
                        break
                    if isinstance(output, Exception):
                        raise output
                else:
                    self._within_timeout(i, single, functools.partial(func, **single))
            except _RewardTimeout:  # this sample alone hangs: no better place to point at than the batch
                break
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


def _as_sequence(output: Any) -> list | None:
    """A reward function's output as a list of per-completion values, or None when it is not a list, a tuple, a 1-D
    numpy array or a 1-D tensor: a dict would be scored by its keys, a string one reward per character."""
    if isinstance(output, (list, tuple)):
        return list(output)
    if isinstance(output, Tensor) or type(output).__module__ == "numpy":
        return list(output) if getattr(output, "ndim", None) == 1 else None
    return None


def _as_number(value: Any) -> float | None:
    """One reward as a float: Python and numpy numbers (bools count, as in TRL's tensor conversion), 1-element
    tensors; None for anything else (a numeric string included)."""
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, Tensor):
        return float(value.item()) if value.numel() == 1 and not value.is_complex() else None
    kind = getattr(getattr(value, "dtype", None), "kind", None)  # numpy scalars: bool, int, uint, float
    if type(value).__module__ == "numpy" and getattr(value, "ndim", None) == 0 and kind in ("b", "i", "u", "f"):
        return float(value)
    return None


def _own_copy(batch: dict, kwargs: dict, extra_kwargs: dict) -> dict:
    """A reward function's arguments: its own deep copy of the prompts, completions, completion ids and dataset
    columns, so that a function changing them changes nothing another function, the logs or the loss see. The
    trainer's objects (`trainer_state`, `log_extra`, `log_metric`, ...) are passed as they are."""
    data = copy.deepcopy({**batch, **{k: v for k, v in kwargs.items() if k not in extra_kwargs}})
    return {**data, **{k: v for k, v in kwargs.items() if k in extra_kwargs}}


def _per_sample(value: Any, n: int) -> bool:
    return isinstance(value, list) and len(value) == n


def _in_caller_state(call: Callable[[], Any]) -> Callable[[], Any]:
    """`call` wrapped to run in another thread with this thread's torch state: grad mode and CUDA device (both
    per thread; under a launch each process trains on its own GPU, which a new thread would not know)."""
    grad = torch.is_grad_enabled()
    device = torch.cuda.current_device() if torch.cuda.is_available() and torch.cuda.is_initialized() else None

    def run():
        if device is not None:
            torch.cuda.set_device(device)
        with torch.set_grad_enabled(grad):
            return call()

    return run


def column_values(rows: list[dict]) -> dict[str, list]:
    """Dataset columns of the rows (other than the reserved ones), as lists, for reward keyword arguments."""
    keys = [k for k in rows[0] if k not in RESERVED_COLUMNS]
    return {k: [row[k] for row in rows] for k in keys}


RewardCallable = Callable[..., list]


class UnscorableRounds:
    """Watches for completions and rounds where every reward is None/NaN: such a completion teaches nothing (its
    advantage is 0). The first unscorable completion of the run is reported with TRL 1.16's warning ("All reward
    functions returned None for the following kwargs: ..."; TRL repeats it every batch, here once); the first round
    where nothing at all was scored gets grpokit's own line (once). Both go through `warn` (None on the processes that
    stay quiet). With `limit` set, that many training rounds in a row scoring nothing raise `RewardError`; with None
    (the default, as TRL) training goes on. Every process sees the same gathered rewards, so all agree."""

    def __init__(self, limit: int | None, names: Sequence[str], warn: Callable[[str], Any] | None):
        self.limit, self.names, self.warn = limit, names, warn
        self.in_a_row = 0  # training rounds in a row where every reward was None/NaN
        self.warned = False  # grpokit's whole-round line
        self.warned_row = False  # TRL's per-completion line

    def check(self, rollout, mode: str) -> None:
        """Count `rollout` (a `Rollout` of `mode`, "train" or "eval"), warn or stop as the class says."""
        self._warn_as_trl(rollout)
        if not rollout.unscorable:
            if mode == "train":
                self.in_a_row = 0
            return
        names = ", ".join(map(repr, self.names))
        if not self.warned and self.warn is not None:
            self.warn(
                f"every reward was None/NaN in this round ({names} scored none of {len(rollout.completions)} "
                "completions): nothing to learn from it, its advantages are 0 and its reward metrics NaN; warned once"
            )
        self.warned = True
        if mode != "train":
            return
        self.in_a_row += 1
        if self.limit is not None and self.in_a_row >= self.limit:
            raise RewardError(
                f"every reward was None/NaN in {self.in_a_row} generation rounds in a row "
                f"(max_unscorable_rounds={self.limit}): nothing to learn from; {names} scored none of the "
                f"{len(rollout.completions)} completions of the last round, which starts with "
                + _sample(rollout.prompts, rollout.completions, 0)
            )

    def _warn_as_trl(self, rollout) -> None:
        if self.warned_row or rollout.rewards is None or rollout.rewards.numel() == 0:
            return
        unscored = torch.isnan(rollout.rewards).all(dim=1).nonzero().flatten().tolist()
        if not unscored:
            return
        self.warned_row = True
        if self.warn is None:
            return
        i = unscored[0]
        row = f"{{'prompt': {_short(rollout.prompts[i])}, 'completion': {_short(rollout.completions[i])}}}"
        self.warn(
            f"All reward functions returned None for the following kwargs: {row} (sample {i} of this round; "
            f"{len(unscored)} of its {len(rollout.completions)} completions unscored, advantage 0): at least one "
            "reward function must score each completion for it to teach anything; warned once"
        )


def build_reward_functions(
    reward_funcs: Sequence[Any],
    processing_classes: Sequence[Any] | None = None,
    *,
    model_init_kwargs: dict | None = None,
    trust_remote_code: bool = False,
    max_completion_length: int | None = None,
    chat_template_kwargs: dict | None = None,
    timeout: float | None = None,
) -> RewardFunctions:
    """Turn what a user passes as `reward_funcs` into `RewardFunctions`.

    Each entry is a callable, a sequence-classification `PreTrainedModel`, or a string: a local directory or a hub id
    (`org/name`) is loaded as a reward model with its tokenizer; any other string, or a `{"name", "kwargs"}`
    mapping, is a built-in reward name or dotted path resolved by `grpokit.rewards.resolve_reward`. `timeout`: seconds
    each reward call may take (None: no limit).
    """
    from transformers import PreTrainedModel

    from grpokit import models
    from grpokit.rewards import resolve_reward

    classes = list(processing_classes or [None] * len(reward_funcs))
    if len(classes) != len(reward_funcs):
        raise ValueError(
            f"got {len(classes)} reward_processing_classes for {len(reward_funcs)} reward functions: the counts must "
            "match; pass one per reward function (None for callables)"
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
    return RewardFunctions(funcs, classes, chat_template_kwargs=dict(chat_template_kwargs or {}), timeout=timeout)


def _is_model_reference(spec: str) -> bool:
    """A local directory, or a hub id `org/name` (a dotted path has no slash)."""
    import os

    return os.path.isdir(spec) or ("/" in spec and not spec.startswith("/") and "." not in spec.split("/")[0])
