"""Checkpoints written atomically and found again: interrupted saves are never resumed from; resume_from_checkpoint
`true`/`last`; settings changed since the checkpoint refused (unless resume_allow_changes); no token in
training_args.bin. The kill of a real `grpokit train` run mid-save is in tests/cli/test_resume_cli.py."""

import json
import os

import pytest
import torch
from _trainer_helpers import text_reward

from grpokit import GRPOTrainer
from grpokit.checkpoints import (
    RUN_FILE,
    ResumeError,
    _publish,
    latest_checkpoint,
    resolve_resume,
    resume_changes,
    run_record,
)


def fake_checkpoint(folder, complete=True):
    folder = str(folder)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "model.safetensors"), "w") as fh:
        fh.write("weights")
    if complete:
        with open(os.path.join(folder, "trainer_state.json"), "w") as fh:
            json.dump({"global_step": int(folder.rsplit("-", 1)[1])}, fh)
    return str(folder)


def test_latest_checkpoint_skips_incomplete_and_interrupted_saves(tmp_path, caplog):
    fake_checkpoint(tmp_path / "checkpoint-2")
    fake_checkpoint(tmp_path / "checkpoint-10")
    fake_checkpoint(tmp_path / "checkpoint-12", complete=False)  # written in place by a writer that was killed
    fake_checkpoint(tmp_path / "tmp-checkpoint-14" / "checkpoint-14")  # an interrupted atomic save
    (tmp_path / "checkpoint-15").write_text("a file, not a folder")
    assert latest_checkpoint(str(tmp_path)) == str(tmp_path / "checkpoint-10")  # 10 > 2 as numbers
    assert "checkpoint-12 is incomplete" in caplog.text
    assert latest_checkpoint(str(tmp_path / "nothing-here")) is None


def test_resolve_resume(tmp_path):
    out = str(tmp_path)
    latest = fake_checkpoint(tmp_path / "checkpoint-3")
    assert resolve_resume(None, out) is None and resolve_resume(False, out) is None
    assert resolve_resume("false", out) is None
    for value in (True, "true", "True", "last", "LAST"):
        assert resolve_resume(value, out) == latest
    assert resolve_resume(latest, out) == latest
    cases = {
        str(tmp_path / "missing"): "resume_from_checkpoint='{v}' (cli): no such folder",
        str(tmp_path): "resume_from_checkpoint='{v}' (cli): not a complete checkpoint (no trainer_state.json); did "
        f"you mean {latest}?",
        fake_checkpoint(tmp_path / "tmp-checkpoint-4" / "checkpoint-4"): "resume_from_checkpoint='{v}' (cli): an "
        "interrupted save, not a checkpoint; resume from a checkpoint-N folder",
    }
    for value, expected in cases.items():
        with pytest.raises(ResumeError) as caught:
            resolve_resume(value, out, "cli")
        assert caught.value.lines == [expected.format(v=value)]
    with pytest.raises(ResumeError) as caught:
        resolve_resume("true", str(tmp_path / "fresh"), "yaml:run.yaml:3")
    assert caught.value.lines == [
        f"resume_from_checkpoint='true' (yaml:run.yaml:3): no complete checkpoint in output_dir {tmp_path}/fresh (a "
        "checkpoint-N folder holding trainer_state.json); leave resume_from_checkpoint unset to start afresh, or set "
        "output_dir to the run to resume"
    ]


def test_resume_changes_lists_old_and_new_values_with_sources(tmp_path):
    checkpoint = fake_checkpoint(tmp_path / "checkpoint-1")
    values = {"model_name_or_path": "m", "per_device_train_batch_size": 4, "gradient_accumulation_steps": 1,
              "steps_per_generation": 1, "generation_batch_size": 4, "num_iterations": 1, "num_generations": 2,
              "loss_type": "dapo", "beta": 0.0}  # fmt: skip
    old = run_record(values, {"num_generations": "yaml:a.yaml:4"}, processes=1)
    with open(os.path.join(checkpoint, RUN_FILE), "w") as fh:
        json.dump({"fields": old}, fh)
    assert resume_changes(checkpoint, old) == []
    # beta counts only as 0 or not; a different non-zero beta, or the same model path with a slash, is no change.
    same = run_record({**values, "model_name_or_path": "m/"}, {}, processes=1)
    assert resume_changes(checkpoint, same) == []
    assert resume_changes(checkpoint, run_record({**values, "beta": 0.04}, {}, processes=1)) == [
        "beta: 0.0 (default) in the checkpoint, 0.04 (default) now (beta 0 trains without a reference model, any "
        "other value with one)"
    ]
    new = run_record(
        {**values, "num_generations": 4, "loss_type": "grpo"},
        {"num_generations": "cli", "loss_type": "yaml:b.yaml:9"},
        processes=2,
        processes_source="num_processes (cli)",
    )
    assert resume_changes(checkpoint, new) == [
        "num_processes: 1 (default) in the checkpoint, 2 (num_processes (cli)) now",
        "num_generations: 2 (yaml:a.yaml:4) in the checkpoint, 4 (cli) now",
        'loss_type: "dapo" (default) in the checkpoint, "grpo" (yaml:b.yaml:9) now',
    ]
    os.remove(os.path.join(checkpoint, RUN_FILE))
    assert resume_changes(checkpoint, new) == []  # a checkpoint without a record (older grpokit): nothing to check


def test_publish_replaces_an_older_folder_of_the_same_name(tmp_path):
    old = fake_checkpoint(tmp_path / "checkpoint-5")
    new = fake_checkpoint(tmp_path / "tmp-checkpoint-5" / "checkpoint-5")
    with open(os.path.join(new, "model.safetensors"), "w") as fh:
        fh.write("new weights")
    _publish(new, old)
    assert sorted(os.listdir(tmp_path)) == ["checkpoint-5"]
    with open(os.path.join(old, "model.safetensors")) as fh:
        assert fh.read() == "new weights"


def test_saves_are_atomic_rotated_recorded_and_tokenless(tiny_model_dir, dataset, make_args, monkeypatch):
    token = "hf_NotForTheDisk0123456789"
    args = make_args(
        save_strategy="steps",
        save_steps=1,
        max_steps=3,
        save_total_limit=2,
        hub_token=token,
        write_run_records=False,  # the folder listings below are the checkpoints' alone
    )
    out = args.output_dir
    os.makedirs(os.path.join(out, "tmp-checkpoint-9", "checkpoint-9"))  # left by a save killed in an earlier run
    seen = []
    from transformers import Trainer

    original = Trainer._save_rng_state

    def spy(self, output_dir):  # where Trainer writes while the checkpoint is being saved
        seen.append((output_dir, sorted(os.listdir(out))))
        original(self, output_dir)

    monkeypatch.setattr(Trainer, "_save_rng_state", spy)
    trainer = GRPOTrainer(tiny_model_dir, text_reward, args=args, train_dataset=dataset)
    trainer.train()
    assert seen[0] == (os.path.join(out, "tmp-checkpoint-1", "checkpoint-1"), ["tmp-checkpoint-1"])
    assert seen[2] == (
        os.path.join(out, "tmp-checkpoint-3", "checkpoint-3"),
        ["checkpoint-1", "checkpoint-2", "tmp-checkpoint-3"],  # rotation waits until checkpoint-3 is complete
    )
    assert sorted(os.listdir(out)) == ["checkpoint-2", "checkpoint-3"]  # save_total_limit=2, no tmp-checkpoint-*
    with open(os.path.join(out, "checkpoint-3", RUN_FILE)) as fh:
        record = json.load(fh)["fields"]
    assert record["num_generations"] == {"value": 2, "source": "GRPOConfig(...)"}
    assert record["loss_type"] == {"value": "dapo", "source": "default"}
    assert record["model_name_or_path"] == {"value": tiny_model_dir, "source": "GRPOTrainer(model=...)"}
    saved_args = torch.load(os.path.join(out, "checkpoint-3", "training_args.bin"), weights_only=False)
    assert saved_args.hub_token is None and trainer.args.hub_token == token
    for root, _, files in os.walk(out):
        for name in files:
            with open(os.path.join(root, name), "rb") as fh:
                assert token.encode() not in fh.read(), os.path.join(root, name)


def test_resume_last_and_changed_settings(tiny_model_dir, dataset, make_args, caplog):
    args = make_args(save_strategy="steps", save_steps=1, max_steps=2)
    GRPOTrainer(tiny_model_dir, text_reward, args=args, train_dataset=dataset).train()

    changed = make_args(max_steps=3, per_device_train_batch_size=8, num_generations=4)
    trainer = GRPOTrainer(tiny_model_dir, text_reward, args=changed, train_dataset=dataset)
    with pytest.raises(ResumeError) as caught:
        trainer.train(resume_from_checkpoint="last")
    checkpoint = os.path.join(args.output_dir, "checkpoint-2")
    assert caught.value.lines == [
        f"resuming from {checkpoint}: 3 setting(s) differ from those the checkpoint was trained with (listed below); "
        "change them back, or set resume_allow_changes: true (--resume_allow_changes) to resume anyway",
        "  per_device_train_batch_size: 4 (GRPOConfig(...)) in the checkpoint, 8 (GRPOConfig(...)) now",
        "  generation_batch_size: 4 (derived) in the checkpoint, 8 (derived) now",
        "  num_generations: 2 (GRPOConfig(...)) in the checkpoint, 4 (GRPOConfig(...)) now",
    ]

    allowed = make_args(max_steps=3, num_generations=4, per_device_train_batch_size=8, resume_allow_changes=True)
    trainer = GRPOTrainer(tiny_model_dir, text_reward, args=allowed, train_dataset=dataset)
    trainer.train(resume_from_checkpoint=True)
    assert trainer.state.global_step == 3
    assert f"resuming from {checkpoint} with changed settings (resume_allow_changes)" in caplog.text


def test_a_run_stopped_after_a_checkpoint_logs_its_partial_interval_after_the_resume(make_args, dataset, tmp_path):
    """Stopped at step 3 of a 2-step logging grid, right after its checkpoint (as SIGTERM stops `grpokit train`): the
    end-of-training row carries no metrics of steps 3 (the checkpoint holds them), and the resumed run logs them on
    the grid, at step 4: rows at 2 and 4 only, no off-grid row at 3."""
    from transformers import TrainerCallback

    from grpokit import GRPOTrainer
    from grpokit.tiny import build_model, build_tokenizer

    class StopAt3(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 3:
                control.should_save = control.should_training_stop = True

    tokenizer = build_tokenizer()
    out = str(tmp_path / "run")
    args = make_args(output_dir=out, max_steps=4, logging_steps=2, save_strategy="steps", save_steps=100)
    first = GRPOTrainer(
        build_model(tokenizer),
        text_reward,
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[StopAt3()],
    )
    first.train()
    assert [row["step"] for row in first.state.log_history if "reward" in row] == [2]
    args = make_args(output_dir=out, max_steps=4, logging_steps=2, save_strategy="steps", save_steps=100)
    resumed = GRPOTrainer(
        build_model(tokenizer), text_reward, args=args, train_dataset=dataset, processing_class=tokenizer
    )
    resumed.train(resume_from_checkpoint=f"{out}/checkpoint-3")
    assert [row["step"] for row in resumed.state.log_history if "reward" in row] == [2, 4]
