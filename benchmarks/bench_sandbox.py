"""Per-run cost of the code sandbox: wall time of one `run_program` of a trivial program, by layer.

    python benchmarks/bench_sandbox.py                 # 200 runs per configuration, medians and quartiles
    python benchmarks/bench_sandbox.py --runs 50 --json results/sandbox.json

Configurations (where the code has them): "full" (what the code rewards run: namespaces, seccomp allowlist, the
memory cgroup, a tmpfs working directory, the audit hook), "no cgroup" (the same without the memory cgroup, as on a
machine where none can be made), "no seccomp", and where the code has them "unstaged" (bwrap started by the
trainer itself, as before issue 42: no uid drop, no staged working directory) and "no pids". The same script runs against an older checkout (PYTHONPATH) to
compare: there only "full" exists. Prints numbers; not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from grpokit.rewards import sandbox  # noqa: E402

PROGRAM = "import sys\nprint(sum(map(int, sys.stdin.read().split())))\n"


def _configurations() -> dict:
    configurations = {"full": lambda: sandbox.run_program(PROGRAM, "1 2 3\n")}
    parameters = sandbox._run.__code__.co_varnames
    memory, defaults = sandbox.DEFAULT_MEMORY_MB << 20, (10.0, 10, sandbox.DEFAULT_MAX_OUTPUT_BYTES)
    disk = getattr(sandbox, "DEFAULT_DISK_MB", 64) << 20
    if "cgroup" in parameters:
        timeout, cpu, output = defaults
        configurations["no cgroup"] = lambda: sandbox._run(
            PROGRAM, "1 2 3\n", timeout, cpu, memory, output, sandbox.DEFAULT_MAX_FILE_BYTES, disk, cgroup=False
        )
        configurations["no seccomp"] = lambda: sandbox._run(
            PROGRAM, "1 2 3\n", timeout, cpu, memory, output, sandbox.DEFAULT_MAX_FILE_BYTES, disk, seccomp=False
        )
    if "without" in parameters:
        for name, without in (("unstaged", {"uid", "inodes"}), ("no pids", {"pids"})):
            configurations[name] = lambda without=without: sandbox._run(
                PROGRAM, "1 2 3\n", timeout, cpu, memory, output, sandbox.DEFAULT_MAX_FILE_BYTES, disk, without=without
            )
    return configurations


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    figures = {}
    for name, run in _configurations().items():
        for _ in range(5):  # warm-up: the one-time boundary probe, the cgroup lookup, the page cache
            assert run().stdout == "6\n"
        times = []
        for _ in range(args.runs):
            start = time.perf_counter()
            result = run()
            times.append((time.perf_counter() - start) * 1000)
            assert result.stdout == "6\n", result
        q1, median, q3 = statistics.quantiles(times, n=4)
        figures[name] = {"median_ms": round(median, 1), "q1_ms": round(q1, 1), "q3_ms": round(q3, 1)}
        print(f"{name:>11}: {median:6.1f} ms per run (quartiles {q1:.1f}-{q3:.1f}, {args.runs} runs)", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"python": sys.version.split()[0], "runs": args.runs, "figures": figures}, f, indent=2)


if __name__ == "__main__":
    main()
