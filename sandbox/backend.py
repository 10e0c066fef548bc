"""Choose and open a sandbox backend from a SandboxConfig; run one command in a fresh sandbox.

`with open_backend(config) as backend:` opens the Docker backend (warm pool, sandbox/docker.py) or the local
bubblewrap backend (sandbox/local.py). When Docker is asked for and no engine answers, it raises SandboxUnavailable
naming the fix, unless the caller asked for `auto_fallback`: then it says so in a warning log line and opens the
local backend.
`check_backend(config)` is the cheap preflight (engine up, image present) that flows run before writing anything.
`exec_once` is `flywheel sandbox exec`: a fresh sandbox, one command, one ExecResult.
This module runs no sandbox logic of its own.
"""

from __future__ import annotations

import logging

from sandbox.result import Backend, ExecResult, SandboxConfig, SandboxError, SandboxUnavailable

log = logging.getLogger(__name__)


def _local(config: SandboxConfig, pool_size: int = 2) -> Backend:
    try:
        from sandbox.local import LocalBackend
    except ImportError as e:
        raise SandboxUnavailable(f"the local backend is not available ({e}); use --backend docker") from e
    return LocalBackend(config.model_copy(update={"backend": "local"}), pool_size=pool_size,
                        prestart_interpreter=pool_size > 0)


def _docker_answers() -> bool:
    from sandbox.engine import docker_client

    try:
        docker_client(timeout=5).close()  # pings the engine
    except SandboxError:
        return False
    return True


def resolve(config: SandboxConfig) -> SandboxConfig:
    """`auto` -> docker when an engine answers, else local (a warning says so). Other values pass through."""
    if config.backend != "auto":
        return config
    if _docker_answers():
        return config.model_copy(update={"backend": "docker"})
    log.warning("no Docker engine answers; using the local bubblewrap backend (--backend docker to insist)")
    return config.model_copy(update={"backend": "local"})


def open_backend(config: SandboxConfig, *, auto_fallback: bool = False, pool_size: int = 2) -> Backend:
    """The backend config.backend names, to be used as `with open_backend(config) as backend:` (leaving the block
    shuts it down). Raises SandboxUnavailable (message names the fix) when it cannot run.

    With auto_fallback, a Docker backend that cannot start (no engine, no image) is replaced by the local one and a
    warning says so; never silently.
    """
    config = resolve(config)
    if config.backend == "local":
        return _local(config, pool_size)
    from sandbox.docker import DockerBackend

    try:
        return DockerBackend(config, pool_size=pool_size)
    except SandboxUnavailable as e:
        if not auto_fallback:
            raise
        log.warning("Docker backend unavailable (%s); falling back to the local bubblewrap backend", e)
        return _local(config, pool_size)


def check_backend(config: SandboxConfig) -> None:
    """Preflight: raise SandboxUnavailable naming the fix when config.backend cannot run here. Starts nothing."""
    config = resolve(config)
    if config.backend == "local":
        _local(config, pool_size=0).shutdown()
        return
    from sandbox.engine import docker_client, image_id

    client = docker_client(timeout=10)
    try:
        if image_id(config.image, client) is None:
            raise SandboxUnavailable(
                f"sandbox image {config.image!r} is not in the Docker engine; fix: flywheel sandbox build-image")
    finally:
        client.close()


def exec_once(config: SandboxConfig, argv: list[str], *, stdin: bytes | None = None,
              auto_fallback: bool = False) -> ExecResult:
    """Run argv in a fresh sandbox of config.backend and return its ExecResult (the `flywheel sandbox exec` contract).

    Raises SandboxUnavailable when the backend cannot run at all; a sandbox that cannot be created after retries
    gives verdict infra_error.
    """
    if not argv:
        raise ValueError("exec_once needs a command: flywheel sandbox exec -- CMD [ARG...]")
    with open_backend(config, auto_fallback=auto_fallback, pool_size=0) as backend:
        try:
            sandbox = backend.acquire()
        except SandboxUnavailable:
            raise
        except SandboxError as e:
            return ExecResult(exit_code=None, verdict="infra_error", error=f"{type(e).__name__}: {e}")
        try:
            return sandbox.exec(list(argv), timeout_s=config.timeout_s, stdin=stdin)
        finally:
            sandbox.close()
