"""Reading /proc: one parser of a process's stat line, and the one rule for what counts as a live process.

Host code (the sandbox drivers, the reaper, the local server's supervisor, benchmarks) and in-sandbox programs read
processes through these functions. The rule: a process is alive while /proc has it and its state is neither zombie
(Z) nor dead (X); a zombie has exited and only waits for its parent to reap it, so it has no start time here and
is not running. A start time is the kernel's field 22 of /proc/PID/stat (clock ticks since boot), kept as the
string the kernel wrote; with the pid it names one process across pid reuse.

Standard library only, so the file can be shipped into a sandbox as it is. It does not signal, wait for or
otherwise touch a process."""

from __future__ import annotations

import os

GONE_STATES = ("Z", "X")


class Stat:
    """The fields of /proc/PID/stat this project reads. A plain class, not a dataclass: the in-sandbox kernel
    imports this module on every start, and `dataclasses` costs it several milliseconds of imports."""

    __slots__ = ("comm", "pid", "ppid", "start", "state")

    def __init__(self, pid: int, comm: str, state: str, ppid: int, start: str) -> None:
        self.pid = pid
        self.comm = comm  # the command name, at most 15 bytes as the kernel keeps it
        self.state = state  # one letter: R, S, D, T, t, Z, X, ...
        self.ppid = ppid
        self.start = start  # field 22: start time in clock ticks since boot

    def __repr__(self) -> str:
        return f"Stat(pid={self.pid}, comm={self.comm!r}, state={self.state!r}, ppid={self.ppid}, start={self.start!r})"

    @property
    def alive(self) -> bool:
        return self.state not in GONE_STATES


def parse_stat(pid: int, raw: bytes) -> Stat:
    """Parse the text of /proc/PID/stat. The command name may hold spaces and parentheses, so the fields are
    split after its last closing parenthesis."""
    head, _, tail = raw.rpartition(b")")
    fields = tail.split()
    return Stat(pid=pid, comm=head.partition(b"(")[2].decode("utf-8", "replace"), state=fields[0].decode(),
                ppid=int(fields[1]), start=fields[19].decode())


def stat(pid: int, proc: str = "/proc") -> Stat | None:
    """The stat of process `pid` under the procfs mounted at `proc`, or None when there is no such process."""
    try:
        with open(f"{proc}/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    try:
        return parse_stat(pid, raw)
    except (IndexError, ValueError):  # a torn or foreign line: treated as no process
        return None


def start_time(pid: int, proc: str = "/proc") -> str | None:
    """The start time of `pid`, or None when it is gone (no such process, a zombie or dead)."""
    st = stat(pid, proc)
    return st.start if st is not None and st.alive else None


def running(pid: int, proc: str = "/proc") -> bool:
    """Whether `pid` is a process that has not exited (a zombie has)."""
    st = stat(pid, proc)
    return st is not None and st.alive


def pids(proc: str = "/proc") -> list[int]:
    """Every pid listed under the procfs at `proc`, ascending (some may be gone by the time they are read)."""
    try:
        return sorted(int(d) for d in os.listdir(proc) if d.isdigit())
    except OSError:
        return []


def stats(proc: str = "/proc") -> list[Stat]:
    """The stat of every process under `proc` that could be read, by pid."""
    return [st for st in (stat(p, proc) for p in pids(proc)) if st is not None]


def namespace(pid: int, kind: str, proc: str = "/proc") -> str | None:
    """The namespace of `kind` (pid, mnt, user, ...) that `pid` is in, as the kernel names it ("pid:[4026532]"),
    or None when the process is gone or not ours to look at."""
    try:
        return os.readlink(f"{proc}/{pid}/ns/{kind}")
    except OSError:
        return None


def ns_pid(pid: int, proc: str = "/proc") -> int | None:
    """The pid of `pid` in its innermost pid namespace (the last NSpid of /proc/PID/status), or None when gone."""
    try:
        with open(f"{proc}/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"NSpid:"):
                    return int(line.split()[-1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def cmdline(pid: int, proc: str = "/proc") -> list[bytes]:
    """The arguments `pid` was started with (empty when it is gone, or a kernel thread)."""
    try:
        with open(f"{proc}/{pid}/cmdline", "rb") as f:
            return f.read().split(b"\0")
    except OSError:
        return []


def descendants(root_pid: int, proc: str = "/proc") -> list[int]:
    """Pids of all live descendants of `root_pid`, parents before their children."""
    children: dict[int, list[int]] = {}
    for st in stats(proc):
        if st.alive:
            children.setdefault(st.ppid, []).append(st.pid)
    found, todo = [], [root_pid]
    while todo:
        for child in children.get(todo.pop(0), []):
            found.append(child)
            todo.append(child)
    return found
