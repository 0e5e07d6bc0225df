"""Built-in rewards under TRL's names (`trl.rewards`), with TRL's semantics.

All take `completions` first (as TRL's do) and accept any other keyword argument the trainer passes
(`prompts`, `completion_ids`, dataset columns, `trainer_state`, ...).
"""

from __future__ import annotations

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
    soft_overlong_penalty,
    token_ids,
)
from ._math import DEFAULT_MATH_TIMEOUT, grade_answers

_THINK_OPEN, _THINK_CLOSE = "<think>", "</think>"


def _log_grades(log_extra: Callable[[str, list], None] | None, solution: Sequence, grades: list) -> None:
    if log_extra is not None:
        log_extra("solution", list(solution))
        log_extra("gold_parsed", [g.gold for g in grades])
        log_extra("answer_parsed", [g.answer for g in grades])


def accuracy_reward(
    completions: list,
    solution: Sequence[str] | None = None,
    log_extra: Callable[[str, list], None] | None = None,
    *,
    math_timeout: float | None = DEFAULT_MATH_TIMEOUT,
    **kwargs: Any,
) -> list[float | None]:
    r"""1.0 if the completion's final answer equals the gold `solution` (checked with math-verify), else 0.0.

    The gold solution is parsed with math-verify's default extraction; the answer must be LaTeX (a `\boxed{}` is
    tried first). An unparsable gold solution gives `None` (the example is skipped). Needs `pip install
    'grpokit[math]'`. `math_timeout` bounds each parse/verify in seconds (None: no limit).

    >>> accuracy_reward([r"So \boxed{\frac{1}{3}}", r"So \boxed{\frac{1}{2}}"], solution=[r"\frac{1}{3}"] * 2)
    [1.0, 0.0]
    """
    name = "accuracy_reward"
    texts = completion_texts(completions, name)
    solution = column(solution, "solution", len(texts), name)
    grades = grade_answers(texts, solution, flavor="trl", reward=name, timeout=check_timeout(name, math_timeout))
    _log_grades(log_extra, solution, grades)
    return [g.score for g in grades]


def reasoning_accuracy_reward(
    completions: list,
    solution: Sequence[str] | None = None,
    reasoning_delimiters: Sequence[str] | None = None,
    log_extra: Callable[[str, list], None] | None = None,
    *,
    math_timeout: float | None = DEFAULT_MATH_TIMEOUT,
    **kwargs: Any,
) -> list[float | None]:
    r"""Like `accuracy_reward`, but only the text after the reasoning counts.

    The answer is what follows the last occurrence of the first delimiter in `reasoning_delimiters`
    (default `["</think>"]`) found in the completion. A completion with none of the delimiters (unfinished
    reasoning) gets 0.0; an unparsable gold solution gives `None`.

    >>> done = r"<think>maybe \boxed{2}</think> The answer is \boxed{\frac{1}{3}}"
    >>> unfinished = r"<think>I think it is \boxed{\frac{1}{3}}"
    >>> reasoning_accuracy_reward([done, unfinished], solution=[r"\frac{1}{3}"] * 2)
    [1.0, 0.0]
    """
    name = "reasoning_accuracy_reward"
    texts = completion_texts(completions, name)
    solution = column(solution, "solution", len(texts), name)
    delimiters = [_THINK_CLOSE] if reasoning_delimiters is None else reasoning_delimiters
    if isinstance(delimiters, str) or not all(isinstance(d, str) and d for d in delimiters):
        raise ValueError(f"{name}: `reasoning_delimiters` must be a list of non-empty strings, got {delimiters!r}")
    finals: list[str | None] = []
    for text in texts:
        delimiter = next((d for d in delimiters if d in text), None)
        finals.append(None if delimiter is None else text.rsplit(delimiter, 1)[1])
    complete = [i for i, final in enumerate(finals) if final is not None]
    graded = grade_answers(
        [finals[i] for i in complete],
        [solution[i] for i in complete],
        flavor="trl",
        reward=name,
        timeout=check_timeout(name, math_timeout),
    )
    scores: list[float | None] = [0.0] * len(texts)  # unfinished reasoning is penalised, not skipped
    gold_text = ["[incomplete reasoning]"] * len(texts)
    answer_text = ["[incomplete reasoning]"] * len(texts)
    for i, grade in zip(complete, graded, strict=True):
        scores[i], gold_text[i], answer_text[i] = grade.score, grade.gold, grade.answer
    if log_extra is not None:
        log_extra("solution", list(solution))
        log_extra("gold_parsed", gold_text)
        log_extra("answer_parsed", answer_text)
    return scores


def think_format_reward(completions: list, **kwargs: Any) -> list[float]:
    """1.0 if the completion starts with `<think>`, has no second `<think>`, and closes it with `</think>`; else 0.0.

    >>> think_format_reward(["<think>\\nhmm\\n</think>\\n42", "<think>\\nhmm, 42", "42 <think>x</think>"])
    [1.0, 0.0, 0.0]
    >>> think_format_reward([[{"role": "assistant", "content": "<think>a</think>b"}]])
    [1.0]
    """
    rewards = []
    for text in completion_texts(completions, "think_format_reward"):
        rest = text[len(_THINK_OPEN) :]
        ok = text.startswith(_THINK_OPEN) and _THINK_OPEN not in rest and _THINK_CLOSE in rest
        rewards.append(1.0 if ok else 0.0)
    return rewards


class _SoftOverlongPunishment(RewardCallable):
    def __init__(self, name: str, max_completion_len: int, soft_punish_cache: int):
        super().__init__(name, max_completion_len=max_completion_len, soft_punish_cache=soft_punish_cache)
        self.max_completion_len = max_completion_len
        self.soft_punish_cache = soft_punish_cache

    def __call__(self, completion_ids: list[list[int]] | None = None, **kwargs: Any) -> list[float]:
        n = len(kwargs["completions"]) if kwargs.get("completions") is not None else None
        return [
            soft_overlong_penalty(len(ids), self.max_completion_len, self.soft_punish_cache)
            for ids in token_ids(completion_ids, self.__name__, n)
        ]


def make_soft_overlong_punishment(owner: str, name: str, max_completion_len: Any, soft_punish_cache: Any):
    max_completion_len = check_int(owner, "max_completion_len", max_completion_len, 1)
    soft_punish_cache = check_int(owner, "soft_punish_cache", soft_punish_cache, 0)
    if soft_punish_cache > max_completion_len:
        raise ValueError(
            f"{owner}: `soft_punish_cache` ({soft_punish_cache}) must be <= `max_completion_len` ({max_completion_len})"
        )
    return _SoftOverlongPunishment(name, max_completion_len, soft_punish_cache)


def get_soft_overlong_punishment(max_completion_len: int, soft_punish_cache: int) -> Callable[..., list[float]]:
    """Factory of DAPO's soft overlong punishment (Eq. 13 of arXiv:2503.14476), over completion token counts.

    With `L = max_completion_len` and `C = soft_punish_cache`: 0.0 up to `L - C` tokens, then
    `(L - C - length) / C` (linear down to -1.0 at `L`), and -1.0 beyond `L`. The returned reward is named
    `soft_overlong_punishment_reward` (TRL's name) and reads `completion_ids`.

    >>> punish = get_soft_overlong_punishment(max_completion_len=100, soft_punish_cache=20)
    >>> punish(completion_ids=[[1] * 80, [1] * 90, [1] * 120])
    [0.0, -0.5, -1.0]
    """
    return make_soft_overlong_punishment(
        "get_soft_overlong_punishment", "soft_overlong_punishment_reward", max_completion_len, soft_punish_cache
    )


class _CosineScaledReward(RewardCallable):
    def __init__(self, max_len: int, values: dict[str, float], math_timeout: float | None):
        super().__init__("cosine_scaled_reward", max_len=max_len, **values, math_timeout=math_timeout)
        self.max_len = max_len
        self.values = values
        self.math_timeout = math_timeout

    def __call__(
        self,
        completions: list | None = None,
        solution: Sequence[str] | None = None,
        completion_ids: list[list[int]] | None = None,
        **kwargs: Any,
    ) -> list[float | None]:
        texts = completion_texts(completions, self.__name__)
        ids = token_ids(completion_ids, self.__name__, len(texts))
        solution = column(solution, "solution", len(texts), self.__name__)
        grades = grade_answers(texts, solution, flavor="trl", reward=self.__name__, timeout=self.math_timeout)
        v = self.values
        rewards: list[float | None] = []
        for grade, row in zip(grades, ids, strict=True):
            if grade.score is None:
                rewards.append(None)
            elif grade.score:  # correct: shorter is better
                rewards.append(
                    cosine_interpolate(len(row) / self.max_len, v["max_value_correct"], v["min_value_correct"])
                )
            else:  # wrong: shorter is penalised more
                rewards.append(cosine_interpolate(len(row) / self.max_len, v["min_value_wrong"], v["max_value_wrong"]))
        return rewards


def get_cosine_scaled_reward(
    max_len: int,
    min_value_wrong: float = -1.0,
    max_value_wrong: float = -0.5,
    min_value_correct: float = 0.5,
    max_value_correct: float = 1.0,
    *,
    math_timeout: float | None = DEFAULT_MATH_TIMEOUT,
) -> Callable[..., list[float | None]]:
    r"""Factory of TRL's cosine length-scaled correctness reward (arXiv:2502.03373, App. C.1), over token counts.

    With `p = min(len(completion_ids) / max_len, 1)`, a correct answer (as in `accuracy_reward`) gets
    `max_value_correct` at `p = 0` falling along a half cosine to `min_value_correct` at `p = 1`; a wrong one gets
    `min_value_wrong` at `p = 0` rising to `max_value_wrong` at `p = 1`. Unparsable gold: `None`. The returned
    reward is named `cosine_scaled_reward` and reads `completions`, `solution` and `completion_ids`.

    >>> reward = get_cosine_scaled_reward(max_len=100)
    >>> reward([r"\boxed{\frac{1}{3}}", r"\boxed{\frac{1}{2}}"], [r"\frac{1}{3}"] * 2, [[1] * 50, [1] * 50])
    [0.75, -0.75]
    """
    owner = "get_cosine_scaled_reward"
    values = {
        "min_value_wrong": check_number(owner, "min_value_wrong", min_value_wrong),
        "max_value_wrong": check_number(owner, "max_value_wrong", max_value_wrong),
        "min_value_correct": check_number(owner, "min_value_correct", min_value_correct),
        "max_value_correct": check_number(owner, "max_value_correct", max_value_correct),
    }
    return _CosineScaledReward(check_int(owner, "max_len", max_len, 1), values, check_timeout(owner, math_timeout))


class _TokenRepetitionPenalty(RewardCallable):
    def __init__(self, ngram_size: int, max_penalty: float):
        super().__init__("repetition_penalty_reward", ngram_size=ngram_size, max_penalty=max_penalty)
        self.ngram_size = ngram_size
        self.max_penalty = max_penalty

    def __call__(self, completion_ids: list[list[int]] | None = None, **kwargs: Any) -> list[float]:
        rewards = []
        for row in token_ids(completion_ids, self.__name__):
            fraction = repeated_ngram_fraction(row, self.ngram_size)
            rewards.append(fraction * self.max_penalty if fraction else 0.0)
        return rewards


def get_repetition_penalty_reward(ngram_size: int = 3, max_penalty: float = -1.0) -> Callable[..., list[float]]:
    """Factory of TRL's n-gram repetition penalty (arXiv:2502.03373, App. C.2), over completion *token ids*.

    Reward = `(1 - unique n-grams / n-grams) * max_penalty`: 0.0 without repetition, towards `max_penalty` (<= 0)
    for a fully repetitive completion; 0.0 with fewer than `ngram_size` tokens. Named `repetition_penalty_reward`.

    >>> penalty = get_repetition_penalty_reward(ngram_size=2, max_penalty=-1.0)
    >>> penalty(completion_ids=[[1, 2, 3, 4], [5, 5, 5, 5, 5]])
    [0.0, -0.75]
    """
    owner = "get_repetition_penalty_reward"
    return _TokenRepetitionPenalty(
        check_int(owner, "ngram_size", ngram_size, 1), check_number(owner, "max_penalty", max_penalty, maximum=0.0)
    )
