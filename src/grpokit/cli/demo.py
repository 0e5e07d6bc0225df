"""The command's side of the built-in demo (`grpokit train` with no arguments): its YAML and its run folder.

The demo's task itself (the tiny model, the prompts and the reward the YAML names) is `grpokit.demo`, in the library,
so that a config naming `grpokit.demo.copy_digit_reward` trains from Python as well.
"""

from __future__ import annotations

import contextlib
import os
from importlib import resources

# `grpokit train --demo [tools|async|real]`
DEMOS = {"digits": "demo.yaml", "tools": "demo_tools.yaml", "async": "demo_async.yaml", "real": "demo_real.yaml"}


def demo_config_path(kind: str = "digits") -> str:
    return str(resources.files(__package__).joinpath(DEMOS[kind]))


def make_demo_dir(path: str) -> None:
    """Create the demo's folder; one that grpokit creates gets a `.gitignore` of `*` (as a virtualenv does), so that
    the default `grpokit-demo/`, made wherever `grpokit train` runs, never shows up in a git checkout. A folder that
    already exists is left as it is: it may be the user's."""
    if os.path.isdir(path):
        return
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, ".gitignore"), "w", encoding="utf-8") as fh:
        fh.write("# created by grpokit for the demo's run: nothing here is meant for version control\n*\n")


@contextlib.contextmanager
def demo_server(
    model_dir: str,
    log_path: str,
    timeout_s: float = 600.0,
    *,
    max_model_len: int = 64,
    dtype: str = "float32",
    extra=(),
):
    """`grpokit vllm-serve` of the demo's model on a free local port, for `--demo async` where vLLM is installed (and
    the benchmarks): yields its URL once healthy (None when vLLM is not installed); stopped, with its process group,
    on exit. `extra`: more `vllm serve` arguments."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        yield None
        return
    import signal
    import socket
    import subprocess
    import sys
    import time
    import urllib.request

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [sys.executable, "-m", "grpokit", "vllm-serve", model_dir, "--port", str(port), "--host", "127.0.0.1"]
    command += ["--max-model-len", str(max_model_len), "--dtype", dtype, *extra]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
    with open(log_path, "w", encoding="utf-8") as log:
        server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        url, deadline = f"http://127.0.0.1:{port}", time.monotonic() + timeout_s
        try:
            while True:
                if server.poll() is not None:
                    raise RuntimeError(f"the demo's vLLM server exited with {server.returncode}: see {log_path}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the demo's vLLM server was not up within {timeout_s:g} s: see {log_path}")
                try:
                    with urllib.request.urlopen(url + "/health", timeout=2) as answer:
                        if answer.status == 200:
                            break
                except OSError:
                    time.sleep(1)
            yield url
        finally:
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(server.pid, sig)
                    server.wait(timeout=30)
                except (ProcessLookupError, subprocess.TimeoutExpired):
                    continue
