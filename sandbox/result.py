"""What one command in a sandbox produced, and the sandbox settings every backend honours.

`ExecResult` is the contract of `flywheel sandbox exec` and of every tool call: the same fields on every backend.
`SandboxConfig` holds the limits. `Sandbox` is the protocol a backend's per-episode session implements.
This module runs nothing.
"""

from __future__ import annotations

from typing import Literal, Protocol, Self

from pydantic import BaseModel, ConfigDict, Field

ExecVerdict = Literal["ok", "error", "timeout", "resource_limit", "infra_error"]


class ExecResult(BaseModel):
    model_config = ConfigDict(extra="forbid")
    exit_code: int | None = Field(description="Process exit code; None when it never ran or was killed by us.")
    stdout: str = ""
    stderr: str = ""
    timed_out: bool = False
    oom_killed: bool = False
    truncated: bool = Field(default=False, description="stdout or stderr hit the output cap and was cut.")
    duration_ms: float = 0.0
    verdict: ExecVerdict
    error: str | None = Field(default=None, description="Infrastructure error text when verdict is infra_error.")


class SandboxConfig(BaseModel):
    """Limits and placement of sandboxes. Every field applies to every call of every episode."""

    model_config = ConfigDict(extra="forbid")
    backend: Literal["auto", "docker", "local"] = Field(
        default="auto", description="Where code runs: docker, local (bubblewrap), or auto (Docker when an engine "
                                    "answers, else local, said in the log).")
    image: str = Field(default="flywheel-sandbox:bookworm", description="Docker image (built by build-image).")
    memory_mb: int = Field(default=512, gt=0, description="Memory limit including swap, per sandbox.")
    pids_limit: int = Field(default=128, gt=0, description="Max processes/threads in a sandbox.")
    cpus: float = Field(default=1.0, gt=0, description="CPU quota in cores.")
    timeout_s: float = Field(default=10.0, gt=0, description="Wall-clock limit of one call.")
    output_limit_bytes: int = Field(default=1_000_000, gt=0, description="Cap on stdout and on stderr, each.")
    tmpfs_mb: int = Field(default=64, gt=0, description="Size of the writable /tmp (and workspace).")
    reuse: bool | None = Field(
        default=None, description="After an episode, reset its sandbox (kill its processes, empty /tmp, /workspace "
                                  "and /dev/shm) and hand it to the next episode once checks show nothing is left, "
                                  "instead of starting a fresh one; a failed check destroys it. Unset: on for docker "
                                  "(measured with benchmarks/sandbox.py, 4 threads: CPU per clean episode ~25 ms reused vs "
                                  "~260 ms fresh, 9x the episodes/s on a loaded 2-core machine), off for local "
                                  "(where it saves ~60 ms of CPU per episode).")


class Sandbox(Protocol):
    """One episode's sandbox. Obtained from a backend, closed when the episode ends."""

    backend: str
    image: str | None

    def exec(self, argv: list[str], *, timeout_s: float | None = None, stdin: bytes | None = None) -> ExecResult: ...

    def run_python(self, code: str, *, timeout_s: float | None = None) -> ExecResult: ...

    def write_files(self, files: dict[str, str]) -> None: ...

    def close(self) -> None: ...


class Backend(Protocol):
    """A place sandboxes come from (a Docker engine with a warm pool, or bubblewrap on this host)."""

    name: str

    def acquire(self) -> Sandbox:
        """A clean sandbox for one episode: no files, processes or state of an earlier one. Caller closes it."""
        ...

    def shutdown(self) -> None:
        """Release every sandbox and pooled resource of this backend."""
        ...

    def __enter__(self) -> Self:
        """The backend itself: every caller holds one as `with open_backend(config) as backend:`."""
        ...

    def __exit__(self, *exc: object) -> None:
        """shutdown()."""
        ...


class SandboxError(Exception):
    """Base of sandbox infrastructure errors (never the program's fault)."""


class SandboxUnavailable(SandboxError):
    """The backend cannot be used at all (no engine, image missing, bwrap missing); the message names the fix."""
