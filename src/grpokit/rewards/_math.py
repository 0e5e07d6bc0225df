"""Checking math answers with math-verify (optional dependency), under a timeout that also works off the main thread.

math-verify's own timeouts use `signal.alarm`, which only works on the main thread. We switch them off (passing
`parsing_timeout=None` / `timeout_seconds=None`) and run each parse/verify in a daemon worker thread that we wait on
for at most `math_timeout` seconds. A thread cannot be killed: a pathological expression that times out keeps its
thread busy in the background, but the reward call returns.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger("grpokit.rewards")

MATH_INSTALL_HINT = "pip install 'grpokit[math]'"
DEFAULT_MATH_TIMEOUT = 10.0


class MathVerifyNotInstalledError(ImportError):
    """A math reward was called but the optional `math-verify` package is not installed."""


def is_math_verify_available() -> bool:
    return importlib.util.find_spec("math_verify") is not None


class _DropExpectedWarnings(logging.Filter):
    # We disable math-verify's signal timeouts on purpose (and enforce our own), and open-r1's answer normalisation
    # keeps `equations=True` (still effective, but warned about on every parse): both warnings are noise here.
    def filter(self, record: logging.LogRecord) -> bool:
        message = str(record.msg)
        return not (message.startswith("Timeout is disabled") or message.startswith("equations=True"))


_FILTER = _DropExpectedWarnings()
_QUIETED_LOGGERS = ("math_verify.parser", "math_verify.grader", "latex2sympy2_extended.math_normalization")


@dataclass(frozen=True)
class Checker:
    """How one family of rewards (TRL's or open-r1's) parses gold solutions and answers, and compares them."""

    parse_gold: Callable[[str], list]
    parse_answer: Callable[[str], list]
    verify: Callable[[list, list], bool]


def load_checker(flavor: str, reward: str) -> Checker:
    """Import math-verify (lazily) and build the parse/verify configuration of `flavor` ("trl" or "openr1")."""
    try:
        import math_verify
        from latex2sympy2_extended import NormalizationConfig
    except ImportError as e:
        raise MathVerifyNotInstalledError(
            f"reward {reward!r} checks math answers with the math-verify package, which is not installed: "
            f"{MATH_INSTALL_HINT}"
        ) from e
    for name in _QUIETED_LOGGERS:
        log = logging.getLogger(name)
        if _FILTER not in log.filters:
            log.addFilter(_FILTER)

    latex = math_verify.LatexExtractionConfig
    if flavor == "trl":
        # Gold: math-verify's default extraction (LaTeX and plain expressions). Answer: LaTeX only, boxed first,
        # no extraction without an anchor (a bare number in the text does not count as an answer).
        gold_kwargs: dict[str, Any] = {}
        normalization = NormalizationConfig(units=True)
    elif flavor == "openr1":
        # Gold: LaTeX, first match, as open-r1; a gold solution without LaTeX (e.g. a bare "42"), which open-r1
        # would skip, falls back to math-verify's default extraction. Answer: as open-r1.
        gold_kwargs = {"extraction_config": [latex()], "extraction_mode": "first_match"}
        normalization = NormalizationConfig(
            nits=False, malformed_operators=False, basic_latex=True, equations=True, boxed="all", units=True
        )
    else:  # pragma: no cover - internal misuse
        raise ValueError(f"unknown math checker flavor {flavor!r}")
    answer_config = [
        latex(normalization_config=normalization, boxed_match_priority=0, try_extract_without_anchor=False)
    ]
    parse_gold = functools.partial(math_verify.parse, parsing_timeout=None, **gold_kwargs)
    if gold_kwargs:
        parse_gold = functools.partial(
            _first_nonempty, (parse_gold, functools.partial(math_verify.parse, parsing_timeout=None))
        )
    return Checker(
        parse_gold=parse_gold,
        parse_answer=functools.partial(
            math_verify.parse, extraction_config=answer_config, extraction_mode="first_match", parsing_timeout=None
        ),
        verify=functools.partial(math_verify.verify, timeout_seconds=None),
    )


def _first_nonempty(parsers: tuple[Callable[[str], list], ...], text: str) -> list:
    for parse in parsers:
        parsed = parse(text)
        if parsed:
            return parsed
    return []


class MathTimeout(TimeoutError):
    pass


def call_with_timeout(fn: Callable, args: tuple, timeout: float | None) -> Any:
    """`fn(*args)` in a daemon worker thread, waited on for at most `timeout` seconds (None: no limit, inline)."""
    if timeout is None:
        return fn(*args)
    box: dict[str, Any] = {}

    def work() -> None:
        try:
            box["value"] = fn(*args)
        except BaseException as e:  # re-raised in the caller's thread
            box["error"] = e

    thread = threading.Thread(target=work, name="grpokit-math-verify", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise MathTimeout(f"math-verify did not finish within {timeout:g}s")
    if "error" in box:
        raise box["error"]
    return box["value"]


@dataclass(frozen=True)
class Grade:
    score: float | None  # 1.0 correct, 0.0 wrong, None when the gold solution cannot be parsed (skip the example)
    gold: str  # printable parse results, for the completions table (`log_extra`)
    answer: str


def _parse_gold(checker: Checker, solution: str) -> tuple[list, str]:
    parsed = checker.parse_gold(solution)
    return parsed, str(parsed)


def _check_answer(checker: Checker, gold: list, content: str) -> tuple[bool, str]:
    answer = checker.parse_answer(content)
    # str() of a sympy expression can itself be slow, so it runs inside the worker too.
    return bool(answer) and bool(checker.verify(gold, answer)), str(answer) if answer else "[unparseable]"


def grade_answers(
    contents: Sequence[str], solutions: Sequence[Any], *, flavor: str, reward: str, timeout: float | None
) -> list[Grade]:
    """Grade each completion text against its gold solution (parsing each distinct solution once)."""
    checker = load_checker(flavor, reward)
    golds: dict[str, tuple[list, str] | None] = {}
    grades = []
    for content, solution in zip(contents, solutions, strict=True):
        if solution is None:
            grades.append(Grade(None, "[no solution]", "[skipped]"))
            continue
        key = str(solution)
        if key not in golds:
            try:
                parsed, text = call_with_timeout(_parse_gold, (checker, key), timeout)
                golds[key] = (parsed, text) if parsed else None
            except MathTimeout:
                logger.warning("%s: parsing a gold solution timed out after %gs; example skipped", reward, timeout)
                golds[key] = None
            except Exception as e:  # an unparsable gold solution skips the example
                logger.debug("%s: gold solution could not be parsed: %s", reward, e)
                golds[key] = None
        gold = golds[key]
        if gold is None:
            grades.append(Grade(None, "[unparseable]", "[skipped]"))
            continue
        try:
            correct, answer_text = call_with_timeout(_check_answer, (checker, gold[0], content), timeout)
        except MathTimeout:
            logger.warning("%s: checking an answer timed out after %gs; scored as wrong", reward, timeout)
            correct, answer_text = False, "[timeout]"
        except Exception as e:  # an answer that breaks the checker is wrong
            logger.debug("%s: answer check failed: %s", reward, e)
            correct, answer_text = False, "[error]"
        grades.append(Grade(1.0 if correct else 0.0, gold[1], answer_text))
    return grades
