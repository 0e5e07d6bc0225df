"""Plain helpers of the configuration tests (fixtures live in conftest.py)."""

import os
import re
import subprocess
import sys


def console_script(*args, cwd=None) -> subprocess.Popen:
    """Start the real console script (`python -m grpokit ...`) without waiting: callers start several at once."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    env.pop("WORLD_SIZE", None)
    return subprocess.Popen(
        [sys.executable, "-m", "grpokit", *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=cwd,
    )


def line_of(path, key: str) -> int:
    """1-based line of the top-level `key:` in a YAML file, found by reading the text (independently of the parser)."""
    with open(path, encoding="utf-8") as fh:
        for number, line in enumerate(fh, start=1):
            if line.startswith(f"{key}:"):
                return number
    raise AssertionError(f"{key} not found in {path}")


def plan_rows(out: str, section: str) -> dict[str, tuple[str, str]]:
    """The rows of one section of `grpokit config plan`'s output: name -> (value, how)."""
    lines = out.split(section + "\n", 1)[1].splitlines()
    rows = {}
    for line in lines:
        if not line.startswith("  "):
            break
        match = re.match(r"^  (\S.*?)\s{2,}(\S+(?: \S+)?)\s{2,}(.*)$", line)
        assert match, line
        rows[match.group(1)] = (match.group(2), match.group(3))
    return rows
