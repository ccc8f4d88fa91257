"""An in-memory cgroup v2 filesystem with the kernel's rules, for gpud.worker.cgroup_v2.V2.

What it models (cgroup-v2.rst): a new cgroup gets the core files and the files of each
controller its parent enables in ``cgroup.subtree_control``; a controller can be enabled only
where the parent offers it (``cgroup.controllers``), and not in a non-root cgroup that holds
processes ("no internal processes"), nor can a process join a non-root cgroup that enables
controllers (both EBUSY); ``rmdir`` refuses a cgroup with processes or children (EBUSY);
writing a file the cgroup does not have is ENOENT, as is writing ``cgroup.kill`` where the
kernel is older than 5.14 (``kill_file=False``); ``cgroup.kill`` empties the subtree and
``cgroup.events`` says whether it is populated.  Processes are plain numbers.  Device
programs attached through ``attach`` are kept per cgroup for tests to run
(``run_device_program``).
"""

from __future__ import annotations

import errno
import struct
from dataclasses import dataclass, field

CORE = ("cgroup.procs", "cgroup.events", "cgroup.controllers", "cgroup.subtree_control",
        "cgroup.freeze", "cpu.stat")
CONTROLLER_FILES = {
    "memory": ("memory.max", "memory.swap.max", "memory.peak", "memory.current", "memory.events"),
    "pids": ("pids.max", "pids.current"),
    "cpuset": ("cpuset.cpus", "cpuset.mems"),
    "cpu": ("cpu.max", "cpu.weight"),
}


@dataclass
class Node:
    parent: "Node | None"
    files: dict[str, str] = field(default_factory=dict)
    children: dict[str, "Node"] = field(default_factory=dict)
    procs: set[int] = field(default_factory=set)
    subtree: set[str] = field(default_factory=set)
    available: set[str] = field(default_factory=set)

    def populated(self) -> bool:
        return bool(self.procs) or any(c.populated() for c in self.children.values())

    def all_procs(self) -> set[int]:
        out = set(self.procs)
        for c in self.children.values():
            out |= c.all_procs()
        return out


class FakeCgroup2:
    def __init__(self, mount: str = "/sys/fs/cgroup", controllers: tuple[str, ...] = ("memory", "pids", "cpuset", "cpu"),
                 *, kill_file: bool = True) -> None:
        self.mount = mount.rstrip("/")
        self.kill_file = kill_file
        self.root = self._new(None, set(controllers))
        self.programs: dict[str, list[bytes]] = {}
        self.killed: list[int] = []
        self.writes: list[tuple[str, str]] = []

    # -- building -----------------------------------------------------------------------------

    def _new(self, parent: Node | None, available: set[str]) -> Node:
        node = Node(parent, available=set(available))
        for f in CORE:
            node.files[f] = ""
        if self.kill_file:
            node.files["cgroup.kill"] = ""
        node.files["cpu.stat"] = "usage_usec 0\nuser_usec 0\nsystem_usec 0\n"
        for c in available if parent is not None else ():
            for f in CONTROLLER_FILES.get(c, ()):
                node.files[f] = {"memory.max": "max", "memory.swap.max": "max", "pids.max": "max",
                                 "memory.events": "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n"}.get(f, "0" if "memory" in f or "pids" in f else "")
        return node

    def mkpath(self, path: str, pids: tuple[int, ...] = ()) -> Node:
        """Make the cgroups on the way to ``path`` (as systemd would) and put ``pids`` in it."""
        node = self.root
        for part in self._parts(path):
            if part not in node.children:
                node.children[part] = self._new(node, node.subtree)
            node = node.children[part]
        node.procs |= set(pids)
        return node

    def _parts(self, path: str) -> list[str]:
        if not (path == self.mount or path.startswith(self.mount + "/")):
            raise FileNotFoundError(errno.ENOENT, "not under the mount", path)
        return [p for p in path[len(self.mount):].split("/") if p]

    def node(self, path: str) -> Node | None:
        node = self.root
        for part in self._parts(path):
            node = node.children.get(part)
            if node is None:
                return None
        return node

    def _file(self, path: str) -> tuple[Node, str]:
        d, _, name = path.rpartition("/")
        node = self.node(d)
        if node is None or name not in node.files:
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", path)
        return node, name

    def where(self, pid: int) -> str | None:
        def walk(node: Node, path: str) -> str | None:
            if pid in node.procs:
                return path
            for name, c in node.children.items():
                found = walk(c, f"{path}/{name}")
                if found:
                    return found
            return None
        return walk(self.root, self.mount)

    # -- the CgroupFs protocol --------------------------------------------------------------------

    def read(self, path: str) -> str:
        node, name = self._file(path)
        if name == "cgroup.procs":
            return "".join(f"{p}\n" for p in sorted(node.procs))
        if name == "cgroup.events":
            return f"populated {int(node.populated())}\nfrozen {node.files['cgroup.freeze'] or 0}\n"
        if name == "cgroup.controllers":
            return " ".join(sorted(node.available)) + "\n"
        if name == "cgroup.subtree_control":
            return " ".join(sorted(node.subtree)) + "\n"
        return node.files[name]

    def write(self, path: str, text: str) -> None:
        node, name = self._file(path)
        self.writes.append((path, text))
        if name == "cgroup.procs":
            pid = int(text)
            if node is not self.root and node.subtree:
                raise OSError(errno.EBUSY, "Device or resource busy", path)
            self._detach(pid)
            node.procs.add(pid)
        elif name == "cgroup.subtree_control":
            for word in text.split():
                ctrl = word[1:]
                if ctrl not in node.available:
                    raise OSError(errno.ENOENT, "No such file or directory", path)
                if word[0] == "+":
                    if node is not self.root and node.procs:
                        raise OSError(errno.EBUSY, "Device or resource busy", path)
                    node.subtree.add(ctrl)
                else:
                    node.subtree.discard(ctrl)
        elif name == "cgroup.kill":
            if text.strip() == "1":
                pids = node.all_procs()
                self.killed += sorted(pids)
                for p in pids:
                    self._detach(p)
        else:
            node.files[name] = text

    def _detach(self, pid: int) -> None:
        def walk(node: Node) -> None:
            node.procs.discard(pid)
            for c in node.children.values():
                walk(c)
        walk(self.root)

    def exists(self, path: str) -> bool:
        try:
            if self.node(path) is not None:
                return True
            self._file(path)
            return True
        except FileNotFoundError:
            return False

    def isdir(self, path: str) -> bool:
        try:
            return self.node(path) is not None
        except FileNotFoundError:
            return False

    def mkdir(self, path: str) -> None:
        d, _, name = path.rstrip("/").rpartition("/")
        parent = self.node(d)
        if parent is None:
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", path)
        if name in parent.children or name in parent.files:
            raise FileExistsError(errno.EEXIST, "File exists", path)
        parent.children[name] = self._new(parent, parent.subtree)

    def rmdir(self, path: str) -> None:
        d, _, name = path.rstrip("/").rpartition("/")
        parent = self.node(d)
        if parent is None or name not in parent.children:
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", path)
        node = parent.children[name]
        if node.populated() or node.children:
            raise OSError(errno.EBUSY, "Device or resource busy", path)
        del parent.children[name]
        self.programs.pop(path, None)

    def listdir(self, path: str) -> list[str]:
        node = self.node(path)
        if node is None:
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", path)
        return sorted(node.files) + sorted(node.children)

    # -- the bpf side ------------------------------------------------------------------------------

    def attach(self, path: str, program: list[bytes]) -> None:
        if self.node(path) is None:
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", path)
        self.programs[path] = list(program)


def run_device_program(program: list[bytes], dev_type: int, major: int, minor: int, access: int = 6) -> int:
    """Interpret a BPF_PROG_TYPE_CGROUP_DEVICE program (the instructions gpud emits, and
    nothing else: an unknown opcode fails the test) on one access; 1 allows, 0 denies."""
    ctx = struct.pack("<III", (access << 16) | dev_type, major, minor)
    regs = [0] * 11
    pc, steps = 0, 0
    while True:
        steps += 1
        assert steps < 10_000, "the program loops"
        assert 0 <= pc < len(program), f"jump out of the program to {pc}"
        code, regs_byte, off, imm = struct.unpack("<BBhi", program[pc])
        dst, src = regs_byte & 0xF, regs_byte >> 4
        pc += 1
        if code == 0x61:      # ldxw dst, [src + off]: only the context (r1) is readable
            assert src == 1 and off in (0, 4, 8), "reads outside bpf_cgroup_dev_ctx"
            regs[dst] = struct.unpack_from("<I", ctx, off)[0]
        elif code == 0x57:
            regs[dst] &= imm & 0xFFFFFFFFFFFFFFFF
        elif code == 0xb7:
            regs[dst] = imm & 0xFFFFFFFFFFFFFFFF
        elif code == 0x15:
            pc += off if regs[dst] == imm & 0xFFFFFFFFFFFFFFFF else 0
        elif code == 0x55:
            pc += off if regs[dst] != imm & 0xFFFFFFFFFFFFFFFF else 0
        elif code == 0x05:
            pc += off
        elif code == 0x95:
            return regs[0]
        else:
            raise AssertionError(f"unexpected opcode {code:#x}")
