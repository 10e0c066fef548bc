"""Find and remove stray sandbox containers: ours by label, whose owning process is gone.

Every container the Docker backend creates carries the labels `flywheel.sandbox=1` and
`flywheel.owner=<hostname>:<pid>:<process start time>` (sandbox/engine.py writes and parses both). `reap()`
removes those whose owner (on this host) no longer runs, or runs as a different process that reused the pid. Containers owned by live processes, or by another host
sharing the engine, are left alone. The backend calls it at start; normally there is nothing to reap, because PID 1
of each container exits when its owner's attach socket closes (see sandbox/docker.py).
This module does not create containers.
"""

from __future__ import annotations

import logging

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
