"""Reward faults injected into real `grpokit train` runs (in this process, through `grpokit.cli.main`): a reward that
hangs (sync or async), returns inf, or scores nothing. Each stops with one `error:` line and exit code 1 with the
weights saved and finite, or, for a round that scores nothing, trains nothing on it and warns once."""

import json
import math
import sys
import threading
import uuid

import pytest
import torch
from safetensors.torch import load_file

from grpokit.cli import main

LAUNCHER_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "ACCELERATE_USE_CPU")


@pytest.fixture(autouse=True)
def _not_launched(monkeypatch, tmp_path):
    for name in LAUNCHER_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)  # `grpokit train` imports dotted reward paths from the working directory, as
    monkeypatch.syspath_prepend(str(tmp_path))  # `python -m grpokit` finds them there


@pytest.fixture
def train(tmp_path, tiny_model_dir, capsys):
    """`train(reward_source, **recipe)` writes the reward module, runs `grpokit train` on a tiny model (4
    completions of 8 tokens per step), returns (exit code, stdout, stderr, the reward module)."""

    def run(source: str, **overrides):
        module = f"faulty_{uuid.uuid4().hex[:8]}"  # a fresh module each run: nothing cached between tests
        (tmp_path / f"{module}.py").write_text(source)
        rows = [{"prompt": f"{i}+{i}="} for i in range(8)]
        (tmp_path / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        recipe = {
            "model_name_or_path": tiny_model_dir,
            "dataset_name": str(tmp_path / "data.jsonl"),
            "reward_funcs": [f"{module}.{overrides.pop('reward', 'reward')}"],
            "num_generations": 2,
            "per_device_train_batch_size": 4,
            "max_completion_length": 8,
            "max_steps": 3,
            "logging_steps": 1,
            "learning_rate": 1.0e-2,
            "gradient_checkpointing": False,
            "bf16": False,
            "report_to": "none",
            "save_strategy": "no",
            "seed": 0,
            "output_dir": str(tmp_path / "run"),
            **overrides,
        }
        (tmp_path / "recipe.yaml").write_text("".join(f"{k}: {json.dumps(v)}\n" for k, v in recipe.items()))
        capsys.readouterr()
        code = main(["train", "--config", str(tmp_path / "recipe.yaml")])
        out, err = capsys.readouterr()
        return code, out, err, sys.modules.get(module)

    yield run
    for name in [m for m in sys.modules if m.startswith("faulty_")]:
        release = getattr(sys.modules[name], "release", None)
        if release is not None:
            release.set()  # let an abandoned reward thread finish
        del sys.modules[name]


def errors(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("error:")]


def unscorable_warnings(caplog) -> list[str]:
    """The trainer's warning, as logged (the console shows it on stderr; pytest captures log records)."""
    messages = [record.getMessage() for record in caplog.records if record.name == "grpokit.trainer"]
    return [message for message in messages if "every reward was None/NaN in this round" in message]


def weights(path) -> dict:
    return load_file(str(path / "model.safetensors"))


def assert_finite(path):
    tensors = weights(path)
    assert tensors and all(torch.isfinite(t).all() for t in tensors.values())


# A reward that scores the first round, then misbehaves from the second call on: the weights saved are those after
# one trained step.
FIRST_CALL_FINE = """
import asyncio, math, threading, time
calls = []
release = threading.Event()
cancelled = threading.Event()

def first_fine(completions):
    calls.append(len(completions))
    return len(calls) == 1
"""


def test_a_hanging_sync_reward_stops_the_run_in_one_line(train, tmp_path):
    source = FIRST_CALL_FINE + (
        "def slow_reward(completions, **kwargs):\n"
        "    if not first_fine(completions):\n"
        "        release.wait(60)\n"
        "    return [float(len(c)) for c in completions]\n"
    )
    code, _, err, module = train(source, reward="slow_reward", reward_timeout=1)
    assert code == 1, err[-3000:]
    assert "Traceback" not in err
    (line,) = errors(err)
    assert line.startswith(
        "error: reward function 'slow_reward' did not return within 1.0 s (reward_timeout) on a batch of 4 "
        "completions; the batch starts with sample 0 (prompt="
    ), line
    assert line.endswith(f"(weights at step 1 saved to {tmp_path / 'run' / 'interrupted-step-1'})")
    assert module.calls == [4, 4]
    assert_finite(tmp_path / "run" / "interrupted-step-1")
    # The abandoned thread is still waiting; it would run until its function returns.
    assert any(t.name == "grpokit-reward-0" and t.is_alive() for t in threading.enumerate())


def test_a_hanging_async_reward_is_cancelled_and_stops_the_run_in_one_line(train, tmp_path):
    source = FIRST_CALL_FINE + (
        "async def remote_judge(completions, **kwargs):\n"
        "    if not first_fine(completions):\n"
        "        try:\n"
        "            await asyncio.sleep(60)\n"
        "        except asyncio.CancelledError:\n"
        "            cancelled.set()\n"
        "            raise\n"
        "    return [float(len(c)) for c in completions]\n"
    )
    code, _, err, module = train(source, reward="remote_judge", reward_timeout=1)
    assert code == 1, err[-3000:]
    assert "Traceback" not in err
    (line,) = errors(err)
    assert line.startswith(
        "error: reward function 'remote_judge' did not return within 1.0 s (reward_timeout) on a batch of 4 "
    ), line
    assert "interrupted-step-1" in line
    assert module.cancelled.wait(5)
    assert_finite(tmp_path / "run" / "interrupted-step-1")


def test_an_infinite_reward_stops_the_run_naming_function_and_sample(train, tmp_path):
    source = FIRST_CALL_FINE + (
        "def explosive(completions, **kwargs):\n"
        "    first = first_fine(completions)\n"
        "    return [1.0 if first or i != 2 else -math.inf for i in range(len(completions))]\n"
    )
    code, _, err, _ = train(source, reward="explosive")
    assert code == 1, err[-3000:]
    assert "Traceback" not in err
    (line,) = errors(err)
    assert line.startswith("error: reward function 'explosive' returned -inf for sample 2 (prompt="), line
    assert "rewards must be finite float32 numbers (None for no opinion)" in line
    assert_finite(tmp_path / "run" / "interrupted-step-1")


@pytest.mark.parametrize("nothing", ["None", "math.nan"])
def test_rounds_that_score_nothing_train_nothing_and_warn_once(train, tmp_path, tiny_model_dir, caplog, nothing):
    source = f"import math\ndef blank(completions, **kwargs):\n    return [{nothing}] * len(completions)\n"
    code, out, err, _ = train(source, reward="blank", max_steps=2, max_unscorable_rounds=3)
    assert code == 0, err[-3000:]
    assert "Traceback" not in err and not errors(err)
    (warning,) = unscorable_warnings(caplog)
    assert warning == (
        "every reward was None/NaN in this round ('blank' scored none of 4 completions): nothing to learn from it, "
        "its advantages are 0 and its reward metrics NaN; warned once"
    )
    progress = [line for line in out.splitlines() if line.startswith("step ")]
    assert len(progress) == 2 and all("reward nan ± nan" in line for line in progress)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "loss" in r]
    assert len(rows) == 2
    for row in rows:
        assert math.isnan(row["reward"]) and math.isnan(row["reward_std"]) and math.isnan(row["rewards/blank/mean"])
        assert row["loss"] == 0.0 and row["grad_norm"] == 0.0  # zero advantages, beta 0: no gradient at all
    initial, final = weights(__import__("pathlib").Path(tiny_model_dir)), weights(tmp_path / "run")
    assert all(torch.equal(initial[name], final[name]) for name in initial)  # nothing was learned


def test_too_many_unscorable_rounds_in_a_row_stop_the_run(train, tmp_path, caplog):
    source = "def blank(completions, **kwargs):\n    return [None] * len(completions)\n"
    code, _, err, _ = train(source, reward="blank", max_steps=5, max_unscorable_rounds=2)
    assert code == 1, err[-3000:]
    assert "Traceback" not in err
    (line,) = errors(err)
    assert line.startswith(
        "error: every reward was None/NaN in 2 generation rounds in a row (max_unscorable_rounds=2): nothing to "
        "learn from; 'blank' scored none of the 4 completions of the last round, which starts with sample 0 (prompt="
    ), line
    assert line.endswith(f"(weights at step 1 saved to {tmp_path / 'run' / 'interrupted-step-1'})")
    assert len(unscorable_warnings(caplog)) == 1
    assert_finite(tmp_path / "run" / "interrupted-step-1")


def test_unscorable_rounds_that_are_not_in_a_row_do_not_stop_the_run(train):
    source = (
        "calls = []\n"
        "def every_other(completions, **kwargs):\n"
        "    calls.append(1)\n"
        "    return [None if len(calls) % 2 else 1.0] * len(completions)\n"
    )
    # Rounds 1 and 3 score nothing: without the reset after round 2, round 3 would be the second in a row.
    code, _, err, module = train(source, reward="every_other", max_steps=3, max_unscorable_rounds=2)
    assert code == 0, err[-3000:]
    assert len(module.calls) == 3


def test_a_reward_that_exits_is_one_line_not_a_finished_run(train):
    code, _, err, _ = train("import sys\n\ndef reward(completions, **kwargs):\n    sys.exit(0)\n")
    assert code == 1
    assert errors(err)[-1] == (
        "error: reward function 'reward' called sys.exit(0) on a batch of 4 completions; a reward returns scores and "
        "must not end the run (no step was trained: nothing saved)"
    )


def test_threads_a_reward_leaves_do_not_keep_the_finished_command_alive(tmp_path, tiny_model_dir):
    """The console command (`python -m grpokit train`) exits when the run is done, with one warning naming the
    non-daemon thread a reward started and never joined (the interpreter would wait for it forever)."""

    (tmp_path / "lingering.py").write_text(
        "import threading\n\n"
        "def reward(completions, **kwargs):\n"
        "    if not any(t.name == 'lingering-worker' for t in threading.enumerate()):\n"
        "        worker = threading.Thread(target=threading.Event().wait, name='lingering-worker', daemon=False)\n"
        "        worker.start()\n"
        "    return [1.0] * len(completions)\n"
    )
    done = _console_train(tmp_path, tiny_model_dir, "lingering.reward")
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "run" / "model.safetensors").is_file()
    assert done.stderr.strip().splitlines()[-1] == (
        "warning: exiting without waiting for 1 thread(s) that user code left running: lingering-worker"
    )


def test_os_exit_zero_in_a_reward_is_not_a_success(tmp_path, tiny_model_dir):
    """`os._exit(0)` ends the training process at once with status 0; the command that supervises it says the run
    did not finish, in one line, with status 1 (a scheduler must not take the missing model for a finished run)."""

    (tmp_path / "exiter.py").write_text("import os\n\ndef reward(completions, **kwargs):\n    os._exit(0)\n")
    done = _console_train(tmp_path, tiny_model_dir, "exiter.reward")
    assert done.returncode == 1
    assert errors(done.stderr) == [
        "error: the training process exited with status 0 before `grpokit train` finished (os._exit in a reward, a "
        "callback or a library?): the run is incomplete; its last checkpoint, if any, is in output_dir"
    ]


def _console_train(tmp_path, model_dir, reward: str):
    """`python -m grpokit train` (the console command, supervised) for one step with `reward`, in tmp_path."""
    import os
    import subprocess

    (tmp_path / "data.jsonl").write_text("".join(json.dumps({"prompt": f"{i}="}) + "\n" for i in range(8)))
    command = [sys.executable, "-m", "grpokit", "train", "--model_name_or_path", model_dir, "--reward_funcs", reward]
    command += ["--dataset_name", str(tmp_path / "data.jsonl"), "--num_generations", "2"]
    command += ["--per_device_train_batch_size", "4", "--max_completion_length", "4", "--max_steps", "1"]
    command += ["--report_to", "none", "--save_strategy", "no", "--output_dir", "run"]
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_ENV}
    return subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
