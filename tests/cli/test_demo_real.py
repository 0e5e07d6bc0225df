"""`grpokit train --demo real`: SmolLM2-135M-Instruct learns to answer one-digit sums with the number alone."""

import json
import os
import subprocess
import sys

import pytest

from grpokit import gguf
from grpokit.cli import main
from grpokit.demo import HELD_OUT, SUM_EXAMPLE, sum_pairs, sum_reward, sum_row
from grpokit.records.plot import curve_series

try:
    gguf.smollm2_gguf()
    HAVE_REAL = True
except ValueError:
    HAVE_REAL = False


def test_the_sums_are_split_once_and_the_example_is_in_neither():
    train, held_out = sum_pairs(0)
    assert (len(train), len(held_out)) == (67, HELD_OUT) and not set(train) & set(held_out)
    assert SUM_EXAMPLE not in train + held_out and sum_pairs(0) == (train, held_out) != sum_pairs(1)
    row = sum_row(4, 8)
    assert row["answer"] == "12" and [m["role"] for m in row["prompt"]] == ["user", "assistant", "user"]
    assert row["prompt"][1]["content"] == "7" and row["prompt"][2]["content"] == "What is 4 + 8?"


def test_sum_reward_by_hand():
    replies = ["12", " 12.", "12\n", "4 + 8 = 12", "The answer is 12.", "13", "", "12 apples"]
    assert sum_reward([[{"role": "assistant", "content": r}] for r in replies], ["12"] * 8) == [
        1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0,
    ]  # fmt: skip


def test_the_plot_reads_the_held_out_rows():
    rows = [{"step": 5, "reward": 0.1}, {"step": 0, "held_out/greedy_accuracy": 0.25},
            {"step": 40, "held_out/greedy_accuracy": 0.5}]  # fmt: skip
    assert curve_series(rows)["held_out"] == {"step": [0, 40], "value": [0.25, 0.5]}


def test_demo_real_may_come_after_other_flags(monkeypatch):
    import grpokit.cli.train

    seen = []
    monkeypatch.setattr(grpokit.cli.train, "run_demo", lambda args: seen.append(args) or 0)
    assert main(["train", "--max_steps", "3", "--demo", "real"]) == 0
    assert seen == [["real", "--max_steps", "3"]]


@pytest.mark.skipif(not HAVE_REAL, reason=f"the real model is not installed: {gguf.INSTALL_HINT}")
def test_a_short_real_demo_scores_the_held_out_sums_evaluates_and_saves(tmp_path):
    """Two steps of the real demo: the held-out sums scored greedily before and after (rows at steps 0 and 2, drawn
    in the plot), TRL's evaluation at eval_steps (eval_reward rows at steps 1 and 2), the model saved as safetensors
    that reload."""
    from transformers import AutoModelForCausalLM

    out = tmp_path / "real"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    command = [sys.executable, "-m", "grpokit", "train", "--demo", "real", "--output_dir", str(out)]
    command += ["--max_steps", "2", "--logging_steps", "1", "--eval_steps", "1", "--per_device_train_batch_size", "8"]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "held-out accuracy (greedy, 32 sums never trained on) before training:" in result.stdout
    assert "demo: held-out accuracy (greedy)" in result.stdout
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "held_out/greedy_accuracy" in r] == [0, 2]
    assert [r["step"] for r in rows if "eval_reward" in r] == [1, 2]
    assert (out / "reward_curve.png").is_file() and (out / "model.safetensors").is_file()
    assert AutoModelForCausalLM.from_pretrained(out).config.vocab_size == 49152
