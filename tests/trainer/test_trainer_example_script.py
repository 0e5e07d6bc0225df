"""examples/trl_grpo_script.py, a script written for TRL, runs as is with grpokit (in a subprocess, offline)."""

import os
import subprocess
import sys

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "trl_grpo_script.py")


def test_only_the_import_line_mentions_grpokit():
    with open(SCRIPT) as f:
        imports = [line.strip() for line in f if line.startswith(("import ", "from "))]
    assert [line for line in imports if "grpokit" in line or "trl" in line] == [
        "from grpokit import GRPOConfig, GRPOTrainer"
    ]


def test_example_script_trains_offline(tiny_model_dir, tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": ""}
    result = subprocess.run(
        [
            sys.executable,
            SCRIPT,
            "--model_name_or_path",
            tiny_model_dir,
            "--output_dir",
            str(tmp_path),
            "--max_steps",
            "2",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "completions at step 2" in result.stdout
    assert "'rewards/reward_mentions_answer/mean'" in result.stdout
    assert os.path.isdir(tmp_path / "checkpoint-2")
    assert os.path.exists(tmp_path / "model.safetensors")
    # the records `grpokit train` leaves, left by a TRL script too (grpokit.records)
    for name in ("metrics.jsonl", "reward_curve.png", "resolved_config.yaml"):
        assert os.path.isfile(tmp_path / name), name
    assert "# python" in (tmp_path / "resolved_config.yaml").read_text()
