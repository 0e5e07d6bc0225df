"""The sandbox's seccomp filter: a classic-BPF program that forbids new processes and new namespaces.

bubblewrap (`bwrap --seccomp FD`) loads it right before it starts the program, so it binds the program and
everything it execs, with no way to lift it (seccomp filters can only be added, and bwrap sets no_new_privs).

Why this filter and only this: the namespaces already keep the program away from other processes, files and the
network, but not from the machine's process table: as root (CI), RLIMIT_NPROC is not enforced, so a fork bomb
would take every free PID of the host (32768 on a default kernel) until the wall-clock kill. With this filter:

- `fork`, `vfork`, and `clone` without CLONE_THREAD fail with EPERM (threads, which the CPU and memory rlimits
  already count, still work);
- `clone` asking for a namespace, `unshare` and `setns` fail with EPERM (no nested user namespace, where the
  program would hold capabilities again);
- `ptrace`, `process_vm_readv` and `process_vm_writev` fail with EPERM (nothing else is visible to them in the PID
  namespace; refused anyway, as no test program needs them);
- `clone3` fails with ENOSYS, whose flags live in memory a BPF filter cannot read; glibc then falls back to
  `clone` for threads;
- a system call of another ABI (x32, or i386 through `int 0x80` on x86_64) kills the process, since its numbers
  differ and would slip past the checks above.

Only x86_64 and aarch64 are known; elsewhere `program()` returns None and the sandbox runs without the filter
(the PID namespace and the wall-clock kill still end every process of a run).
"""

from __future__ import annotations

import errno
import platform
import struct

# linux/filter.h and linux/seccomp.h
_LD_W_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
_JEQ = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_JGE = 0x35  # BPF_JMP | BPF_JGE | BPF_K
_JSET = 0x45  # BPF_JMP | BPF_JSET | BPF_K
_RET = 0x06  # BPF_RET | BPF_K
_ALLOW = 0x7FFF0000
_KILL_PROCESS = 0x80000000
_ERRNO = 0x00050000

# struct seccomp_data: int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6] (little endian: the low half
# of args[0] is at 16)
_NR, _ARCH, _ARG0_LOW = 0, 4, 16

_CLONE_THREAD = 0x00010000
# CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET
_CLONE_NAMESPACES = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000
_X32_BIT = 0x40000000

# machine -> (AUDIT_ARCH_*, system calls refused with EPERM, clone, clone3, has an x32 ABI to shut out)
_ARCHES = {
    # fork, vfork, ptrace, unshare, setns, process_vm_readv, process_vm_writev
    "x86_64": (0xC000003E, (57, 58, 101, 272, 308, 310, 311), 56, 435, True),
    # unshare, ptrace, setns, process_vm_readv, process_vm_writev (no fork or vfork there)
    "aarch64": (0xC00000B7, (97, 117, 268, 270, 271), 220, 435, False),
}


def _op(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("<HBBI", code, jt, jf, k)  # struct sock_filter


def program(machine: str | None = None) -> bytes | None:
    """The filter for `machine` (default: this one) as bwrap reads it, or None for an unknown architecture."""
    machine = machine or platform.machine()
    if machine not in _ARCHES:
        return None
    arch, denied, clone, clone3, x32 = _ARCHES[machine]
    ops = [_op(_LD_W_ABS, _ARCH), _op(_JEQ, arch, jt=1), _op(_RET, _KILL_PROCESS), _op(_LD_W_ABS, _NR)]
    if x32:
        ops += [_op(_JGE, _X32_BIT, jf=1), _op(_RET, _KILL_PROCESS)]
    for number, error in sorted({**dict.fromkeys(denied, errno.EPERM), clone3: errno.ENOSYS}.items()):
        ops += [_op(_JEQ, number, jf=1), _op(_RET, _ERRNO | error)]
    # clone: allowed only for a thread that asks for no namespace
    ops += [
        _op(_JEQ, clone, jt=1),
        _op(_RET, _ALLOW),
        _op(_LD_W_ABS, _ARG0_LOW),
        _op(_JSET, _CLONE_NAMESPACES, jt=2),
        _op(_JSET, _CLONE_THREAD, jf=1),
        _op(_RET, _ALLOW),
        _op(_RET, _ERRNO | errno.EPERM),
    ]
    return b"".join(ops)
