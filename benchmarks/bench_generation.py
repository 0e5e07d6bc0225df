"""Generation backends compared on CPU: grpokit's transformers backend (`generate` through grpokit's shared-prefix
decoding loop) against transformers' continuous batching (`use_transformers_continuous_batching`), in completions per
second of one generation round.

    python benchmarks/bench_generation.py                       # short and long workloads, G = 8 and 32
    python benchmarks/bench_generation.py --workloads long --groups 32 --runs 5

The models and prompts are `bench_grpo.py`'s `short` (6-token prompts) and `long` (128-token prompts) workloads:
random-init Qwen2, hidden 512, 4 layers, float32, 2 torch threads. A round is 2 prompts x G completions of exactly
32 tokens (the EOS id is one the model cannot sample, so no completion ends early: both backends do the same work),
sampled at temperature 1, both backends built by `grpokit.generation.build_generator` from the same `GRPOConfig`.

Every run is its own subprocess: it generates 1 warm-up round and `--rounds` timed rounds, and reports the median
round and its peak RSS. Runs alternate between the backends; the table shows the median over the runs other processes
left alone (under 10% of the CPU; all runs where none was), and the largest share of the CPU other processes used
meanwhile (a run is retried, `--retries` times, when that is over 5%).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_grpo import (  # noqa: E402
    THREADS,
    WORKLOADS,
    build_model_dir,
    cpu_busy_seconds,
    max_rss_mb,
    prompts_for,
    wait_until_idle,
)

BACKENDS = ("grpokit", "continuous")
COMPLETION_LENGTH = 32
PROMPTS_PER_ROUND = 2


def worker(backend: str, workload_name: str, model_dir: str, group: int, rounds: int) -> dict:
    import contextlib

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpokit import GRPOConfig
    from grpokit.generation import build_generator

    torch.set_num_threads(THREADS)
    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    args = GRPOConfig(
        tempfile.mkdtemp(),
        report_to="none",
        per_device_train_batch_size=PROMPTS_PER_ROUND * group,
        num_generations=group,
        max_completion_length=COMPLETION_LENGTH,
        use_transformers_continuous_batching=backend == "continuous",
    )
    generator = build_generator(
        args,
        policy=lambda: contextlib.nullcontext(model),
        model_path=model_dir,
        dtype=torch.float32,
        tokenizer=tokenizer,
        eos_token_ids=[model.config.vocab_size],  # never sampled: every completion has COMPLETION_LENGTH tokens
    )
    workload = WORKLOADS[workload_name]
    seconds = []
    for i in range(rounds + 1):
        texts = prompts_for(workload, PROMPTS_PER_ROUND, seed=i)
        prompts = [tokenizer(t)["input_ids"] for t in texts]
        rows = [p for p in prompts for _ in range(group)]
        start = time.perf_counter()
        out = generator.generate(rows)
        elapsed = time.perf_counter() - start
        assert [len(ids) for ids in out.completion_ids] == [COMPLETION_LENGTH] * len(rows)
        if i:  # the first round warms up
            seconds.append(elapsed)
    round_s = statistics.median(seconds)
    return {
        "backend": backend,
        "workload": workload_name,
        "group": group,
        "completions": PROMPTS_PER_ROUND * group,
        "round_s": round_s,
        "completions_per_s": PROMPTS_PER_ROUND * group / round_s,
        "peak_rss_mb": max_rss_mb(),
    }


def run_worker(argv: list[str], retries: int = 1) -> dict:
    """This script as a worker subprocess, rerun (up to `retries` times) when other processes took over 5% of the
    CPU meanwhile; the result carries that share as `contention`."""
    env = {
        **os.environ,
        "OMP_NUM_THREADS": str(THREADS),
        "MKL_NUM_THREADS": str(THREADS),
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
        "CUDA_VISIBLE_DEVICES": "",
    }
    for attempt in range(retries + 1):
        wait_until_idle(timeout=20.0)
        with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
            out = f.name
        start, busy = time.monotonic(), cpu_busy_seconds()
        own = resource.getrusage(resource.RUSAGE_CHILDREN)
        result = subprocess.run(
            [sys.executable, os.path.abspath(__file__), *argv, "--out", out], env=env, capture_output=True, text=True
        )
        child = resource.getrusage(resource.RUSAGE_CHILDREN)
        child_cpu = child.ru_utime + child.ru_stime - own.ru_utime - own.ru_stime
        contention = max(0.0, cpu_busy_seconds() - busy - child_cpu) / ((time.monotonic() - start) * os.cpu_count())
        if result.returncode != 0:
            print(result.stdout[-2000:], result.stderr[-5000:], file=sys.stderr)
            raise SystemExit(f"worker failed: {' '.join(argv)}")
        with open(out) as f:
            values = json.load(f)
        os.unlink(out)
        if contention <= 0.05 or attempt == retries:
            return {**values, "contention": contention}
        print(f"other processes used {contention:.0%} of the CPU during the run; running it again", file=sys.stderr)


def _undisturbed(runs: list[dict], share: float = 0.10) -> list[dict]:
    quiet = [r for r in runs if r["contention"] <= share]
    return quiet or runs


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", default="short,long")
    parser.add_argument("--groups", default="8,32", help="generations per prompt (G)")
    parser.add_argument("--runs", type=int, default=3, help="runs per backend, alternating")
    parser.add_argument("--rounds", type=int, default=3, help="timed generation rounds per run")
    parser.add_argument("--retries", type=int, default=1, help="reruns of a run while others took >5%% of the CPU")
    parser.add_argument("--worker", nargs=4, metavar=("BACKEND", "WORKLOAD", "MODEL_DIR", "G"), help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        backend, workload, model_dir, group = args.worker
        result = worker(backend, workload, model_dir, int(group), args.rounds)
        with open(args.out, "w") as f:
            json.dump(result, f)
        return

    results = {}
    with tempfile.TemporaryDirectory() as root:
        for name in args.workloads.split(","):
            model_dir = build_model_dir(WORKLOADS[name], root)
            for group in [int(g) for g in args.groups.split(",")]:
                for run in range(args.runs):
                    for backend in BACKENDS if run % 2 == 0 else BACKENDS[::-1]:
                        argv = ["--worker", backend, name, model_dir, str(group), "--rounds", str(args.rounds)]
                        result = run_worker(argv, retries=args.retries)
                        results.setdefault((name, group, backend), []).append(result)
                        print(
                            f"{name} G={group} {backend}: {result['completions_per_s']:.1f} completions/s "
                            f"(other processes {result['contention']:.0%} of the CPU)",
                            file=sys.stderr,
                        )
    print(f"\nload average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs")
    print(
        "| workload | G | completions/round | grpokit completions/s | continuous completions/s | continuous / grpokit "
        "| grpokit peak RSS MB | continuous peak RSS MB | other processes' CPU share (max) |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for name in args.workloads.split(","):
        for group in [int(g) for g in args.groups.split(",")]:
            # Runs other processes disturbed (over 10% of the CPU) count only where no undisturbed run exists.
            runs = {b: _undisturbed(results[(name, group, b)]) for b in BACKENDS}
            rate = {b: statistics.median(r["completions_per_s"] for r in runs[b]) for b in BACKENDS}
            rss = {b: statistics.median(r["peak_rss_mb"] for r in runs[b]) for b in BACKENDS}
            contention = max(r["contention"] for b in BACKENDS for r in runs[b])
            print(
                f"| {name} | {group} | {PROMPTS_PER_ROUND * group} | {rate['grpokit']:.1f} | {rate['continuous']:.1f} "
                f"| {rate['continuous'] / rate['grpokit']:.2f}x | {rss['grpokit']:.0f} | {rss['continuous']:.0f} "
                f"| {contention:.0%} |"
            )


if __name__ == "__main__":
    main()
