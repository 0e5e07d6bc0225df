"""`grpokit train --demo` with a learning rate that makes the run non-finite: the NaN guard stops it with one line and
saves the last finite weights."""

import os
import re
import subprocess
import sys

import torch
from safetensors.torch import load_file

SMALL = ["--per_device_train_batch_size", "8", "--num_generations", "4", "--logging_steps", "1"]


def run_demo(out, *args):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    command = [sys.executable, "-m", "grpokit", "train", "--demo", *SMALL, "--output_dir", str(out), *args]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)


def test_nonfinite_steps_in_a_row_stop_with_one_line_and_the_last_finite_weights(tmp_path):
    # lr 1e30: the first update that moves the weights makes every later loss NaN.
    result = run_demo(tmp_path / "run", "--learning_rate", "1e30", "--max_steps", "20", "--max_nonfinite_steps", "3")
    assert result.returncode == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr[-3000:]
    found = re.fullmatch(
        r"error: max_nonfinite_steps=3: 3 optimizer steps in a row \(steps (\d+) to (\d+)\) had a non-finite loss or "
        r"gradient norm \(last: .*\); the last finite weights \(those after step (\d+)\) are saved to (.*)",
        errors[0],
    )
    assert found, errors[0]
    first, last, good, saved = int(found[1]), int(found[2]), int(found[3]), found[4]
    assert (last, good) == (first + 2, first - 1) and good >= 1
    assert saved == str(tmp_path / "run" / f"interrupted-step-{last - 1}")
    warnings = [line for line in result.stderr.splitlines() if "optimizer step skipped" in line]
    assert [w.split(":")[1].strip() for w in warnings] == [f"step {first}", f"step {first + 1}"], warnings

    weights = load_file(os.path.join(saved, "model.safetensors"))
    assert all(torch.isfinite(t).all() for t in weights.values())
    # The same run stopped after the last good step holds the same weights, bit for bit.
    again = run_demo(tmp_path / "good", "--learning_rate", "1e30", "--max_steps", str(good))
    assert again.returncode == 0, again.stderr[-3000:]
    reference = load_file(str(tmp_path / "good" / "model.safetensors"))
    assert weights.keys() == reference.keys()
    assert all(torch.equal(weights[name], reference[name]) for name in weights)
