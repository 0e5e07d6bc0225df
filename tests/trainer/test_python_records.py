"""A TRL-API script (GRPOTrainer(model=..., reward_funcs=..., args=GRPOConfig(...), train_dataset=...).train())
leaves the records `grpokit train` leaves: metrics.jsonl, reward_curve.png, resolved_config.yaml with provenance
`python`; its console stays transformers' unless progress_lines asks for grpokit's step lines."""

import json
import os

from _trainer_helpers import text_reward

from grpokit import GRPOConfig, GRPOTrainer

RECORDS = {"metrics.jsonl", "reward_curve.png", "resolved_config.yaml"}


def _args(tmp_path, **overrides):
    values = dict(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=8,
        max_steps=2,
        learning_rate=1e-2,
        logging_steps=1,
        report_to="none",
        use_cpu=True,
        save_strategy="no",
        seed=0,
    )
    return GRPOConfig(**{**values, **overrides})


def test_a_trl_script_leaves_the_three_records(tiny_model_dir, dataset, tmp_path, capsys):
    trainer = GRPOTrainer(model=tiny_model_dir, reward_funcs=text_reward, args=_args(tmp_path), train_dataset=dataset)
    trainer.train()
    out = tmp_path / "out"
    assert RECORDS <= set(os.listdir(out))
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [1, 2]  # logging_steps=1, max_steps=2
    assert [row["reward"] for row in rows] == [e["reward"] for e in trainer.state.log_history if "reward" in e]
    resolved = (out / "resolved_config.yaml").read_text().splitlines()
    assert (
        resolved[0] == "# resolved configuration of this run, started from Python: GRPOTrainer(args=GRPOConfig(...))"
    )
    assert f"# given in code, not in this file: model {tiny_model_dir}; rewards text_reward; the datasets" in resolved
    body = [line for line in resolved if not line.startswith("#")]
    assert body == [  # the arguments given to GRPOConfig(...), in field order, as TrainingArguments keeps them
        f'output_dir: "{out}"  # python',
        "per_device_train_batch_size: 4  # python",
        "max_steps: 2  # python",
        "learning_rate: 0.01  # python",
        "logging_steps: 1.0  # python",
        "report_to: []  # python",  # transformers' form of "none"
        'save_strategy: "no"  # python',
        "seed: 0  # python",
        "use_cpu: true  # python",
        "num_generations: 2  # python",
        "max_completion_length: 8  # python",
    ]
    assert resolved[-1] == "# derived when resolved: generation_batch_size=4, steps_per_generation=1"
    console = capsys.readouterr()
    assert "step     1/2 | reward" not in console.out  # TRL's console (transformers' log dicts), not grpokit's lines


def test_progress_lines_and_write_run_records_are_the_switches(tiny_model_dir, dataset, tmp_path, capsys):
    args = _args(tmp_path, write_run_records=False, progress_lines=True)
    GRPOTrainer(tiny_model_dir, text_reward, args=args, train_dataset=dataset).train()
    assert not RECORDS & set(os.listdir(tmp_path / "out"))
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("step ")]
    assert [line[:12] for line in lines] == ["step     1/2", "step     2/2"]
    assert all("{'loss'" not in line for line in lines)


def test_a_fresh_run_starts_its_records_afresh_and_a_resumed_one_keeps_them(tiny_model_dir, dataset, tmp_path):
    args = _args(tmp_path, max_steps=3, save_strategy="steps", save_steps=2)
    GRPOTrainer(tiny_model_dir, text_reward, args=args, train_dataset=dataset).train()
    metrics = tmp_path / "out" / "metrics.jsonl"
    first = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [row["step"] for row in first] == [1, 2, 3]
    resumed = GRPOTrainer(tiny_model_dir, text_reward, args=args, train_dataset=dataset)
    resumed.train(resume_from_checkpoint=str(tmp_path / "out" / "checkpoint-2"))
    again = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [row["step"] for row in again] == [1, 2, 3]  # rows after step 2 dropped, step 3 logged again
    assert again[:2] == first[:2]
    GRPOTrainer(tiny_model_dir, text_reward, args=_args(tmp_path, max_steps=1), train_dataset=dataset).train()
    assert [json.loads(line)["step"] for line in metrics.read_text().splitlines()] == [1]  # not resumed: afresh


def test_a_failure_to_write_the_resolved_config_stops_training_before_its_first_step(
    tiny_model_dir, dataset, tmp_path, monkeypatch
):
    """A failure to write resolved_config.yaml is not lost: train() raises it before any step, no metrics row is
    written and no plot is drawn."""
    import pytest

    import grpokit.records.resolved as resolved

    def refuse(*args, **kwargs):
        raise OSError("disk quota exceeded")

    monkeypatch.setattr(resolved, "write_resolved_config", refuse)
    trainer = GRPOTrainer(model=tiny_model_dir, reward_funcs=text_reward, args=_args(tmp_path), train_dataset=dataset)
    with pytest.raises(OSError, match="disk quota exceeded"):
        trainer.train()
    assert trainer.state.global_step == 0
    out = tmp_path / "out"
    assert not (out / "reward_curve.png").exists()
    assert not (out / "metrics.jsonl").exists() or (out / "metrics.jsonl").read_text() == ""
