"""Where the peak RSS of a real-model GRPO step goes, and the least any trainer training as TRL does could hold.

    python benchmarks/bench_memory.py --workloads real-short,real-short-bf16 [--trl-python <python with trl>]

For each workload of `bench_grpo.py`, one run of each side (`bench_grpo.train_worker`: 2 warm-up steps, 2 measured),
watched from inside the process: glibc's `mallinfo2` sampled every millisecond by a thread (so the step times of
these runs mean nothing; take them from `bench_grpo.py`), read at the end of each forward pass, each backward pass
and each optimizer step. Printed per side: the heap's bytes in use at those points and its in-use peak between them,
the heap's size (`arena`: what malloc holds, in use or free), and the RSS; then the peak RSS.

The floor: what a trainer that trains as TRL 1.16 does must hold at the worst moment of a step, whatever its code:
    process   the RSS of the Python process once it has imported the trainer and loaded the tokenizer (measured);
    weights   float32, 4 bytes a parameter (TRL and grpokit keep fp32 weights under `bf16=True` too);
    AdamW     two float32 moments, 8 bytes a parameter;
    then the larger of
    gradients float32, 4 bytes a parameter, all held at the end of backward, and
    the start of backward: the LM head's weight gradient (4 x vocabulary x hidden) and the activations no backward
      can do without unless it recomputes matrix products: per token and layer the layer's input and the residual
      after attention (2 x hidden), q, k and v after rotary embedding, attention's output (2 x hidden + 2 x the
      key/value width) and the MLP's gate and up products (2 x intermediate), in the compute dtype (4 bytes; 2 under
      `bf16=True`), for grpokit's tokens (each group's prompt once, then every completion); under
      `gradient_checkpointing=True` each layer's input, and those values for one layer at a time.
Gradients are set to None between steps (transformers' `zero_grad`), so they are not held while the activations are.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_grpo  # noqa: E402

MB = 2**20


def parameter_count(config: dict) -> int:
    """Parameters of a Llama-architecture model described by its `config.json` (tied embeddings counted once)."""
    d, layers, ff, vocab, q, kv = bench_grpo.model_shapes(config)
    layer = d * q + 2 * d * kv + q * d + 3 * d * ff + 2 * d  # q, k, v, o; gate, up, down; two RMSNorm weights
    embeddings = vocab * d * (1 if config.get("tie_word_embeddings", True) else 2)
    return layers * layer + embeddings + d  # + the final norm


def floor_mb(workload: bench_grpo.Workload, config: dict, process_mb: float) -> dict:
    """The floor's parts in MB (see the module's docstring)."""
    params = parameter_count(config)
    d, layers, ff, vocab, q, kv = bench_grpo.model_shapes(config)
    groups = bench_grpo.COMPLETIONS_PER_STEP // bench_grpo.NUM_GENERATIONS
    tokens = groups * workload.prompt_tokens + bench_grpo.COMPLETIONS_PER_STEP * bench_grpo.COMPLETION_LENGTH
    per_token_layer = 2 * d + (q + 2 * kv) + q + 2 * ff
    # activation checkpointing: each layer's input, then one layer recomputed at a time
    kept = d * layers + per_token_layer if workload.checkpointing else per_token_layer * layers
    activations = tokens * kept * (2 if workload.bf16 else 4)
    parts = {
        "process": process_mb,
        "weights": 4 * params / MB,
        "adamw": 8 * params / MB,
        "gradients": 4 * params / MB,
        "activations": activations / MB,
        "lm_head_gradient": 4 * vocab * d / MB,
    }
    backward_start = parts["activations"] + parts["lm_head_gradient"]
    parts["total"] = parts["process"] + parts["weights"] + parts["adamw"] + max(parts["gradients"], backward_start)
    return parts


# ------------------------------------------------------------------------------------------------ worker


def watch(trainer, phases: list) -> None:
    """Record the heap and the RSS at the end of each forward, backward and optimizer step of `trainer`, with the
    heap's in-use peak since the previous record (a sampling thread)."""
    import ctypes
    import threading
    import time

    from transformers import TrainerCallback

    libc = ctypes.CDLL(None)

    class MallInfo2(ctypes.Structure):
        names = "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost"  # malloc.h's order
        _fields_ = [(n, ctypes.c_size_t) for n in names.split()]

    libc.mallinfo2.restype = MallInfo2
    peak = [0]

    def sample():
        while True:
            peak[0] = max(peak[0], libc.mallinfo2().uordblks)
            time.sleep(0.001)

    def record(what):
        info = libc.mallinfo2()
        with open("/proc/self/statm") as fh:
            rss = int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        phases.append(
            {
                "after": what,
                "heap_in_use": info.uordblks / MB,
                "heap_in_use_peak": max(peak[0], info.uordblks) / MB,
                "heap": info.arena / MB,
                "mmapped": info.hblkhd / MB,
                "rss": rss / MB,
            }
        )
        peak[0] = 0

    threading.Thread(target=sample, daemon=True).start()
    backward = trainer.accelerator.backward

    def watched_backward(*args, **kwargs):
        record("forward")
        result = backward(*args, **kwargs)
        record("backward")
        return result

    trainer.accelerator.backward = watched_backward

    class Steps(TrainerCallback):
        def on_step_end(self, *args, **kwargs):
            record("optimizer step")

    trainer.add_callback(Steps())


def worker(side: str, workload: bench_grpo.Workload, model_dir: str, warmup: int, steps: int) -> dict:
    from transformers import AutoTokenizer

    if side == "grpokit":
        import grpokit  # noqa: F401
    else:
        import trl  # noqa: F401
    AutoTokenizer.from_pretrained(model_dir)
    process = bench_grpo.max_rss_mb()
    phases = []
    make_trainer = bench_grpo.make_trainer

    def watched(*args, **kwargs):
        trainer = make_trainer(*args, **kwargs)
        watch(trainer, phases)
        return trainer

    bench_grpo.make_trainer = watched
    result = bench_grpo.train_worker(side, workload, model_dir, warmup, steps)
    return {"side": side, "process_mb": process, "peak_total_mb": result["peak_total_mb"], "phases": phases}


# ------------------------------------------------------------------------------------------------ report


def print_run(run: dict) -> None:
    print(
        f"\n{run['workload']}, {run['side']}: peak RSS {run['peak_total_mb']:.0f} MB; process {run['process_mb']:.0f} MB"
    )
    print("| after | heap in use MB | heap in-use peak since the row before MB | heap MB | mmapped MB | RSS MB |")
    print("|---|---|---|---|---|---|")
    for p in run["phases"]:
        cells = [p["after"]] + [f"{p[k]:.0f}" for k in ("heap_in_use", "heap_in_use_peak", "heap", "mmapped", "rss")]
        print("| " + " | ".join(cells) + " |")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", default="real-short,real-short-bf16")
    parser.add_argument("--trl-python", help="also watch TRL's runs, with this Python (one with trl installed)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--save", help="write the runs and floors to this JSON file")
    parser.add_argument("--worker", choices=["grpokit", "trl"], help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    cli = parser.parse_args()
    if cli.worker:
        (name,) = cli.workloads.split(",")
        run = worker(cli.worker, bench_grpo.WORKLOADS[name], cli.model_dir, cli.warmup, cli.steps)
        with open(cli.out, "w") as fh:
            json.dump(run, fh)
        return

    bench_grpo.NO_WAIT = True  # memory, not time: no need to wait for an idle machine
    sides = [("grpokit", sys.executable)] + ([("trl", cli.trl_python)] if cli.trl_python else [])
    saved, rows = [], []
    with tempfile.TemporaryDirectory() as root:
        for name in cli.workloads.split(","):
            workload = bench_grpo.WORKLOADS[name]
            model_dir = bench_grpo.build_model_dir(workload, root)
            with open(os.path.join(model_dir, "config.json")) as fh:
                config = json.load(fh)
            runs = {}
            for side, python in sides:
                argv = ["--worker", side, "--workloads", name, "--model-dir", model_dir]
                argv += ["--warmup", str(cli.warmup), "--steps", str(cli.steps)]
                run = bench_grpo.run_worker(python, argv, script=__file__)
                if run is None:
                    raise SystemExit(f"{name}: the {side} run failed")
                run["workload"] = name
                runs[side] = run
            floor = floor_mb(workload, config, runs["grpokit"]["process_mb"])
            for run in runs.values():
                print_run(run)
            saved.append({"workload": name, "floor": floor, "runs": runs})
            rows.append((name, floor, runs))
    print(
        "\n| workload | floor MB: process + weights + AdamW + max(gradients, activations + LM-head gradient) | "
        "grpokit peak MB | TRL peak MB | floor / TRL | grpokit / TRL |"
    )
    print("|---" * 6 + "|")
    for name, f, runs in rows:
        ours = runs["grpokit"]["peak_total_mb"]
        theirs = runs["trl"]["peak_total_mb"] if "trl" in runs else None
        parts = " + ".join(f"{f[k]:.0f}" for k in ("process", "weights", "adamw"))
        parts += f" + max({f['gradients']:.0f}, {f['activations']:.0f} + {f['lm_head_gradient']:.0f})"
        cells = [name, f"{parts} = {f['total']:.0f}", f"{ours:.0f}"]
        if theirs:
            cells += [f"{theirs:.0f}", f"{f['total'] / theirs:.2f}", f"{ours / theirs:.2f}"]
        else:
            cells += ["-", "-", "-"]
        print("| " + " | ".join(cells) + " |")
    if cli.save:
        with open(cli.save, "w") as fh:
            json.dump(saved, fh, indent=1)


if __name__ == "__main__":
    main()
