"""CPU training: keep freed memory in the process instead of handing it back to the OS after every tensor.

A GRPO step on a real model allocates and frees the same large tensors again and again: logits chunks of
`rows x vocabulary` (16.7 MB each for 85 rows of SmolLM2's 49,152 tokens), activations, gradient buffers. glibc's
malloc serves every block above its mmap threshold (128 KiB, raised only as far as 32 MiB by its own heuristics)
with a fresh `mmap` and unmaps it on free, and gives the top of its heap back once more than its trim threshold is
free. Each of those blocks is then faulted in again, page by page, on its first write: on a virtual machine a
page fault costs microseconds, and element-wise passes over a 16.7 MB tensor took 28 ms instead of about 2 ms
(measured on SmolLM2-135M, 2 cores: the LM head's backward went from 3.35 s to under 1 s a step).

`keep_freed_memory` raises both thresholds, so large blocks come from the heap and stay there for the next step's
tensors of the same sizes. Peak RSS does not grow (the blocks are reused); the process simply keeps its peak until
it ends. This is what allocators such as jemalloc or tcmalloc (the usual advice for CPU training, e.g. Intel's
PyTorch guides) do by design.

It runs only on Linux with glibc, and never when the user chose malloc settings themselves: any `MALLOC_*`
environment variable, `GLIBC_TUNABLES`, an allocator in `LD_PRELOAD` (jemalloc, tcmalloc), or
`GRPOKIT_KEEP_FREED_MEMORY=0`.
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys

import torch

logger = logging.getLogger(__name__)

# mallopt parameters (malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
# 1 GiB: every block up to it comes from the heap; free memory at the heap's top is kept up to it too.
THRESHOLD = 1 << 30

_applied: bool | None = None


def user_chose_malloc_settings(environ=os.environ) -> str | None:
    """The environment variable through which the user chose malloc's behaviour (or switched this off), or None."""
    if environ.get("GRPOKIT_KEEP_FREED_MEMORY", "1").strip().lower() in ("0", "false", "no", "off"):
        return "GRPOKIT_KEEP_FREED_MEMORY"
    for name in environ:
        if (
            name.startswith("MALLOC_")
            or name == "GLIBC_TUNABLES"
            or (name == "LD_PRELOAD" and "malloc" in environ[name])
        ):
            return name
    return None


def keep_freed_memory(device=None) -> bool:
    """Raise glibc malloc's mmap and trim thresholds to `THRESHOLD` (once per process); True when they are set.
    `device`: where the model trains; nothing is done for any other than the CPU."""
    global _applied
    if device is not None and torch.device(device).type != "cpu":
        return False
    if _applied is not None:
        return _applied
    _applied = False
    if not sys.platform.startswith("linux"):
        return False
    chosen = user_chose_malloc_settings()
    if chosen:
        logger.info("malloc thresholds left as they are (%s is set)", chosen)
        return False
    try:
        libc = ctypes.CDLL(None)
        if not hasattr(libc, "gnu_get_libc_version"):  # glibc only (musl has no mallopt thresholds)
            return False
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    _applied = bool(mallopt(M_MMAP_THRESHOLD, THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, THRESHOLD))
    if _applied:
        logger.info("malloc keeps freed memory for reuse (mmap and trim thresholds 1 GiB)")
    return _applied
