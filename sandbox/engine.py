"""The Docker engine as the sandbox backends see it: the client, our labels, the owner tag, image lookup.

Written once and used by the Docker backend (which labels every container it creates), the reaper (which reads
those labels back to find strays) and the image builder. The owner tag is `<hostname>:<pid>:<process start time>`
(the start time guards against pid reuse); `owner_alive` parses exactly what `owner_tag` writes. This module
creates no container and builds no image.
"""

from __future__ import annotations

import os
import socket

from sandbox import procfs
from sandbox.result import SandboxUnavailable

LABEL = "flywheel.sandbox"
OWNER_LABEL = "flywheel.owner"
BACKEND_LABEL = "flywheel.backend"  # one value per DockerBackend instance: its final sweep removes only its own
SANDBOX_USER = "65534:65534"
WORKDIR = "/workspace"


def docker_client(timeout: int = 60):
    """A docker-py client for the engine in the environment (DOCKER_HOST or the CLI context); raises
    SandboxUnavailable naming the fix when no engine answers."""
    try:
        import docker
    except ImportError as e:  # pragma: no cover
        raise SandboxUnavailable("the `docker` Python package is missing; fix: pip install docker") from e
    try:
        # many episodes share one client from threads: a pool large enough that connections are reused
        client = docker.from_env(timeout=timeout, max_pool_size=64)
        client.ping()
    except Exception as e:
        where = os.environ.get("DOCKER_HOST") or "the default socket"
        raise SandboxUnavailable(
            f"no Docker engine answers at {where} ({type(e).__name__}: {str(e)[:200]}); fix: start dockerd "
            "(`dockerd &` or `systemctl start docker`), or use --backend local"
        ) from e
    return client


def image_id(tag: str, client=None) -> str | None:
    """The id of the local image tagged `tag`, or None when there is none. Raises SandboxUnavailable without an engine."""
    import docker.errors

    client = client or docker_client(timeout=300)
    try:
        return client.images.get(tag).id
    except docker.errors.ImageNotFound:
        return None


def owner_tag(pid: int | None = None) -> str:
    """The owner label value of process `pid` (this one by default): hostname:pid:start-time."""
    pid = os.getpid() if pid is None else pid
    return f"{socket.gethostname()}:{pid}:{procfs.start_time(pid) or '?'}"


def owner_alive(owner: str, hostname: str | None = None) -> bool:
    """True when `owner` (as owner_tag writes it) names a live process, or a process on another host (unknowable)."""
    host, _, rest = owner.partition(":")
    pid_s, _, start = rest.partition(":")
    if host != (hostname or socket.gethostname()):
        return True
    try:
        pid = int(pid_s)
    except ValueError:
        return False  # malformed owner of our label: nobody can claim it
    now = procfs.start_time(pid)  # a zombie owner has exited: its containers are strays
    if now is None:
        return False
    return start in ("", "?") or now == start
