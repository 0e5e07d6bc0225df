"""open-r1's code rewards (`code`, `binary_code`, `code_format`, `ioi_code`), run in the local sandbox.

open-r1 sends the programs to remote services (E2B, MorphCloud, a router, piston workers); grpokit runs them on
this machine with `grpokit.rewards.sandbox` (see its docstring for the boundary, the limits and what they
guarantee), and refuses the remote providers with a one-line error when the reward is built. Building `code`,
`binary_code` or `ioi_code` also checks that the sandbox can be set up here (bubblewrap installed and able to create
namespaces): otherwise one line says what is missing, before any model loads. The factories' keyword-only
parameters carry open-r1's config field names, so a training config offers its values to them.

How a completion is scored: the code is the last fenced block in the language (```` ```python ````) of the last
assistant message (or of the text); a completion without one scores 0.0. Each test feeds its `input` on stdin; it
passes when the program exits with code 0 and its stdout equals the expected `output` line by line, each line
stripped of surrounding whitespace, after stripping the whole text. Deviation from open-r1, on purpose: the number
of lines must match too (open-r1 compares the common prefix of lines only, so a program printing just the first of
three expected lines passes there). A row without test cases gives `None` (skipped, as TRL does).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from . import sandbox
from ._common import RewardCallable, _message_text, check_int, column, completion_texts

_REMOTE_CODE_PROVIDERS = ("e2b", "morph", "router")
_REMOTE_IOI_PROVIDERS = ("piston", "morph")
_BINARY_THRESHOLD = 0.99  # open-r1's: binary_code is 1.0 above this pass fraction


# ---------------------------------------------------------------------------------------------------- arguments


def _remote_refusal(setting: str, value: Any, service: str, use: str) -> ValueError:
    return ValueError(
        f"{setting}={value!r} needs a remote {service}, which grpokit does not call (offline-first); use {use}"
    )


def _check_code_provider(code_provider: Any, e2b_router_url: Any, morph_router_url: Any) -> None:
    if code_provider != "local":
        if code_provider in _REMOTE_CODE_PROVIDERS:
            raise _remote_refusal("code_provider", code_provider, "sandbox service", "code_provider: local")
        raise ValueError(f"code_provider={code_provider!r} is not a code provider; use code_provider: local")
    for name, url in (("e2b_router_url", e2b_router_url), ("morph_router_url", morph_router_url)):
        if url is not None:
            raise _remote_refusal(name, url, "sandbox service", f"code_provider: local and no {name}")


def _limits(owner: str, timeout: Any, memory_mb: Any, max_output_bytes: Any, disk_mb: Any) -> dict[str, Any]:
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout < float("inf"):
        raise ValueError(f"{owner}: `timeout` must be a positive number of seconds, got {timeout!r}")
    if memory_mb is not None:
        check_int(owner, "memory_mb", memory_mb, 1)
    check_int(owner, "max_output_bytes", max_output_bytes, 1)
    check_int(owner, "disk_mb", disk_mb, 1)
    return {
        "timeout": float(timeout),
        "memory_mb": memory_mb,
        "max_output_bytes": max_output_bytes,
        "disk_mb": disk_mb,
    }


def _check_batch_size(owner: str, value: Any) -> int:
    if value == -1 and not isinstance(value, bool):
        return -1
    return check_int(owner, "code_eval_test_batch_size", value, 1)


# ---------------------------------------------------------------------------------------------------- completions


def _last_message_texts(completions: Any, reward: str) -> list[str]:
    """The text of each completion: a string as is; of a message list, the last assistant message (else the last)."""
    texts = completion_texts(completions, reward)  # checks the shape; reads first messages
    for i, completion in enumerate(completions):
        if isinstance(completion, Sequence) and not isinstance(completion, str) and len(completion) > 1:
            assistant = [m for m in completion if isinstance(m, Mapping) and m.get("role") == "assistant"]
            texts[i] = _message_text(assistant[-1] if assistant else completion[-1], reward)
    return texts


def extract_code(text: str, language: str = "python") -> str:
    """The last ```` ```language ```` fenced block of `text`, or "" when there is none.

    >>> extract_code("first\\n```python\\nprint(1)\\n```\\nthen\\n```python\\nprint(2)\\n```")
    'print(2)\\n'
    >>> extract_code("```cpp\\nint main() {}\\n```")
    ''
    """
    matches = re.findall(rf"```{re.escape(language)}\n(.*?)```", text, re.DOTALL)
    return matches[-1] if matches else ""


def outputs_match(actual: str, expected: str) -> bool:
    """Whether stdout equals the expected output, line by line, each line and the whole text stripped.

    >>> outputs_match("1 2  \\n3\\n\\n", "1 2\\n3")
    True
    >>> outputs_match("1 2\\n", "1 2\\n3")
    False
    """
    return [line.strip() for line in actual.strip().split("\n")] == [
        line.strip() for line in expected.strip().split("\n")
    ]


# ---------------------------------------------------------------------------------------------------- running tests


def _run_tests(
    programs: list[str],
    tests: list[list[tuple[str, str]]],
    *,
    stop_early: bool,
    batch_size: int,
    workers: int,
    limits: Mapping[str, Any],
) -> list[list[bool]]:
    """Run each program on its tests; which tests passed (tests never run count as failed).

    Every round runs, for each program still going, its next batch of `batch_size` tests (-1: all), all programs'
    batches together on `workers` subprocesses. With `stop_early`, a program stops after a batch with a failure
    (its score is then known); otherwise every test runs.
    """
    passed = [[False] * len(t) for t in tests]
    done = [0] * len(programs)
    active = [i for i, program in enumerate(programs) if program and tests[i]]
    while active:
        jobs, owners = [], []
        for i in active:
            size = len(tests[i]) if batch_size == -1 or not stop_early else batch_size
            for j in range(done[i], min(done[i] + size, len(tests[i]))):
                jobs.append({"source": programs[i], "stdin": tests[i][j][0], **limits})
                owners.append((i, j))
        results = sandbox.run_many(jobs, workers=workers)
        failed = set()
        for (i, j), result in zip(owners, results, strict=True):
            passed[i][j] = result.status == "ok" and outputs_match(result.stdout, tests[i][j][1])
            if not passed[i][j]:
                failed.add(i)
            done[i] = max(done[i], j + 1)
        active = [i for i in active if done[i] < len(tests[i]) and not (stop_early and i in failed)]
    return passed


def _test_cases(info: Any, reward: str) -> tuple[str | None, list[tuple[str, str]]]:
    """(language, [(input, output), ...]) of one `verification_info` value (a mapping or its JSON text)."""
    if isinstance(info, str):
        try:
            info = json.loads(info)
        except json.JSONDecodeError as e:
            raise ValueError(f"{reward}: a `verification_info` string must be JSON, got {info!r:.80}") from e
    if not isinstance(info, Mapping):
        raise ValueError(
            f"{reward}: each `verification_info` must be a mapping with 'test_cases' (and 'language'), "
            f"got {type(info).__name__}"
        )
    cases = info.get("test_cases")
    if cases is None:
        cases = []
    if isinstance(cases, str) or not isinstance(cases, Sequence):
        raise ValueError(f"{reward}: `verification_info['test_cases']` must be a list, got {type(cases).__name__}")
    return info.get("language"), [_case(case, reward) for case in cases]


def _case(case: Any, reward: str) -> tuple[str, str]:
    if isinstance(case, Mapping):
        stdin, expected = case.get("input"), case.get("output")
    elif isinstance(case, Sequence) and not isinstance(case, str) and len(case) == 2:
        stdin, expected = case
    else:
        stdin = expected = None
    if not isinstance(stdin, str) or not isinstance(expected, str):
        raise ValueError(
            f"{reward}: a test case must be {{'input': str, 'output': str}} or an [input, output] pair, got "
            f"{case!r:.80}"
        )
    return stdin, expected


# ------------------------------------------------------------------------------------------------ code, binary_code


class _CodeReward(RewardCallable):
    def __init__(self, name: str, *, binary: bool, batch_size: int, workers: int, limits: dict[str, Any]):
        super().__init__(name, **({"code_eval_test_batch_size": batch_size} if binary else {}))
        self.params.update(parallel_code_exec_per_proc=workers, **limits)
        self.binary = binary
        self.batch_size = batch_size
        self.workers = workers
        self.limits = limits

    def __call__(
        self, completions: list | None = None, verification_info: Sequence | None = None, **kwargs: Any
    ) -> list[float | None]:
        name = self.__name__
        texts = _last_message_texts(completions, name)
        infos = column(verification_info, "verification_info", len(texts), name)
        programs, tests = [], []
        for text, info in zip(texts, infos, strict=True):
            language, cases = _test_cases(info, name)
            language = sandbox.check_language("python" if language is None else language, name)
            programs.append(extract_code(text, language))
            tests.append(cases)
        passed = _run_tests(
            programs,
            tests,
            stop_early=self.binary,
            batch_size=self.batch_size,
            workers=self.workers,
            limits=self.limits,
        )
        rewards: list[float | None] = []
        for results in passed:
            if not results:
                rewards.append(None)
                continue
            fraction = sum(results) / len(results)
            rewards.append((1.0 if fraction > _BINARY_THRESHOLD else 0.0) if self.binary else fraction)
        return rewards


def code(
    *,
    code_provider: str = "local",
    parallel_code_exec_per_proc: int = 2,
    e2b_router_url: str | None = None,
    morph_router_url: str | None = None,
    timeout: float = sandbox.DEFAULT_TIMEOUT,
    memory_mb: int | None = sandbox.DEFAULT_MEMORY_MB,
    max_output_bytes: int = sandbox.DEFAULT_MAX_OUTPUT_BYTES,
    disk_mb: int = sandbox.DEFAULT_DISK_MB,
) -> Callable[..., list[float | None]]:
    """Factory of open-r1's `code` reward: the fraction of the row's test cases the completion's program passes.

    Needs a `verification_info` column: `{"language": "python", "test_cases": [{"input": ..., "output": ...}]}` per
    row (as in open-r1/verifiable-coding-problems-python; a JSON string of it also works). The program is the last
    ```` ```python ```` block of the completion (0.0 without one); every test runs, since the score counts them all.
    A row with no test cases gives None; a row whose language is not Python raises ValueError.

    code_provider: "local" (this machine's sandbox); open-r1's "e2b", "morph" (and routers, `e2b_router_url`,
        `morph_router_url`) are remote services, refused when the reward is built.
    parallel_code_exec_per_proc: programs run at once (subprocesses).
    timeout: wall-clock seconds per test (also the CPU limit, rounded up); memory_mb: memory limit per program
        (its address space, and with a memory cgroup all it makes the kernel hold; None: none); max_output_bytes:
        stdout/stderr cap per program (more fails the test); disk_mb: its working directory's size, all files
        together.

    >>> reward = code(timeout=5)
    >>> tests = [{"input": "1 2\\n", "output": "3\\n"}, {"input": "2 2\\n", "output": "4"}]
    >>> completion = "```python\\na, b = map(int, input().split())\\nprint(a + b)\\n```"
    >>> reward([completion, "no code"], verification_info=[{"language": "python", "test_cases": tests}] * 2)
    [1.0, 0.0]
    """
    _check_code_provider(code_provider, e2b_router_url, morph_router_url)
    workers = check_int("code", "parallel_code_exec_per_proc", parallel_code_exec_per_proc, 1)
    limits = _limits("code", timeout, memory_mb, max_output_bytes, disk_mb)
    sandbox.check_boundary("code")  # last: a setting's own mistake is said first
    return _CodeReward("code", binary=False, batch_size=-1, workers=workers, limits=limits)


def binary_code(
    *,
    code_provider: str = "local",
    code_eval_test_batch_size: int = 1,
    parallel_code_exec_per_proc: int = 2,
    e2b_router_url: str | None = None,
    morph_router_url: str | None = None,
    timeout: float = sandbox.DEFAULT_TIMEOUT,
    memory_mb: int | None = sandbox.DEFAULT_MEMORY_MB,
    max_output_bytes: int = sandbox.DEFAULT_MAX_OUTPUT_BYTES,
    disk_mb: int = sandbox.DEFAULT_DISK_MB,
) -> Callable[..., list[float | None]]:
    """Factory of open-r1's `binary_code` reward: 1.0 when the program passes more than 99% of the row's test
    cases (in practice: all of them), else 0.0.

    Same data, extraction and parameters as `code`. code_eval_test_batch_size: a program's tests run in batches of
    this size (-1: all at once); after a batch with a failure the rest is skipped, the score being 0.0 already.

    >>> reward = binary_code(timeout=5)
    >>> info = {"test_cases": [{"input": "", "output": "1"}, {"input": "", "output": "2"}]}
    >>> reward(["```python\\nprint(1)\\n```"], verification_info=[info])  # passes 1 of 2 tests
    [0.0]
    """
    _check_code_provider(code_provider, e2b_router_url, morph_router_url)
    batch_size = _check_batch_size("binary_code", code_eval_test_batch_size)
    workers = check_int("binary_code", "parallel_code_exec_per_proc", parallel_code_exec_per_proc, 1)
    limits = _limits("binary_code", timeout, memory_mb, max_output_bytes, disk_mb)
    sandbox.check_boundary("binary_code")  # last: a setting's own mistake is said first
    return _CodeReward("binary_code", binary=True, batch_size=batch_size, workers=workers, limits=limits)


# ---------------------------------------------------------------------------------------------------- code_format


class _CodeFormat(RewardCallable):
    def __init__(self, language: str):
        super().__init__("code_format", code_language=language)
        self.language = language

    def __call__(
        self, completions: list | None = None, language: Sequence | None = None, **kwargs: Any
    ) -> list[float]:
        texts = completion_texts(completions, self.__name__)
        n = len(texts)
        languages = [self.language] * n if language is None else column(language, "language", n, self.__name__)
        rewards = []
        for text, lang in zip(texts, languages, strict=True):
            pattern = rf"^<think>\n.*?\n</think>\n<answer>\n.*?```{re.escape(str(lang))}.*?```.*?\n</answer>$"
            rewards.append(1.0 if re.match(pattern, text, re.DOTALL | re.MULTILINE) else 0.0)
        return rewards


def code_format(*, code_language: str = "python") -> Callable[..., list[float]]:
    """Factory of open-r1's `code_format` reward: 1.0 for `<think>\\n...\\n</think>\\n<answer>\\n...\\n</answer>` whose
    answer holds a ```` ```code_language ```` fenced block, else 0.0.

    As open-r1: the first message of a conversational completion is read, the match starts at the beginning and
    `</answer>` must end a line; a `language` column, when the dataset has one, overrides `code_language` per row.
    Runs no code (any language).

    >>> fmt = code_format()
    >>> good = "<think>\\nplan\\n</think>\\n<answer>\\n```python\\nprint(1)\\n```\\n</answer>"
    >>> fmt([good, good.replace("python", "cpp"), "```python\\nprint(1)\\n```"])
    [1.0, 0.0, 0.0]
    """
    if not isinstance(code_language, str) or not code_language:
        raise ValueError(f"code_format: `code_language` must be a non-empty string, got {code_language!r}")
    return _CodeFormat(code_language)


# ---------------------------------------------------------------------------------------------------- ioi_code


class _IOICode(RewardCallable):
    def __init__(self, language: str, batch_size: int, workers: int, limits: dict[str, Any]):
        super().__init__(
            "ioi_code",
            ioi_provider="local",
            code_language=language,
            code_eval_test_batch_size=batch_size,
            parallel_code_exec_per_proc=workers,
            **limits,
        )
        self.language = language
        self.batch_size = batch_size
        self.workers = workers
        self.limits = limits

    def __call__(self, completions: list | None = None, **kwargs: Any) -> list[float | None]:
        name = self.__name__
        texts = _last_message_texts(completions, name)
        n = len(texts)
        if kwargs.get("test_cases") is None:
            raise ValueError(
                f"{name}: ioi_provider='local' needs a `test_cases` column (each subtask's tests inline, as "
                "[input, output] pairs); open-r1 loads them from the Hub, which grpokit does not do (offline-first)"
            )
        all_cases = column(kwargs["test_cases"], "test_cases", n, name)
        names = kwargs.get("test_names")
        names = column(names, "test_names", n, name) if names is not None else [None] * n
        graders = kwargs.get("grader_files")
        graders = column(graders, "grader_files", n, name) if graders is not None else [None] * n
        ids = kwargs.get("id")
        ids = column(ids, "id", n, name) if ids is not None else list(range(n))
        tests = []
        for cases, test_names, grader_files, problem in zip(all_cases, names, graders, ids, strict=True):
            if grader_files and any(_grader_content(f) for f in grader_files):
                raise ValueError(
                    f"{name}: problem {problem!r} needs its grader files (`grader_files`), which the local sandbox "
                    "cannot run; ioi_provider: local scores stdin/stdout problems only"
                )
            tests.append(_subtask_cases(cases, test_names, name))
        programs = [extract_code(text, self.language) for text in texts]
        passed = _run_tests(
            programs, tests, stop_early=True, batch_size=self.batch_size, workers=self.workers, limits=self.limits
        )
        return [None if not results else 1.0 if all(results) else 0.0 for results in passed]


def _grader_content(entry: Any) -> Any:
    if isinstance(entry, Mapping):
        return entry.get("content")
    if isinstance(entry, Sequence) and not isinstance(entry, str) and len(entry) == 2:
        return entry[1]
    return entry


def _subtask_cases(cases: Any, test_names: Any, reward: str) -> list[tuple[str, str]]:
    """A subtask's tests: a list of cases, or a mapping test name -> case narrowed to `test_names` when given."""
    if isinstance(cases, Mapping):
        keys = list(cases) if test_names is None else list(test_names)
        missing = [key for key in keys if key not in cases]
        if missing:
            raise ValueError(f"{reward}: `test_cases` has no test named {missing[0]!r}")
        cases = [cases[key] for key in keys]
    if cases is None:
        cases = []
    if isinstance(cases, str) or not isinstance(cases, Sequence):
        raise ValueError(f"{reward}: `test_cases` values must be lists or mappings, got {type(cases).__name__}")
    return [_case(case, reward) for case in cases]


def ioi_code(
    *,
    ioi_provider: str = "piston",
    code_language: str = "python",
    code_eval_test_batch_size: int = 1,
    parallel_code_exec_per_proc: int = 2,
    timeout: float = sandbox.DEFAULT_TIMEOUT,
    memory_mb: int | None = sandbox.DEFAULT_MEMORY_MB,
    max_output_bytes: int = sandbox.DEFAULT_MAX_OUTPUT_BYTES,
    disk_mb: int = sandbox.DEFAULT_DISK_MB,
) -> Callable[..., list[float | None]]:
    """Factory of open-r1's `ioi_code` reward: an IOI subtask's score, 1.0 when the program passes all its tests,
    else 0.0 (open-r1's subtask score, the minimum over its tests, with pass/fail tests).

    ioi_provider: open-r1's "piston" (its default, kept here) and "morph" are remote workers, refused when the
        reward is built; "local" runs the subtask's stdin/stdout tests in this machine's sandbox.
    Local needs the tests inline: a `test_cases` column whose rows are lists of `[input, output]` pairs (or
    `{"input", "output"}` mappings), or mappings test name -> pair narrowed by a `test_names` column. Problems that
    need grader files (a non-empty `grader_files` column, as real IOI problems in C++ do) are refused with a
    ValueError. The program is the last ```` ```code_language ```` block, which must be Python locally.
    code_eval_test_batch_size: tests run in batches of this size (-1: all at once), stopping after a batch with a
    failure; the other parameters are those of `code`.

    >>> reward = ioi_code(ioi_provider="local", timeout=5)
    >>> reward(["```python\\nprint(int(input()) * 2)\\n```"], test_cases=[[["3", "6"], ["5", "10"]]])
    [1.0]
    """
    if ioi_provider != "local":
        if ioi_provider in _REMOTE_IOI_PROVIDERS:
            service = "piston worker" if ioi_provider == "piston" else "sandbox service"
            raise _remote_refusal("ioi_provider", ioi_provider, service, "ioi_provider: local")
        raise ValueError(f"ioi_provider={ioi_provider!r} is not an IOI provider; use ioi_provider: local")
    sandbox.check_language(code_language, "ioi_code")
    batch_size = _check_batch_size("ioi_code", code_eval_test_batch_size)
    workers = check_int("ioi_code", "parallel_code_exec_per_proc", parallel_code_exec_per_proc, 1)
    limits = _limits("ioi_code", timeout, memory_mb, max_output_bytes, disk_mb)
    sandbox.check_boundary("ioi_code")
    return _IOICode(code_language, batch_size, workers, limits)
