"""The one reset check of a reused sandbox, run inside it on both backends: empty the writable folders and say what
an episode could have left behind.

Between two episodes of a reused sandbox the backend first kills every process of the last episode (the local
zygote with `kill(-1)`, the Docker host with the container's cgroup frozen), then runs this program as the sandbox
user: in the zygote itself (sandbox/guest/zygote.py) or, on Docker, in the keeper's child that becomes the next
interpreter (sandbox/guest/keeper.py: `main(["--empty", DIR...])`, printing one JSON object before the ready line). It

- empties RESET_DIRS (never following a link; folders made unreadable are opened up first) and, given the state
  the sandbox had when fresh, puts back those folders' modes and removes extended attributes added since;
- finds what must be gone whatever the sandbox looked like at start (`problems`): other processes than PID 1, this
  one and its parent, entries left in the folders, System V IPC objects;
- reports what must be as it was when the sandbox was fresh (`state`): the folders' mode, owner and extended
  attributes, /dev/mqueue (POSIX message queues), the writable mounts and the kernel keys this sandbox can see.

The caller compares `state` with the one taken when the sandbox was fresh (`changed`). Standard library only.
This module kills no process and knows nothing of the backend that runs it.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from typing import Any

RESET_DIRS = ("/tmp", "/workspace", "/dev/shm")
MQUEUE = "/dev/mqueue"
SYSVIPC = ("shm", "sem", "msg")


def remove(path: str) -> None:
    """Remove a file, link or directory tree without following links; makes unreadable directories readable."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        os.chmod(path, 0o700)
        for name in os.listdir(path):
            remove(os.path.join(path, name))
        os.rmdir(path)
    else:
        os.unlink(path)


def _folder(path: str, entries: bool) -> list[Any] | str:
    """[entries (when asked),] mode, owner, group and extended attributes of a folder; the error's name if none."""
    try:
        st = os.lstat(path)
        meta = [stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, sorted(os.listxattr(path))]
        return [sorted(os.listdir(path)), *meta] if entries else meta
    except OSError as e:
        return type(e).__name__


def state(dirs: tuple[str, ...] = RESET_DIRS) -> dict[str, Any]:
    """What a reset must restore to the sandbox's fresh state (JSON-able; compare two with `changed`)."""
    found: dict[str, Any] = {d: _folder(d, entries=False) for d in dirs}
    found[MQUEUE] = _folder(MQUEUE, entries=True)
    mounts = []
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                fields = line.split()
                i = fields.index("-")
                if "rw" in fields[5].split(","):
                    mounts.append([fields[4], fields[5], fields[i + 1], fields[i + 3] if len(fields) > i + 3 else ""])
    except (OSError, ValueError) as e:
        mounts = [type(e).__name__]
    found["writable mounts"] = sorted(mounts)
    try:
        with open("/proc/keys") as f:
            found["keys"] = sorted(line.split()[0] for line in f)
    except OSError:
        found["keys"] = None
    return found


def problems(dirs: tuple[str, ...] = RESET_DIRS) -> list[str]:
    """What must be gone after a reset whatever the sandbox held at start: processes but PID 1, this one and its
    parent; entries in the folders; System V IPC objects."""
    found = []
    me = {1, os.getpid(), os.getppid()}
    others = sorted(int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) not in me)
    if others:
        found.append(f"processes survived the reset: {others[:8]}")
    for d in dirs:
        try:
            if os.listdir(d):
                found.append(f"{d} is not empty")
        except OSError as e:
            found.append(f"cannot list {d}: {e}")
    for kind in SYSVIPC:
        try:
            with open(f"/proc/sysvipc/{kind}") as f:
                if len(f.read().splitlines()) > 1:
                    found.append(f"System V {kind} objects are left")
        except OSError as e:
            found.append(f"cannot read /proc/sysvipc/{kind}: {e}")
    return found


def clear(dirs: tuple[str, ...] = RESET_DIRS, fresh: dict[str, Any] | None = None) -> list[str]:
    """Empty the folders and, given their `fresh` state, put back their modes and drop extended attributes added
    since; what could not be done."""
    found = []
    for d in dirs:
        try:
            for name in os.listdir(d):
                remove(os.path.join(d, name))
            was = fresh.get(d) if fresh else None
            if isinstance(was, list):
                if stat.S_IMODE(os.lstat(d).st_mode) != was[0]:
                    os.chmod(d, was[0])
                for attr in set(os.listxattr(d)) - set(was[3]):
                    os.removexattr(d, attr)
        except (OSError, RecursionError) as e:
            found.append(f"cannot empty {d}: {type(e).__name__}: {e}")
    return found


def changed(fresh: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """The keys whose value differs between two `state`s."""
    return sorted(k for k in set(fresh) | set(now) if fresh.get(k) != now.get(k))


def check(dirs: tuple[str, ...], fresh: dict[str, Any]) -> list[str]:
    """A whole reset after the processes were killed: clear, then every problem and every change since `fresh`."""
    found = clear(dirs, fresh) + problems(dirs)
    diff = changed(fresh, state(dirs))
    if diff:
        found.append(f"changed since the sandbox started: {', '.join(diff)}")
    return found


def main(args: list[str]) -> None:
    """`[--empty] DIR...`: (empty the folders, then) print {"problems": [...], **state} as one JSON line. The host
    keeps a fresh sandbox's answer (without --empty) and compares later answers' state with it."""
    empty = args[:1] == ["--empty"]
    dirs = tuple(args[1:] if empty else args) or RESET_DIRS
    found = clear(dirs) if empty else []
    found += problems(dirs)
    sys.stdout.write(json.dumps({"problems": found, **state(dirs)}) + "\n")
