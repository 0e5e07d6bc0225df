"""Learning side by side: grpokit and TRL 1.16's `GRPOTrainer` train SmolLM2-135M-Instruct on the real demo's task
(`grpokit train --demo real`: one-digit sums, the reply must be the number alone) with the same data, seeds and
configuration, and this prints the reward curves, held-out accuracy and wall time to a reward level.

    python benchmarks/bench_learning.py --trl-python /path/to/python-with-trl --seeds 0,1,2

Each run is its own subprocess with 2 torch threads, runs alternate grpokit / TRL per seed, and the driver waits for
an idle machine before each (see `bench_grpo.run_worker`). Both sides load the same cached model folder
(`grpokit.gguf.smollm2()`, float32) and the same JSONL files written by `grpokit.demo.prepare_real_demo`; the TRL
worker reads the task (reward, greedy held-out scoring) from `src/grpokit/demo.py` by path, so it never imports
grpokit. The configuration is the demo's (`src/grpokit/cli/demo_real.yaml`) with `seed` set per run, logging every
step and the `eval_*` passes left out (they cost both sides the same and are not what is compared).

Reported per run: mean reward of the first and last 5 steps, held-out greedy accuracy (32 sums never trained on)
before and after, training wall time (held-out scoring excluded), and the wall time at which the reward's
5-step moving average first reaches `--level`.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_grpo  # noqa: E402  (the worker runner: idle wait, reruns on contention)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEMO_FILE = os.path.join(ROOT, "src", "grpokit", "demo.py")
CONFIG_FILE = os.path.join(ROOT, "src", "grpokit", "cli", "demo_real.yaml")
WINDOW = 5


def demo_module():
    """`grpokit/demo.py` loaded by path (standard library imports only): the task both sides train on."""
    spec = importlib.util.spec_from_file_location("real_demo_task", DEMO_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def config_values(output_dir: str, seed: int, steps: int) -> dict:
    """The demo's configuration (its YAML file), for one run."""
    import yaml

    with open(CONFIG_FILE, encoding="utf-8") as fh:
        values = yaml.safe_load(fh)
    values.pop("reward_funcs")
    values.update(
        output_dir=output_dir,
        seed=seed,
        max_steps=steps,
        logging_steps=1,
        eval_strategy="no",
        disable_tqdm=True,
        log_completions=False,
    )
    for key in ("eval_steps", "num_generations_eval", "per_device_eval_batch_size"):
        values.pop(key, None)
    return values


def train_worker(side: str, model_dir: str, train_file: str, held_out_file: str, seed: int, steps: int) -> dict:
    import torch
    from datasets import load_dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback

    if side == "grpokit":
        from grpokit import GRPOConfig, GRPOTrainer
    else:
        from trl import GRPOConfig, GRPOTrainer
    torch.set_num_threads(bench_grpo.THREADS)
    task = demo_module()
    with open(held_out_file, encoding="utf-8") as fh:
        held_out = [json.loads(line) for line in fh]
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    dataset = load_dataset("json", data_files=train_file, split="train")
    before = task.greedy_accuracy(model, tokenizer, held_out)
    log: list[dict] = []

    class Curve(TrainerCallback):
        start = None

        def on_train_begin(self, args, state, control, **kwargs):
            self.start = time.perf_counter()

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "reward" in logs:
                log.append(
                    {"step": state.global_step, "reward": logs["reward"], "seconds": time.perf_counter() - self.start}
                )

    def sum_reward(completions, answer, **kwargs):  # the demo's reward, under the name both sides log
        return task.sum_reward(completions, answer)

    with tempfile.TemporaryDirectory() as out:
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=[sum_reward],
            args=GRPOConfig(**config_values(out, seed, steps)),
            train_dataset=dataset,
            processing_class=tokenizer,
        )
        curve = Curve()
        trainer.add_callback(curve)
        trainer.train()
        seconds = time.perf_counter() - curve.start
    after = task.greedy_accuracy(trainer.model, tokenizer, held_out)
    return {
        "side": side,
        "seed": seed,
        "curve": log,
        "held_out_before": before,
        "held_out_after": after,
        "train_seconds": seconds,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def moving_average(values: list[float], window: int = WINDOW) -> list[float]:
    return [statistics.mean(values[max(0, i + 1 - window) : i + 1]) for i in range(len(values))]


def seconds_to_level(run: dict, level: float) -> float | None:
    """Wall seconds at the first step whose `WINDOW`-step moving average reward reaches `level` (None: never)."""
    rewards = [p["reward"] for p in run["curve"]]
    for point, average in zip(run["curve"], moving_average(rewards), strict=True):
        if average >= level:
            return point["seconds"]
    return None


def report(runs: list[dict], level: float) -> None:
    print(
        f"| run | seed | reward, first {WINDOW} steps | reward, last {WINDOW} steps | held-out before | held-out after "
        f"| s / step | train s | s to reward {level} | peak RSS MB |"
    )
    print("|---" * 10 + "|")
    for run in runs:
        rewards = [p["reward"] for p in run["curve"]]
        reached = seconds_to_level(run, level)
        cells = [
            run["side"],
            str(run["seed"]),
            f"{statistics.mean(rewards[:WINDOW]):.3f}",
            f"{statistics.mean(rewards[-WINDOW:]):.3f}",
            f"{run['held_out_before']:.2f}",
            f"{run['held_out_after']:.2f}",
            f"{run['train_seconds'] / len(rewards):.2f}",
            f"{run['train_seconds']:.0f}",
            "never" if reached is None else f"{reached:.0f}",
            f"{run['peak_rss_mb']:.0f}",
        ]
        print("| " + " | ".join(cells) + " |")
    sides = list(dict.fromkeys(r["side"] for r in runs))
    print("\nmean reward per step over seeds (min-max):")
    curves = {s: [[p["reward"] for p in r["curve"]] for r in runs if r["side"] == s] for s in sides}
    steps = min(len(c) for s in sides for c in curves[s])
    print("| step | " + " | ".join(sides) + " |")
    print("|---" * (len(sides) + 1) + "|")
    for i in range(0, steps, 3):
        cells = []
        for s in sides:
            values = [c[i] for c in curves[s]]
            cells.append(f"{statistics.mean(values):.3f} ({min(values):.2f}-{max(values):.2f})")
        print(f"| {i + 1} | " + " | ".join(cells) + " |")
    for s in sides:
        mine = [r for r in runs if r["side"] == s]
        reached = [seconds_to_level(r, level) for r in mine]
        print(
            f"{s}: held-out {statistics.mean(r['held_out_before'] for r in mine):.2f} -> "
            f"{statistics.mean(r['held_out_after'] for r in mine):.2f} (mean over {len(mine)} seeds); "
            f"{statistics.median(r['train_seconds'] / len(r['curve']) for r in mine):.2f} s a step; reward "
            f"{level} reached by {sum(x is not None for x in reached)} of {len(mine)} seeds, median "
            + (f"{statistics.median(x for x in reached if x is not None):.0f} s" if any(reached) else "-")
        )


def plot(runs: list[dict], path: str, level: float) -> None:
    try:
        import matplotlib
    except ImportError:
        raise SystemExit("this benchmark's plot needs matplotlib (grpokit does not): pip install matplotlib") from None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (by_step, by_time) = plt.subplots(1, 2, figsize=(10, 3.6))
    colours = {"grpokit": "tab:blue", "trl": "tab:orange"}
    for run in runs:
        steps = [p["step"] for p in run["curve"]]
        average = moving_average([p["reward"] for p in run["curve"]])
        label = f"{run['side']} seed {run['seed']}"
        by_step.plot(steps, average, color=colours.get(run["side"]), alpha=0.8, label=label)
        by_time.plot([p["seconds"] for p in run["curve"]], average, color=colours.get(run["side"]), alpha=0.8)
    for axis, xlabel in ((by_step, "step"), (by_time, "training seconds (2 CPU cores)")):
        axis.axhline(level, color="grey", linestyle=":", linewidth=1)
        axis.set_xlabel(xlabel)
        axis.set_ylabel(f"reward ({WINDOW}-step moving average)")
    by_step.legend(fontsize=7)
    figure.suptitle("SmolLM2-135M-Instruct, one-digit sums: grpokit vs TRL 1.16, same data, seeds and config")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    print(f"plot: {path}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trl-python", help="a python with trl 1.16 (omit: grpokit only)")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--level", type=float, default=0.5, help="the reward level to time (moving average)")
    parser.add_argument("--save", help="write every run to this JSON file")
    parser.add_argument("--plot", help="draw the reward curves to this PNG file")
    parser.add_argument("--no-wait", action="store_true", help="no idle wait nor reruns (timings meaningless)")
    parser.add_argument("--worker", choices=["grpokit", "trl"], help=argparse.SUPPRESS)
    parser.add_argument("--args", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    cli = parser.parse_args()
    if cli.worker:
        result = train_worker(cli.worker, **json.loads(cli.args))
        with open(cli.out, "w") as fh:
            json.dump(result, fh)
        return
    bench_grpo.NO_WAIT = cli.no_wait

    from grpokit.demo import prepare_real_demo

    runs = []
    with tempfile.TemporaryDirectory() as work:
        model_dir, train_file, held_out_file = prepare_real_demo(work)
        sides = [("grpokit", sys.executable)] + ([("trl", cli.trl_python)] if cli.trl_python else [])
        for seed in (int(s) for s in cli.seeds.split(",")):
            for side, python in sides:
                args = dict(
                    model_dir=str(model_dir),
                    train_file=train_file,
                    held_out_file=held_out_file,
                    seed=seed,
                    steps=cli.steps,
                )
                run = bench_grpo.run_worker(python, ["--worker", side, "--args", json.dumps(args)], script=__file__)
                print(
                    f"{side} seed {seed}: held-out {run['held_out_before']:.2f} -> {run['held_out_after']:.2f}, "
                    f"{run['train_seconds']:.0f} s",
                    flush=True,
                )
                runs.append(run)
    report(runs, cli.level)
    if cli.plot:
        plot(runs, cli.plot, cli.level)
    if cli.save:
        with open(cli.save, "w") as fh:
            json.dump(runs, fh, indent=1)


if __name__ == "__main__":
    main()
