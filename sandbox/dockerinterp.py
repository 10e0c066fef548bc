"""The episode's interpreter in a Docker container: started with its own `docker exec`, or forked by the container's
keeper (reuse) after the reset check.

`start_interpreter` runs sandbox/guest/kernel.py with `docker exec -i`; `start_keeper` runs sandbox/guest/keeper.py,
which forks each interpreter; `keeper_call` sends the keeper its own requests (reset, spawn) on the same stream;
`spawn` has the keeper fork the next interpreter, which first runs the one reset check (sandbox/guest/reset.py), and
returns the state the check reports with the interpreter.
Used by the Docker driver (sandbox/docker.py); this module creates and removes no container.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass

from sandbox import procfs, programs
from sandbox.dockerexec import INTERP_OOM_ADJ, ExecStream, ExecTransport, start_exec
from sandbox.engine import SANDBOX_USER, WORKDIR
from sandbox.interpreter import InterpreterClient, InterpreterError, interpreter_argv
from sandbox.result import SandboxError

GRACE_S = 2.0  # how long past its timeout a call may take before our own backstop kills it
STARTUP_TIMEOUT_S = 30.0
RESET_WAIT_S = 2.0  # a reset whose processes are not all gone (or frozen) by then fails: the container is removed
KEEPER_OOM_ADJ = 200  # the OOM killer takes commands (500), then the interpreter (300), then the keeper
RESET_DIRS = ("/tmp", WORKDIR, "/dev/shm")


@dataclass
class Interp:
    """The episode's running interpreter: its exec, socket, pid inside the container, and the protocol client."""

    exec_id: str
    stream: ExecStream
    client: InterpreterClient
    pid: int = 0
    keeper: int = 0  # pid of its keeper inside the container (reuse), whose exec this stream is; 0: its own exec

    @property
    def transport(self) -> ExecTransport:
        assert isinstance(self.client.transport, ExecTransport)
        return self.client.transport


def warm(it: Interp) -> None:
    """Run an empty cell so the interpreter's lazy imports are paid before an episode starts."""
    raw = it.client.call_raw("pass", 10, 1000)
    if raw["died"] or raw["exit_code"] != 0:
        it.stream.close()
        raise SandboxError(f"the interpreter did not answer its warm-up call: {raw['stderr'][-200:]!r}")


def await_ready(exec_id: str, st: ExecStream, transport: ExecTransport, keeper: int = 0) -> Interp:
    """A protocol client for the interpreter starting behind `transport`, once its ready line came; closes the
    stream and raises SandboxError when none comes."""
    client = InterpreterClient(transport, grace_s=GRACE_S, startup_timeout_s=STARTUP_TIMEOUT_S)
    try:
        ready = client.wait_ready()
    except InterpreterError as e:
        st.close()
        raise SandboxError(str(e)) from e
    transport.err.clear()
    return Interp(exec_id, st, client, int(ready.get("pid") or 0), keeper)


def start_interpreter(api, cid: str, user: str = SANDBOX_USER, workdir: str = WORKDIR) -> Interp:
    """Start the interpreter (sandbox/guest/kernel.py) in the container with `docker exec -i` and wait for its ready line."""
    exec_id, st = start_exec(api, cid, interpreter_argv("python3"), stdin=True, adj=INTERP_OOM_ADJ, user=user,
                              workdir=workdir)
    return await_ready(exec_id, st, ExecTransport(st))


def keeper_call(transport: ExecTransport, op: str, timeout_s: float = RESET_WAIT_S,
                check: list[str] | None = None) -> dict:
    """Send a request to the keeper (a raw line on the transport) and return its answer (lines before it, left by
    the last episode, are dropped; what follows it, a spawned interpreter's check and ready lines, stays)."""
    nonce = uuid.uuid4().hex
    deadline = time.monotonic() + timeout_s
    req = {"keeper": op, "nonce": nonce, **({"check": check} if check is not None else {})}
    transport.send(json.dumps(req).encode() + b"\n", deadline)
    while True:
        line = transport.read_line(deadline, 1 << 26)
        if line is None:
            raise SandboxError(f"the keeper did not answer {op!r} (stderr {transport.stderr_tail()[-300:]!r})")
        if line.startswith(b"{") and nonce.encode() in line:
            msg = json.loads(line)
            if isinstance(msg, dict) and msg.get("keeper") == nonce:
                return msg


def spawn(exec_id: str, st: ExecStream, transport: ExecTransport, keeper: int, empty: bool,
          timeout_s: float = STARTUP_TIMEOUT_S) -> tuple[Interp, dict]:
    """Have the keeper behind `transport` fork the next interpreter, which first runs the reset check (emptying
    RESET_DIRS when `empty`); returns the interpreter, once ready, and the state the check printed (with its
    `problems`). Raises SandboxError when the check does not answer."""
    deadline = time.monotonic() + timeout_s
    keeper_call(transport, "spawn", timeout_s, check=[*(["--empty"] if empty else []), *RESET_DIRS])
    line = transport.read_line(deadline, 1 << 20)
    try:
        state = json.loads(line) if line is not None else None
    except ValueError:
        state = None
    if not isinstance(state, dict) or not isinstance(state.get("problems"), list):
        raise SandboxError(f"the reset check did not answer (line {line!r:.200}; stderr "
                           f"{transport.stderr_tail()[-300:]!r})")
    return await_ready(exec_id, st, transport, keeper), state


def start_keeper(api, cid: str, empty: bool) -> tuple[Interp, dict]:
    """Start the keeper (sandbox/guest/keeper.py) with `docker exec -i` and have it fork an interpreter (see
    `spawn`); returns the interpreter and the reset check's state."""
    argv = programs.command("python3", "keeper", WORKDIR, str(INTERP_OOM_ADJ))
    exec_id, st = start_exec(api, cid, argv, stdin=True, adj=KEEPER_OOM_ADJ)
    transport = ExecTransport(st)
    try:
        line = transport.read_line(time.monotonic() + STARTUP_TIMEOUT_S, 1 << 16)
        hello = json.loads(line) if line is not None else None
        if not isinstance(hello, dict) or hello.get("keeper") != "hello":
            raise SandboxError(f"the keeper did not start (first line {line!r:.200}; stderr "
                               f"{transport.stderr_tail()[-300:]!r})")
        return spawn(exec_id, st, transport, int(hello["pid"]), empty)
    except BaseException:
        st.close()
        raise


def host_pid(procs: list[int], ns_pid: int) -> int:
    """The host pid of the container process whose pid inside the container is ns_pid (0 when none is)."""
    return next((p for p in procs if procfs.ns_pid(p) == ns_pid), 0)
