"""The built-in rollout worker (a thread generating with a local copy of the policy): pacing by max_staleness with a
slow trainer, the copy's weights following the trainer's, faults that stop the trainer in one line, prompts in
epoch order, LoRA, tools."""

import threading
import time

import pytest
from _async_helpers import PROMPTS, make_config, text_reward
from transformers import TrainerCallback

from grpokit.experimental.async_grpo import AsyncGRPOTrainer, RolloutWorkerError
from grpokit.experimental.async_grpo.worker import PromptOrder


@pytest.fixture
def dataset():
    from datasets import Dataset

    return Dataset.from_dict({"prompt": PROMPTS})


class SlowSteps(TrainerCallback):
    """A slow trainer: each optimizer step takes `seconds` more, so the worker is always ready first."""

    def __init__(self, seconds):
        self.seconds = seconds

    def on_step_end(self, args, state, control, **kwargs):
        time.sleep(self.seconds)


def logged_rows(trainer):
    return [row for row in trainer.state.log_history if "loss" in row]


@pytest.mark.parametrize("max_staleness", [0, 2])
def test_a_fast_worker_never_runs_further_ahead_than_max_staleness(
    tmp_path, tiny_model, tiny_tokenizer, dataset, max_staleness
):
    """With a slow trainer the worker waits: every sample is trained within max_staleness versions, none dropped;
    at staleness 0 the copy it samples with holds the trainer's weights, so every importance ratio is 1."""
    args = make_config(tmp_path, max_steps=5, max_staleness=max_staleness, learning_rate=5e-2)
    trainer = AsyncGRPOTrainer(
        tiny_model,
        lambda completions, **kw: [len(c) / 10 for c in completions],  # a lambda: the worker is a thread
        args=args,
        train_dataset=dataset,
        processing_class=tiny_tokenizer,
        callbacks=[SlowSteps(0.2)],
    )
    trainer.train()
    rows = logged_rows(trainer)
    assert len(rows) == 5
    assert all("sample/dropped_stale_total" not in row for row in rows)
    seen = max(row["sample/staleness_max"] for row in rows)
    assert seen <= max_staleness and (seen >= 1 if max_staleness else seen == 0)  # it does run ahead
    if max_staleness == 0:
        for row in rows:
            assert row["sampling/importance_sampling_ratio/min"] == pytest.approx(1.0, abs=1e-4)
            assert row["sampling/importance_sampling_ratio/max"] == pytest.approx(1.0, abs=1e-4)
            # grpokit's sampler/* metrics, logged by the async trainer too: no gap, the ratio's band at 1
            assert row["sampler/logprob_gap"] == pytest.approx(0.0, abs=1e-4)
            assert row["sampler/ratio/p05"] == pytest.approx(1.0, abs=1e-4)
            assert row["sampler/ratio/p95"] == pytest.approx(1.0, abs=1e-4)
    else:  # samples a version or two old were sampled by other weights
        assert max(row["sampling/sampling_logp_difference/max"] for row in rows[1:]) > 1e-3
        assert max(row["sampler/logprob_gap"] for row in rows[1:]) > 1e-4


def test_a_reward_that_raises_in_the_worker_stops_the_trainer_in_one_line(
    tmp_path, tiny_model, tiny_tokenizer, dataset
):
    def broken(completions, **kwargs):
        raise ZeroDivisionError("the judge divided by zero")

    args = make_config(tmp_path, max_steps=3)
    trainer = AsyncGRPOTrainer(tiny_model, broken, args=args, train_dataset=dataset, processing_class=tiny_tokenizer)
    with pytest.raises(RolloutWorkerError) as caught:
        trainer.train()
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("the rollout worker failed: RewardError:")
    assert "the judge divided by zero" in message
    assert trainer.rollout_worker._thread is None  # stopped


def test_a_hung_reward_stops_the_trainer_within_the_heartbeat(tmp_path, tiny_model, tiny_tokenizer, dataset):
    release = threading.Event()

    def hangs(completions, **kwargs):
        release.wait(60)
        return [0.0] * len(completions)

    args = make_config(tmp_path, max_steps=3, heartbeat_stale_after_s=1.5, reward_timeout=None)
    trainer = AsyncGRPOTrainer(tiny_model, hangs, args=args, train_dataset=dataset, processing_class=tiny_tokenizer)
    started = time.monotonic()
    try:
        with pytest.raises(
            RolloutWorkerError, match=r"gave no sign of life for \d+ s \(heartbeat_stale_after_s=1.5\)"
        ):
            trainer.train()
        assert time.monotonic() - started < 15
    finally:
        release.set()


def test_prompts_come_in_epoch_order_and_a_requeued_one_first():
    order = PromptOrder(4, shuffle=False, seed=0)
    first = [order.next() for _ in range(3)]
    assert first == [(0, 0), (0, 1), (0, 2)]
    order.requeue(0, 1)
    assert [order.next() for _ in range(3)] == [(0, 1), (0, 3), (1, 0)]


def test_the_prompt_order_resumes_with_the_untrained_prompts_of_its_epoch():
    order = PromptOrder(5, shuffle=True, seed=3)
    epoch0 = order.order(0)
    handed = [order.next() for _ in range(4)]
    for epoch, index in handed[:2]:  # two trained, two in flight when the checkpoint is taken
        order.trained(epoch, index)
    state = order.state()
    assert state == {"epoch": 0, "trained": {"0": sorted(epoch0[:2])}}
    resumed = PromptOrder(5, shuffle=True, seed=3, state=state)
    assert [resumed.next() for _ in range(4)] == [(0, i) for i in epoch0[2:]] + [(1, order.order(1)[0])]


def test_lora_adapter_weights_reach_the_local_sampler(tmp_path, tiny_model, tiny_tokenizer, dataset):
    """Only the adapter trains; at staleness 0 the sampler's copy (adapter included) follows the trainer: ratios 1."""
    from peft import LoraConfig

    args = make_config(tmp_path, max_steps=3, max_staleness=0, learning_rate=5e-1)
    trainer = AsyncGRPOTrainer(
        tiny_model,
        text_reward,
        args=args,
        train_dataset=dataset,
        processing_class=tiny_tokenizer,
        peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
    )
    trainer.train()
    rows = logged_rows(trainer)
    assert len(rows) == 3
    for row in rows:
        assert row["sampling/importance_sampling_ratio/min"] == pytest.approx(1.0, abs=1e-4)
        assert row["sampling/importance_sampling_ratio/max"] == pytest.approx(1.0, abs=1e-4)
    lora = {n: p for n, p in trainer.generator.model.named_parameters() if "lora_B" in n}
    assert lora and any(p.abs().sum() > 0 for p in lora.values())  # B starts at 0: the copy got trained values


def test_a_server_that_is_not_up_is_one_line_before_the_model_loads(tmp_path, tiny_tokenizer, dataset, monkeypatch):
    from grpokit import models
    from grpokit.generation.vllm_server import VLLMServerError

    loaded = []
    monkeypatch.setattr(models, "build_models", lambda *a, **k: loaded.append(1))
    args = make_config(tmp_path, use_vllm=True, vllm_server_base_url="http://127.0.0.1:9", vllm_server_timeout=1.0)
    with pytest.raises(VLLMServerError) as caught:
        AsyncGRPOTrainer("no-such-model", text_reward, args=args, train_dataset=dataset)
    assert "\n" not in str(caught.value) and loaded == []
    assert str(caught.value).startswith("no vLLM server answered at http://127.0.0.1:9 within 1s")


def test_a_generator_that_dies_mid_run_stops_the_trainer_in_one_line(tmp_path, tiny_model, tiny_tokenizer, dataset):
    from grpokit.generation import GenerationError

    args = make_config(tmp_path, max_steps=4, max_staleness=0)
    trainer = AsyncGRPOTrainer(
        tiny_model, text_reward, args=args, train_dataset=dataset, processing_class=tiny_tokenizer
    )
    inner, calls = trainer.generator.inner.generate, []

    def dies_at_the_third(prompt_ids, vision=None):
        calls.append(1)
        if len(calls) == 3:
            raise GenerationError("the vLLM server at http://127.0.0.1:8000 did not answer /v1/completions")
        return inner(prompt_ids)

    trainer.generator.inner.generate = dies_at_the_third
    with pytest.raises(RolloutWorkerError) as caught:
        trainer.train()
    assert isinstance(caught.value, GenerationError)  # grpokit train: one line, the weights saved
    assert str(caught.value) == (
        "the rollout worker failed: GenerationError: the vLLM server at http://127.0.0.1:8000 did not answer "
        "/v1/completions"
    )
    assert trainer.state.global_step == 2  # the batches generated before it were trained


def test_the_environment_owns_the_data(tmp_path):
    """No train_dataset: the environment writes each prompt in reset(); max_steps sets the length (as TRL)."""
    from grpokit.tiny import build_model, build_tool_tokenizer

    tiny_tokenizer = build_tool_tokenizer()

    class Guess:
        def reset(self, **kwargs):
            self.target = "7"
            return "Say 7."

        def get_reward(self):
            return 1.0

    args = make_config(tmp_path, max_steps=2)
    trainer = AsyncGRPOTrainer(
        build_model(tiny_tokenizer), args=args, processing_class=tiny_tokenizer, environment_factory=Guess
    )
    trainer.train()
    assert trainer.state.global_step == 2
    assert trainer.reward_func_names == ["Guess"]


def test_async_rewards_and_none_entries_in_the_worker(tmp_path, tiny_model, tiny_tokenizer, dataset):
    """An async reward function and one that scores only some samples (None for the others), as TRL takes them."""
    import asyncio

    async def slow_length(completions, **kwargs):
        await asyncio.sleep(0.01)
        return [len(c) / 8 for c in completions]

    def only_short_prompts(prompts, completions, **kwargs):
        return [1.0 if len(p) <= 2 else None for p in prompts]

    args = make_config(tmp_path, max_steps=2)
    trainer = AsyncGRPOTrainer(
        tiny_model,
        [slow_length, only_short_prompts],
        args=args,
        train_dataset=dataset,
        processing_class=tiny_tokenizer,
    )
    trainer.train()
    rows = [row for row in trainer.state.log_history if "loss" in row]
    assert len(rows) == 2
    # step 1 trains prompts "ab" and "cde": only "ab" is short, so the second function scores half the samples
    assert rows[0]["rewards/only_short_prompts/mean"] == 1.0
    assert 0 <= rows[0]["rewards/slow_length/mean"] <= 1


def test_a_full_queue_blocks_the_worker_never_the_trainer(tmp_path, tiny_model, tiny_tokenizer, dataset):
    """queue_maxsize=3 (less than a 4-sample batch) with a slow trainer: the worker waits on the full queue
    (rollout/backpressure_s), the queue never holds more than 3 samples, and every step still trains."""
    args = make_config(tmp_path, max_steps=4, max_staleness=3, queue_maxsize=3)
    trainer = AsyncGRPOTrainer(
        tiny_model,
        text_reward,
        args=args,
        train_dataset=dataset,
        processing_class=tiny_tokenizer,
        callbacks=[SlowSteps(0.3)],
    )
    sizes = []
    take = trainer._take_samples

    def watched(count):
        sizes.append(trainer.rollout_queue.qsize())
        return take(count)

    trainer._take_samples = watched
    trainer.train()
    rows = logged_rows(trainer)
    assert len(rows) == 4 and max(sizes) <= 3
    assert sum(row.get("rollout/backpressure_s", 0.0) for row in rows) > 0.1


def test_log_extra_columns_reach_the_records(tmp_path, tiny_model, tiny_tokenizer, dataset, capsys):
    """A reward function's log_extra in the worker: its values go with their samples to the completions table (and
    its parquet files), each beside its own completion."""

    def judged(completions, log_extra=None, **kwargs):
        log_extra("verdict", [f"len {len(c)}" for c in completions])
        return [len(c) / 8 for c in completions]

    args = make_config(tmp_path, max_steps=2, log_completions=True)
    trainer = AsyncGRPOTrainer(tiny_model, judged, args=args, train_dataset=dataset, processing_class=tiny_tokenizer)
    trainer.train()
    import pandas as pd

    frames = [pd.read_parquet(path) for path in sorted((tmp_path / "out" / "completions").glob("*.parquet"))]
    assert len(frames) == 2 and all(len(frame) == 4 for frame in frames)
    for frame in frames:
        assert list(frame["verdict"]) == [f"len {len(c)}" for c in frame["completion"]]
    assert "verdict" in capsys.readouterr().out
