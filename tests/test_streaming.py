"""Streaming (iterable) datasets, as TRL 1.16 takes them: groups formed on the fly in `RepeatSampler`'s order,
processes reading disjoint parts of the stream, training cycling over it until max_steps and resuming at the same
row, `evaluate()` on an iterable eval set with a 0-worker loader."""

import logging

import datasets
import pytest

from grpokit import GRPOConfig, GRPOTrainer
from grpokit.rollout.sampler import RepeatSampler
from grpokit.rollout.stream import GroupedStream, layout

LETTERS = ["a", "b", "c", "d", "e", "f", "g"]


def stream_of(values, shards=1):
    return datasets.Dataset.from_dict({"x": values}).to_iterable_dataset(num_shards=shards)


def xs(rows):
    return [row["x"] for row in rows]


def first(stream, n):
    it = iter(stream)
    return [next(it)["x"] for _ in range(n)]


# ------------------------------------------------------------------------------------------------ the grouping


def test_one_process_yields_repeat_samplers_order():
    # 7 prompts, 3 per generation batch, 2 copies each, each batch twice: the 7th prompt is dropped (incomplete chunk).
    stream = GroupedStream(stream_of(LETTERS), group_size=2, chunk_prompts=3, repeat_count=2, cycle=False)
    sampler = RepeatSampler(LETTERS, mini_repeat_count=2, batch_size=3, repeat_count=2, shuffle=False)
    assert (
        xs(stream)
        == [LETTERS[i] for i in sampler]
        == (["a", "a", "b", "b", "c", "c"] * 2 + ["d", "d", "e", "e", "f", "f"] * 2)
    )


def test_training_cycles_over_the_stream_pass_after_pass():
    stream = GroupedStream(stream_of(LETTERS[:5]), group_size=2, chunk_prompts=2)
    # Pass 0: a b | c d (e dropped); pass 1 starts again at a.
    assert first(stream, 12) == ["a", "a", "b", "b", "c", "c", "d", "d", "a", "a", "b", "b"]


def test_each_pass_is_shuffled_anew_and_the_same_on_every_iteration():
    stream = GroupedStream(stream_of(list(range(7))), group_size=1, chunk_prompts=7, shuffle=True, seed=0)
    rows = first(stream, 14)
    assert sorted(rows[:7]) == sorted(rows[7:]) == list(range(7)) and rows[:7] != rows[7:]
    assert first(stream, 14) == rows  # deterministic: what a resume replays


def test_a_stream_shorter_than_one_generation_batch_is_one_line():
    with pytest.raises(ValueError, match="holds fewer than 4 prompts, one generation batch: nothing to train on"):
        first(GroupedStream(stream_of(["a", "b", "c"]), group_size=2, chunk_prompts=4), 1)


# ------------------------------------------------------------------------------------------------ several processes


def test_processes_read_disjoint_shards_when_their_batches_are_whole_groups():
    # 2 processes, 4 rows each per generation batch, 2 generations: each forms 2 groups from its own part.
    assert layout(4, 2, 1, 2) == {"chunk_prompts": 2, "shard": (1, 2)}
    # One file-shard: split_dataset_by_node keeps every other row (0, 2, 4, 6 / 1, 3, 5).
    rows = {p: xs(GroupedStream(stream_of(LETTERS), group_size=2, cycle=False, **layout(4, 2, p, 2))) for p in (0, 1)}
    assert rows == {0: ["a", "a", "c", "c", "e", "e", "g", "g"], 1: ["b", "b", "d", "d"]}  # f dropped: half a chunk
    # Two file-shards: each process reads one file (a b c d / e f g) and never opens the other.
    rows = {
        p: xs(GroupedStream(stream_of(LETTERS, 2), group_size=2, cycle=False, **layout(4, 2, p, 2))) for p in (0, 1)
    }
    assert rows == {0: ["a", "a", "b", "b", "c", "c", "d", "d"], 1: ["e", "e", "f", "f"]}


def test_a_group_spanning_processes_gives_each_its_slice_of_the_generation_batch():
    # 3 rows per process, 2 generations: the generation batch a a b b c c is cut a a b | b c c, as RepeatSampler's
    # indices are by accelerate's batch sharding; every process reads the whole stream.
    assert layout(3, 2, 1, 2) == {"chunk_prompts": 3, "keep": (3, 6), "shard": None}
    rows = {p: xs(GroupedStream(stream_of(LETTERS), group_size=2, cycle=False, **layout(3, 2, p, 2))) for p in (0, 1)}
    assert rows == {0: ["a", "a", "b", "d", "d", "e"], 1: ["b", "c", "c", "e", "f", "f"]}


# ------------------------------------------------------------------------------------------------ the trainer


class Recorder:
    """A reward that records the prompts of each round (one call per generation batch)."""

    def __init__(self):
        self.rounds = []
        self.__name__ = "recorder"

    def __call__(self, prompts, completions, **kwargs):
        self.rounds.append(list(prompts))
        return [float(len(c)) for c in completions]


def make_args(tmp_path, **overrides):
    values = dict(output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=2, max_completion_length=4)
    values.update(report_to="none", use_cpu=True, bf16=False, save_strategy="no", logging_steps=1)
    values.update(overrides)
    return GRPOConfig(**values)


def prompts(n=5):
    return datasets.Dataset.from_dict({"prompt": ["ab", "cde", "fghi", "jk", "lmnop"][:n]})


def test_training_on_a_stream_forms_the_groups_on_the_fly(tiny_model, tiny_tokenizer, tmp_path):
    reward = Recorder()
    args = make_args(tmp_path, max_steps=3, shuffle_dataset=False)
    trainer = GRPOTrainer(
        tiny_model, reward, args=args, train_dataset=prompts().to_iterable_dataset(), processing_class=tiny_tokenizer
    )
    trainer.train()
    assert trainer.state.global_step == 3
    # 2 prompts per round, 2 completions each; pass 0 is ab cde | fghi jk (lmnop dropped), then pass 1 starts again.
    assert reward.rounds == [["ab", "ab", "cde", "cde"], ["fghi", "fghi", "jk", "jk"], ["ab", "ab", "cde", "cde"]]


def test_a_stream_needs_max_steps(tiny_model, tiny_tokenizer, tmp_path):
    with pytest.raises(ValueError, match="`max_steps` must be set to a positive value"):
        GRPOTrainer(
            tiny_model,
            Recorder(),
            args=make_args(tmp_path),
            train_dataset=prompts().to_iterable_dataset(),
            processing_class=tiny_tokenizer,
        )


def test_a_stream_is_read_by_one_worker_as_in_trl(tiny_model, tiny_tokenizer, tmp_path, caplog):
    args = make_args(tmp_path, max_steps=1, dataloader_num_workers=2)
    with caplog.at_level(logging.WARNING, logger="grpokit.trl_compat"):
        trainer = GRPOTrainer(
            tiny_model,
            Recorder(),
            args=args,
            train_dataset=prompts().to_iterable_dataset(),
            processing_class=tiny_tokenizer,
        )
    assert trainer.args.dataloader_num_workers == 0 and trainer.get_train_dataloader().num_workers == 0
    assert any("Iterable datasets require `dataloader_num_workers=0`" in r.getMessage() for r in caplog.records)


def test_resuming_on_a_stream_continues_at_the_same_row(tiny_model_dir, tiny_tokenizer, tmp_path):
    # Shuffled, 2 rounds per pass: the checkpoint after step 2 ends pass 0, so the resumed round is pass 1's first,
    # shuffled with the seed and pass 1, exactly as the uninterrupted run drew it.
    def run(output, **overrides):
        reward = Recorder()
        args = make_args(output, max_steps=3, shuffle_dataset=True, save_strategy="steps", save_steps=2, **overrides)
        trainer = GRPOTrainer(
            tiny_model_dir,
            reward,
            args=args,
            train_dataset=prompts().to_iterable_dataset(),
            processing_class=tiny_tokenizer,
        )
        return trainer, reward

    trainer, whole = run(tmp_path / "whole")
    trainer.train()
    # datasets' buffered shuffle with seed 42: pass 0 is lmnop fghi jk cde (ab left out), pass 1 lmnop jk fghi ab.
    pairs = [[a, a, b, b] for a, b in [("lmnop", "fghi"), ("jk", "cde"), ("lmnop", "jk")]]
    assert whole.rounds == pairs
    trainer, resumed = run(tmp_path / "whole")
    trainer.train(resume_from_checkpoint=str(tmp_path / "whole" / "checkpoint-2"))
    assert resumed.rounds == pairs[2:]


def test_evaluate_on_an_iterable_eval_set(tiny_model, tiny_tokenizer, tmp_path):
    reward = Recorder()
    args = make_args(tmp_path, max_steps=1, per_device_eval_batch_size=4, dataloader_num_workers=2)
    trainer = GRPOTrainer(
        tiny_model,
        reward,
        args=args,
        train_dataset=prompts(),
        eval_dataset=prompts(3).to_iterable_dataset(),
        processing_class=tiny_tokenizer,
    )
    loader = trainer.get_eval_dataloader()
    assert loader.num_workers == 0 and trainer.args.dataloader_num_workers == 2  # TRL: for this loader only
    metrics = trainer.evaluate()
    assert "eval_loss" in metrics and "eval_reward" in metrics
    # 3 prompts, 2 completions each, batches of 4 rows: one full batch and the last one of 2 rows; every prompt once.
    assert [len(r) for r in reward.rounds] == [4, 2]
    seen = [p for r in reward.rounds for p in r]
    assert sorted(seen) == ["ab", "ab", "cde", "cde", "fghi", "fghi"]
    assert all(seen[i] == seen[i + 1] for i in range(0, 6, 2))


def test_iterable_sets_turn_dispatch_batches_off_as_trl_and_refuse_it_on(tmp_path):
    """TRL 1.16's two checks: `dispatch_batches` ends False with a stream, and True is refused with its words."""
    import datasets

    from grpokit import GRPOConfig, GRPOTrainer
    from grpokit.tiny import build_model, build_tokenizer

    tokenizer = build_tokenizer()
    stream = datasets.Dataset.from_dict({"prompt": ["ab", "cd", "ef"]}).to_iterable_dataset()

    def make(**accelerator_config):
        args = GRPOConfig(
            output_dir=str(tmp_path),
            per_device_train_batch_size=3,
            num_generations=3,
            max_completion_length=4,
            max_steps=1,
            report_to="none",
            accelerator_config=accelerator_config,
        )
        return GRPOTrainer(
            model=build_model(tokenizer),
            reward_funcs=lambda completions, **kw: [0.0] * len(completions),
            args=args,
            train_dataset=stream,
            processing_class=tokenizer,
        )

    assert make().args.accelerator_config.dispatch_batches is False
    with pytest.raises(ValueError, match="Iterable datasets require `dispatch_batches=False`"):
        make(dispatch_batches=True)
