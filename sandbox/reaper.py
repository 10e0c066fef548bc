"""Find and remove stray sandboxes whose owning process is gone: Docker containers by label (`reap`), local
bubblewrap sandboxes by the marker in their command line (`reap_local`).

Every container the Docker backend creates carries the labels `flywheel.sandbox=1` and
`flywheel.owner=<hostname>:<pid>:<process start time>` (sandbox/engine.py writes and parses both). `reap()`
removes those whose owner (on this host) no longer runs, or runs as a different process that reused the pid. Containers owned by live processes, or by another host
sharing the engine, are left alone. The backend calls it at start; normally there is nothing to reap, because PID 1
of each container exits when its owner's attach socket closes (see sandbox/docker.py).
A local sandbox's bwrap and PID 1 carry MARKER and OWNER_ARG (sandbox/local.py puts them on the holder's command
line); `reap_local` kills those whose owner is gone.
This module creates no sandbox.
"""

from __future__ import annotations

import logging
import os
import signal

from sandbox import procfs
from sandbox.engine import LABEL, OWNER_LABEL, docker_client, owner_alive

log = logging.getLogger(__name__)


def reap(client=None) -> int:
    """Remove containers labelled flywheel.sandbox=1 whose owner process is gone; return how many were removed."""
    client = client or docker_client()
    removed = 0
    for c in client.api.containers(all=True, filters={"label": f"{LABEL}=1"}):
        owner = (c.get("Labels") or {}).get(OWNER_LABEL, "")
        if owner_alive(owner):
            continue
        try:
            client.api.remove_container(c["Id"], force=True)
            removed += 1
            log.info("reaped stray sandbox container %s (owner %s is gone)", c["Id"][:12], owner)
        except Exception as e:  # noqa: BLE001 - one container that will not go must not stop the others
            if "No such container" not in str(e) and "already in progress" not in str(e):
                log.warning("could not remove stray container %s: %s", c["Id"][:12], e)
    return removed


MARKER = "flywheel-local-sandbox"  # in the holder's command line: how tests and humans find our processes
OWNER_ARG = "owner="  # after MARKER: owner=PID-STARTTIME of the process that started the sandbox (reap_local)


def owner_arg() -> str:
    """The OWNER_ARG a sandbox started by this process carries."""
    return f"{OWNER_ARG}{os.getpid()}-{procfs.start_time(os.getpid())}"


def reap_local(marker: str = MARKER) -> int:
    """SIGKILL every process of a local sandbox (its bwrap and its PID 1, found by `marker` in their command line)
    whose owner (the process that started it, OWNER_ARG) is gone. A sandbox normally ends with its owner (PID 1
    lives until its stdin closes), but one whose start a SIGKILL of the owner interrupted can stay (seen once in the
    kill test of `flywheel run`: a bwrap left 30 s after its command died). Called by the shared server's watchdog
    and by each command when its server answers, with MARKER; a test passes a marker of its own, so that the
    reapers of the commands running beside it (every command on the machine reaps) leave its processes alone.

    A bwrap that leads its process group (the driver starts it in a session of its own) is killed with its whole
    group: killed alone between its clone and the go-ahead it writes to its child, it would leave that child (a
    copy of bwrap, the same command line) waiting for the go-ahead forever. And the scan is repeated until a pass
    finds no process it had not killed yet, so a child cloned after the first listing of /proc is not missed.
    Returns how many processes it killed (each counted once; its group's other members not counted)."""
    killed: set[int] = set()
    for _ in range(5):  # a pass finds only what was cloned during the one before: it settles at once
        new = []
        for pid in procfs.pids():
            if pid in killed:
                continue
            argv = procfs.cmdline(pid)
            if marker.encode() not in argv:
                continue
            owner = next((a[len(OWNER_ARG):].decode() for a in argv if a.startswith(OWNER_ARG.encode())), None)
            owner_pid, _, start = (owner or "").partition("-")
            if not owner_pid.isdigit() or procfs.start_time(int(owner_pid)) == start:
                continue
            try:
                if os.getpgid(pid) == pid:
                    os.killpg(pid, signal.SIGKILL)
                else:
                    os.kill(pid, signal.SIGKILL)
                new.append(pid)
            except OSError:
                pass
        if not new:
            break
        killed.update(new)
    if killed:
        log.warning("local sandbox: killed %d process(es) of sandboxes whose command is gone", len(killed))
    return len(killed)
