"""The agent path's speed, quiet and under load, beside the text path: seconds per optimizer step and completion
tokens per second of `grpokit train --demo tools` (tool turns), `tools-not-run`: the same with `max_tool_calling_iterations 0` (the
same model and prompts, calls parsed but never run: no tool turns) and `grpokit train --demo` (text).

    python benchmarks/bench_agent.py [--steps 60] [--load 0,4] [--runs 1] [--env "OMP_WAIT_POLICY=ACTIVE"]

`--load N` starts N busy processes (one Python loop each) beside the run, as other jobs on a shared machine would;
each run is its own `grpokit train` process. Step time is `step_time` of metrics.jsonl (the trainer's own
measure of an optimizer step), median over the logged rows after the first; tokens per second are the completion
tokens of a step (`completions/mean_length` x completions per step) over its step time. `--env` adds variables to
the runs (to compare thread settings).
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

WORKLOADS = {
    "tools": ["--demo", "tools"],
    "tools-not-run": ["--demo", "tools", "--max_tool_calling_iterations", "0"],
    "text": ["--demo"],
}


def run(workload: str, steps: int, load: int, extra_env: dict[str, str]) -> dict:
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(load)]
    try:
        with tempfile.TemporaryDirectory() as out:
            command = [sys.executable, "-m", "grpokit", "train", *WORKLOADS[workload], "--max_steps", str(steps)]
            command += ["--logging_steps", "5", "--output_dir", os.path.join(out, "run")]
            env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", **extra_env}
            start = time.perf_counter()
            done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=3600)
            wall = time.perf_counter() - start
            if done.returncode != 0:
                raise SystemExit(f"{workload}: exit {done.returncode}\n{done.stderr[-3000:]}")
            with open(os.path.join(out, "run", "metrics.jsonl"), encoding="utf-8") as fh:
                rows = [json.loads(line) for line in fh if line.strip()]
            with open(os.path.join(out, "run", "resolved_config.yaml"), encoding="utf-8") as fh:
                per_step = next(
                    int(line.split(":")[1].split("#")[0])
                    for line in fh
                    if line.startswith("per_device_train_batch_size:")
                )
    finally:
        for process in busy:
            process.kill()
    rows = [r for r in rows if "step_time" in r][1:]
    step_s = statistics.median(r["step_time"] for r in rows)
    tokens = statistics.median(r["completions/mean_length"] * per_step / r["step_time"] for r in rows)
    calls = rows[-1].get("tools/call_frequency")
    return {"workload": workload, "load": load, "wall_s": wall, "step_s": step_s, "tok_s": tokens, "calls": calls}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--load", default="0,4", help="comma-separated numbers of busy processes beside the run")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--env", action="append", default=[], help="NAME=VALUE for the runs (repeatable)")
    options = parser.parse_args()
    extra_env = dict(item.split("=", 1) for item in options.env)
    print(f"steps {options.steps}, env {extra_env or 'as is'}")
    print(f"{'workload':22s} {'load':>4s} {'s/step':>8s} {'tok/s':>8s} {'wall s':>7s} {'calls':>6s}")
    for load in (int(n) for n in options.load.split(",")):
        for _ in range(options.runs):
            for workload in options.workloads.split(","):
                r = run(workload, options.steps, load, extra_env)
                calls = "" if r["calls"] is None else f"{r['calls']:.2f}"
                print(f"{workload:22s} {load:4d} {r['step_s']:8.3f} {r['tok_s']:8.0f} {r['wall_s']:7.1f} {calls:>6s}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
