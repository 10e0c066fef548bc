"""Docker's exec channel as the sandbox sees it: a command started with `docker exec` in a container (OOM-preferred),
its raw socket demultiplexed with deadlines (`ExecStream`), and the same socket as an interpreter transport
(`ExecTransport`).

Used by the Docker driver (sandbox/docker.py) for every call and by sandbox/dockerinterp.py for the interpreter and
the keeper. Engine errors that mean "the infrastructure failed" are told apart by `is_infra`.
This module creates no container and decides no verdict.
"""

from __future__ import annotations

import io
import select
import socket
import struct
import time
from typing import Any

from sandbox.capture import text
from sandbox.engine import SANDBOX_USER, WORKDIR
from sandbox.result import SandboxError


def _wait(sock: socket.socket, event: int, timeout_s: float) -> bool:
    """poll() one socket (select() breaks on descriptors past 1024, which a busy process reaches)."""
    p = select.poll()
    p.register(sock, event | select.POLLHUP | select.POLLERR)
    return bool(p.poll(max(0, int(timeout_s * 1000) + 1)))


def _read_ahead(sock_io: Any, sock: Any) -> bytes:
    """The bytes of the exec's stream that http.client already read into the response's buffer with the headers.

    docker-py hands over the raw socket under the response's BufferedReader; when the command writes quickly (a
    short exec, a busy host that parses the headers late) its first frames sit in that buffer, and reading only the
    socket loses them: `echo 636` came back empty, and an interpreter's ready line never came."""
    try:
        fp = sock_io._response.raw._fp.fp
    except AttributeError:
        return b""
    if not isinstance(fp, io.BufferedReader) or not isinstance(sock, socket.socket):
        return b""
    blocking = sock.getblocking()
    try:
        sock.setblocking(False)
        data = fp.read1(1 << 20)  # buffered bytes only, or one non-blocking read
    except (OSError, ValueError):
        data = b""
    finally:
        try:
            sock.setblocking(blocking)
        except OSError:
            pass
    return bytes(data or b"")


class ExecStream:
    """Demultiplexes Docker's framed stdout/stderr stream from a hijacked socket, with deadlines."""

    def __init__(self, sock_io: Any):
        self.io = sock_io  # keep the SocketIO (and its response) alive
        self.sock: socket.socket = getattr(sock_io, "_sock", sock_io)
        self.buf = _read_ahead(sock_io, self.sock)
        self.eof = False

    def fileno(self) -> int:
        return self.sock.fileno()

    def send(self, data: bytes, deadline: float) -> None:
        view = memoryview(data)
        while view:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("stdin not consumed before the deadline")
            if _wait(self.sock, select.POLLOUT, left):
                n = self.sock.send(view[:65536])
                view = view[n:]

    def close_stdin(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def read_frames(self, deadline: float) -> list[tuple[int, bytes]] | None:
        """Frames available now (waiting until the deadline for at least one byte); [] at EOF; None on timeout."""
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        if not _wait(self.sock, select.POLLIN, left):
            return None
        try:
            data = self.sock.recv(1 << 20)
        except (BlockingIOError, InterruptedError):
            data = None
        except OSError:
            data = b""
        if data == b"":
            self.eof = True
        elif data:
            self.buf += data
        frames = []
        while len(self.buf) >= 8:
            kind, size = struct.unpack(">BxxxL", self.buf[:8])
            if len(self.buf) < 8 + size:
                break
            frames.append((kind, self.buf[8 : 8 + size]))
            self.buf = self.buf[8 + size :]
        return frames

    def close(self) -> None:
        for obj in (self.sock, self.io):
            try:
                obj.close()
            except Exception:  # noqa: BLE001, S110 - closing a dead socket is best effort
                pass


def is_infra(e: BaseException) -> bool:
    import docker.errors
    import requests

    return isinstance(e, (SandboxError, docker.errors.DockerException, requests.RequestException, ConnectionError,
                          OSError))


# ---------------------------------------------------------------------------------------------------------------
# containers


class ExecTransport:
    """The interpreter's `docker exec -i` socket as an InterpreterClient transport: stdin out, Docker's framed
    stdout/stderr in (stdout is the protocol; the process's own stderr is kept, up to 64 KiB, for error text).
    With reuse the exec is the keeper's, which relays to the interpreter it forked: `read_line` reads the keeper's
    own lines outside the client, and what arrived after such a line is handed to the next `recv`."""

    def __init__(self, stream: ExecStream):
        self.stream = stream
        self.err = bytearray()
        self.pending = bytearray()  # stdout read past a keeper line: the next recv returns it first

    def send(self, data: bytes, deadline: float) -> None:
        self.stream.send(data, deadline)

    def recv(self, deadline: float) -> bytes | None:
        if self.pending:
            data = bytes(self.pending)
            self.pending.clear()
            return data
        return self._read(deadline)

    def _read(self, deadline: float) -> bytes | None:
        """Stdout from the socket (stderr frames kept aside), as `recv` without what is pending."""
        while True:
            if self.stream.eof:
                return b""
            frames = self.stream.read_frames(max(deadline, time.monotonic() + 0.001))
            if frames is None:
                return None
            out = b""
            for kind, data in frames:
                if kind == 2:
                    self.err += data[: max(0, 65536 - len(self.err))]
                else:
                    out += data
            if out:
                return out
            if self.stream.eof:
                return b""
            if time.monotonic() >= deadline:
                return None

    def read_line(self, deadline: float, limit: int) -> bytes | None:
        """One raw stdout line (the keeper's hello and answers); None at EOF or past the deadline. Raises
        ValueError on a line over `limit` bytes."""
        while True:
            nl = self.pending.find(b"\n")
            if nl >= 0:
                line = bytes(self.pending[:nl])
                del self.pending[: nl + 1]
                return line
            if len(self.pending) > limit:
                raise ValueError(f"the keeper wrote a line over {limit} bytes")
            data = self._read(deadline)
            if not data:
                return None
            self.pending += data

    def stderr_tail(self) -> str:
        return text(self.err)[-2000:]

    def close(self) -> None:
        self.stream.close()


# Every exec'd process first makes itself a preferred victim of the OOM killer (raising oom_score_adj needs no
# privilege, lowering it below 0 does), so a memory bomb never takes PID 1 and the container down with it; commands
# (500) go before the episode's interpreter (300), whose variables are worth more.
EXEC_OOM_ADJ, INTERP_OOM_ADJ = 500, 300


def _oom_prefix(adj: int) -> list[str]:
    return ["sh", "-c", f'echo {adj} > /proc/self/oom_score_adj; exec "$@"', "sh"]


def start_exec(api, cid: str, argv: list[str], *, stdin: bool, adj: int = EXEC_OOM_ADJ, user: str = SANDBOX_USER,
                workdir: str = WORKDIR) -> tuple[str, ExecStream]:
    ex = api.exec_create(cid, _oom_prefix(adj) + argv, stdin=stdin, stdout=True, stderr=True, user=user,
                         workdir=workdir)
    sock = api.exec_start(ex["Id"], socket=True)
    return ex["Id"], ExecStream(sock)
