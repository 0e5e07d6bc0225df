"""open-r1's code rewards (`code`, `binary_code`, `code_format`, `ioi_code`) on the local sandbox.

Expected values are worked out by hand from the test cases in each test. Limits are short (1-2 s).
"""

from __future__ import annotations

import doctest
import json
import pickle

import pytest

import grpokit.rewards as R
from grpokit.rewards import code_rewards, sandbox
from grpokit.rewards.code_rewards import binary_code, code, code_format, ioi_code

ADD = "a, b = map(int, input().split())\nprint(a + b)\n"
# The program ADD gets the first two right (1+2=3, 2+2=4) and the third wrong (5+5=10, not 11): 2 of 3.
TWO_OF_THREE = {
    "language": "python",
    "test_cases": [
        {"input": "1 2\n", "output": "3\n", "type": "stdin_stdout"},
        {"input": "2 2\n", "output": "4", "type": "stdin_stdout"},
        {"input": "5 5\n", "output": "11\n", "type": "stdin_stdout"},
    ],
}
ALL_THREE = {"language": "python", "test_cases": [*TWO_OF_THREE["test_cases"][:2], {"input": "5 5", "output": "10"}]}


def fenced(source: str, language: str = "python") -> str:
    return f"Here is my solution.\n```{language}\n{source}```\nDone."


def conversational(text: str) -> list[dict]:
    return [{"role": "assistant", "content": text}]


# ------------------------------------------------------------------------------------------------ code, binary_code


@pytest.mark.parametrize("fmt", ["standard", "conversational"])
def test_code_is_the_fraction_of_tests_passed(fmt):
    completion = fenced(ADD)
    completions = [completion, completion] if fmt == "standard" else [conversational(completion)] * 2
    rewards = code(timeout=2)(completions=completions, verification_info=[TWO_OF_THREE, ALL_THREE])
    assert rewards == [2 / 3, 1.0]


def test_binary_code_is_one_only_when_all_tests_pass():
    reward = binary_code(timeout=2)
    assert reward(completions=[fenced(ADD)] * 2, verification_info=[TWO_OF_THREE, ALL_THREE]) == [0.0, 1.0]


@pytest.mark.parametrize(
    "source",
    [
        "print(0)\n",  # wrong output on every test
        "raise ValueError('boom')\n",  # raises
        "while True:\n    pass\n",  # never ends: killed at the timeout
        "x = bytearray(2 * 1024**3)\nprint(3)\n",  # over the memory limit
        "import socket\nsocket.create_connection(('127.0.0.1', 80))\n",  # refused
        "print(3)\nprint('x' * 10_000)\n",  # over the output cap
    ],
    ids=["wrong", "raises", "loops", "memory", "socket", "output"],
)
def test_failing_programs_score_zero(source):
    info = {"test_cases": [{"input": "1 2\n", "output": "3"}]}
    reward = code(timeout=1, memory_mb=256, max_output_bytes=1000)
    assert reward(completions=[fenced(source)], verification_info=[info]) == [0.0]


def test_completion_without_code_scores_zero_and_is_not_run(monkeypatch):
    calls = []
    monkeypatch.setattr(sandbox, "run_many", lambda jobs, **kw: calls.append(jobs) or [])
    texts = ["no code at all", "```\nprint(3)\n```", fenced("print(3)\n", "cpp")]
    assert code()(completions=texts, verification_info=[TWO_OF_THREE] * 3) == [0.0, 0.0, 0.0]
    assert calls == []


def test_the_last_python_block_of_the_last_assistant_message_is_run():
    conversation = [
        {"role": "assistant", "content": fenced("print(0)\n")},
        {"role": "user", "content": "try again"},
        {"role": "assistant", "content": fenced("print(1)\n") + "\nor better:\n" + fenced(ADD)},
        {"role": "tool", "content": "irrelevant"},
    ]
    assert code(timeout=2)(completions=[conversation], verification_info=[ALL_THREE]) == [1.0]


def test_output_comparison_strips_lines_but_needs_every_line():
    info = {"test_cases": [{"input": "", "output": "1 2\n3\n"}]}
    reward = code(timeout=2)
    sources = [
        "print('  1 2   ')\nprint('3')\nprint()\nprint()\n",  # surrounding whitespace, blank lines at the end
        "print('1 2')\n",  # a missing line (open-r1 would pass it: it compares the common lines only)
        "print('1 2')\nprint('3')\nprint('4')\n",  # an extra line
        "print('1  2')\nprint('3')\n",  # whitespace inside a line matters
    ]
    assert reward(completions=[fenced(s) for s in sources], verification_info=[info] * 4) == [1.0, 0.0, 0.0, 0.0]


def test_verification_info_as_json_and_rows_without_tests():
    reward = code(timeout=2)
    infos = [json.dumps(ALL_THREE), {"language": "python", "test_cases": []}, {"language": "python"}]
    assert reward(completions=[fenced(ADD)] * 3, verification_info=infos) == [1.0, None, None]


def test_pairs_are_accepted_as_test_cases():
    info = {"test_cases": [["1 2", "3"], ["2 2", "5"]]}
    assert code(timeout=2)(completions=[fenced(ADD)], verification_info=[info]) == [0.5]


@pytest.mark.parametrize(
    ("info", "message"),
    [
        ({"language": "cpp", "test_cases": []}, "code: language 'cpp' cannot run in the local sandbox"),
        ("{not json", "must be JSON"),
        (["1", "2"], "must be a mapping"),
        ({"test_cases": "1 2"}, r"\['test_cases'\]` must be a list"),
        ({"test_cases": [{"input": "1"}]}, "a test case must be"),
    ],
)
def test_bad_verification_info(info, message):
    with pytest.raises(ValueError, match=message):
        code()(completions=[fenced(ADD)], verification_info=[info])


def test_missing_or_misaligned_column():
    with pytest.raises(ValueError, match="needs a `verification_info` column"):
        code()(completions=[fenced(ADD)])
    with pytest.raises(ValueError, match="got 2 `verification_info` values for 1 completions"):
        code()(completions=[fenced(ADD)], verification_info=[ALL_THREE] * 2)


def test_parallel_results_come_back_in_completion_order():
    # Programs of different speeds and results; 4 at a time.
    sources = [f"import time\ntime.sleep({0.3 if i % 2 == 0 else 0})\nprint({i})\n" for i in range(6)]
    info = [{"test_cases": [{"input": "", "output": "2"}, {"input": "", "output": "2"}]}] * 6
    reward = code(parallel_code_exec_per_proc=4, timeout=2)
    assert reward(completions=[fenced(s) for s in sources], verification_info=info) == [0, 0, 1.0, 0, 0, 0]


def test_batches_stop_early_for_binary_code_only(monkeypatch):
    batches = []
    real_run_many = sandbox.run_many

    def recording_run_many(jobs, workers):
        batches.append(len(jobs))
        return real_run_many(jobs, workers=workers)

    monkeypatch.setattr(sandbox, "run_many", recording_run_many)
    # ADD fails the first of these four tests, passes the others.
    info = {"test_cases": [["1 1", "3"], ["1 2", "3"], ["2 2", "4"], ["2 3", "5"]]}
    one_by_one, three_by_three = binary_code(timeout=2), binary_code(code_eval_test_batch_size=3, timeout=2)
    assert one_by_one(completions=[fenced(ADD)], verification_info=[info]) == [0.0]
    assert batches == [1]  # stopped after the first test
    batches.clear()
    assert three_by_three(completions=[fenced(ADD)], verification_info=[info]) == [0.0]
    assert batches == [3]
    batches.clear()
    assert binary_code(timeout=2)(completions=[fenced(ADD)], verification_info=[ALL_THREE]) == [1.0]
    assert batches == [1, 1, 1]  # every test passes: all run, one at a time
    batches.clear()
    assert code(timeout=2)(completions=[fenced(ADD)], verification_info=[info]) == [0.75]
    assert batches == [4]  # the fraction needs every test


# ------------------------------------------------------------------------------------------------ providers


REMOTE = "needs a remote sandbox service, which grpokit does not call (offline-first); use code_provider: local"


@pytest.mark.parametrize("factory", [code, binary_code])
@pytest.mark.parametrize("provider", ["e2b", "morph", "router"])
def test_remote_code_providers_are_refused(factory, provider):
    with pytest.raises(ValueError) as info:
        factory(code_provider=provider)
    assert str(info.value) == f"code_provider={provider!r} {REMOTE}"


def test_exact_refusal_line_and_other_provider_settings():
    with pytest.raises(ValueError) as info:
        code(code_provider="e2b")
    assert str(info.value) == (
        "code_provider='e2b' needs a remote sandbox service, which grpokit does not call (offline-first); "
        "use code_provider: local"
    )
    with pytest.raises(ValueError, match=r"^e2b_router_url='http://r:8000' needs a remote sandbox service"):
        code(e2b_router_url="http://r:8000")
    with pytest.raises(ValueError, match=r"^morph_router_url='http://m' needs a remote"):
        binary_code(morph_router_url="http://m")
    with pytest.raises(ValueError, match=r"^code_provider='locla' is not a code provider; use code_provider: local$"):
        code(code_provider="locla")


def test_refusal_through_the_config_defaults():
    """The config layer offers its code fields to the factories; a remote provider is one line at validation."""
    assert R.check_reward_spec("code", defaults={"code_provider": "e2b"}) == f"code_provider='e2b' {REMOTE}"
    offered = {"code_provider": "local", "code_eval_test_batch_size": 2, "code_eval_scoring_mode": "weighted_sum"}
    assert R.check_reward_spec("binary_code", defaults=offered) is None
    assert R.check_reward_spec("ioi_code", defaults={"ioi_provider": "piston"}) == (
        "ioi_provider='piston' needs a remote piston worker, which grpokit does not call (offline-first); "
        "use ioi_provider: local"
    )


@pytest.mark.parametrize(
    ("factory", "kwargs", "message"),
    [
        (code, {"timeout": 0}, "code: `timeout` must be a positive number"),
        (code, {"memory_mb": 0}, "code: `memory_mb` must be an int >= 1"),
        (code, {"max_output_bytes": 1.5}, "`max_output_bytes` must be an int"),
        (code, {"parallel_code_exec_per_proc": 0}, "`parallel_code_exec_per_proc` must be an int >= 1"),
        (binary_code, {"code_eval_test_batch_size": 0}, "`code_eval_test_batch_size` must be an int >= 1"),
        (ioi_code, {"ioi_provider": "local", "code_language": "cpp"}, "ioi_code: language 'cpp' cannot run"),
        (ioi_code, {"ioi_provider": "morph"}, "^ioi_provider='morph' needs a remote sandbox service"),
        (ioi_code, {"ioi_provider": "pistn"}, "is not an IOI provider"),
        (code_format, {"code_language": ""}, "non-empty string"),
    ],
)
def test_bad_factory_arguments(factory, kwargs, message):
    with pytest.raises(ValueError, match=message):
        factory(**kwargs)


def test_registry_and_pickling():
    for name in ("code", "binary_code", "code_format", "ioi_code"):
        assert name in R.REWARD_FACTORIES and name not in R.MATH_REWARD_NAMES
    reward = R.resolve_reward({"name": "code", "kwargs": {"timeout": 2}})
    assert reward.__name__ == "code"
    copy = pickle.loads(pickle.dumps(reward))
    assert copy(completions=[fenced(ADD)], verification_info=[TWO_OF_THREE]) == [2 / 3]


# ------------------------------------------------------------------------------------------------ code_format


def test_code_format():
    good = "<think>\nI add them.\n</think>\n<answer>\nSolution:\n```python\nprint(1)\n```\n</answer>"
    texts = [
        good,  # 1.0
        good.replace("```python", "```cpp"),  # wrong language: 0.0
        good.replace("<think>\n", "<think>"),  # no newline after <think>: 0.0
        "```python\nprint(1)\n```",  # no tags: 0.0
        good + "\ntrailing text",  # </answer> ends a line, text may follow (MULTILINE, as open-r1): 1.0
        "<think>\nx\n</think>\n<answer>\nno code\n</answer>",  # no fenced block: 0.0
    ]
    assert code_format()(completions=texts) == [1.0, 0.0, 0.0, 0.0, 1.0, 0.0]
    assert code_format(code_language="cpp")(completions=texts[:2]) == [0.0, 1.0]
    # A `language` column overrides code_language per row; conversational completions read their first message.
    reward = code_format()
    assert reward(completions=[conversational(t) for t in texts[:2]], language=["cpp", "cpp"]) == [0.0, 1.0]


# ------------------------------------------------------------------------------------------------ ioi_code


def test_ioi_code_local_scores_a_subtask():
    reward = ioi_code(ioi_provider="local", timeout=2)
    double = fenced("print(int(input()) * 2)\n")
    cases = [[["3", "6"], ["5", "10"]], [["3", "6"], ["5", "11"]], []]
    assert reward(completions=[double] * 3, test_cases=cases, grader_files=[[], [["grader.cpp", ""]], None]) == [
        1.0,  # every test passes
        0.0,  # one fails: the subtask's score is its minimum
        None,  # no tests
    ]
    named = [{"t1": {"input": "3", "output": "6"}, "t2": {"input": "5", "output": "11"}}]
    assert reward(completions=[double], test_cases=named, test_names=[["t1"]]) == [1.0]
    assert reward(completions=[double], test_cases=named) == [0.0]
    assert reward(completions=["no code"], test_cases=[[["3", "6"]]]) == [0.0]


def test_ioi_code_local_refuses_what_it_cannot_run():
    reward = ioi_code(ioi_provider="local")
    with pytest.raises(ValueError, match="needs a `test_cases` column"):
        reward(completions=[fenced("print(1)\n")], id=["nile"])
    with pytest.raises(ValueError, match=r"problem 'nile' needs its grader files .* stdin/stdout problems only"):
        reward(
            completions=[fenced("print(1)\n")],
            id=["nile"],
            test_cases=[[["1", "1"]]],
            grader_files=[[["graders/grader.cpp", "int main() {}"]]],
        )
    with pytest.raises(ValueError, match="has no test named 't9'"):
        reward(completions=[fenced("print(1)\n")], test_cases=[{"t1": ["1", "1"]}], test_names=[["t9"]])


def test_ioi_code_default_provider_is_refused_with_one_line():
    with pytest.raises(ValueError) as info:
        ioi_code()
    assert str(info.value) == (
        "ioi_provider='piston' needs a remote piston worker, which grpokit does not call (offline-first); "
        "use ioi_provider: local"
    )


def test_docstring_examples():
    failures, attempted = doctest.testmod(code_rewards)
    assert attempted and not failures
