"""What the local driver (sandbox/local.py) needs of the host around bubblewrap: the sandbox's environment and
generated /etc files, the read-only binds of /usr, the host python that enters a sandbox, and small helpers for
the processes it starts (reading a pipe without blocking, a failed fork in stderr, killing and reaping a helper).

This module starts no sandbox and decides no verdict.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
from pathlib import Path

from sandbox.result import SandboxUnavailable

SANDBOX_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "LANG": "C.UTF-8",
    "PYTHONDONTWRITEBYTECODE": "1",
    "HOME": "/tmp",
}
PASSWD = "root:x:0:0:root:/root:/usr/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
GROUP = "root:x:0:\nnogroup:x:65534:\n"

def host_python() -> str:
    """The python3 under /usr: bound read-only into the sandbox and used to enter it."""
    for cand in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if os.access(cand, os.X_OK):
            return cand
    raise SandboxUnavailable("no python3 under /usr/bin or /usr/local/bin (the local sandbox binds /usr); "
                             "fix: apt-get install python3-minimal")


def memfd(name: str, text: str) -> int:
    fd = os.memfd_create(name, 0)
    os.write(fd, text.encode())
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def root_binds() -> list[str]:
    """Read-only binds for /usr and friends; /lib, /bin... become links where the host has merged /usr."""
    args = ["--ro-bind", "/usr", "/usr"]
    for top in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        host = Path("/") / top
        if host.is_symlink():
            args += ["--symlink", os.readlink(host), f"/{top}"]
        elif host.is_dir():
            args += ["--ro-bind", str(host), f"/{top}"]
    for etc in ("/etc/ld.so.cache", "/etc/alternatives", "/etc/localtime"):
        if os.path.exists(etc):
            args += ["--ro-bind", etc, etc]
    return args


def fork_failed(stderr: bytes | bytearray | str) -> bool:
    """Whether stderr ends with a failed fork: Python's BlockingIOError (EAGAIN) or a shell's fork message."""
    text = bytes(stderr).decode("utf-8", "replace") if not isinstance(stderr, str) else stderr
    tail = "\n".join(text.rstrip().splitlines()[-3:])
    return ("BlockingIOError: [Errno 11]" in tail or "fork: Resource temporarily unavailable" in tail
            or "Cannot fork" in tail or "fork: retry" in tail or "can't start new thread" in tail)


def read_now(fd: int) -> str:
    """The last 500 characters of what a pipe holds now (a helper's stderr, for error messages); never blocks."""
    try:
        os.set_blocking(fd, False)
        return os.read(fd, 1 << 16).decode(errors="replace")[-500:]
    except OSError:
        return ""


def killpg(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def read_available(fd: int, wait_s: float = 1.0, limit: int = 65536) -> bytes:
    """What fd holds now (up to limit), waiting at most wait_s for the first byte; never blocks on a writer that
    lives on."""
    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
    out = b""
    timeout_ms = wait_s * 1000
    while len(out) < limit and poller.poll(timeout_ms):
        chunk = os.read(fd, limit - len(out))
        if not chunk:
            break
        out += chunk
        timeout_ms = 0
    return out

def entered(status_r: int) -> str | None:
    """None once the helper said it is inside; else the helper's error text."""
    try:
        data = b""
        while chunk := os.read(status_r, 4096):
            data += chunk
    finally:
        os.close(status_r)
    return None if data == b"ok" else (data.decode(errors="replace") or "the enter helper died")

def reap_helper(proc: subprocess.Popen) -> int | None:
    """Wait for an enter helper whose command was killed inside the sandbox; kill it only as a last resort.

    The helper must outlive its child: killed first, it would leave the child to be reparented to the host's
    init (the helper is outside the sandbox's pid namespace), where it may linger as a zombie and hold the
    namespace's teardown for seconds.
    """
    try:
        return proc.wait(timeout=2)
    except subprocess.TimeoutExpired:
        killpg(proc)
        return proc.wait()
