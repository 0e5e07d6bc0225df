"""Exact resume: a real run killed with SIGKILL (right after a checkpoint, between checkpoints, inside a generation
round) and resumed from its latest checkpoint ends with the same weights (0.0 difference) and logs the same metric
rows and completions as the run that was never interrupted.

Each run is a subprocess (`_resume_run.py`) on the demo's tiny model, fp32 CPU, one torch thread.
"""

import json
import os
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from safetensors.torch import load_file

RUNNER = os.path.join(os.path.dirname(__file__), "_resume_run.py")
TIMING = {"step_time", "train_runtime", "train_samples_per_second", "train_steps_per_second", "total_flos"}

COMMON = dict(
    per_device_train_batch_size=8,
    num_generations=4,
    max_completion_length=4,
    learning_rate=3e-2,  # large, so that training on a regenerated round would show at once
    lr_scheduler_type="constant",
    max_steps=6,
    logging_steps=1,
    save_strategy="steps",
    beta=0.04,  # reference log-probabilities in the buffered round too
    loss_type="dapo",
    use_adaptive_entropy=True,
    entropy_target=10.0,
    log_completions=True,
    num_completions_to_print=0,
    report_to="none",
    use_cpu=True,
    bf16=False,
    gradient_checkpointing=False,
    disable_tqdm=True,
    seed=3,
)
# A generation round spans two optimizer steps in both: its 2 micro-batches one per step, or 2 passes over its 2
# micro-batches, accumulated 2 per step.
CONFIGS = {
    "steps_per_generation_2": dict(gradient_accumulation_steps=1, steps_per_generation=2, save_steps=1),
    "num_iterations_2": dict(gradient_accumulation_steps=2, steps_per_generation=2, num_iterations=2, save_steps=3),
    # dynamic sampling: the rounds after the checkpoint draw their extra prompts where the refill stream stood
    "dynamic_sampling": dict(
        gradient_accumulation_steps=1, steps_per_generation=2, save_steps=1, dynamic_sampling=True
    ),
}
# (config, kill point, checkpoint the resumed run starts from)
CASES = {
    "right_after_checkpoint": ("steps_per_generation_2", {"at": "save", "step": 2}, 2),  # a round boundary
    "inside_round_steps_per_generation_2": ("steps_per_generation_2", {"at": "save", "step": 3}, 3),
    "between_checkpoints_inside_round_num_iterations_2": ("num_iterations_2", {"at": "step_end", "step": 5}, 3),
    "dynamic_sampling_right_after_checkpoint": ("dynamic_sampling", {"at": "save", "step": 2}, 2),
}


def _run(spec):
    os.makedirs(spec["output_dir"], exist_ok=True)
    path = os.path.join(spec["output_dir"], f"spec-{len(os.listdir(spec['output_dir']))}.json")
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(spec, fh)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1"}
    return subprocess.run([sys.executable, RUNNER, path], capture_output=True, text=True, env=env, timeout=300)


def _rows(path):
    with open(path, encoding="utf-8") as fh:
        rows = [json.loads(line) for line in fh]
    # the end-of-training summary (runtime, and train_loss averaged over this process's steps only) is not compared
    return {r["step"]: r for r in rows if "train_runtime" not in r["logs"]}


def _comparable(row):
    return {"logs": {k: v for k, v in row["logs"].items() if k not in TIMING}, "completions": row["completions"]}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Every run of the module, two at a time: the uninterrupted one of each config, then each case killed and
    resumed."""
    from grpokit.demo import prepare_demo

    root = tmp_path_factory.mktemp("resume")
    model, data = prepare_demo(str(root / "demo"), rows=96, seed=0)

    def spec(name, config, **extra):
        out = str(root / name)
        return {
            "model": model,
            "data": data,
            "output_dir": out,
            "rows": os.path.join(out, "rows.jsonl"),
            "args": {**COMMON, **CONFIGS[config]},
            **extra,
        }

    specs = {f"full-{c}": spec(f"full-{c}", c) for c in CONFIGS}
    specs |= {f"killed-{case}": spec(case, config, kill=kill) for case, (config, kill, _) in CASES.items()}
    with ThreadPoolExecutor(2) as pool:
        first = dict(zip(specs, pool.map(_run, specs.values()), strict=True))
        for name, spec_ in specs.items():
            first[name].finished = os.path.exists(os.path.join(spec_["output_dir"], "final"))
        resumed = {
            case: {
                **spec(case, config, resume=os.path.join(str(root / case), f"checkpoint-{checkpoint}")),
                "rows": str(root / case / "rows-resumed.jsonl"),
            }
            for case, (config, _, checkpoint) in CASES.items()
        }
        second = dict(zip(resumed, pool.map(_run, resumed.values()), strict=True))
    return specs, first, resumed, second


@pytest.mark.parametrize("case", list(CASES))
def test_killed_run_resumes_exactly(runs, case):
    specs, first, resumed, second = runs
    config, kill, checkpoint = CASES[case]
    full = specs[f"full-{config}"]
    assert first[f"full-{config}"].returncode == 0, first[f"full-{config}"].stderr[-3000:]
    killed = first[f"killed-{case}"]
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert not killed.finished
    assert second[case].returncode == 0, second[case].stderr[-3000:]

    expected = load_file(os.path.join(full["output_dir"], "final", "model.safetensors"))
    got = load_file(os.path.join(resumed[case]["output_dir"], "final", "model.safetensors"))
    assert expected.keys() == got.keys()
    difference = max((expected[k] - got[k]).abs().max().item() for k in expected)
    assert difference == 0.0, f"max weight difference {difference}"
    at_checkpoint = load_file(os.path.join(full["output_dir"], f"checkpoint-{checkpoint}", "model.safetensors"))
    assert any(not torch.equal(expected[k], at_checkpoint[k]) for k in expected)  # it trained after the checkpoint

    full_rows = _rows(full["rows"])
    last = COMMON["max_steps"]
    assert sorted(full_rows) == list(range(1, last + 1))
    logged_before_kill = kill["step"] if kill["at"] == "save" else kill["step"] - 1
    assert sorted(_rows(specs[f"killed-{case}"]["rows"])) == list(range(1, logged_before_kill + 1))
    rows = _rows(resumed[case]["rows"])
    assert sorted(rows) == list(range(checkpoint + 1, last + 1))
    for step in rows:
        assert _comparable(rows[step]) == _comparable(full_rows[step]), f"step {step}"
