"""A Docker container's cgroup as the host reads it: OOM kills and pids-limit hits, its processes, its freezer and
its limits (cgroup v1 or v2, when the engine runs on this host).

The Docker driver (sandbox/docker.py) reads the counters around each call (an OOM kill or a refused fork is a verdict)
and, to reset a reused container, lists, freezes and kills its processes and checks its limits. When the engine is
not local (no cgroup directory here) `available` is False and the driver falls back to the engine's own state.
This module writes nothing but the freezer's state file, and signals no process.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass
class Counters:
    oom_kill: int = 0
    pids_max: int = 0


class Cgroup:
    """Reads the container's cgroup event counters from /sys/fs/cgroup when the engine is local (v1 or v2)."""

    def __init__(self, cid: str):
        base = Path("/sys/fs/cgroup")
        candidates = [
            (base / "memory/docker" / cid / "memory.oom_control", base / "pids/docker" / cid / "pids.events"),
            (base / f"system.slice/docker-{cid}.scope/memory.events", base / f"system.slice/docker-{cid}.scope/pids.events"),
            (base / "docker" / cid / "memory.events", base / "docker" / cid / "pids.events"),
        ]
        self.mem: Path | None = None
        self.pids: Path | None = None
        for mem, pids in candidates:
            if mem.exists():
                self.mem, self.pids = mem, (pids if pids.exists() else None)
                break
        # what a reset needs (reuse): the container's processes, a freezer, and the limits it was started with
        self.procs: Path | None = None
        self.freeze: tuple[Path, str, str] | None = None  # (file, value that freezes, value that thaws)
        self.limits: list[Path] = []
        if self.mem is not None and self.mem.name == "memory.oom_control":  # v1: one hierarchy per controller
            self.procs = self.pids.parent / "cgroup.procs" if self.pids is not None else None
            self.freeze = (base / "freezer/docker" / cid / "freezer.state", "FROZEN", "THAWED")
            self.limits = [self.mem.parent / "memory.limit_in_bytes", self.mem.parent / "memory.memsw.limit_in_bytes",
                           base / "pids/docker" / cid / "pids.max", base / "cpu/docker" / cid / "cpu.cfs_quota_us"]
        elif self.mem is not None:  # v2: one directory
            d = self.mem.parent
            self.procs = d / "cgroup.procs"
            self.freeze = (d / "cgroup.freeze", "1", "0")
            self.limits = [d / "memory.max", d / "memory.swap.max", d / "pids.max", d / "cpu.max"]
        self.limits = [x for x in self.limits if x.exists()]

    @property
    def available(self) -> bool:
        return self.mem is not None

    @staticmethod
    def _field(path: Path | None, name: str) -> int:
        if path is None:
            return 0
        try:
            for line in path.read_text().splitlines():
                k, _, v = line.partition(" ")
                if k == name:
                    return int(v)
        except (OSError, ValueError):
            pass
        return 0

    def read(self) -> Counters:
        return Counters(self._field(self.mem, "oom_kill"), self._field(self.pids, "max"))

    @property
    def resettable(self) -> bool:
        """The host can kill this container's processes itself: the process list and the freezer are there."""
        return self.procs is not None and self.procs.exists() and self.freeze is not None and self.freeze[0].exists()

    def processes(self) -> list[int]:
        """Host pids of every process in the container (PID 1, exec'd commands, their children)."""
        assert self.procs is not None
        return [int(x) for x in self.procs.read_text().split()]

    def limit_values(self) -> list[str]:
        """The memory, swap, pids and CPU limits as the kernel holds them (a reused container must keep them)."""
        return [x.read_text().strip() for x in self.limits]
