"""Wall time of the commands people put in CI and editors: `grpokit config validate|show|diff|plan` of the demo's
YAML, `grpokit --help`, `--version`, `recipes` and `rewards` (issue 23's target: 1.5 s each on an idle 2-core
machine). Each command runs as its own process (`python -m grpokit ...`, the real command line) `--runs` times; the
median is printed, with the fastest and slowest run.

    python benchmarks/bench_config_commands.py              # 5 runs each
    python benchmarks/bench_config_commands.py --runs 9 --save times.json

It is a script that prints numbers, not part of the test suite (timings depend on the machine and its load).
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
from pathlib import Path

DEMO = Path(__file__).resolve().parents[1] / "src" / "grpokit" / "cli" / "demo.yaml"
TOOLS = DEMO.with_name("demo_tools.yaml")

COMMANDS = {
    "config validate": ["config", "validate", "--config", str(DEMO)],
    "config show": ["config", "show", "--config", str(DEMO)],
    "config diff": ["config", "diff", str(DEMO), str(TOOLS)],
    "config plan": ["config", "plan", "--config", str(DEMO)],
    "--help": ["--help"],
    "--version": ["--version"],
    "recipes": ["recipes"],
    "rewards": ["rewards"],
}


def time_command(args: list[str], runs: int, env: dict) -> list[float]:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        result = subprocess.run([sys.executable, "-m", "grpokit", *args], capture_output=True, text=True, env=env)
        times.append(time.perf_counter() - start)
        if result.returncode != 0:
            raise SystemExit(f"grpokit {' '.join(args)} failed ({result.returncode}): {result.stderr[-500:]}")
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="runs per command (the median is reported)")
    parser.add_argument("--save", metavar="FILE", help="also write the times as JSON")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as home:
        # no accelerate default config of this machine's user, and nothing downloaded
        env = {**os.environ, "HF_HOME": home, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
        env.pop("WORLD_SIZE", None)
        results = {}
        print(f"{'command':<18}{'median':>9}{'min':>9}{'max':>9}   ({args.runs} runs, load {os.getloadavg()[0]:.2f})")
        for name, command in COMMANDS.items():
            times = time_command(command, args.runs, env)
            results[name] = times
            print(f"{name:<18}{statistics.median(times):>8.2f}s{min(times):>8.2f}s{max(times):>8.2f}s")
    if args.save:
        Path(args.save).write_text(json.dumps(results, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
