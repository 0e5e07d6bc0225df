"""Start and stop a real `grpokit vllm-serve` for the vLLM test modules (one server per module)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from types import SimpleNamespace

import pytest

START_TIMEOUT_S = 420


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running_server(model_dir: str, log_path, *, token: str | None = None, max_model_len: int = 256, extra=()):
    """`grpokit vllm-serve MODEL` (and `extra` arguments) on a free port until healthy; stopped (terminate, then kill,
    the whole process group) on exit. Yields `SimpleNamespace(url, port, proc, stop, log, started_s)`."""
    port = free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}
    cmd = [sys.executable, "-m", "grpokit", "vllm-serve", model_dir, "--port", str(port)]
    cmd += ["--max-model-len", str(max_model_len), "--dtype", "float32", *extra]
    start = time.monotonic()
    log = open(log_path, "w")  # noqa: SIM115 - closed at exit
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"

    def stop():
        if proc.poll() is None:
            _signal_group(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        _signal_group(proc.pid, signal.SIGKILL)  # whatever of the group is left (engine core, workers)
        proc.wait(timeout=30)

    try:
        while True:
            if proc.poll() is not None:
                pytest.fail(f"grpokit vllm-serve exited with {proc.returncode}:\n{tail(log_path)}")
            if time.monotonic() - start > START_TIMEOUT_S:
                pytest.fail(f"grpokit vllm-serve not healthy after {START_TIMEOUT_S}s:\n{tail(log_path)}")
            try:
                headers = {"Authorization": f"Bearer {token}"} if token else {}
                with urllib.request.urlopen(urllib.request.Request(url + "/health", headers=headers), timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            time.sleep(1)
        started_s = time.monotonic() - start
        print(f"\nvllm-serve healthy after {started_s:.1f}s")
        yield SimpleNamespace(url=url, port=port, proc=proc, stop=stop, log=log_path, started_s=started_s)
    finally:
        stop()
        log.close()


def _signal_group(pid: int, sig) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def tail(path, n=40) -> str:
    return "\n".join(open(path).read().splitlines()[-n:])
