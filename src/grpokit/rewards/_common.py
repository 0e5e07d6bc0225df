"""Shared helpers of the built-in reward functions: reading completions in both formats, checking columns/arguments."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

# Keyword arguments the trainer passes on every call; they can never be bound ahead of time by a reward spec.
TRAINER_CALL_KWARGS = frozenset(
    {"prompts", "completions", "completion_ids", "trainer_state", "log_extra", "log_metric", "environments"}
)


def _message_text(message: Any, reward: str) -> str:
    if not isinstance(message, Mapping):
        raise ValueError(f"{reward}: a conversational completion must be a list of message dicts, got {message!r:.80}")
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        # Multimodal content: a list of parts such as {"type": "text", "text": "..."}; only the text counts.
        return "".join(
            part.get("text", "")
            for part in content
            if isinstance(part, Mapping) and part.get("type", "text") == "text"
        )
    raise ValueError(f"{reward}: message content must be a string or a list of parts, got {type(content).__name__}")


def completion_texts(completions: Any, reward: str) -> list[str]:
    """The text of each completion, for both the standard (`str`) and the conversational (message list) format.

    A conversational completion is read from its first message, as TRL's built-in rewards do.
    """
    if completions is None:
        raise ValueError(f"{reward}: needs `completions` (a list of strings or of message lists)")
    if isinstance(completions, (str, bytes)) or not isinstance(completions, Sequence):
        raise ValueError(f"{reward}: `completions` must be a list, got {type(completions).__name__}")
    texts = []
    for completion in completions:
        if isinstance(completion, str):
            texts.append(completion)
        elif isinstance(completion, Mapping):  # a single message given without its list
            texts.append(_message_text(completion, reward))
        elif isinstance(completion, Sequence):
            texts.append(_message_text(completion[0], reward) if len(completion) else "")
        else:
            raise ValueError(
                f"{reward}: each completion must be a string or a list of messages, got {type(completion).__name__}"
            )
    return texts


def token_ids(completion_ids: Any, reward: str, n: int | None = None) -> list[list[int]]:
    """`completion_ids` as lists of ints (tensors and tuples accepted), checked against the number of completions."""
    if completion_ids is None:
        raise ValueError(f"{reward}: needs `completion_ids` (the token ids of each completion, passed by the trainer)")
    if isinstance(completion_ids, (str, bytes)) or not isinstance(completion_ids, Sequence):
        if not hasattr(completion_ids, "tolist"):
            raise ValueError(f"{reward}: `completion_ids` must be a list of token id lists")
        completion_ids = completion_ids.tolist()
    rows = [list(ids.tolist() if hasattr(ids, "tolist") else ids) for ids in completion_ids]
    if n is not None and len(rows) != n:
        raise ValueError(f"{reward}: got {len(rows)} `completion_ids` rows for {n} completions")
    return rows


def column(values: Any, name: str, n: int, reward: str) -> list:
    """A dataset column passed as a keyword argument, checked to be a list aligned with the completions."""
    if values is None:
        raise ValueError(f"{reward}: needs a `{name}` column in the dataset (passed as the `{name}` keyword)")
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise ValueError(
            f"{reward}: `{name}` must be a list aligned with the completions, got {type(values).__name__}"
        )
    if len(values) != n:
        raise ValueError(f"{reward}: got {len(values)} `{name}` values for {n} completions")
    return list(values)


def check_int(owner: str, name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{owner}: `{name}` must be an int >= {minimum}, got {value!r}")
    return value


def check_number(owner: str, name: str, value: Any, *, maximum: float | None = None) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{owner}: `{name}` must be a finite number, got {value!r}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{owner}: `{name}` must be <= {maximum}, got {value!r}")
    return float(value)


def check_timeout(owner: str, value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{owner}: `math_timeout` must be a positive number of seconds or None, got {value!r}")
    return float(value)


def repeated_ngram_fraction(items: Sequence, ngram_size: int) -> float:
    """1 - (#unique n-grams / #n-grams); 0.0 when there are fewer than `ngram_size` items."""
    total = len(items) - ngram_size + 1
    if total < 1:
        return 0.0
    unique = {tuple(items[i : i + ngram_size]) for i in range(total)}
    return 1.0 - len(unique) / total


def cosine_interpolate(progress: float, short_value: float, long_value: float) -> float:
    """Value at `progress` in [0, 1] along half a cosine period: `short_value` at 0, `long_value` at 1."""
    progress = min(max(progress, 0.0), 1.0)
    return long_value + 0.5 * (short_value - long_value) * (1.0 + math.cos(math.pi * progress))


def soft_overlong_penalty(length: int, max_completion_len: int, soft_punish_cache: int) -> float:
    """DAPO's soft overlong punishment: 0 up to L-cache, then linear down to -1 at L, and -1 beyond L."""
    start = max_completion_len - soft_punish_cache
    if length <= start:
        return 0.0
    if length <= max_completion_len:
        return (start - length) / soft_punish_cache
    return -1.0


class RewardCallable:
    """Base of the reward callables built by factories: a class (not a closure) so that it pickles for worker
    processes, carrying the `__name__` used for metric names (`rewards/<name>/mean`)."""

    def __init__(self, name: str, **params: Any):
        self.__name__ = name
        self.params = params

    def __repr__(self) -> str:
        args = ", ".join(f"{key}={value!r}" for key, value in self.params.items())
        return f"<reward {self.__name__}({args})>"
