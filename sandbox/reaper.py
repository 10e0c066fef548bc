"""Find and remove stray sandbox containers: ours by label, whose owning process is gone.

Every container the Docker backend creates carries the labels `flywheel.sandbox=1` and
`flywheel.owner=<hostname>:<pid>:<process start time>`. `reap()` removes those whose owner (on this host) no longer
runs, or runs as a different process that reused the pid. Containers owned by live processes, or by another host
sharing the engine, are left alone. The backend calls it at start; normally there is nothing to reap, because PID 1
of each container exits when its owner's attach socket closes (see sandbox/docker.py).
This module does not create containers.
"""

from __future__ import annotations

import logging
import os
import socket
from pathlib import Path

log = logging.getLogger(__name__)

LABEL = "flywheel.sandbox"
OWNER_LABEL = "flywheel.owner"


def _start_time(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
        return stat.rsplit(b")", 1)[1].split()[19].decode()
    except (OSError, IndexError):
        return None


def owner_alive(owner: str, hostname: str | None = None) -> bool:
    """True when `owner` (host:pid:start) names a live process, or a process on another host (unknowable)."""
    host, _, rest = owner.partition(":")
    pid_s, _, start = rest.partition(":")
    if host != (hostname or socket.gethostname()):
        return True
    try:
        pid = int(pid_s)
    except ValueError:
        return False  # malformed owner of our label: nobody can claim it
    now = _start_time(pid)
    if now is None:
        return False
    return start in ("", "?") or now == start


def reap(client=None) -> int:
    """Remove containers labelled flywheel.sandbox=1 whose owner process is gone; return how many were removed."""
    if client is None:
        from sandbox.docker import docker_client

        client = docker_client()
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


def own_pid_tag() -> str:
    """The owner label value of this process (same format as the Docker backend writes)."""
    return f"{socket.gethostname()}:{os.getpid()}:{_start_time(os.getpid()) or '?'}"
