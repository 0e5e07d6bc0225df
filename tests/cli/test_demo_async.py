"""`grpokit train --demo async` and the asynchronous fields on the command's path (YAML, flags, config validate)."""

import json
import os
import subprocess
import sys

from grpokit.cli import main

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def test_the_async_demo_learns(tmp_path):
    """The whole digits demo with async_grpo (the local sampler here, no vLLM in this environment): the reward rises
    from about 0.01 to a mean of 0.15 or more, and 5 times the first 5 logged steps' mean, over the last 5, every
    sample within max_staleness=1 of the policy that trains it. The worker thread and the trainer draw from torch's one
    random generator in an order the threads' timing decides, so runs differ: over the last tenth of the steps 0.55,
    0.78, 0.89, 0.90, 0.99, 0.99 and 1.00 were seen in seven runs alone (one intra-op thread, as the demo runs) and 0.81
    and 1.00 with two, and 0.28 and 0.29 in two full-suite runs; the bound leaves room for that and still fails a demo
    that does not learn (about 0.01-0.05 throughout)."""
    out = tmp_path / "demo"
    command = [sys.executable, "-m", "grpokit", "train", "--demo", "async", "--output_dir", str(out)]
    command += ["--max_steps", "400"]
    result = subprocess.run(command, env=ENV, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "generating the next batches while it trains on this one" in result.stdout
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "reward" in r]
    first = sum(r["reward"] for r in rows[:5]) / 5
    last = sum(r["reward"] for r in rows[-5:]) / 5
    assert rows[0]["reward"] < 0.1 and last >= max(0.15, 5 * first), [r["reward"] for r in rows]
    assert all(r["sample/staleness_max"] <= 1 for r in rows)
    assert max(r["sample/staleness_max"] for r in rows) == 1  # the worker does run a batch ahead


def test_pipeline_fields_without_async_grpo_are_refused_by_validate(tmp_path, capsys):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("model_name_or_path: m\ndataset_name: d\nmax_staleness: 2\nqueue_maxsize: 0\n")
    assert main(["config", "validate", "--config", str(recipe)]) != 0
    err = capsys.readouterr()
    text = err.out + err.err
    assert "max_staleness=2" in text and "has no effect without async_grpo: true" in text
    assert "queue_maxsize=0" in text


def test_async_rules_on_the_command_line(tmp_path, capsys):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("model_name_or_path: m\ndataset_name: d\nasync_grpo: true\n")
    code = main(["config", "validate", "--config", str(recipe), "--num_iterations", "2", "--max_staleness", "-1"])
    assert code != 0
    err = capsys.readouterr()
    text = err.out + err.err
    assert "num_iterations=2" in text and "trains each sample once" in text
    assert "max_staleness=-1" in text
