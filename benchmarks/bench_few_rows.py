"""Few-row products: how fast a decode step's matrix products read their weights, torch (BLAS) against grpokit's
`few_rows` kernel, at the shapes of SmolLM2-135M (hidden 576, MLP 1536, q/k/v stacked 960, vocabulary 49,152).

    python benchmarks/bench_few_rows.py                # rows 8, 16, 24
    python benchmarks/bench_few_rows.py --rows 16 --threads 2

Each product is `W @ x^T` for a float32 weight `W` (out, in) and `rows` rows `x`, as the column decode step computes
it. To measure memory, not cache, each timing cycles through as many distinct weights as fill 400 MB; the best of 3
passes is kept. GB/s = weight bytes read / seconds. Prints one line per shape and row count; a script, not a test.
"""

from __future__ import annotations

import argparse
import time

import torch

from grpokit.fastpath import few_rows

SHAPES = {"q/k/v": (960, 576), "o": (576, 576), "gate/up": (1536, 576), "down": (576, 1536), "lm_head": (49152, 576)}


def gb_per_s(fn, weights) -> float:
    fn()
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return sum(w.numel() * 4 for w in weights) / best / 1e9


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default="8,16,24")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if few_rows.library() is None:
        raise SystemExit(f"the kernel is not available here: {few_rows.unavailable_reason()}")
    print(f"{'product':>8} {'out x in':>12} {'rows':>4} {'torch GB/s':>10} {'few_rows GB/s':>13} {'ratio':>6}")
    for name, (out_features, in_features) in SHAPES.items():
        count = max(1, 400_000_000 // (out_features * in_features * 4))
        weights = [torch.randn(out_features, in_features) for _ in range(count)]
        for rows in map(int, args.rows.split(",")):
            x = torch.randn(rows, in_features)
            blas = gb_per_s(lambda x=x, weights=weights: [torch.mm(w, x.t()) for w in weights], weights)
            ours = gb_per_s(lambda x=x, weights=weights: [few_rows.mm(w, x) for w in weights], weights)
            shape = f"{out_features}x{in_features}"
            if x.numel() > few_rows.MAX_ELEMENTS:
                ours = float("nan")  # not taken by the decode step: BLAS runs it
            print(f"{name:>8} {shape:>12} {rows:>4} {blas:>10.2f} {ours:>13.2f} {ours / blas:>6.2f}")


if __name__ == "__main__":
    main()
