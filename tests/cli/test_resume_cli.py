"""`grpokit train` killed with SIGKILL while a checkpoint is being written, then resumed with
`--resume_from_checkpoint true`: the interrupted checkpoint is never picked up, the last complete one is. Resume
refusals (missing checkpoint, changed settings) are one `error:` line each, before any model loads; no secret of the
YAML reaches the run's files."""

import json
import os

import pytest
from test_train_cli import run_grpokit, write_recipe
from transformers.trainer_utils import get_last_checkpoint

from grpokit.checkpoints import latest_checkpoint

TOKEN = "hf_KeepThisOffTheDisk12345"
WANDB_KEY = "wandb-key-0123456789abcdef"

# A user's reward module: importing it makes Trainer's RNG-state save (which comes after the weights, optimizer and
# scheduler of a checkpoint, before trainer_state.json) kill the process at the step named by KILL_DURING_SAVE.
KILLER = """
import os
import signal

from transformers import Trainer

_save_rng_state = Trainer._save_rng_state


def _killing_save_rng_state(self, output_dir):
    if str(self.state.global_step) == os.environ.get("KILL_DURING_SAVE"):
        os.kill(os.getpid(), signal.SIGKILL)
    _save_rng_state(self, output_dir)


Trainer._save_rng_state = _killing_save_rng_state


def length_reward(completions, **kwargs):
    return [float(len(c) % 3) for c in completions]
"""


def errors_of(result):
    return [line for line in result.stderr.splitlines() if line.startswith("error:")]


@pytest.fixture(scope="module")
def killed_then_resumed(tmp_path_factory, tiny_model_dir):
    tmp = tmp_path_factory.mktemp("resume")
    (tmp / "killer_rewards.py").write_text(KILLER)
    recipe = write_recipe(
        tmp,
        tiny_model_dir,
        reward_funcs=["killer_rewards.length_reward"],
        reward_weights=None,
        max_steps=3,
        save_strategy="steps",
        save_steps=1,
        hub_token=TOKEN,
        env={"WANDB_API_KEY": WANDB_KEY},
    )
    os.environ["KILL_DURING_SAVE"] = "2"
    try:
        killed = run_grpokit("train", "--config", str(recipe), cwd=tmp)
    finally:
        del os.environ["KILL_DURING_SAVE"]
    run = tmp / "run"
    after_kill = {
        "returncode": killed.returncode,
        "entries": sorted(os.listdir(run)),
        "interrupted": sorted(os.listdir(run / "tmp-checkpoint-2" / "checkpoint-2")),
        "latest": latest_checkpoint(str(run)),
        "transformers_latest": get_last_checkpoint(str(run)),
    }
    resumed = run_grpokit("train", "--config", str(recipe), "--resume_from_checkpoint", "true", cwd=tmp)
    return tmp, recipe, after_kill, resumed


def test_a_kill_while_saving_leaves_no_checkpoint_that_resume_picks_up(killed_then_resumed):
    tmp, _, after_kill, _ = killed_then_resumed
    run = tmp / "run"
    assert after_kill["returncode"] == -9
    assert "checkpoint-1" in after_kill["entries"] and "checkpoint-2" not in after_kill["entries"]
    assert "tmp-checkpoint-2" in after_kill["entries"]
    # The interrupted save got as far as the weights, optimizer and scheduler, not the RNG and trainer states.
    assert {"model.safetensors", "optimizer.pt", "scheduler.pt"} <= set(after_kill["interrupted"])
    assert "trainer_state.json" not in after_kill["interrupted"]
    assert after_kill["latest"] == after_kill["transformers_latest"] == str(run / "checkpoint-1")


def test_resume_true_continues_from_the_last_complete_checkpoint(killed_then_resumed):
    tmp, _, _, resumed = killed_then_resumed
    run = tmp / "run"
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "Traceback" not in resumed.stderr
    entries = sorted(os.listdir(run))
    assert [e for e in entries if "checkpoint" in e] == ["checkpoint-1", "checkpoint-2", "checkpoint-3"]
    state = json.loads((run / "checkpoint-3" / "trainer_state.json").read_text())
    assert state["global_step"] == 3
    # Step 1 was logged before the kill and kept; steps 2 and 3 by the resumed run (which started at step 1).
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [s for s in steps if s <= 3] == [1, 2, 3]
    assert "grpokit_run.json" in os.listdir(run / "checkpoint-3")


def test_no_secret_reaches_the_run_folder(killed_then_resumed):
    tmp, _, _, resumed = killed_then_resumed
    run = tmp / "run"
    assert resumed.returncode == 0
    for root, _, files in os.walk(run):
        for name in files:
            data = (tmp / root / name).read_bytes()
            assert TOKEN.encode() not in data and WANDB_KEY.encode() not in data, os.path.join(root, name)
    resolved = (run / "resolved_config.yaml").read_text().splitlines()
    assert any(line.startswith("# hub_token: <redacted: set HF_TOKEN or pass --hub_token>") for line in resolved)
    assert any(
        line.startswith("  # WANDB_API_KEY: <redacted: set WANDB_API_KEY in the environment>") for line in resolved
    )
    assert TOKEN not in resumed.stdout + resumed.stderr


def test_changed_settings_are_refused_then_allowed(killed_then_resumed):
    tmp, recipe, _, _ = killed_then_resumed
    run = tmp / "run"
    changed = ["--per_device_train_batch_size", "8", "--num_generations", "4", "--loss_type", "grpo"]
    result = run_grpokit("train", "--config", str(recipe), "--resume_from_checkpoint", "last", *changed, cwd=tmp)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    lines = {k.split(":")[0]: n for n, k in enumerate(recipe.read_text().splitlines(), start=1)}
    assert errors_of(result) == [
        f"error: resuming from {run}/checkpoint-3 (resume_from_checkpoint='last', cli): 4 setting(s) differ from "
        "those the checkpoint was trained with (listed below); change them back, or set resume_allow_changes: true "
        "(--resume_allow_changes) to resume anyway",
        f"error:   per_device_train_batch_size: 4 (yaml:{recipe}:{lines['per_device_train_batch_size']}) in the "
        "checkpoint, 8 (cli) now",
        "error:   generation_batch_size: 4 (derived) in the checkpoint, 8 (derived) now",
        f"error:   num_generations: 2 (yaml:{recipe}:{lines['num_generations']}) in the checkpoint, 4 (cli) now",
        'error:   loss_type: "dapo" (default) in the checkpoint, "grpo" (cli) now',
    ]

    allowed = run_grpokit(
        "train", "--config", str(recipe), "--resume_from_checkpoint", "last", *changed, "--resume_allow_changes",
        cwd=tmp,
    )  # fmt: skip
    assert allowed.returncode == 0, allowed.stderr[-3000:]
    assert f"warning: resuming from {run}/checkpoint-3 with changed settings (resume_allow_changes)" in allowed.stderr


def test_a_tied_lm_head_is_no_missing_key_and_a_changed_schedule_is_one_line(killed_then_resumed):
    tmp, recipe, _, resumed = killed_then_resumed
    run = tmp / "run"
    # The tiny model ties lm_head to its embedding: saved once, loaded whole, never reported missing.
    assert resumed.returncode == 0
    assert "missing keys" not in resumed.stdout + resumed.stderr
    assert "changed schedule" not in resumed.stderr  # the same schedule: nothing to say
    longer = ["--max_steps", "4", "--learning_rate", "0.002", "--save_steps", "2"]
    checkpoint = str(run / "checkpoint-3")  # the resumed run's last (the test above may have trained further)
    result = run_grpokit("train", "--config", str(recipe), "--resume_from_checkpoint", checkpoint, *longer, cwd=tmp)
    assert result.returncode == 0, result.stderr[-3000:]
    assert [line for line in result.stderr.splitlines() if "schedule" in line] == [
        f"warning: resuming from {run}/checkpoint-3 with a changed schedule: max_steps 3 → 4, learning_rate 0.001 "
        "→ 0.002, save_steps 1 → 2"
    ]
    assert "do not match" not in result.stderr  # transformers' own multi-line version of part of it
    assert "missing keys" not in result.stdout + result.stderr
    assert json.loads((run / "checkpoint-4" / "trainer_state.json").read_text())["global_step"] == 4


@pytest.mark.parametrize("where", ["missing", "no_checkpoint"])
def test_nothing_to_resume_is_one_line_before_loading(tmp_path, tiny_model_dir, where):
    recipe = write_recipe(tmp_path, tiny_model_dir)
    value = str(tmp_path / "nowhere") if where == "missing" else "true"
    result = run_grpokit("train", "--config", str(recipe), "--resume_from_checkpoint", value)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    expected = {
        "missing": f"error: resume_from_checkpoint='{value}' (cli): no such folder",
        "no_checkpoint": f"error: resume_from_checkpoint='true' (cli): no complete checkpoint in output_dir "
        f"{tmp_path}/run (a checkpoint-N folder holding trainer_state.json); leave resume_from_checkpoint unset to "
        "start afresh, or set output_dir to the run to resume",
    }[where]
    assert errors_of(result) == [expected]
    assert not (tmp_path / "run").exists()  # stopped before anything was loaded or written


def test_yaml_true_means_latest(tmp_path):
    from grpokit.config.parser import TrlParser

    path = tmp_path / "r.yaml"
    path.write_text("resume_from_checkpoint: true\n")
    assert TrlParser().resolve(["--config", str(path)]).values["resume_from_checkpoint"] == "true"
    path.write_text("resume_from_checkpoint: false\n")
    assert TrlParser().resolve(["--config", str(path)]).values["resume_from_checkpoint"] is None
