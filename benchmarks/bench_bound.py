"""The lower bound of a GRPO step on this machine, for the real-model workloads of `bench_grpo.py`, and how far the
measured steps are from it.

    python benchmarks/bench_bound.py --results benchmarks/results/real.json

The bound: generation + one forward/backward, each at the best this machine does for the dtype used.
    - matrix products at the measured matmul peak of the dtype (2048 x 2048 products, 2 threads): the FLOPs of
      `bench_grpo.step_flops` (prompt prefilled once per group, one decode step per completion token, forward +
      backward on the completions with the prompt once per group, LM head included);
    - a decode step also reads every weight once (16 rows cannot reuse a weight from cache across steps): it takes
      at least max(its FLOPs / peak, weight bytes / measured read bandwidth). With `bf16=True` grpokit decodes on a
      bfloat16 copy of the weights (2 bytes a weight); in fp32, 4.
Norms, softmax, the optimizer and Python are left out, so no step reaches it; the ratio says how much is left.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_grpo  # noqa: E402


def read_bandwidth(megabytes: int = 1024, repeats: int = 5) -> float:
    """Bytes/s of the best of `repeats` sums over a `megabytes` float32 buffer (far larger than any cache)."""
    import torch

    a = torch.ones(megabytes * 2**20 // 4)
    a.sum()
    best = min(_seconds(a.sum) for _ in range(repeats))
    return a.numel() * 4 / best


def _seconds(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def bound(workload: bench_grpo.Workload, config: dict, peaks: dict, bandwidth: float) -> dict:
    """Seconds: generation, training and their sum at the machine's limits (see the module's docstring)."""
    groups = bench_grpo.COMPLETIONS_PER_STEP // bench_grpo.NUM_GENERATIONS
    rows, length = bench_grpo.COMPLETIONS_PER_STEP, bench_grpo.COMPLETION_LENGTH
    dtype = "bfloat16" if workload.bf16 else "float32"
    peak = peaks[dtype]
    generation, training = bench_grpo.step_flops(
        config, workload.prompt_tokens, length, groups, rows // groups, parts=True
    )
    d, layers, ff, vocab, q, kv = bench_grpo.model_shapes(config)
    weights = layers * (2 * d * q + 2 * d * kv + 3 * d * ff) + d * vocab  # read by every decode step
    decode_steps = length - 1
    prefill = groups * workload.prompt_tokens * 2 * weights  # about: the body and (once per group) the LM head
    per_decode = (generation - prefill) / decode_steps
    weight_seconds = weights * (2 if workload.bf16 else 4) / bandwidth
    generation_s = prefill / peak + decode_steps * max(per_decode / peak, weight_seconds)
    training_s = training / peak
    return {
        "generation_s": generation_s,
        "training_s": training_s,
        "step_s": generation_s + training_s,
        "decode_memory_bound": weight_seconds > per_decode / peak,
        "dtype": dtype,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", help="a bench_grpo.py --save file: compare its steps with the bound")
    parser.add_argument("--workloads", default="real-short,real-short-bf16,real-long,real-long-bf16")
    cli = parser.parse_args()
    import torch

    torch.set_num_threads(bench_grpo.THREADS)
    from grpokit.gguf import smollm2

    with open(os.path.join(smollm2(), "config.json")) as fh:
        config = json.load(fh)
    peaks = {dtype: bench_grpo.matmul_peak(dtype=dtype) for dtype in ("float32", "bfloat16")}
    bandwidth = read_bandwidth()
    print(
        f"matmul peak: float32 {peaks['float32'] / 1e9:.0f} GFLOP/s, bfloat16 {peaks['bfloat16'] / 1e9:.0f} "
        f"GFLOP/s; read bandwidth {bandwidth / 1e9:.1f} GB/s ({bench_grpo.THREADS} threads)"
    )
    summary = {}
    if cli.results:
        with open(cli.results) as fh:
            summary = json.load(fh)["summary"]
    print(
        "| workload | bound: generation s | training s | step s | decode | run | measured: generation s | "
        "logprobs + backward s | step s | step / bound |"
    )
    print("|---" * 10 + "|")
    for name in cli.workloads.split(","):
        b = bound(bench_grpo.WORKLOADS[name], config, peaks, bandwidth)
        sides = summary.get(name) or {"-": None}
        for side, s in sides.items():
            cells = [name, f"{b['generation_s']:.2f}", f"{b['training_s']:.2f}", f"{b['step_s']:.2f}"]
            cells.append("memory-bound" if b["decode_memory_bound"] else "compute-bound")
            if s is None:
                cells += ["-"] * 5
            else:
                cells += [side, f"{s['generation']:.2f}", f"{s['logprobs'] + s['backward']:.2f}", f"{s['step']:.2f}"]
                cells.append(f"{s['step'] / b['step_s']:.2f}")
            print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
