"""Corrupt or planted checkpoint files: resuming from such a checkpoint is one `error:` line per bad file, naming the
file and what is wrong, and pointing at the previous complete checkpoint; nothing loads, nothing is written, and a
planted pickle never runs (files are opened as `torch.load(weights_only=True)` allows)."""

import os
import pickle
import shutil

import pytest
from test_train_cli import run_grpokit, write_recipe

from grpokit.checkpoints import checkpoint_problems, file_problem
from grpokit.cli import main


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, tiny_model_dir):
    """A run of 2 steps with a checkpoint after each (checkpoint-1, checkpoint-2)."""
    tmp = tmp_path_factory.mktemp("ckpt")
    recipe = write_recipe(tmp, tiny_model_dir, save_strategy="steps", save_steps=1, log_completions=False)
    done = run_grpokit("train", "--config", str(recipe), cwd=tmp)
    assert done.returncode == 0, done.stderr[-2000:]
    return tmp


class _Planted:
    """Unpickling this runs `os.system(command)`: what a planted checkpoint file would do if it were loaded."""

    def __init__(self, command):
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


def _truncate(path):
    with open(path, "r+b") as fh:
        fh.truncate(os.path.getsize(path) // 2)


def _garbage(path):
    with open(path, "wb") as fh:
        fh.write(b"\x00not a checkpoint file\xff" * 10)


CORRUPTIONS = {
    "rng_state.pth": (_truncate, "cannot be read (truncated or damaged: File is not a zip file; its archive is"),
    "optimizer.pt": (_garbage, "cannot be read ("),
    "model.safetensors": (_truncate, "cannot be read ("),
    "trainer_state.json": (lambda p: open(p, "w").write('{"global_step": "two"}'), "has no integer global_step"),
    "grpokit_run.json": (lambda p: open(p, "w").write("{truncated"), "cannot be read (JSONDecodeError: "),
}


@pytest.mark.parametrize("name", sorted(CORRUPTIONS))
def test_a_bad_file_is_one_line_naming_it_and_the_previous_checkpoint(finished_run, tmp_path, capsys, name):
    shutil.copytree(finished_run, tmp_path / "copy")
    run = tmp_path / "copy" / "run"
    corrupt, expected = CORRUPTIONS[name]
    corrupt(run / "checkpoint-2" / name)
    before = {p: p.stat().st_mtime_ns for p in run.rglob("*")}
    recipe = tmp_path / "copy" / "recipe.yaml"
    code = main(["train", "--config", str(recipe), "--output_dir", str(run), "--resume_from_checkpoint", "true"])
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert code == 2
    (line,) = errors
    assert line.startswith(f"error: resume_from_checkpoint: {run / 'checkpoint-2' / name}: {expected}")
    assert line.endswith(
        f"; resume from the previous complete checkpoint: --resume_from_checkpoint {run}/checkpoint-1"
    )
    assert {p: p.stat().st_mtime_ns for p in run.rglob("*")} == before  # nothing written, nothing removed


@pytest.mark.parametrize("protocol", [2, 4])
def test_a_planted_pickle_never_runs(finished_run, tmp_path, capsys, protocol):
    shutil.copytree(finished_run, tmp_path / "copy")
    run = tmp_path / "copy" / "run"
    sentinel = tmp_path / "PLANTED_RAN"
    with open(run / "checkpoint-2" / "scheduler.pt", "wb") as fh:
        pickle.dump(_Planted(f"touch {sentinel}"), fh, protocol=protocol)
    code = main(["train", "--config", str(tmp_path / "copy" / "recipe.yaml"), "--output_dir", str(run)])
    assert code == 2  # a previous run and no resume: refused before anything reads the checkpoint
    code = main(["train", "--config", str(tmp_path / "copy" / "recipe.yaml"), "--output_dir", str(run),
                 "--resume_from_checkpoint", str(run / "checkpoint-2")])  # fmt: skip
    (line,) = [x for x in capsys.readouterr().err.splitlines() if x.startswith("error:") and "scheduler.pt" in x]
    assert code == 2 and not sentinel.exists()
    assert line.startswith(f"error: resume_from_checkpoint: {run}/checkpoint-2/scheduler.pt: ")
    assert line.endswith(
        f"; resume from the previous complete checkpoint: --resume_from_checkpoint {run}/checkpoint-1"
    )
    if protocol == 2:  # torch's own format: the loader reads as far as the object it refuses, and names it
        assert ": holds a pickled object beyond tensors and plain values (it asks for posix.system): refused;" in line
    else:  # a newer pickle protocol is refused at its first instruction the loader does not take
        assert ": cannot be read (not a tensor file: Unsupported operand 149);" in line


def test_no_earlier_checkpoint_says_so(finished_run, tmp_path):
    shutil.copytree(finished_run / "run" / "checkpoint-1", tmp_path / "checkpoint-1")
    _garbage(tmp_path / "checkpoint-1" / "optimizer.pt")
    (line,) = checkpoint_problems(str(tmp_path / "checkpoint-1"))
    assert line.endswith("; no earlier complete checkpoint in this folder: start without resume_from_checkpoint")


def test_every_file_of_a_good_checkpoint_reads(finished_run):
    folder = finished_run / "run" / "checkpoint-2"
    assert checkpoint_problems(str(folder)) == []
    assert file_problem(str(folder / "rng_state.pth")) is None  # numpy's RNG state: allowed, as the loader allows it


def test_a_state_from_another_step_is_inconsistent(finished_run, tmp_path):
    for step in (1, 2):
        shutil.copytree(finished_run / "run" / f"checkpoint-{step}", tmp_path / f"checkpoint-{step}")
    shutil.copy(tmp_path / "checkpoint-1" / "trainer_state.json", tmp_path / "checkpoint-2" / "trainer_state.json")
    (line,) = checkpoint_problems(str(tmp_path / "checkpoint-2"))
    assert line == (
        f"resume_from_checkpoint: {tmp_path}/checkpoint-2/trainer_state.json: global_step 1 in a folder named for "
        f"step 2; resume from the previous complete checkpoint: --resume_from_checkpoint {tmp_path}/checkpoint-1"
    )
