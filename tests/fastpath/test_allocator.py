"""Freed memory kept for reuse on CPU: glibc's thresholds raised once, the user's own malloc settings respected, and
a large tensor freed and allocated again costs no new page faults (one fault per 4 KiB page without)."""

import subprocess
import sys

import pytest

from grpokit.fastpath.allocator import user_chose_malloc_settings

# Allocates, fills and frees a 64 MiB tensor 20 times, then counts the minor page faults of doing it 5 times more.
# (The first few times the heap grows: torch asks for 64-byte aligned blocks, which a freed block of exactly the size
# cannot serve, and small blocks allocated meanwhile split the free space; measured here, it settled after 5 to 8
# times in every run.)
REUSE = """
import resource, torch
from grpokit.fastpath.allocator import keep_freed_memory
print(keep_freed_memory())
for _ in range(20):
    resource.getrusage(resource.RUSAGE_SELF)
    torch.ones(16 * 2**20)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    resource.getrusage(resource.RUSAGE_SELF)
    torch.ones(16 * 2**20)
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def faults_of_a_reused_tensor(env):
    out = subprocess.run([sys.executable, "-c", REUSE], env=env, capture_output=True, text=True, check=True).stdout
    applied, faults = out.split()
    return applied == "True", int(faults)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_a_freed_tensor_is_reused_without_page_faults(monkeypatch):
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    kept, faults = faults_of_a_reused_tensor(env)
    assert kept and faults < 1000  # heap blocks of the earlier tensors, reused
    unchanged, faults = faults_of_a_reused_tensor({**env, "GRPOKIT_KEEP_FREED_MEMORY": "0"})
    assert not unchanged
    # glibc maps each 64 MiB block afresh and faults it in page by page: 5 x 16,384 pages of 4 KiB (fewer where
    # transparent huge pages back them: 5 x 32 of 2 MiB).
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as fh:
            huge_pages = "[always]" in fh.read()
    except OSError:  # a kernel without transparent huge pages
        huge_pages = False
    assert faults >= 5 * (32 if huge_pages else 16384)


def test_the_users_own_malloc_settings_win():
    assert user_chose_malloc_settings({}) is None
    assert user_chose_malloc_settings({"PATH": "/bin", "GRPOKIT_KEEP_FREED_MEMORY": "1"}) is None
    assert user_chose_malloc_settings({"MALLOC_ARENA_MAX": "2"}) == "MALLOC_ARENA_MAX"
    assert user_chose_malloc_settings({"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=0"}) == "GLIBC_TUNABLES"
    assert user_chose_malloc_settings({"LD_PRELOAD": "/usr/lib/libjemalloc.so.2"}) == "LD_PRELOAD"
    assert user_chose_malloc_settings({"LD_PRELOAD": "/usr/lib/libfoo.so"}) is None
    assert user_chose_malloc_settings({"GRPOKIT_KEEP_FREED_MEMORY": "off"}) == "GRPOKIT_KEEP_FREED_MEMORY"


def test_bf16_units_are_read_from_cpuinfo():
    from grpokit.fastpath.cpu import bf16_flags

    amx = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n"
    avx2 = "processor\t: 0\nflags\t\t: fpu sse2 avx2 fma\n"
    arm = "processor\t: 0\nFeatures\t: fp asimd sve bf16 i8mm\n"
    assert bf16_flags(amx) == {"avx512_bf16", "amx_bf16"}
    assert bf16_flags(avx2) == set() and bf16_flags(arm) == {"bf16"} and bf16_flags("") == set()
