"""`W @ x^T` for a few float32 rows on an x86-64 CPU with AVX-512F, by a small C kernel (`few_rows.c`), and two more
of the decode step's operations on those rows: the gated MLP's first half (`gated`) and RMSNorm (`rms_norm`).

The column decode step multiplies every weight of the model by one token per sequence: a product of `(out, in)` by
`(in, rows)` with a few rows, whose speed is how fast the weight streams from memory. MKL's general kernels read it at
about 11 GB/s on two cores; `few_rows.c` reaches 15-20 GB/s there (`benchmarks/bench_few_rows.py`), which is a third
of the time of a real model's decoding (SmolLM2-135M).

The library is compiled once per machine with the C compiler at hand (`$CC`, else `cc`; about half a second) into
`kernels` under grpokit's cache (`$GRPOKIT_CACHE`, else `$XDG_CACHE_HOME/grpokit`, else `~/.cache/grpokit`) and loaded
with ctypes. Anywhere it cannot be (no compiler, not Linux on x86-64, no AVX-512F, a build error,
`GRPOKIT_CPU_KERNELS=0`), `library()` is None and the callers use torch's operations, as before; the reason is logged
once.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from torch import Tensor

logger = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("few_rows.c")
FLAGS = ["-O3", "-mavx512f", "-mfma", "-fopenmp", "-shared", "-fPIC"]
# Rows x in-features the kernel takes: its rows of x must stay in the L1 cache (48 KB of float32 here) while the
# weight streams past; beyond that (e.g. 16 rows of the MLP's 1536-wide down projection) BLAS is as fast or faster.
MAX_ELEMENTS = 12288
MAX_ROWS = 24


def unavailable_reason(environ=os.environ, cpuinfo: str | None = None) -> str | None:
    """Why the kernel cannot be used here, or None when it can be built."""
    if environ.get("GRPOKIT_CPU_KERNELS", "1").strip().lower() in ("0", "false", "no", "off"):
        return "GRPOKIT_CPU_KERNELS is off"
    if not sys.platform.startswith("linux") or platform.machine() not in ("x86_64", "AMD64"):
        return f"{sys.platform} on {platform.machine()} (the kernel is for Linux on x86-64)"
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
        except OSError:
            return "/proc/cpuinfo cannot be read"
    flags = next((line.split(":", 1)[1].split() for line in cpuinfo.splitlines() if line.startswith("flags")), [])
    if "avx512f" not in flags:
        return "this CPU has no AVX-512F"
    if compiler(environ) is None:
        return "no C compiler (set CC, or install gcc)"
    return None


def compiler(environ=os.environ) -> str | None:
    """The C compiler to build with: `$CC` when set, else `cc`, `gcc` or `clang` on PATH."""
    names = [environ["CC"]] if environ.get("CC") else ["cc", "gcc", "clang"]
    return next((path for path in map(shutil.which, names) if path), None)


def cache_dir(environ=os.environ) -> Path:
    """`kernels` in grpokit's cache (as the converted models': `$GRPOKIT_CACHE`, else `$XDG_CACHE_HOME/grpokit`, else
    `~/.cache/grpokit`)."""
    root = environ.get("GRPOKIT_CACHE") or os.path.join(
        environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "grpokit"
    )
    return Path(root) / "kernels"


def build(cc: str, directory: Path) -> Path:
    """Compile `few_rows.c` into `directory` (named by the source, the flags and the compiler, so that a change of
    any rebuilds it) and return the library's path; an existing build is reused. Written to a temporary name and
    renamed, so that processes building at once never load a half-written file."""
    source = SOURCE.read_bytes()
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=60).stdout
    key = hashlib.sha256(source + " ".join(FLAGS).encode() + version.encode()).hexdigest()[:16]
    target = directory / f"few_rows-{key}.so"
    if target.exists():
        return target
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=directory) as scratch:
        partial = Path(scratch) / target.name
        result = subprocess.run(
            [cc, *FLAGS, str(SOURCE), "-o", str(partial)], capture_output=True, text=True, timeout=300
        )
        if result.returncode != 0:
            raise RuntimeError(f"{cc} failed: {(result.stderr or result.stdout).strip().splitlines()[-1:]}")
        os.replace(partial, target)
    return target


@functools.cache
def library():
    """The compiled library (`few_rows_mm`, `few_rows_rms_norm`), or None where it cannot be had (the reason is
    logged once)."""
    reason = unavailable_reason()
    if reason is None:
        try:
            lib = ctypes.CDLL(str(build(compiler(), cache_dir())))
            lib.few_rows_mm.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 3 + [ctypes.c_int]
            lib.few_rows_mm.restype = None
            lib.few_rows_rms_norm.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int64] * 2 + [ctypes.c_float]
            lib.few_rows_rms_norm.restype = None
            lib.few_rows_gated.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 3 + [ctypes.c_int]
            lib.few_rows_gated.restype = None
            lib.few_rows_silu_mul.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int64]
            lib.few_rows_silu_mul.restype = None
            return lib
        except (OSError, AttributeError, RuntimeError, subprocess.SubprocessError) as error:
            reason = f"it did not build: {error}"
    logger.info("few-row decoding products use torch's kernels (%s)", reason)
    return None


def _plain(*tensors: Tensor) -> bool:
    """Whether the C functions can take `tensors`: float32, on the CPU, contiguous, outside autograd, the library
    built."""
    return (
        all(t.dtype == torch.float32 and t.device.type == "cpu" and t.is_contiguous() for t in tensors)
        and not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors))
        and library() is not None
    )


def applies(weight: Tensor, x: Tensor) -> bool:
    """Whether `mm(weight, x)` runs on the kernel: float32 CPU tensors, `x` `(rows, in)` with rows at most
    `MAX_ROWS` and at most `MAX_ELEMENTS` values, both contiguous, no autograd."""
    return x.dim() == 2 and 0 < x.size(0) <= MAX_ROWS and x.numel() <= MAX_ELEMENTS and _plain(weight, x)


def mm(weight: Tensor, x: Tensor, bias: Tensor | None = None) -> Tensor:
    """`weight @ x.T (+ bias[:, None])`: `(out, rows)` for `weight` `(out, in)`, `x` `(rows, in)`, `bias` `(out,)`
    or `(out, 1)`. Call only where `applies(weight, x)`."""
    out_features, in_features = weight.shape
    if x.size(1) != in_features:
        raise ValueError(f"x has {x.size(1)} features, the weight takes {in_features}")
    if bias is not None:
        bias = bias.reshape(-1).to(torch.float32).contiguous()
        if bias.numel() != out_features:
            raise ValueError(f"bias has {bias.numel()} values, the weight gives {out_features}")
    y = torch.empty(out_features, x.size(0), dtype=torch.float32)
    library().few_rows_mm(
        weight.data_ptr(),
        x.data_ptr(),
        y.data_ptr(),
        None if bias is None else bias.data_ptr(),
        out_features,
        in_features,
        x.size(0),
        torch.get_num_threads(),
    )
    return y


def rms_norm_applies(x: Tensor, weight: Tensor) -> bool:
    """Whether `rms_norm(x, weight, eps)` runs in C: float32 CPU rows `(n, hidden)`, at most `MAX_ROWS`, contiguous,
    no autograd, the library built."""
    return x.dim() == 2 and 0 < x.size(0) <= MAX_ROWS and weight.numel() == x.size(1) and _plain(x, weight)


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """`weight * x / sqrt(mean(x^2) + eps)` over each row (the float32 RMSNorm of Llama-family models), in one pass
    of C per row, without torch's thread pool (a decode step's 16 x 576 values are too few to share, and waking the
    pool cost more than the arithmetic: 60-70 us a call in the decode loop against 3). Call where
    `rms_norm_applies(x, weight)`."""
    y = torch.empty_like(x)
    library().few_rows_rms_norm(x.data_ptr(), weight.data_ptr(), y.data_ptr(), x.size(0), x.size(1), eps)
    return y


def gated_applies(gate: Tensor, up: Tensor, x: Tensor) -> bool:
    """Whether `gated(gate, up, x)` runs in C: `applies` for both weights, and 16 rows (the kernel's block)."""
    return x.dim() == 2 and x.size(0) == 16 and gate.shape == up.shape and applies(gate, x) and applies(up, x)


def gated(gate: Tensor, up: Tensor, x: Tensor) -> Tensor:
    """`silu(x @ gate.T) * (x @ up.T)`, `(rows, out)`: the first half of a gated SiLU MLP, each weight read once,
    SiLU and the product taken as the sums come out (exp by a polynomial good to about 1 ulp: equal to torch's
    `silu` up to rounding). Call where `gated_applies(gate, up, x)`."""
    out_features, in_features = gate.shape
    h = torch.empty(x.size(0), out_features, dtype=torch.float32)
    library().few_rows_gated(
        gate.data_ptr(),
        up.data_ptr(),
        x.data_ptr(),
        h.data_ptr(),
        out_features,
        in_features,
        x.size(0),
        torch.get_num_threads(),
    )
    return h


def silu_mul(a: Tensor, b: Tensor) -> Tensor:
    """`silu(a) * b` of float32 CPU tensors with a multiple of 16 values, the arithmetic `gated` uses (for tests)."""
    a, b = a.contiguous(), b.contiguous()
    if a.numel() % 16 or a.shape != b.shape:
        raise ValueError("silu_mul takes two tensors of one shape with a multiple of 16 values")
    y = torch.empty_like(a)
    library().few_rows_silu_mul(a.data_ptr(), b.data_ptr(), y.data_ptr(), a.numel())
    return y
