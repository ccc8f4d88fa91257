"""The cgroup v2 device fence: a BPF_PROG_TYPE_CGROUP_DEVICE program, built here and loaded
with the ``bpf`` syscall (ctypes), as systemd and Slurm's cgroup/v2 plugin do.

v2 has no devices controller: the kernel runs the programs attached to a process's cgroup
(and its ancestors) on every open or mknod of a device node.  The program reads
``struct bpf_cgroup_dev_ctx`` and returns 1 to allow, 0 to deny.  ``device_program`` emits a
few instructions per fenced major (no loops, no maps, nothing the verifier could refuse);
``attach_device_program`` loads them and attaches them with BPF_F_ALLOW_MULTI.  No
library is needed for that: two syscalls with fixed structures.  tests/fake_cgroup2.py runs
the same instructions through a small interpreter.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct


class BpfError(OSError):
    pass


# eBPF opcodes used (linux/bpf.h): the program reads struct bpf_cgroup_dev_ctx
# {u32 access_type (access << 16 | type); u32 major; u32 minor} and returns 1 (allow) or 0.
LDXW = 0x61        # BPF_LDX | BPF_MEM | BPF_W
AND64_K = 0x57     # BPF_ALU64 | BPF_AND | BPF_K
MOV64_K = 0xb7     # BPF_ALU64 | BPF_MOV | BPF_K
JEQ_K = 0x15       # BPF_JMP | BPF_JEQ | BPF_K
JNE_K = 0x55       # BPF_JMP | BPF_JNE | BPF_K
JA = 0x05          # BPF_JMP | BPF_JA
EXIT = 0x95        # BPF_JMP | BPF_EXIT
DEV_CHAR = 2       # BPF_DEVCG_DEV_CHAR


def insn(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    return struct.pack("<BBhi", code, (src << 4) | dst, off, imm)


def device_program(fence: dict[int, frozenset[int]]) -> list[bytes]:
    """Instructions that deny character devices of each fenced major except its allowed
    minors, and allow everything else (other majors, block devices)."""
    # Layout: prologue, one block per major, then "allow" and "deny" exits.  Jumps are
    # relative to the next instruction, so blocks are built first and offsets filled in.
    prologue = [insn(LDXW, 2, 1, 0), insn(AND64_K, 2, imm=0xFFFF), insn(LDXW, 3, 1, 4),
                insn(LDXW, 4, 1, 8)]
    blocks: list[list[tuple]] = []
    for major in sorted(fence):
        minors = sorted(fence[major])
        block: list[tuple] = [("jne_next", major)]
        block += [("jeq_allow", m) for m in minors]
        block.append(("ja_deny",))
        blocks.append(block)
    # instruction 0 after the prologue checks the type
    total_body = 1 + sum(len(b) for b in blocks)
    allow_at = len(prologue) + total_body       # index of "r0 = 1"
    deny_at = allow_at + 2                      # index of "r0 = 0"
    out = list(prologue)
    out.append(insn(JNE_K, 2, off=allow_at - (len(out) + 1), imm=DEV_CHAR))
    for block in blocks:
        end = len(out) + len(block)             # first instruction of the next block
        for op in block:
            here = len(out) + 1
            if op[0] == "jne_next":
                out.append(insn(JNE_K, 3, off=end - here, imm=op[1]))
            elif op[0] == "jeq_allow":
                out.append(insn(JEQ_K, 4, off=allow_at - here, imm=op[1]))
            else:
                out.append(insn(JA, off=deny_at - here))
    out += [insn(MOV64_K, 0, imm=1), insn(EXIT), insn(MOV64_K, 0, imm=0), insn(EXIT)]
    return out


_BPF_SYSCALL = {"x86_64": 321, "aarch64": 280, "ppc64le": 361, "s390x": 351}
BPF_PROG_LOAD = 5
BPF_PROG_ATTACH = 8
BPF_PROG_TYPE_CGROUP_DEVICE = 15
BPF_CGROUP_DEVICE = 6
BPF_F_ALLOW_MULTI = 2


def _bpf(cmd: int, attr: bytes) -> int:
    nr = _BPF_SYSCALL.get(platform.machine())
    if nr is None:
        raise BpfError(errno.ENOSYS, f"no bpf syscall number known for {platform.machine()}")
    libc = ctypes.CDLL(None, use_errno=True)
    buf = ctypes.create_string_buffer(attr, 128)
    libc.syscall.restype = ctypes.c_long
    r = libc.syscall(ctypes.c_long(nr), ctypes.c_int(cmd), buf, ctypes.c_uint(128))
    if r < 0:
        e = ctypes.get_errno()
        raise BpfError(e, f"bpf: {os.strerror(e)}")
    return r


def attach_device_program(cgroup: str, program: list[bytes]) -> None:
    """Load ``program`` and attach it to the cgroup directory ``cgroup``.  The kernel keeps it
    while the cgroup exists, so no file descriptor or pin outlives this call; ALLOW_MULTI
    keeps the programs of the parents (systemd's DevicePolicy) in force as well."""
    code = ctypes.create_string_buffer(b"".join(program))
    lic = ctypes.create_string_buffer(b"GPL")
    attr = struct.pack("<IIQQIIQ", BPF_PROG_TYPE_CGROUP_DEVICE, len(program),
                       ctypes.addressof(code), ctypes.addressof(lic), 0, 0, 0)
    prog = _bpf(BPF_PROG_LOAD, attr)
    try:
        cg = os.open(cgroup, os.O_RDONLY | os.O_DIRECTORY)
        try:
            _bpf(BPF_PROG_ATTACH, struct.pack("<IIII", cg, prog, BPF_CGROUP_DEVICE, BPF_F_ALLOW_MULTI))
        finally:
            os.close(cg)
    finally:
        os.close(prog)
