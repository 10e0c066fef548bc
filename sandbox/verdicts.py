"""The verdict ladders: what a sandboxed call's observations mean, the same on every backend.

A backend observes (its own way: cgroup counters on Docker, rlimits, stderr and task counts locally) whether a
call hit the memory limit, the pids limit, the output flood limit, the clock, or an rlimit signal; these two
functions turn those observations into one ExecVerdict, with the rung written once:

  exec:        output flood > out of memory > pids limit > killed by SIGXCPU/SIGXFSZ > a failed exit whose stderr
               ends with MemoryError > timeout > exit 0 ok > error
  run_python:  out of memory > pids limit > the cell raised MemoryError > the interpreter killed by SIGXCPU/SIGXFSZ >
               timeout > the interpreter died (error) > an uncaught exception or nonzero SystemExit (error) > ok

A limit outranks the clock: a fork bomb that also runs out of time is `resource_limit`, on every backend.
Each function also returns the `[sandbox]` note that says which limit was hit (None for the plain rungs).
`infra_result` is the one shape of an infra_error result.
This module observes nothing and runs nothing.
"""

from __future__ import annotations

import logging
import signal
import time
from typing import Any

from sandbox.capture import with_notes
from sandbox.result import ExecResult, ExecVerdict

log = logging.getLogger(__name__)

RLIMIT_SIGNALS = (signal.SIGXCPU, signal.SIGXFSZ)


def memory_error(stderr: bytes | bytearray | str) -> bool:
    """Whether a program's stderr ends with Python's MemoryError (how a failed allocation shows in a python
    process, e.g. under RLIMIT_AS)."""
    text = stderr.encode("utf-8", "replace") if isinstance(stderr, str) else bytes(stderr)
    lines = text.rstrip().splitlines()
    return bool(lines) and lines[-1].startswith(b"MemoryError")


def _limits(*, oom: bool, pids: bool, memory_mb: int, pids_limit: int) -> tuple[ExecVerdict, str] | None:
    if oom:
        return "resource_limit", f"[sandbox] killed: out of memory (limit {memory_mb} MB)"
    if pids:
        return "resource_limit", f"[sandbox] the pids limit ({pids_limit}) was reached"
    return None


def _rlimit_signal(signo: int | None) -> tuple[ExecVerdict, str] | None:
    if signo is not None and signo in RLIMIT_SIGNALS:
        return "resource_limit", f"[sandbox] killed by {signal.Signals(signo).name} (a resource limit)"
    return None


def exec_verdict(*, exit_code: int | None, killed_by: int | None, timed_out: bool, flooded: bool, flood_bytes: int,
                 oom: bool, pids: bool, stderr: bytes | bytearray | str, memory_mb: int,
                 pids_limit: int) -> tuple[ExecVerdict, str | None]:
    """The verdict of one `exec` call and the note that explains a limit (None otherwise).

    exit_code: the command's exit status (None when it was killed by us); killed_by: the signal that ended it when
    the backend can tell (None otherwise); stderr: what it wrote there (for a trailing MemoryError, which is how
    RLIMIT_AS shows in a python process)."""
    if flooded:
        return "resource_limit", f"[sandbox] output flood (over {flood_bytes} bytes): killed"
    hit = _limits(oom=oom, pids=pids, memory_mb=memory_mb, pids_limit=pids_limit) or _rlimit_signal(killed_by)
    if hit is not None:
        return hit
    if exit_code not in (0, None) and memory_error(stderr):
        return "resource_limit", f"[sandbox] the memory limit ({memory_mb} MB) was reached"
    if timed_out:
        return "timeout", None
    return ("ok" if exit_code == 0 else "error"), None


def python_verdict(*, timed_out: bool, died: bool, killed_by: int | None, memory_error: bool, error: str | None,
                   exit_code: int | None, oom: bool, pids: bool, memory_mb: int,
                   pids_limit: int) -> tuple[ExecVerdict, str | None]:
    """The verdict of one `run_python` call and the note that explains a limit (None otherwise).

    The fields are the interpreter's answer (sandbox/guest/kernel.py): timed_out, memory_error (the cell raised
    MemoryError), error (its traceback), exit_code (its SystemExit code); died: the interpreter died or hung and
    was killed, killed_by: the signal that ended it when the backend can tell."""
    hit = _limits(oom=oom, pids=pids, memory_mb=memory_mb, pids_limit=pids_limit)
    if hit is not None:
        return hit
    if memory_error:
        return "resource_limit", None  # the traceback in stderr says so
    hit = _rlimit_signal(killed_by) if died else None
    if hit is not None:
        return hit
    if timed_out:
        return "timeout", None
    if died or error is not None or exit_code not in (None, 0):
        return "error", None
    return "ok", None


def infra_result(backend: str, what: str, e: BaseException, t0: float) -> ExecResult:
    """The result of a call the sandbox itself failed (verdict infra_error, never the program's fault): `what` failed
    with `e`, the call having started at time.perf_counter() `t0`. Logged as a warning."""
    log.warning("%s sandbox: %s: %s", backend, what, e)
    return ExecResult(exit_code=None, verdict="infra_error", error=f"{what}: {type(e).__name__}: {str(e)[:500]}",
                      duration_ms=(time.perf_counter() - t0) * 1000)


def exec_fields(raw: dict[str, Any], *, oom: bool = False, pids: bool = False, memory_mb: int = 0,
                pids_limit: int = 0) -> dict[str, Any]:
    """The fields of a `run_python` ExecResult from the interpreter's answer (`InterpreterClient.call_raw`) and what
    the backend observed (oom, pids), with the verdict of `python_verdict`; its note and the interpreter's own
    ("the interpreter died...") are appended to stderr. The traceback stays in stderr (what the model sees);
    ExecResult.error is only for infrastructure text, so it is None here."""
    status = raw.get("exit_status")
    verdict, note = python_verdict(
        timed_out=raw["timed_out"], died=raw["died"], killed_by=-status if status is not None and status < 0 else None,
        memory_error=raw["memory_error"], error=raw["error"], exit_code=raw["exit_code"], oom=oom, pids=pids,
        memory_mb=memory_mb, pids_limit=pids_limit)
    notes = [note] if note else []
    if raw["timed_out"]:
        exit_code = None
        if raw["died"]:
            notes.append("[the interpreter did not stop at its timeout and was killed; variables are lost, files "
                         "are kept]")
    elif raw["died"]:
        exit_code = status
        notes.append("[the interpreter died; variables of this episode are lost, files are kept]")
    elif raw["error"] is not None or raw["memory_error"]:
        exit_code = 1
    else:
        exit_code = raw["exit_code"] or 0
    return {"exit_code": exit_code, "stdout": raw["stdout"], "stderr": with_notes(raw["stderr"], notes),
            "timed_out": raw["timed_out"], "oom_killed": oom, "truncated": bool(raw["truncated"]),
            "duration_ms": raw["duration_ms"], "verdict": verdict, "error": None}
