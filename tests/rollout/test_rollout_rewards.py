"""Reward calling: None becomes NaN, async functions run together, failures name the function and the sample."""

import asyncio
import math
import threading
import time

import numpy as np
import pytest
import torch

from grpokit.rollout.rewards import RewardError, RewardFunctions, build_reward_functions, column_values

PROMPTS = ["p0", "p0", "p1", "p1"]
COMPLETIONS = ["a", "bb", "ccc", "dddd"]
IDS = [[10], [11, 11], [12, 12, 12], [13, 13, 13, 13]]


def call(funcs, **kwargs):
    return RewardFunctions(funcs)(PROMPTS, COMPLETIONS, IDS, **kwargs)


def test_none_becomes_nan_and_columns_arrive_as_keywords():
    def lengths(prompts, completions, completion_ids, solution, trainer_state, **kwargs):
        assert solution == ["s0", "s0", "s1", "s1"] and trainer_state == "state"
        assert [len(ids) for ids in completion_ids] == [1, 2, 3, 4]
        return [float(len(c)) for c in completions]

    def partial_opinion(completions, **kwargs):
        return [1, None, 2.5, True]  # ints and bools count as numbers, as in TRL

    rewards = call(
        [lengths, partial_opinion],
        columns={"solution": ["s0", "s0", "s1", "s1"], "prompt": "x"},
        trainer_state="state",
    )
    assert rewards.shape == (4, 2) and rewards.dtype == torch.float32
    assert rewards[:, 0].tolist() == [1.0, 2.0, 3.0, 4.0]
    assert rewards[0, 1] == 1.0 and math.isnan(rewards[1, 1]) and rewards[2, 1] == 2.5 and rewards[3, 1] == 1.0


def test_async_functions_run_concurrently():
    async def slow_a(completions, **kwargs):
        await asyncio.sleep(0.3)
        return [1.0] * len(completions)

    async def slow_b(completions, **kwargs):
        await asyncio.sleep(0.3)
        return [None, 2.0, 2.0, 2.0]

    start = time.perf_counter()
    rewards = call([slow_a, lambda completions, **kw: [0.5] * 4, slow_b])
    assert time.perf_counter() - start < 0.55  # one sleep, not two
    assert rewards[:, 0].tolist() == [1.0] * 4 and rewards[:, 1].tolist() == [0.5] * 4
    assert math.isnan(rewards[0, 2]) and rewards[1:, 2].tolist() == [2.0, 2.0, 2.0]


def test_async_functions_work_inside_a_running_event_loop():
    async def one(completions, **kwargs):
        return [1.0] * len(completions)

    async def main():  # e.g. a notebook, where the caller already runs an event loop
        return call([one])

    assert asyncio.run(main()).tolist() == [[1.0]] * 4


def test_a_raising_function_is_named_with_the_failing_sample():
    def fussy(prompts, completions, **kwargs):
        return [1.0 / (len(c) - 3) for c in completions]  # the "ccc" sample divides by zero

    with pytest.raises(RewardError) as error:
        call([fussy])
    assert str(error.value).startswith(
        "reward function 'fussy' raised ZeroDivisionError: float division by zero on sample 2 (prompt='p1', "
        "completion='ccc')"
    )


def test_a_failure_of_the_whole_batch_is_reported_as_such():
    def needs_one(completions, **kwargs):
        if len(completions) > 1:
            raise RuntimeError("batch too large")
        return [0.0]

    with pytest.raises(RewardError, match=r"'needs_one' raised RuntimeError: batch too large on a batch of 4 .*alone"):
        call([needs_one])


def test_a_raising_async_function_is_named_too():
    async def remote_judge(completions, **kwargs):
        if "dddd" in completions:
            raise ConnectionError("judge is down")
        return [0.0] * len(completions)

    with pytest.raises(RewardError, match=r"'remote_judge' raised ConnectionError: judge is down on sample 3"):
        call([remote_judge])


def test_wrong_length_and_wrong_type_are_errors():
    with pytest.raises(RewardError, match=r"'short' returned 3 rewards for 4 completions.*sample 0 \(prompt='p0'"):

        def short(completions, **kwargs):
            return [0.0] * 3

        call([short])
    with pytest.raises(
        RewardError, match=r"'wordy' returned 'good' \(str\) for sample 1 \(prompt='p0', completion='bb'\)"
    ):

        def wordy(completions, **kwargs):
            return [0.0, "good", 0.0, 0.0]

        call([wordy])
    with pytest.raises(RewardError, match=r"'scalar' returned 1.0 \(float\); expected a list of 4"):

        def scalar(completions, **kwargs):
            return 1.0

        call([scalar])


def test_reward_model_scores_prompt_plus_completion(tiny_tokenizer):
    from grpokit.tiny import build_reward_model

    model = build_reward_model(tiny_tokenizer).eval()
    rewards = RewardFunctions([model], [tiny_tokenizer])(PROMPTS, COMPLETIONS, IDS)
    with torch.no_grad():
        expected = [
            model(**tiny_tokenizer([p + c], return_tensors="pt")).logits[0, 0].item()
            for p, c in zip(PROMPTS, COMPLETIONS, strict=True)
        ]
    assert rewards[:, 0].tolist() == pytest.approx(expected, abs=1e-5)  # right padding does not change the score


def test_build_resolves_built_in_names_and_checks_processing_classes():
    rewards = build_reward_functions(
        ["tag_count", {"name": "soft_overlong_punishment", "kwargs": {}}], max_completion_length=8
    )
    assert rewards.names[0] == "tag_count" and callable(rewards.funcs[1])
    with pytest.raises(ValueError, match="got 2 reward_processing_classes for 1 reward functions"):
        build_reward_functions([lambda **kw: []], [None, None])


def test_column_values_skip_reserved_columns():
    rows = [{"prompt": "a", "answer": 1, "completion": "x"}, {"prompt": "b", "answer": 2, "completion": "y"}]
    assert column_values(rows) == {"answer": [1, 2]}


# ---- faults: timeouts, infinite rewards, several processes


def test_a_hanging_sync_function_times_out_and_its_thread_is_left_running():
    release = threading.Event()

    def slow_reward(completions, **kwargs):
        release.wait(30)
        return [0.0] * len(completions)

    start = time.perf_counter()
    with pytest.raises(RewardError) as error:
        RewardFunctions([slow_reward], timeout=0.5)(PROMPTS, COMPLETIONS, IDS)
    assert 0.5 <= time.perf_counter() - start < 2.0
    assert str(error.value).startswith(
        "reward function 'slow_reward' did not return within 0.5 s (reward_timeout) on a batch of 4 completions; "
        "the batch starts with sample 0 (prompt='p0', completion='a')"
    )
    (worker,) = [t for t in threading.enumerate() if t.name == "grpokit-reward-0" and t.is_alive()]
    assert worker.daemon  # abandoned, still running; it cannot keep the process alive at exit
    release.set()
    worker.join(5)
    assert not worker.is_alive()


def test_within_the_timeout_a_sync_function_runs_in_a_worker_thread_with_the_callers_grad_mode():
    seen = []

    def quick(completions, **kwargs):
        seen.append((threading.current_thread().name, torch.is_grad_enabled()))
        return [1.0] * len(completions)

    with torch.no_grad():
        rewards = RewardFunctions([quick], timeout=5)(PROMPTS, COMPLETIONS, IDS)
    assert rewards[:, 0].tolist() == [1.0] * 4 and seen == [("grpokit-reward-0", False)]
    # Without a timeout it runs in the calling thread, as before.
    RewardFunctions([quick], timeout=None)(PROMPTS, COMPLETIONS, IDS)
    assert seen[-1][0] == threading.current_thread().name


def test_a_hanging_async_function_is_cancelled():
    cancelled = threading.Event()

    async def slow_judge(completions, **kwargs):
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return [0.0] * len(completions)

    async def quick_judge(completions, **kwargs):
        return [1.0] * len(completions)

    start = time.perf_counter()
    with pytest.raises(RewardError, match=r"^reward function 'slow_judge' did not return within 0.5 s \(reward_"):
        RewardFunctions([quick_judge, slow_judge], timeout=0.5)(PROMPTS, COMPLETIONS, IDS)
    assert time.perf_counter() - start < 2.0
    assert cancelled.wait(2)


def test_an_async_function_that_blocks_the_event_loop_still_times_out():
    async def blocking(completions, **kwargs):
        time.sleep(2.5)  # a sync call inside an async function: the loop cannot cancel it
        return [0.0] * len(completions)

    async def fine(completions, **kwargs):
        return [1.0] * len(completions)

    start = time.perf_counter()
    with pytest.raises(RewardError, match=r"'blocking' did not return within 0.2 s"):
        RewardFunctions([blocking], timeout=0.2)(PROMPTS, COMPLETIONS, IDS)
    assert time.perf_counter() - start < 2.0  # 0.2 s and the 1 s grace
    # The stuck loop is abandoned: the next call gets a fresh one.
    assert RewardFunctions([fine], timeout=1)(PROMPTS, COMPLETIONS, IDS)[:, 0].tolist() == [1.0] * 4


def test_a_hanging_reward_model_times_out(tiny_tokenizer, monkeypatch):
    from grpokit.tiny import build_reward_model

    model = build_reward_model(tiny_tokenizer).eval()
    monkeypatch.setattr(RewardFunctions, "_score_with_model", lambda *args: time.sleep(3))
    with pytest.raises(RewardError, match=r"^reward model '\w+' did not return within 0.3 s .* batch of 4"):
        RewardFunctions([model], [tiny_tokenizer], timeout=0.3)(PROMPTS, COMPLETIONS, IDS)


def test_a_sample_that_alone_hangs_while_locating_a_failure_does_not_hang():
    def flaky(completions, **kwargs):
        if len(completions) > 1:
            raise RuntimeError("batch too large")
        time.sleep(3)
        return [0.0]

    start = time.perf_counter()
    with pytest.raises(RewardError, match=r"'flaky' raised RuntimeError: batch too large on a batch of 4"):
        RewardFunctions([flaky], timeout=0.3)(PROMPTS, COMPLETIONS, IDS)
    assert time.perf_counter() - start < 1.5


@pytest.mark.parametrize("bad", [math.inf, -math.inf, 1e39])  # 1e39 overflows float32
def test_an_infinite_reward_is_named_with_its_sample(bad):
    def explosive(completions, **kwargs):
        return [0.0, 1.0, bad, 2.0]

    with pytest.raises(RewardError) as error:
        call([explosive])
    assert str(error.value) == (
        f"reward function 'explosive' returned {bad!r} for sample 2 (prompt='p1', completion='ccc'); rewards must "
        "be finite float32 numbers (None for no opinion)"
    )


def test_an_infinite_score_of_a_reward_model_is_named_with_its_sample(tiny_tokenizer, monkeypatch):
    from grpokit.tiny import build_reward_model

    model = build_reward_model(tiny_tokenizer).eval()
    monkeypatch.setattr(RewardFunctions, "_score_with_model", lambda *args: torch.tensor([0.0, 1.0, 2.0, -math.inf]))
    with pytest.raises(RewardError, match=r"^reward model '\w+' returned -inf for sample 3 \(prompt='p1', comp"):
        RewardFunctions([model], [tiny_tokenizer])(PROMPTS, COMPLETIONS, IDS)


def test_nan_is_still_no_opinion():
    rewards = call([lambda completions, **kwargs: [math.nan, 1.0, None, 2.0]])
    assert math.isnan(rewards[0, 0]) and math.isnan(rewards[2, 0]) and rewards[1, 0] == 1.0


class _TwoProcesses:
    """Process `process_index` of two; the other process's contribution to gather_object is `other`."""

    num_processes = 2

    def __init__(self, process_index, other):
        self.process_index, self.other, self.gathered = process_index, other, []

    def gather_object(self, items):
        self.gathered.append(list(items))
        return [*items, *self.other] if self.process_index == 0 else [*self.other, *items]


def test_every_process_raises_when_the_rewards_of_one_fail():
    from grpokit.rollout.rollout import _agreed_rewards

    def picky(completions, **kwargs):
        return [1.0, "x", 0.0, 0.0]

    def fine(completions, **kwargs):
        return [1.0] * len(completions)

    failing = _TwoProcesses(1, [None])
    with pytest.raises(RewardError, match=r"^reward function 'picky' returned 'x' \(str\) for sample 1") as own:
        _agreed_rewards(failing, RewardFunctions([picky]), PROMPTS, COMPLETIONS, IDS)
    assert failing.gathered == [[str(own.value)]]  # its message went to the others before it raised

    other = _TwoProcesses(0, [str(own.value)])
    with pytest.raises(RewardError) as error:
        _agreed_rewards(other, RewardFunctions([fine]), PROMPTS, COMPLETIONS, IDS)
    assert str(error.value) == f"{own.value} (on process 1 of 2)"
    assert other.gathered == [[None]]

    healthy = _TwoProcesses(0, [None])
    assert _agreed_rewards(healthy, RewardFunctions([fine]), PROMPTS, COMPLETIONS, IDS)[:, 0].tolist() == [1.0] * 4


def test_any_failure_in_scoring_reaches_the_other_processes_as_a_reward_error(tiny_tokenizer, monkeypatch):
    from grpokit.rollout.rollout import _agreed_rewards
    from grpokit.tiny import build_reward_model

    def out_of_memory(*args):
        raise MemoryError("no room")

    monkeypatch.setattr(RewardFunctions, "_score_with_model", out_of_memory)
    failing = _TwoProcesses(0, [None])
    rewards = RewardFunctions([build_reward_model(tiny_tokenizer)], [tiny_tokenizer])
    with pytest.raises(RewardError, match=r"^scoring rewards failed on process 0: MemoryError\('no room'\)$"):
        _agreed_rewards(failing, rewards, PROMPTS, COMPLETIONS, IDS)
    assert failing.gathered == [["MemoryError('no room')"]]


def test_each_reward_gets_its_own_copy_of_its_inputs():
    seen = {}

    def vandal(prompts, completions, completion_ids, solution, **kwargs):
        prompts[0] = "changed"
        completions.clear()
        completion_ids[0].append(99)
        solution[0] = "changed"
        return [0.0] * len(prompts)

    def witness(prompts, completions, completion_ids, solution, **kwargs):
        seen.update(prompts=list(prompts), completions=list(completions), ids=completion_ids[0], solution=solution[0])
        return [1.0] * len(prompts)

    async def async_witness(prompts, completions, **kwargs):
        seen["async_completions"] = list(completions)
        return [2.0] * len(prompts)

    prompts, completions, ids = ["p1", "p2"], ["c1", "c2"], [[1, 2], [3]]
    columns = {"solution": ["s1", "s2"]}
    rewards = RewardFunctions([vandal, witness, async_witness])(prompts, completions, ids, columns=columns)
    assert rewards.tolist() == [[0.0, 1.0, 2.0], [0.0, 1.0, 2.0]]
    assert seen == {
        "prompts": ["p1", "p2"],
        "completions": ["c1", "c2"],
        "ids": [1, 2],
        "solution": "s1",
        "async_completions": ["c1", "c2"],
    }
    # the caller's lists, which the logs and the loss use, are untouched too
    assert (prompts, completions, ids, columns["solution"]) == (
        ["p1", "p2"],
        ["c1", "c2"],
        [[1, 2], [3]],
        ["s1", "s2"],
    )


@pytest.mark.parametrize(
    "output, shown",
    [
        ({"a": 1.0, "b": 0.0, "c": 0.0, "d": 1.0}, "(dict)"),  # would be scored by its keys
        ("1010", "(str)"),  # would be one reward per character
        ({1.0, 0.0}, "(set)"),
        (iter([1.0, 0.0, 1.0, 0.0]), "(list_iterator)"),
        (np.ones((2, 2)), "(ndarray)"),  # 2-D: 2 rows that are not rewards
        (torch.ones(4, 1), "(Tensor)"),
    ],
)
def test_only_a_sequence_of_numbers_is_a_reward_output(output, shown):
    def odd(completions, **kwargs):
        return output

    with pytest.raises(RewardError) as info:
        RewardFunctions([odd])(PROMPTS, COMPLETIONS, IDS)
    message = str(info.value)
    assert message.startswith("reward function 'odd' returned ") and f"{shown}; expected a list of 4 floats" in message


@pytest.mark.parametrize(
    "output",
    [
        (1.0, 0.0, True, None),
        np.array([1.0, 0.0, 1.0, np.nan]),
        torch.tensor([1.0, 0.0, 1.0, float("nan")]),
        [np.float32(1.0), np.int64(0), torch.tensor(1.0), None],
    ],
)
def test_lists_tuples_arrays_and_tensors_of_numbers_are_rewards(output):
    def fine(completions, **kwargs):
        return output

    rewards = RewardFunctions([fine])(PROMPTS, COMPLETIONS, IDS)
    assert rewards[:3, 0].tolist() == [1.0, 0.0, 1.0] and math.isnan(rewards[3, 0].item())


def test_a_numeric_string_is_not_a_reward():
    def stringly(completions, **kwargs):
        return ["1.0", 0.0, 0.0, 0.0]

    with pytest.raises(
        RewardError, match=r"'stringly' returned '1.0' \(str\) for sample 0 .*expected a float or None"
    ):
        RewardFunctions([stringly])(PROMPTS, COMPLETIONS, IDS)


@pytest.mark.parametrize("timeout", [None, 30.0])
def test_sys_exit_in_a_reward_is_one_line(timeout):
    import sys

    def quits(completions, **kwargs):
        sys.exit(0)

    async def aquits(completions, **kwargs):
        sys.exit(3)

    with pytest.raises(RewardError) as info:
        RewardFunctions([quits], timeout=timeout)(PROMPTS, COMPLETIONS, IDS)
    assert str(info.value) == (
        "reward function 'quits' called sys.exit(0) on a batch of 4 completions; a reward returns scores and must "
        "not end the run"
    )
    with pytest.raises(RewardError, match=r"'aquits' called sys.exit\(3\) on a batch of 4 completions"):
        RewardFunctions([aquits], timeout=timeout)(PROMPTS, COMPLETIONS, IDS)
