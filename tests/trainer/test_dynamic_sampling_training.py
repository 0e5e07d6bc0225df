"""Dynamic sampling in real training runs on the tiny model: every optimizer batch holds only groups whose rewards
differ, the metrics count what was generated, the cap fills the batch with zero-advantage groups and warns, and the
configuration refuses what cannot work."""

import logging
import math

import pytest
from _trainer_helpers import last_log_with

from grpokit import GRPOTrainer
from grpokit.config.rules import ConfigError

GOOD = ("ab", "jk")  # the only prompts whose rewards depend on the completion


def prompt_reward_recorder():
    """A reward that depends only on the prompt (its length), except for GOOD prompts, where it is the row's index
    in the call (so a group's two completions always differ by 1). `calls` keeps each call's prompts."""
    calls = []

    def reward(prompts, completions, **kwargs):
        calls.append(list(prompts))
        return [float(i) if p in GOOD else float(len(p)) for i, p in enumerate(prompts)]

    return reward, calls


def spy_on_batches(monkeypatch, tokenizer):
    """Every training micro-batch's (decoded prompts, advantages)."""
    batches = []
    original = GRPOTrainer.compute_loss

    def compute_loss(self, model, inputs, *args, **kwargs):
        if self.model.training:
            prompts = tokenizer.batch_decode(inputs["prompt_ids"], skip_special_tokens=True)
            batches.append((prompts, inputs["advantages"].tolist()))
        return original(self, model, inputs, *args, **kwargs)

    monkeypatch.setattr(GRPOTrainer, "compute_loss", compute_loss)
    return batches


def test_every_batch_holds_only_groups_that_differ(tiny_model, tiny_tokenizer, dataset, make_args, monkeypatch):
    reward, calls = prompt_reward_recorder()
    batches = spy_on_batches(monkeypatch, tiny_tokenizer)
    args = make_args(max_steps=3, dynamic_sampling=True)  # 4 rows per step: 2 groups of 2
    trainer = GRPOTrainer(tiny_model, reward, args=args, train_dataset=dataset, processing_class=tiny_tokenizer)
    trainer.train()

    assert len(batches) == 3
    a = 0.5 / (math.sqrt(0.5) + 1e-4)  # a group with rewards (i, i + 1): mean i + 0.5, std sqrt(0.5)
    for prompts, advantages in batches:
        assert len(prompts) == 4 and set(prompts) <= set(GOOD)
        assert sorted(advantages) == pytest.approx([-a, -a, a, a], rel=1e-5)
    # one reward call per generation round; each step's metrics follow from the prompts it scored
    rows = [entry for entry in trainer.state.log_history if "dynamic_sampling/rounds" in entry]
    assert len(rows) == 3
    assert sum(row["dynamic_sampling/rounds"] for row in rows) == len(calls)
    first = 0
    for row in rows:
        rounds = int(row["dynamic_sampling/rounds"])
        scored = calls[first : first + rounds]
        first += rounds
        groups = [prompts[i] for prompts in scored for i in range(0, 4, 2)]
        good = [p for p in groups if p in GOOD]
        assert len(good) >= 2 and len([p for p in scored[-1][::2] if p in GOOD]) >= 1  # the last round was needed
        assert row["dynamic_sampling/groups_kept"] == 2
        assert row["dynamic_sampling/groups_filled"] == 0
        assert row["dynamic_sampling/groups_dropped"] == len(groups) - len(good)
        assert row["dynamic_sampling/completions_per_kept_sample"] == rounds * 4 / 4
    assert any(row["dynamic_sampling/rounds"] > 1 for row in rows)  # the test did exercise the refill


def test_cap_fills_with_dropped_groups_and_warns(tiny_model, tiny_tokenizer, dataset, make_args, monkeypatch, caplog):
    batches = spy_on_batches(monkeypatch, tiny_tokenizer)

    def constant(prompts, completions, **kwargs):
        return [1.0] * len(prompts)

    args = make_args(max_steps=2, dynamic_sampling=True, dynamic_sampling_max_rounds=2)
    trainer = GRPOTrainer(tiny_model, constant, args=args, train_dataset=dataset, processing_class=tiny_tokenizer)
    with caplog.at_level(logging.WARNING, logger="grpokit"):
        trainer.train()
    assert [adv for _, advantages in batches for adv in advantages] == [0.0] * 8
    lines = [r.getMessage() for r in caplog.records if "dynamic sampling" in r.getMessage()]
    assert (
        lines
        == [
            "warning: dynamic sampling: after 2 extra generation rounds (dynamic_sampling_max_rounds) only 0 of 2 groups "
            "have reward std > 0.0; the batch is filled with 2 dropped groups at advantage 0"
        ]
        * 2
    )
    row = last_log_with(trainer, "dynamic_sampling/rounds")
    assert row["dynamic_sampling/rounds"] == 3
    assert row["dynamic_sampling/groups_kept"] == 0
    assert row["dynamic_sampling/groups_filled"] == 2
    assert row["dynamic_sampling/groups_dropped"] == 6
    assert "dynamic_sampling/completions_per_kept_sample" not in row  # nothing kept: no ratio


def test_streaming_dataset_is_refused(tiny_model, tiny_tokenizer, dataset, make_args):
    args = make_args(dynamic_sampling=True)
    with pytest.raises(ValueError, match="dynamic_sampling needs a train dataset that can be indexed"):
        GRPOTrainer(
            tiny_model,
            lambda completions, **kw: [0.0] * len(completions),
            args=args,
            train_dataset=dataset.to_iterable_dataset(),
            processing_class=tiny_tokenizer,
        )


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(dynamic_sampling_min_reward_std=0.1), "dynamic_sampling_min_reward_std=0.1: has no effect without"),
        (dict(dynamic_sampling_max_rounds=3), "dynamic_sampling_max_rounds=3: has no effect without"),
        (dict(dynamic_sampling=True, dynamic_sampling_max_rounds=0), "dynamic_sampling_max_rounds=0: must be"),
        (dict(dynamic_sampling=True, dynamic_sampling_min_reward_std=-1.0), "dynamic_sampling_min_reward_std=-1.0"),
    ],
)
def test_config_refusals(make_args, overrides, message):
    with pytest.raises(ConfigError, match=message):
        make_args(**overrides)


def test_groups_must_not_span_processes(tmp_path):
    from grpokit import GRPOConfig

    # 2 processes x 1 row: each group of 2 spans both processes, which could not agree on keeping it
    values = dict(output_dir=str(tmp_path), per_device_train_batch_size=1, num_generations=2, use_cpu=True)
    with pytest.raises(ConfigError, match="dynamic_sampling=True: needs whole groups on each process: the generation"):
        GRPOConfig.for_processes(2, dynamic_sampling=True, **values)
    GRPOConfig.for_processes(2, **values)  # fine without dynamic sampling
    GRPOConfig.for_processes(2, dynamic_sampling=True, **{**values, "per_device_train_batch_size": 2})
