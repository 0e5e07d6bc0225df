"""Long-run memory benchmark: the built-in demo (`grpokit train --demo`) for 2,000 optimizer steps, with the resident
set size (RSS) of the training process printed every 100 steps and its growth after warm-up.

    python benchmarks/bench_rss.py                      # 2,000 steps, warm-up 200 (about 15 minutes on 2 cores)
    python benchmarks/bench_rss.py --steps 600 --every 50 --warmup 100 --save rss.json

The demo runs as a subprocess of this script (the real command line, nothing patched); its progress lines (one per
logging step) tell the step, and at every `--every` steps this script reads the child's `VmRSS` from
`/proc/<pid>/status` (Linux; no psutil). Growth = (RSS at the last step - RSS at the warm-up step) / RSS at the
warm-up step. The target is under 5 % (issue 11): more means something accumulates per step (metrics, completion logs,
cached tensors). It is a script that prints numbers, not part of the test suite.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

STEP_LINE = re.compile(r"^step\s+(\d+)/")


def rss_mb(pid: int) -> tuple[float, float]:
    """(current RSS, peak RSS) of a process in MiB, from /proc/<pid>/status."""
    values = {}
    with open(f"/proc/{pid}/status", encoding="ascii") as fh:
        for line in fh:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                values[key] = int(rest.split()[0]) / 1024  # kB
    return values["VmRSS"], values["VmHWM"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--every", type=int, default=100, help="print RSS every N steps (a multiple of 10)")
    parser.add_argument("--warmup", type=int, default=200, help="growth is measured from this step")
    parser.add_argument("--save", help="write the samples and the growth as JSON here")
    parser.add_argument("extra", nargs="*", help="more `grpokit train --demo` flags, after `--`")
    args = parser.parse_args(argv)
    if args.every % 10:
        parser.error("--every must be a multiple of 10 (the demo logs every 10 steps)")

    with tempfile.TemporaryDirectory(prefix="grpokit-rss-") as out:
        command = [sys.executable, "-m", "grpokit", "train", "--demo", "--output_dir", out]
        command += ["--max_steps", str(args.steps), "--logging_steps", "10", *args.extra]
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
        start = time.time()
        child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        samples = []  # (step, rss MiB, peak MiB, seconds)
        print(f"{'step':>6} {'RSS MiB':>9} {'peak MiB':>9} {'seconds':>8}", flush=True)
        for line in child.stdout:
            match = STEP_LINE.match(line)
            if not match:
                if line.startswith(("error", "Traceback")) or "Error" in line:
                    print(line, end="", file=sys.stderr)
                continue
            step = int(match.group(1))
            if step % args.every == 0:
                rss, peak = rss_mb(child.pid)
                samples.append((step, rss, peak, time.time() - start))
                print(f"{step:>6} {rss:>9.1f} {peak:>9.1f} {samples[-1][3]:>8.0f}", flush=True)
        code = child.wait()
    if code != 0:
        print(f"the demo exited with code {code}", file=sys.stderr)
        return code or 1
    base = [s for s in samples if s[0] >= args.warmup]
    if len(base) < 2:
        print("too few samples after warm-up to measure growth", file=sys.stderr)
        return 1
    growth = (base[-1][1] - base[0][1]) / base[0][1] * 100
    top = max(s[1] for s in base)
    print(
        f"\nRSS after warm-up (step {base[0][0]}): {base[0][1]:.1f} MiB; at step {base[-1][0]}: {base[-1][1]:.1f} "
        f"MiB; growth {growth:+.2f} % (max {top:.1f} MiB, {(top - base[0][1]) / base[0][1] * 100:+.2f} %); "
        f"target < 5 %: {'met' if growth < 5 else 'NOT met'}"
    )
    if args.save:
        with open(args.save, "w", encoding="utf-8") as fh:
            json.dump({"samples": samples, "warmup": args.warmup, "growth_percent": growth}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
