"""Built-in rewards under open-r1's registry names (`accuracy`, `format`, `tag_count`, ...), with open-r1's formulas.

Each reward's `__name__` is its registry name, so metrics read `rewards/accuracy/mean`, `rewards/format/mean`, ...
Parameterised rewards are factories taking keyword arguments (defaults: open-r1's factory defaults).
Deviations from open-r1, on purpose: an unparsable gold solution gives `None` (skip the example, as TRL does)
instead of 1.0 / "treated as correct"; a gold solution without LaTeX (e.g. `42`) falls back to math-verify's default
extraction instead of being unparsable; answers are verified as `verify(gold, answer)` (math-verify's argument order);
the cosine schedule is clamped past `max_len` (instead of rising again).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from ._common import (
    RewardCallable,
    check_int,
    check_number,
    check_timeout,
    column,
    completion_texts,
    cosine_interpolate,
    repeated_ngram_fraction,
)
from ._math import DEFAULT_MATH_TIMEOUT, grade_answers
from .trl_rewards import make_soft_overlong_punishment

# <think>, newline, reasoning, newline, </think>, newline, <answer>, newline, answer, newline, </answer> at a line end.
# Flags as open-r1: DOTALL lets the parts span lines; MULTILINE lets `$` match at any line end (text may follow).
_FORMAT_RE = re.compile(r"^<think>\n.*?\n</think>\n<answer>\n.*?\n</answer>$", re.DOTALL | re.MULTILINE)
# "Step N:", "N." at the very start of the text (no MULTILINE, as open-r1), "\n-" / "\n*" bullets, transition words.
_STEP_RE = re.compile(r"Step \d+:|^\d+\.|\n-|\n\*|First,|Second,|Next,|Finally,")
_TAGS = ("<think>\n", "\n</think>\n", "\n<answer>\n", "\n</answer>")


def _correctness(name: str, completions: Any, solution: Any, math_timeout: Any) -> tuple[list[str], list]:
    texts = completion_texts(completions, name)
    solution = column(solution, "solution", len(texts), name)
    grades = grade_answers(texts, solution, flavor="openr1", reward=name, timeout=check_timeout(name, math_timeout))
    return texts, [g.score for g in grades]


def accuracy(
    completions: list,
    solution: Sequence[str] | None = None,
    *,
    math_timeout: float | None = DEFAULT_MATH_TIMEOUT,
    **kwargs: Any,
) -> list[float | None]:
    r"""open-r1's accuracy: 1.0 if the (LaTeX, boxed-first) answer equals the gold `solution`, else 0.0.

    The gold solution is parsed as LaTeX (first match); unparsable gold gives `None`. Needs math-verify.

    >>> accuracy([r"$\boxed{\frac{1}{3}}$", r"$\boxed{0.5}$"], solution=[r"$\frac{1}{3}$"] * 2)
    [1.0, 0.0]
    """
    return _correctness("accuracy", completions, solution, math_timeout)[1]


def format_reward(completions: list, **kwargs: Any) -> list[float]:
    """open-r1's `format`: 1.0 for `<think>\\n...\\n</think>\\n<answer>\\n...\\n</answer>`, else 0.0.

    As in open-r1, the match must start at the beginning and `</answer>` must end a line (text may follow it).

    >>> format_reward(["<think>\\nhmm\\n</think>\\n<answer>\\n42\\n</answer>", "<think>hmm</think><answer>42</answer>"])
    [1.0, 0.0]
    """
    return [1.0 if _FORMAT_RE.match(text) else 0.0 for text in completion_texts(completions, "format")]


format_reward.__name__ = "format"  # registry/metric name; the Python name avoids shadowing the builtin


def tag_count(completions: list, **kwargs: Any) -> list[float]:
    """open-r1's `tag_count`: 0.25 for each of `<think>\\n`, `\\n</think>\\n`, `\\n<answer>\\n`, `\\n</answer>`
    that occurs exactly once.

    >>> tag_count(["<think>\\nhmm\\n</think>\\n<answer>\\n42\\n</answer>", "<think>\\nhmm\\n</think>\\n42"])
    [1.0, 0.5]
    """
    return [sum(0.25 for tag in _TAGS if text.count(tag) == 1) for text in completion_texts(completions, "tag_count")]


def reasoning_steps(completions: list, **kwargs: Any) -> list[float]:
    """open-r1's `reasoning_steps`: min(1, #step markers / 3).

    Markers: `Step N:`, `N.` at the very start of the text, a newline followed by `-` or `*`, and the words
    `First,` `Second,` `Next,` `Finally,`.

    >>> reasoning_steps(["Step 1: a\\nStep 2: b\\nStep 3: c\\nStep 4: d", "First, a. Next, b.", "just 42"])
    [1.0, 0.6666666666666666, 0.0]
    """
    return [min(1.0, len(_STEP_RE.findall(text)) / 3) for text in completion_texts(completions, "reasoning_steps")]


def length(
    completions: list,
    solution: Sequence[str] | None = None,
    *,
    math_timeout: float | None = DEFAULT_MATH_TIMEOUT,
    **kwargs: Any,
) -> list[float | None]:
    r"""open-r1's `length` (Kimi k1.5 length penalty, arXiv:2501.12599), over completion lengths in characters.

    With `lam = 0.5 - (len - min_len) / (max_len - min_len)` (min/max over the completions of the call): a
    correct answer gets `lam`, a wrong one `min(0, lam)`; all 0.0 when every completion has the same length.
    Unparsable gold: `None`. Needs math-verify.

    >>> texts = [r"\boxed{3}", r"It is \boxed{2}", r"So \boxed{2}"]  # 9, 15 and 12 characters; the first is wrong
    >>> length(texts, solution=["$2$"] * 3)  # lam = 0.5, -0.5, 0.0
    [0.0, -0.5, 0.0]
    """
    texts, scores = _correctness("length", completions, solution, math_timeout)
    lengths = [len(text) for text in texts]
    shortest, longest = min(lengths, default=0), max(lengths, default=0)
    if shortest == longest:
        return [None if s is None else 0.0 for s in scores]
    rewards: list[float | None] = []
    for n, score in zip(lengths, scores, strict=True):
        lam = 0.5 - (n - shortest) / (longest - shortest)
        rewards.append(None if score is None else lam if score else min(0.0, lam))
    return rewards


class _Cosine(RewardCallable):
    def __init__(self, values: dict[str, float], max_len: int, math_timeout: float | None):
        super().__init__("cosine", **values, max_len=max_len, math_timeout=math_timeout)
        self.values = values
        self.max_len = max_len
        self.math_timeout = math_timeout

    def __call__(
        self, completions: list | None = None, solution: Sequence[str] | None = None, **kwargs: Any
    ) -> list[float | None]:
        texts, scores = _correctness(self.__name__, completions, solution, self.math_timeout)
        v = self.values
        rewards: list[float | None] = []
        for text, score in zip(texts, scores, strict=True):
            progress = len(text) / self.max_len
            if score is None:
                rewards.append(None)
            elif score:  # correct: shorter is better
                rewards.append(cosine_interpolate(progress, v["max_value_correct"], v["min_value_correct"]))
            else:  # wrong: shorter is penalised more
                rewards.append(cosine_interpolate(progress, v["min_value_wrong"], v["max_value_wrong"]))
        return rewards


def cosine(
    *,
    min_value_wrong: float = -1.0,
    max_value_wrong: float = -0.5,
    min_value_correct: float = 0.5,
    max_value_correct: float = 1.0,
    max_len: int = 1000,
    math_timeout: float | None = DEFAULT_MATH_TIMEOUT,
) -> Callable[..., list[float | None]]:
    r"""Factory of open-r1's `cosine` reward: correctness scaled by completion length in *characters*.

    With `p = min(len(text) / max_len, 1)`: correct answers get `max_value_correct` at `p = 0` falling along a
    half cosine to `min_value_correct` at `p = 1`; wrong ones get `min_value_wrong` at `p = 0` rising to
    `max_value_wrong` at `p = 1`. Unparsable gold: `None`. Needs math-verify.

    >>> reward = cosine(max_len=20)
    >>> texts = [r"\boxed{2}", r"\boxed{3}"]  # 9 characters each
    >>> [round(r, 4) for r in reward(texts, solution=["$2$", "$2$"])]
    [0.7891, -0.7891]
    """
    owner = "cosine"
    values = {
        "min_value_wrong": check_number(owner, "min_value_wrong", min_value_wrong),
        "max_value_wrong": check_number(owner, "max_value_wrong", max_value_wrong),
        "min_value_correct": check_number(owner, "min_value_correct", min_value_correct),
        "max_value_correct": check_number(owner, "max_value_correct", max_value_correct),
    }
    return _Cosine(values, check_int(owner, "max_len", max_len, 1), check_timeout(owner, math_timeout))


class _WordRepetitionPenalty(RewardCallable):
    def __init__(self, ngram_size: int, max_penalty: float):
        super().__init__("repetition_penalty", ngram_size=ngram_size, max_penalty=max_penalty)
        self.ngram_size = ngram_size
        self.max_penalty = max_penalty

    def __call__(self, completions: list | None = None, **kwargs: Any) -> list[float]:
        rewards = []
        for text in completion_texts(completions, self.__name__):
            fraction = repeated_ngram_fraction(text.lower().split(), self.ngram_size)
            rewards.append(fraction * self.max_penalty if fraction else 0.0)
        return rewards


def repetition_penalty(*, ngram_size: int = 3, max_penalty: float = -1.0) -> Callable[..., list[float]]:
    """Factory of open-r1's `repetition_penalty` (arXiv:2502.03373, App. C.2), over lower-cased whitespace *words*.

    Reward = `(1 - unique n-grams / n-grams) * max_penalty` (`max_penalty` <= 0); 0.0 with fewer than
    `ngram_size` words.

    >>> penalty = repetition_penalty(ngram_size=2)
    >>> penalty(["a b a b a", "one two three"])  # bigrams: ab ba ab ba -> 1 - 2/4 repeated
    [-0.5, 0.0]
    """
    owner = "repetition_penalty"
    return _WordRepetitionPenalty(
        check_int(owner, "ngram_size", ngram_size, 1), check_number(owner, "max_penalty", max_penalty, maximum=0.0)
    )


def soft_overlong_punishment(
    *, max_completion_len: int = 16384, soft_punish_cache: int | None = None
) -> Callable[..., list[float]]:
    """Factory of open-r1's `soft_overlong_punishment` (DAPO, same formula as TRL's `get_soft_overlong_punishment`).

    Over token counts (`completion_ids`): 0.0 up to `max_completion_len - soft_punish_cache`, then linear down to
    -1.0 at `max_completion_len`, -1.0 beyond. `soft_punish_cache=None` means a quarter of `max_completion_len`
    (open-r1's defaults: 16384 and 4096), so the window follows a `max_completion_len` taken from the training
    config (which `resolve_reward` offers through `defaults`).

    >>> punish = soft_overlong_punishment(max_completion_len=10, soft_punish_cache=4)
    >>> punish(completion_ids=[[0] * 6, [0] * 8, [0] * 11])
    [0.0, -0.5, -1.0]
    """
    owner = "soft_overlong_punishment"
    if soft_punish_cache is None:
        soft_punish_cache = check_int(owner, "max_completion_len", max_completion_len, 1) // 4
    return make_soft_overlong_punishment(owner, owner, max_completion_len, soft_punish_cache)
