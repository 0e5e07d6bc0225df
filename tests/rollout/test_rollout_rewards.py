"""Reward calling: None becomes NaN, async functions run together, failures name the function and the sample."""

import asyncio
import math
import time

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
