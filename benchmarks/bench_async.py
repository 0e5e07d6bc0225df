"""Asynchronous GRPO against synchronous GRPO on the same workload: seconds per step, completion tokens per second,
the trainer's idle fraction (waiting for samples), the generator's idle fraction (the worker held back by
max_staleness), staleness seen.

    python benchmarks/bench_async.py [--steps 40] [--generator auto|server|local]

The workload is the demo's task (a tiny model learns to repeat a digit) with longer completions, so that generation
and training both take time. `auto`: a `grpokit vllm-serve` of the model where vLLM is installed (the legs: sync
GRPOTrainer with vllm_mode server, async at max_staleness 0 and 2, all against the same server), else generation
with transformers (sync; async with the worker's own copy of the policy). Prints one table; numbers, not a verdict.
On a 2-core CPU the trainer, the worker and a server share the same cores: overlap cannot buy much there.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TQDM_DISABLE", "1")


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def run_leg(name, model_dir, data_path, steps, use_vllm, url, asynchronous, **extra):
    import json

    from datasets import Dataset

    from grpokit.demo import copy_digit_reward

    rows = [json.loads(line) for line in open(data_path, encoding="utf-8")][: 64 * steps]
    dataset = Dataset.from_list(rows)
    with tempfile.TemporaryDirectory() as out:
        values = dict(
            output_dir=out,
            per_device_train_batch_size=32,
            num_generations=8,
            max_completion_length=16,
            learning_rate=3e-3,
            lr_scheduler_type="constant",
            max_steps=steps,
            logging_steps=1,
            beta=0.0,
            loss_type="dapo",
            gradient_checkpointing=False,
            bf16=False,
            use_cpu=True,
            save_strategy="no",
            report_to="none",
            seed=0,
            use_vllm=use_vllm,
            write_run_records=False,
        )
        if use_vllm:
            values.update(vllm_mode="server", vllm_server_base_url=url, vllm_group_port=_free_port())
        if asynchronous:
            from grpokit.experimental.async_grpo import AsyncGRPOConfig as Config
            from grpokit.experimental.async_grpo import AsyncGRPOTrainer as Trainer
        else:
            from grpokit import GRPOConfig as Config
            from grpokit import GRPOTrainer as Trainer
        args = Config(**values, **extra)
        trainer = Trainer(model_dir, copy_digit_reward, args=args, train_dataset=dataset)
        started = time.perf_counter()
        trainer.train()
        wall = time.perf_counter() - started
        if not asynchronous and use_vllm:
            trainer.generator.close()
    logs = [row for row in trainer.state.log_history if "loss" in row]
    tokens = sum(row["completions/mean_length"] * 32 for row in logs)
    step_times = [row["step_time"] for row in logs if "step_time" in row]
    waited = sum(row.get("perf/rollout_wait_s", 0.0) for row in logs)
    idle = sum(row.get("rollout/idle_s", 0.0) for row in logs)
    return {
        "leg": name,
        "s/step": wall / steps,
        "median step_time": statistics.median(step_times) if step_times else float("nan"),
        "tokens/s": tokens / wall,
        "trainer idle": waited / wall if asynchronous else float("nan"),
        "generator idle": idle / wall if asynchronous else float("nan"),
        "staleness mean": statistics.mean(r["sample/staleness_mean"] for r in logs) if asynchronous else 0.0,
        "staleness max": max(r["sample/staleness_max"] for r in logs) if asynchronous else 0.0,
        "reward (last 5)": statistics.mean(r["reward"] for r in logs[-5:]),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--generator", choices=["auto", "server", "local"], default="auto")
    options = parser.parse_args()
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))
    import torch

    from grpokit.cli.demo import demo_server
    from grpokit.demo import prepare_demo

    have_vllm = importlib.util.find_spec("vllm") is not None
    server = options.generator == "server" or (options.generator == "auto" and have_vllm)
    if server and not have_vllm:
        print("bench_async: --generator server needs vLLM installed (the vLLM venv)")
        return 2
    work = tempfile.mkdtemp(prefix="bench-async-")
    model_dir, data_path = prepare_demo(work, rows=64 * options.steps)
    results = []
    import contextlib

    context = demo_server(model_dir, os.path.join(work, "vllm-serve.log")) if server else contextlib.nullcontext()
    with context as url:
        legs = [
            ("sync", False, {}),
            ("async, max_staleness 0", True, {"max_staleness": 0}),
            ("async, max_staleness 2", True, {"max_staleness": 2}),
        ]
        for name, asynchronous, extra in legs:
            results.append(run_leg(name, model_dir, data_path, options.steps, server, url, asynchronous, **extra))
    where = "a vLLM server (grpokit vllm-serve)" if server else "transformers (async: the worker's own copy)"
    print(
        f"\n{options.steps} steps of 32 completions (groups of 8, up to 16 tokens), generation by {where}, "
        f"{os.cpu_count()} CPU cores, torch threads {torch.get_num_threads()}"
    )
    columns = list(results[0])
    widths = [max(len(c), 10) for c in columns]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)))
    for row in results:
        cells = [row[c] if isinstance(row[c], str) else f"{row[c]:.3f}" for c in columns]
        print("  ".join(str(v).ljust(w) for v, w in zip(cells, widths, strict=True)))
    sync = results[0]["s/step"]
    for row in results[1:]:
        print(f"{row['leg']}: {100 * (row['s/step'] / sync - 1):+.1f} % seconds per step against sync")
    return 0


if __name__ == "__main__":
    sys.exit(main())
