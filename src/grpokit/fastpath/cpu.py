"""Whether this CPU multiplies bfloat16 in hardware (x86: AVX512-BF16 or AMX; Arm: the BF16 extension).

Without those units torch still runs bfloat16 products, by converting to float32 on the fly: slower than float32
itself. grpokit's bf16 fast path (decoding on a bfloat16 copy of the weights under `bf16=True`) is taken only where
they exist; elsewhere `bf16=True` runs as autocast runs it.
"""

from __future__ import annotations

import functools

X86_FLAGS = {"avx512_bf16", "amx_bf16"}
ARM_FLAGS = {"bf16"}


def bf16_flags(cpuinfo: str) -> set[str]:
    """The bfloat16 feature flags named in a `/proc/cpuinfo` text (x86 `flags`, Arm `Features` lines)."""
    found = set()
    for line in cpuinfo.splitlines():
        name, _, values = line.partition(":")
        if name.strip() in ("flags", "Features"):
            found |= set(values.split()) & (X86_FLAGS | ARM_FLAGS)
    return found


@functools.cache
def has_bf16_units() -> bool:
    """True where the CPU has bfloat16 arithmetic units (read from /proc/cpuinfo; False where it cannot be read)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            return bool(bf16_flags(fh.read()))
    except OSError:
        return False
