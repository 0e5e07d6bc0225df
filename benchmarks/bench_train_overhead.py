"""`train()`'s time outside its optimizer steps, grpokit against TRL 1.16, side by side on `bench_grpo`'s short
workload, two ways: the whole `trainer.train()` minus the sum of its steps (each from `on_step_begin` to `on_step_end`):
set-up at train begin, the between-step callbacks and logging, and the end (records, plot, memory release); and the
one-off cost, `train()` minus the number of steps times the steady step (the median of step 2 onward), which also
counts what the first step pays beyond a steady one (work done beside it in a thread, first-call warm-ups).

    PYTHONPATH=/path/to/trl python benchmarks/bench_train_overhead.py [--runs 3] [--steps 6]

Each run is its own process, the two sides alternating; grpokit's run writes its records (metrics.jsonl,
resolved_config.yaml, reward_curve.png) as it does by default. Prints each run and the medians.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_grpo  # noqa: E402


def worker(side: str, steps: int, model_dir: str) -> dict:
    import torch
    from datasets import Dataset

    torch.set_num_threads(bench_grpo.THREADS)
    workload = bench_grpo.WORKLOADS["short"]
    model, tokenizer = bench_grpo.load(model_dir)
    dataset = Dataset.from_dict({"prompt": bench_grpo.prompts_for(workload, steps * bench_grpo.COMPLETIONS_PER_STEP)})
    timer = bench_grpo.PhaseTimer()
    with tempfile.TemporaryDirectory() as out:
        trainer = bench_grpo.make_trainer(side, model, tokenizer, dataset, bench_grpo.config_values(out, steps), timer)
        start = time.perf_counter()
        trainer.train()
        wall = time.perf_counter() - start
    steps_s = [step["step"] for step in timer.steps]
    inside = sum(steps_s)
    steady = statistics.median(steps_s[1:])
    return {
        "side": side,
        "train_s": wall,
        "steps_s": inside,
        "outside_s": wall - inside,
        "first_step_s": steps_s[0],
        "steady_step_s": steady,
        "one_off_s": wall - steady * len(steps_s),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--worker", choices=["grpokit", "trl"])
    parser.add_argument("--model")
    options = parser.parse_args()
    if options.worker:
        print(json.dumps(worker(options.worker, options.steps, options.model)))
        return 0
    root = tempfile.mkdtemp(prefix="train-overhead-")
    model_dir = bench_grpo.build_model_dir(bench_grpo.WORKLOADS["short"], root)
    results = []
    for _ in range(options.runs):
        for side in ("grpokit", "trl"):
            command = [sys.executable, __file__, "--worker", side, "--steps", str(options.steps), "--model", model_dir]
            done = subprocess.run(command, capture_output=True, text=True, timeout=900)
            if done.returncode != 0:
                print(done.stderr[-3000:], file=sys.stderr)
                return 1
            results.append(json.loads(done.stdout.strip().splitlines()[-1]))
            r = results[-1]
            print(
                f"{side:8s} train() {r['train_s']:.3f} s, steps {r['steps_s']:.3f} s, outside {r['outside_s']:.3f} s, "
                f"first step {r['first_step_s']:.3f} s, steady step {r['steady_step_s']:.3f} s, "
                f"one-off {r['one_off_s']:.3f} s"
            )
    for side in ("grpokit", "trl"):
        outside = statistics.median(r["outside_s"] for r in results if r["side"] == side)
        one_off = statistics.median(r["one_off_s"] for r in results if r["side"] == side)
        print(
            f"median, {side}: outside the steps {outside:.3f} s, one-off (train() - steps x steady step) {one_off:.3f} s"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
