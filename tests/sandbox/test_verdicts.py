"""The verdict ladders of sandbox/verdicts.py, rung by rung (the hostile tests show each rung reached for real on
every backend; these pin the order, where two observations meet in one call)."""

from __future__ import annotations

import signal

from sandbox.verdicts import exec_fields, exec_verdict, python_verdict

LIMITS = {"memory_mb": 128, "pids_limit": 64}


def ex(**kw):
    args = {"exit_code": 0, "killed_by": None, "timed_out": False, "flooded": False, "flood_bytes": 1000,
            "oom": False, "pids": False, "stderr": b"", **LIMITS, **kw}
    return exec_verdict(**args)


def py(**kw):
    args = {"timed_out": False, "died": False, "killed_by": None, "memory_error": False, "error": None,
            "exit_code": 0, "oom": False, "pids": False, **LIMITS, **kw}
    return python_verdict(**args)


def test_exec_ladder_a_limit_outranks_the_clock():
    # the case that differed: a fork bomb that also ran out of time (was `timeout` on Docker, `resource_limit` here)
    pids_note = "[sandbox] the pids limit (64) was reached"
    assert ex(exit_code=None, timed_out=True, pids=True) == ("resource_limit", pids_note)
    assert ex(exit_code=None, timed_out=True, oom=True)[0] == "resource_limit"
    assert ex(exit_code=None, timed_out=True, flooded=True)[1] == "[sandbox] output flood (over 1000 bytes): killed"
    cpu_note = "[sandbox] killed by SIGXCPU (a resource limit)"
    assert ex(exit_code=-signal.SIGXCPU, killed_by=signal.SIGXCPU)[1] == cpu_note
    assert ex(exit_code=None, timed_out=True) == ("timeout", None)


def test_exec_ladder_memory_error_counts_only_for_a_failed_exit():
    tb = b"Traceback (most recent call last):\n  ...\nMemoryError\n"
    assert ex(exit_code=1, stderr=tb)[0] == "resource_limit"
    assert ex(exit_code=0, stderr=tb) == ("ok", None)  # printed a traceback it caught, and succeeded
    assert ex(exit_code=3) == ("error", None)
    assert ex(exit_code=-9, killed_by=9) == ("error", None)


def test_python_ladder():
    assert py(timed_out=True, died=True, pids=True)[0] == "resource_limit"
    assert py(died=True, killed_by=signal.SIGXFSZ)[0] == "resource_limit"
    assert py(memory_error=True, error="MemoryError", exit_code=1) == ("resource_limit", None)
    assert py(timed_out=True, exit_code=None) == ("timeout", None)
    assert py(died=True, killed_by=signal.SIGKILL, exit_code=None) == ("error", None)
    assert py(exit_code=2) == ("error", None)
    assert py(exit_code=None) == ("ok", None)


def test_exec_fields_appends_notes_after_the_program_stderr():
    raw = {"stdout": "", "stderr": "boom", "truncated": False, "exit_code": None, "timed_out": False, "error": None,
           "memory_error": False, "died": True, "exit_status": -9, "duration_ms": 1.0}
    r = exec_fields(raw, oom=True, **LIMITS)
    assert r["verdict"] == "resource_limit" and r["oom_killed"] and r["exit_code"] == -9
    assert r["stderr"].splitlines() == ["boom", "[sandbox] killed: out of memory (limit 128 MB)",
                                        "[the interpreter died; variables of this episode are lost, files are kept]"]
