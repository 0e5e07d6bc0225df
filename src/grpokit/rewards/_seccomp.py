"""The sandbox's seccomp filter: an allowlist of the system calls a CPython program needs, as classic BPF.

bubblewrap (`bwrap --seccomp FD`) loads it right before it execs the interpreter, so it binds the program and
everything it execs, with no way to lift it (seccomp filters can only be added, and bwrap sets no_new_privs).

What a program may call (`ALLOWED`) is what CPython's interpreter and standard library use to run a program that
reads stdin, computes, uses threads and writes files in its working directory: files and directories, memory
(`mmap`, `brk`, `mremap`, `madvise`), threads and futexes, signals to itself, clocks and timers, `getrandom`,
`poll`/`select`/`epoll`, pipes and local sockets (asyncio's self-pipe is a socketpair). The list was taken from
`strace -f -c` of honest programs (the code rewards' tests, open-r1-style solutions, the modules math, itertools,
collections, heapq, re, json, threading, asyncio, concurrent.futures, sqlite3, tempfile) and kept to what Docker's
default profile also allows. Five calls are allowed only with some arguments:

- `clone` only for a thread (CLONE_THREAD) that asks for no namespace; `fork`, `vfork` and a process-making `clone`
  fail with EPERM (threads are counted by the run's pids cgroup and RLIMIT_NPROC, see `sandbox.py`);
- `clone3` fails with ENOSYS, as if the kernel were older: its flags live in memory a BPF filter cannot read, and
  glibc then falls back to `clone` for threads;
- `socket` only for AF_UNIX: a program has no network to reach (its namespace has only a loopback of its own),
  and internet sockets' buffers are what a memory cgroup v1 does not count (TCP's only with a limit of its own, UDP
  never); AF_INET, AF_INET6, netlink, packet, AF_ALG, vsock and the rest fail with EAFNOSUPPORT;
- `setsockopt` but not SO_SNDBUF, SO_RCVBUF or their FORCE forms: a socket's buffers stay at the machine's default
  (`net.core.wmem_default`, `rmem_default`; the maximum a program could ask for, `wmem_max`, is 4 MiB on some
  machines), so 64 open sockets hold a bounded amount even where no memory cgroup counts them;
- `fcntl` but not F_SETPIPE_SZ: a pipe stays at 64 KiB, so 64 open files hold at most 4 MiB of pipe buffers.

`ptrace`, `process_vm_readv`/`writev`, `unshare` and `setns` fail with EPERM, the error a program that tries them
on purpose expects. Every other call fails with ENOSYS ("this kernel has no such call"), the answer libc's fallbacks
look for: among them kernel keyrings (`keyctl`, `add_key`, `request_key`: keyrings are not namespaced, so a key
the trainer holds would be readable), `io_uring_*`, `bpf`, `perf_event_open`, `userfaultfd`, the mount family,
`kexec_*`, `memfd_create`, System V shared memory, message queues and semaphores, POSIX message queues, `flock`,
`sync`. A call of another ABI (x32, or i386 through `int 0x80` on x86_64) kills the process, since its numbers
differ and would slip past the checks above.

Two calls pass any seccomp filter: since Linux 6.11 `uretprobe` and since 6.16 `uprobe` (x86_64) are exempt, so
that user-space probes keep working under filters. Both only act on a probe the machine's root installed
(a process without one that makes them is killed with SIGILL), so they give a program nothing.

Only x86_64 and aarch64 are known; elsewhere `program()` returns None and the sandbox runs without the filter (the
namespaces, the memory cgroup and the wall-clock kill still hold; new processes die with the PID namespace).
"""

from __future__ import annotations

import errno
import platform
import socket
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

# struct seccomp_data: int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6] (little endian: the low half of
# args[i] is at 16 + 8 i)
_NR, _ARCH, _ARG0_LOW, _ARG1_LOW, _ARG2_LOW = 0, 4, 16, 24, 32

_CLONE_THREAD = 0x00010000
# CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET
_CLONE_NAMESPACES = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000
_X32_BIT = 0x40000000
_F_SETPIPE_SZ = 1031
_SOCKET_FAMILIES = (socket.AF_UNIX,)
# SOL_SOCKET and SO_SNDBUF, SO_RCVBUF, SO_SNDBUFFORCE, SO_RCVBUFFORCE (asm-generic/socket.h: x86_64 and aarch64)
_SOL_SOCKET = 1
_BUFFER_OPTIONS = (7, 8, 32, 33)

# machine -> (AUDIT_ARCH_*, index into _NUMBERS' pairs, has an x32 ABI to shut out)
_ARCHES = {"x86_64": (0xC000003E, 0, True), "aarch64": (0xC00000B7, 1, False)}

ALLOWED = frozenset(
    """
    read write readv writev pread64 pwrite64 preadv pwritev preadv2 pwritev2 open openat openat2 creat close
    close_range lseek stat fstat lstat newfstatat statx access faccessat faccessat2 getdents getdents64 getcwd chdir
    fchdir mkdir mkdirat rmdir unlink unlinkat rename renameat renameat2 link linkat symlink symlinkat readlink
    readlinkat chmod fchmod fchmodat truncate ftruncate fallocate fsync fdatasync statfs fstatfs utimensat utime
    utimes futimesat umask sendfile copy_file_range fadvise64 dup dup2 dup3 pipe pipe2 ioctl
    select pselect6 poll ppoll epoll_create epoll_create1 epoll_ctl epoll_wait epoll_pwait epoll_pwait2 eventfd
    eventfd2
    brk mmap munmap mprotect mremap madvise msync
    exit exit_group futex set_robust_list rseq set_tid_address arch_prctl sched_yield sched_getaffinity getcpu
    gettid getpid getppid getuid geteuid getgid getegid getgroups getresuid getresgid getpgrp getpgid getsid uname
    sysinfo getrusage times prlimit64 getrlimit setrlimit wait4 waitid execve execveat
    rt_sigaction rt_sigprocmask rt_sigreturn rt_sigpending rt_sigtimedwait rt_sigsuspend sigaltstack pause kill
    tkill tgkill alarm getitimer setitimer restart_syscall
    nanosleep clock_nanosleep clock_gettime clock_getres gettimeofday time getrandom
    socketpair bind connect listen accept accept4 sendto recvfrom sendmsg recvmsg sendmmsg recvmmsg shutdown
    getsockopt setsockopt getsockname getpeername
    """.split()
)
REFUSED = ("fork", "vfork", "ptrace", "process_vm_readv", "process_vm_writev", "unshare", "setns")  # EPERM

# System call numbers: name -> (x86_64, aarch64; None where that ABI has no such call). From the kernel's
# asm/unistd_64.h and asm-generic/unistd.h; the calls the filter names, and those the tests check it refuses.
_NUMBERS = {
    "accept": (43, 202),
    "accept4": (288, 242),
    "access": (21, None),
    "add_key": (248, 217),
    "alarm": (37, None),
    "arch_prctl": (158, None),
    "bind": (49, 200),
    "bpf": (321, 280),
    "brk": (12, 214),
    "chdir": (80, 49),
    "chmod": (90, None),
    "chroot": (161, 51),
    "clock_getres": (229, 114),
    "clock_gettime": (228, 113),
    "clock_nanosleep": (230, 115),
    "clone": (56, 220),
    "clone3": (435, 435),
    "close": (3, 57),
    "close_range": (436, 436),
    "connect": (42, 203),
    "copy_file_range": (326, 285),
    "creat": (85, None),
    "dup": (32, 23),
    "dup2": (33, None),
    "dup3": (292, 24),
    "epoll_create": (213, None),
    "epoll_create1": (291, 20),
    "epoll_ctl": (233, 21),
    "epoll_pwait": (281, 22),
    "epoll_pwait2": (441, 441),
    "epoll_wait": (232, None),
    "eventfd": (284, None),
    "eventfd2": (290, 19),
    "execve": (59, 221),
    "execveat": (322, 281),
    "exit": (60, 93),
    "exit_group": (231, 94),
    "faccessat": (269, 48),
    "faccessat2": (439, 439),
    "fadvise64": (221, 223),
    "fallocate": (285, 47),
    "fchdir": (81, 50),
    "fchmod": (91, 52),
    "fchmodat": (268, 53),
    "fcntl": (72, 25),
    "fdatasync": (75, 83),
    "flock": (73, 32),
    "fork": (57, None),
    "fsconfig": (431, 431),
    "fsmount": (432, 432),
    "fsopen": (430, 430),
    "fspick": (433, 433),
    "fstat": (5, 80),
    "fstatfs": (138, 44),
    "fsync": (74, 82),
    "ftruncate": (77, 46),
    "futex": (202, 98),
    "futimesat": (261, None),
    "getcpu": (309, 168),
    "getcwd": (79, 17),
    "getdents": (78, None),
    "getdents64": (217, 61),
    "getegid": (108, 177),
    "geteuid": (107, 175),
    "getgid": (104, 176),
    "getgroups": (115, 158),
    "getitimer": (36, 102),
    "getpeername": (52, 205),
    "getpgid": (121, 155),
    "getpgrp": (111, None),
    "getpid": (39, 172),
    "getppid": (110, 173),
    "getrandom": (318, 278),
    "getresgid": (120, 150),
    "getresuid": (118, 148),
    "getrlimit": (97, 163),
    "getrusage": (98, 165),
    "getsid": (124, 156),
    "getsockname": (51, 204),
    "getsockopt": (55, 209),
    "gettid": (186, 178),
    "gettimeofday": (96, 169),
    "getuid": (102, 174),
    "io_uring_enter": (426, 426),
    "io_uring_register": (427, 427),
    "io_uring_setup": (425, 425),
    "ioctl": (16, 29),
    "kexec_file_load": (320, 294),
    "kexec_load": (246, 104),
    "keyctl": (250, 219),
    "kill": (62, 129),
    "link": (86, None),
    "linkat": (265, 37),
    "listen": (50, 201),
    "lseek": (8, 62),
    "lstat": (6, None),
    "madvise": (28, 233),
    "memfd_create": (319, 279),
    "mkdir": (83, None),
    "mkdirat": (258, 34),
    "mmap": (9, 222),
    "mount": (165, 40),
    "mount_setattr": (442, 442),
    "move_mount": (429, 429),
    "mprotect": (10, 226),
    "mq_open": (240, 180),
    "mremap": (25, 216),
    "msgget": (68, 186),
    "msync": (26, 227),
    "munmap": (11, 215),
    "nanosleep": (35, 101),
    "newfstatat": (262, 79),
    "open": (2, None),
    "open_tree": (428, 428),
    "openat": (257, 56),
    "openat2": (437, 437),
    "pause": (34, None),
    "perf_event_open": (298, 241),
    "pipe": (22, None),
    "pipe2": (293, 59),
    "pivot_root": (155, 41),
    "poll": (7, None),
    "ppoll": (271, 73),
    "pread64": (17, 67),
    "preadv": (295, 69),
    "preadv2": (327, 286),
    "prlimit64": (302, 261),
    "process_vm_readv": (310, 270),
    "process_vm_writev": (311, 271),
    "pselect6": (270, 72),
    "ptrace": (101, 117),
    "pwrite64": (18, 68),
    "pwritev": (296, 70),
    "pwritev2": (328, 287),
    "read": (0, 63),
    "readlink": (89, None),
    "readlinkat": (267, 78),
    "readv": (19, 65),
    "recvfrom": (45, 207),
    "recvmmsg": (299, 243),
    "recvmsg": (47, 212),
    "rename": (82, None),
    "renameat": (264, 38),
    "renameat2": (316, 276),
    "request_key": (249, 218),
    "restart_syscall": (219, 128),
    "rmdir": (84, None),
    "rseq": (334, 293),
    "rt_sigaction": (13, 134),
    "rt_sigpending": (127, 136),
    "rt_sigprocmask": (14, 135),
    "rt_sigreturn": (15, 139),
    "rt_sigsuspend": (130, 133),
    "rt_sigtimedwait": (128, 137),
    "sched_getaffinity": (204, 123),
    "sched_yield": (24, 124),
    "select": (23, None),
    "semget": (64, 190),
    "sendfile": (40, 71),
    "sendmmsg": (307, 269),
    "sendmsg": (46, 211),
    "sendto": (44, 206),
    "set_robust_list": (273, 99),
    "set_tid_address": (218, 96),
    "setitimer": (38, 103),
    "setns": (308, 268),
    "setrlimit": (160, 164),
    "setsockopt": (54, 208),
    "shmat": (30, 196),
    "shmctl": (31, 195),
    "shmdt": (67, 197),
    "shmget": (29, 194),
    "shutdown": (48, 210),
    "sigaltstack": (131, 132),
    "socket": (41, 198),
    "socketpair": (53, 199),
    "stat": (4, None),
    "statfs": (137, 43),
    "statx": (332, 291),
    "symlink": (88, None),
    "symlinkat": (266, 36),
    "sync": (162, 81),
    "syncfs": (306, 267),
    "sysinfo": (99, 179),
    "tgkill": (234, 131),
    "time": (201, None),
    "times": (100, 153),
    "tkill": (200, 130),
    "truncate": (76, 45),
    "umask": (95, 166),
    "umount2": (166, 39),
    "uname": (63, 160),
    "unlink": (87, None),
    "unlinkat": (263, 35),
    "unshare": (272, 97),
    "userfaultfd": (323, 282),
    "utime": (132, None),
    "utimensat": (280, 88),
    "utimes": (235, None),
    "vfork": (58, None),
    "wait4": (61, 260),
    "waitid": (247, 95),
    "write": (1, 64),
    "writev": (20, 66),
}


def number(name: str, machine: str | None = None) -> int | None:
    """The number of system call `name` on `machine` (default: this one), None where it has none."""
    machine = machine or platform.machine()
    return _NUMBERS[name][_ARCHES[machine][1]]


def _op(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("<HBBI", code, jt, jf, k)  # struct sock_filter


def program(machine: str | None = None) -> bytes | None:
    """The filter for `machine` (default: this one) as bwrap reads it, or None for an unknown architecture."""
    machine = machine or platform.machine()
    if machine not in _ARCHES:
        return None
    arch, which, x32 = _ARCHES[machine]

    def nr(name: str) -> int | None:
        return _NUMBERS[name][which]

    ops = [_op(_LD_W_ABS, _ARCH), _op(_JEQ, arch, jt=1), _op(_RET, _KILL_PROCESS), _op(_LD_W_ABS, _NR)]
    if x32:
        ops += [_op(_JGE, _X32_BIT, jf=1), _op(_RET, _KILL_PROCESS)]
    for name in REFUSED:
        if nr(name) is not None:
            ops += [_op(_JEQ, nr(name), jf=1), _op(_RET, _ERRNO | errno.EPERM)]
    ops += [_op(_JEQ, nr("clone3"), jf=1), _op(_RET, _ERRNO | errno.ENOSYS)]
    # Calls allowed with some arguments only: each block ends in a return on every path (the accumulator is lost).
    ops += [
        # clone: a thread that asks for no namespace
        _op(_JEQ, nr("clone"), jf=5),
        _op(_LD_W_ABS, _ARG0_LOW),
        _op(_JSET, _CLONE_NAMESPACES, jt=2),
        _op(_JSET, _CLONE_THREAD, jf=1),
        _op(_RET, _ALLOW),
        _op(_RET, _ERRNO | errno.EPERM),
        # fcntl: not F_SETPIPE_SZ
        _op(_JEQ, nr("fcntl"), jf=4),
        _op(_LD_W_ABS, _ARG1_LOW),
        _op(_JEQ, _F_SETPIPE_SZ, jf=1),
        _op(_RET, _ERRNO | errno.EPERM),
        _op(_RET, _ALLOW),
        # setsockopt: not a socket buffer's size
        _op(_JEQ, nr("setsockopt"), jf=5 + len(_BUFFER_OPTIONS)),
        _op(_LD_W_ABS, _ARG1_LOW),
        _op(_JEQ, _SOL_SOCKET, jf=1 + len(_BUFFER_OPTIONS)),
        _op(_LD_W_ABS, _ARG2_LOW),
        *(_op(_JEQ, option, jt=len(_BUFFER_OPTIONS) - i) for i, option in enumerate(_BUFFER_OPTIONS)),
        _op(_RET, _ALLOW),
        _op(_RET, _ERRNO | errno.EPERM),
        # socket: the local family only
        _op(_JEQ, nr("socket"), jf=2 + len(_SOCKET_FAMILIES) + 1),
        _op(_LD_W_ABS, _ARG0_LOW),
        *(_op(_JEQ, family, jt=len(_SOCKET_FAMILIES) - i) for i, family in enumerate(_SOCKET_FAMILIES)),
        _op(_RET, _ERRNO | errno.EAFNOSUPPORT),
        _op(_RET, _ALLOW),
    ]
    allowed = sorted({nr(name) for name in ALLOWED} - {None})
    assert len(allowed) < 256, "a BPF jump reaches 255 instructions at most"
    for i, number_ in enumerate(allowed):
        ops.append(_op(_JEQ, number_, jt=len(allowed) - i))  # to the _ALLOW after the ENOSYS below
    ops += [_op(_RET, _ERRNO | errno.ENOSYS), _op(_RET, _ALLOW)]
    return b"".join(ops)
