"""The output directory is checked before anything loads and locked while a run writes; records are never deleted;
every way a run can stop (SIGTERM, an unexpected exception, a full disk, nothing trained) keeps what was trained and
says so in one line. Real `grpokit train` subprocesses on a tiny local model; faults are injected with a
sitecustomize module where a real one cannot be (a full disk)."""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import subprocess
import sys

import pytest
from test_train_cli import run_grpokit, write_recipe

from grpokit.cli.run_dir import LOCK_NAME, RunLock, checkpoint_bytes, output_dir_problems


def _errors(result) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.startswith("error:")]


def _rows(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


# ------------------------------------------------------------------------------------------ checks before loading


def test_output_dir_that_is_a_file(tmp_path, tiny_model_dir):
    target = tmp_path / "run"
    target.write_text("not a folder")
    recipe = write_recipe(tmp_path, tiny_model_dir)
    result = run_grpokit("train", "--config", str(recipe), cwd=tmp_path)
    assert result.returncode == 2
    assert _errors(result) == [f"error: output_dir={str(target)!r} is a file, not a folder: choose another output_dir"]
    assert target.read_text() == "not a folder"


def test_output_dir_not_writable(tmp_path, monkeypatch):
    parent = tmp_path / "ro"
    parent.mkdir()
    monkeypatch.setattr(os, "access", lambda path, mode: os.path.abspath(path) != str(parent))  # root writes anyway
    assert output_dir_problems(str(parent / "run"), resuming=False, overwrite=False) == [
        f"output_dir={str(parent / 'run')!r}: {str(parent)!r}, where it would be made, is not writable: choose "
        "another output_dir"
    ]


def test_not_enough_free_space_for_a_checkpoint(tmp_path, tiny_model_dir):
    petabyte = 2**50
    (line,) = output_dir_problems(str(tmp_path / "run"), resuming=False, overwrite=False, checkpoint_bytes=petabyte)
    assert "free on its disk, a checkpoint needs about 1048576.0 GiB" in line
    # The estimate: fp32 weights (4 bytes) + AdamW's two fp32 states (8 bytes) per parameter; LoRA is not estimated.
    with open(os.path.join(tiny_model_dir, "model.safetensors"), "rb") as fh:
        header = json.loads(fh.read(int.from_bytes(fh.read(8), "little")))
    count = sum(math.prod(t["shape"]) for k, t in header.items() if k != "__metadata__")  # tied: stored once
    assert checkpoint_bytes({"model_name_or_path": tiny_model_dir}) == count * 12
    assert checkpoint_bytes({"model_name_or_path": tiny_model_dir, "dtype": "bfloat16"}) == count * 10
    assert checkpoint_bytes({"model_name_or_path": tiny_model_dir, "use_peft": True}) is None


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, tiny_model_dir):
    """A completed 2-step run: its folder holds weights and records."""
    tmp_path = tmp_path_factory.mktemp("finished")
    recipe = write_recipe(tmp_path, tiny_model_dir)
    result = run_grpokit("train", "--config", str(recipe), cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    return tmp_path, recipe


def test_a_previous_run_is_refused_and_left_untouched(finished_run):
    tmp_path, recipe = finished_run
    run = tmp_path / "run"
    before = {name: (run / name).read_bytes() for name in ("metrics.jsonl", "completions.jsonl", "model.safetensors")}
    result = run_grpokit("train", "--config", str(recipe), cwd=tmp_path)
    assert result.returncode == 2
    assert _errors(result) == [
        f"error: output_dir={str(run)!r} holds a previous run (completions.jsonl, metrics.jsonl, model.safetensors): "
        "resume it with --resume_from_checkpoint true, replace it with --overwrite_output_dir true, or choose another "
        "output_dir"
    ]
    assert {name: (run / name).read_bytes() for name in before} == before


def test_a_live_lock_refuses_and_a_stale_one_is_taken_over(tmp_path, tiny_model_dir):
    recipe = write_recipe(tmp_path, tiny_model_dir, max_steps=1)
    run = tmp_path / "run"
    run.mkdir()
    host = socket.gethostname()
    (run / LOCK_NAME).write_text(json.dumps({"pid": os.getpid(), "host": host, "since": "2026-12-03 10:00:00"}))
    refused = run_grpokit("train", "--config", str(recipe), cwd=tmp_path)
    assert refused.returncode == 2
    assert _errors(refused) == [
        f"error: output_dir={str(run)!r} is in use by another run (pid {os.getpid()} on {host} since 2026-12-03 "
        "10:00:00): wait for it to end or choose another output_dir"
    ]
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # a pid that no process has any more
    (run / LOCK_NAME).write_text(json.dumps({"pid": dead.pid, "host": host, "since": "2026-12-03 10:00:00"}))
    taken = run_grpokit("train", "--config", str(recipe), cwd=tmp_path)
    assert taken.returncode == 0, taken.stderr[-2000:]
    assert f"warning: took over the lock of {run} left by pid {dead.pid} on {host}" in taken.stderr
    assert not (run / LOCK_NAME).exists()  # released at the end


def test_lock_is_exclusive_in_process(tmp_path):
    first = RunLock(str(tmp_path)).acquire()
    with pytest.raises(Exception, match="is in use by another run"):
        RunLock(str(tmp_path)).acquire()
    first.release()
    RunLock(str(tmp_path)).acquire().release()


def test_failed_start_leaves_no_folder_and_deletes_no_records(finished_run, tmp_path, tiny_model_dir):
    # a start that fails after the checks (the reward module has no such function) writes nothing
    recipe = write_recipe(tmp_path, tiny_model_dir, reward_funcs=["json.no_such_reward"], reward_weights=None)
    result = run_grpokit("train", "--config", str(recipe), cwd=tmp_path)
    assert result.returncode == 2 and "no_such_reward" in _errors(result)[0]
    assert not (tmp_path / "run").exists()
    # resuming a run without a checkpoint is refused before anything is touched
    done, done_recipe = finished_run
    metrics = (done / "run" / "metrics.jsonl").read_bytes()
    resumed = run_grpokit("train", "--config", str(done_recipe), "--resume_from_checkpoint", "true", cwd=done)
    assert resumed.returncode == 2
    assert (done / "run" / "metrics.jsonl").read_bytes() == metrics


# ------------------------------------------------------------------------------------------ stopping


def _popen(recipe, cwd, *flags, env_extra=None):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    env.update(env_extra or {})
    return subprocess.Popen(
        [sys.executable, "-m", "grpokit", "train", "--config", str(recipe), *flags],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_sigterm_saves_a_checkpoint_and_the_run_resumes_with_its_records(tmp_path, tiny_model_dir):
    recipe = write_recipe(tmp_path, tiny_model_dir, max_steps=500, save_strategy="steps", save_steps=1000)
    proc = _popen(recipe, tmp_path)
    for line in proc.stdout:  # the first progress line: training is under way
        if line.startswith("step"):
            break
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err[-2000:]
    (line,) = [x for x in err.splitlines() if x.startswith("error:")]
    step = int(line.split("stopped after step ")[1].split(";")[0])
    checkpoint = tmp_path / "run" / f"checkpoint-{step}"
    assert line == (
        f"error: SIGTERM: stopped after step {step}; checkpoint saved to {checkpoint} (continue with "
        "--resume_from_checkpoint true)"
    )
    assert (checkpoint / "trainer_state.json").is_file() and (checkpoint / "optimizer.pt").is_file()
    assert "Traceback" not in err
    rows = _rows(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, step + 1))
    resumed = run_grpokit(
        "train",
        "--config",
        str(recipe),
        "--resume_from_checkpoint",
        "true",
        "--max_steps",
        str(step + 2),
        cwd=tmp_path,
    )
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    after = _rows(tmp_path / "run" / "metrics.jsonl")
    assert after[:step] == rows  # the rows up to the checkpoint are kept as they were
    assert [r["step"] for r in after if "reward" in r] == list(range(1, step + 3))


def _sitecustomize(tmp_path, code: str) -> dict:
    folder = tmp_path / "inject"
    folder.mkdir()
    (folder / "sitecustomize.py").write_text(code)
    return {"PYTHONPATH": os.pathsep.join([str(folder), os.environ.get("PYTHONPATH", "")])}


def test_an_unexpected_exception_saves_the_weights_then_shows_the_error(tmp_path, tiny_model_dir):
    env = _sitecustomize(
        tmp_path,
        "import torch\n_step = torch.optim.AdamW.step\n_n = [0]\n"
        "def step(self, *a, **k):\n    _n[0] += 1\n    if _n[0] == 3:\n        raise RuntimeError('injected fault')\n"
        "    return _step(self, *a, **k)\ntorch.optim.AdamW.step = step\n",
    )
    recipe = write_recipe(tmp_path, tiny_model_dir, max_steps=5)
    proc = _popen(recipe, tmp_path, env_extra=env)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 1, err[-2000:]
    saved = tmp_path / "run" / "interrupted-step-2"
    assert "Traceback" in err and "RuntimeError: injected fault" in err  # a bug: its traceback, then the one line
    assert err.strip().splitlines()[-1] == (
        f"error: RuntimeError: injected fault (weights at step 2 saved to {saved})"
    )
    assert (saved / "model.safetensors").is_file()


def test_disk_full_during_a_checkpoint_keeps_the_previous_one(tmp_path, tiny_model_dir):
    env = _sitecustomize(
        tmp_path,
        "import errno, safetensors.torch as st\n_save = st.save_file\n"
        "def save_file(tensors, filename, *a, **k):\n"
        "    if 'checkpoint-4' in str(filename):\n"
        "        raise OSError(errno.ENOSPC, 'No space left on device', str(filename))\n"
        "    return _save(tensors, filename, *a, **k)\nst.save_file = save_file\n",
    )
    recipe = write_recipe(tmp_path, tiny_model_dir, max_steps=6, save_strategy="steps", save_steps=2)
    proc = _popen(recipe, tmp_path, env_extra=env)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 1, err[-2000:]
    run = tmp_path / "run"
    assert _errors(subprocess.CompletedProcess([], 1, out, err)) == [
        f"error: disk full at step 4: the checkpoint being written was removed; the last checkpoint is "
        f"{run / 'checkpoint-2'} (--resume_from_checkpoint true); free some space"
    ]
    assert "Traceback" not in err
    assert sorted(p.name for p in run.iterdir() if "checkpoint" in p.name) == ["checkpoint-2"]
    assert (run / "checkpoint-2" / "trainer_state.json").is_file()


def test_nothing_is_saved_when_no_step_was_trained(tmp_path, tiny_model_dir):
    (tmp_path / "my_rewards.py").write_text("def broken(completions, **kwargs):\n    raise KeyError('answer')\n")
    recipe = write_recipe(tmp_path, tiny_model_dir, reward_funcs=["my_rewards.broken"], reward_weights=None)
    result = run_grpokit("train", "--config", str(recipe), cwd=tmp_path)
    assert result.returncode == 1
    (line,) = _errors(result)
    assert line.startswith("error: reward function 'broken' raised KeyError") and line.endswith(
        "(no step was trained: nothing saved)"
    )
    assert not [p for p in (tmp_path / "run").iterdir() if p.name.startswith("interrupted")]


@pytest.fixture
def small_disk(tmp_path):
    """A real 512 KiB file system (tmpfs; needs root): room for one checkpoint of the tiny model, not two."""
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(mount_point)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.decode().strip()}); the simulated ENOSPC test stands")
    yield mount_point
    subprocess.run(["umount", str(mount_point)], check=True)


def test_a_real_full_disk_keeps_the_previous_checkpoint(tmp_path, tiny_model_dir, small_disk):
    run = small_disk / "run"
    recipe = write_recipe(
        tmp_path, tiny_model_dir, max_steps=8, save_strategy="steps", save_steps=2, output_dir=str(run)
    )
    proc = _popen(recipe, tmp_path)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 1, err[-2000:]
    (line,) = [x for x in err.splitlines() if x.startswith("error:")]
    step = int(line.split("disk full at step ")[1].split(":")[0])
    assert line == (
        f"error: disk full at step {step}: the checkpoint being written was removed; the last checkpoint is "
        f"{run / f'checkpoint-{step - 2}'} (--resume_from_checkpoint true); free some space"
    )
    assert "Traceback" not in err
    assert sorted(p.name for p in run.iterdir() if "checkpoint" in p.name) == [f"checkpoint-{step - 2}"]
    assert (run / f"checkpoint-{step - 2}" / "trainer_state.json").is_file()
