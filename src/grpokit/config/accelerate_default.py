"""The process count of the user's accelerate default config file: what `accelerate launch` (with no --config_file)
starts, and so the count `grpokit config validate|show|plan` checks the batch geometry at when nothing else gives one.

The file is where accelerate looks for it (`accelerate.commands.config.config_args`): `$HF_HOME/accelerate/
default_config.yaml`, with HF_HOME defaulting to `$XDG_CACHE_HOME/huggingface` and XDG_CACHE_HOME to `~/.cache`. It
is read with PyYAML only (no accelerate, no torch).
"""

from __future__ import annotations

import os
from collections.abc import Mapping


def default_config_path(env: Mapping[str, str] | None = None) -> str:
    """Where accelerate keeps its default config file (whether or not it exists)."""
    env = os.environ if env is None else env
    home = env.get("HF_HOME") or os.path.join(env.get("XDG_CACHE_HOME") or "~/.cache", "huggingface")
    return os.path.join(os.path.expanduser(home), "accelerate", "default_config.yaml")


def default_config_processes(env: Mapping[str, str] | None = None) -> tuple[int, str] | None:
    """(processes, path) that `accelerate launch` would start from the default config file, or None when there is
    no such file or it cannot be read. `distributed_type` NO or MULTI_CPU starts one process whatever its
    num_processes says (accelerate 1.x); otherwise its num_processes (1 when unset)."""
    path = default_config_path(env)
    if not os.path.isfile(path):
        return None
    try:
        import yaml

        with open(path, encoding="utf-8") as fh:
            data = yaml.safe_load(fh)
    except (OSError, ValueError, yaml.YAMLError):
        return None
    if not isinstance(data, dict):
        return None
    kind = str(data.get("distributed_type", "NO")).upper()
    count = data.get("num_processes")
    if kind in ("NO", "MULTI_CPU") or not isinstance(count, int) or isinstance(count, bool) or count < 1:
        return 1, path
    return count, path
