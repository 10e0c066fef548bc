"""The warm starter of `flywheel generate` (flows/warm.py), through the console script with real processes: the first
generate runs in-process and leaves a starter; the next goes through it (its episodes run in the starter's forked
child, the client has no child process) and lands the same rows; bad input through it is exit 2 and one `error:`
line; a client whose child is killed says so in one `error:` line, exit 1; another environment is another fingerprint (in-process, then a second starter); `server status` lists the
starters and `server stop` leaves no process. The SIGKILL case is in test_kill.py.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
import uuid
from pathlib import Path

import duckdb
import pytest

from tests.conftest import FLYWHEEL
from tests.flows.test_kill import _env, _parent, descendants, processes_with, warm_starters

pytestmark = pytest.mark.slow


def wait_starters(home: Path, n: int, timeout_s: float = 180.0) -> dict[str, int]:
    deadline = time.monotonic() + timeout_s
    while len(got := warm_starters(home, ready=True)) < n:
        assert time.monotonic() < deadline, f"no {n} warm starter(s) came up: {_log(home)[-2000:]}"
        time.sleep(0.2)
    return got


def _log(home: Path) -> str:
    f = home / "flywheel-warm.log"
    return f.read_text() if f.exists() else ""


def generate(tmp: Path, env: dict, out: str, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([FLYWHEEL, "generate", "--backend", "local", "--samples", "1", "--run-id", "warm-run",
                           "--out", str(tmp / out), *extra], env=env, cwd=tmp, capture_output=True, text=True,
                          timeout=300)


def rows(lake: Path) -> list[tuple]:
    con = duckdb.connect()
    got = con.execute("SELECT trajectory_id, task_id, verdict, reward FROM read_parquet(?) ORDER BY 1",
                      [str(lake / "trajectories" / "**" / "*.parquet")]).fetchall()
    con.close()
    return got


def test_second_generate_runs_in_the_starter_with_the_same_rows(tmp_path):
    home, marker = tmp_path / "prefect-home", uuid.uuid4().hex
    env = {**_env(home, marker), "FLYWHEEL_LOCAL_SERVER": "shared"}
    env.pop("FLYWHEEL_WARM", None)
    try:
        first = generate(tmp_path, env, "lake-in-process", "--n-tasks", "6")
        assert first.returncode == 0, first.stderr[-3000:]
        fp, starter = next(iter(wait_starters(home, 1).items()))
        assert "forked" not in _log(home)  # the first command ran in-process

        # the same command through the starter: its episodes are the starter's grandchildren, not the client's
        with open(tmp_path / "warm.out", "w") as o, open(tmp_path / "warm.err", "w") as e:
            p = subprocess.Popen([FLYWHEEL, "generate", "--backend", "local", "--samples", "1", "--run-id",
                                  "warm-run", "--out", str(tmp_path / "lake-warm"), "--n-tasks", "6"], env=env,
                                 cwd=tmp_path, stdout=o, stderr=e)
        seen_sandbox, client_kids = False, set()
        while p.poll() is None:
            under = descendants(starter)
            client_kids |= set(descendants(p.pid))
            seen_sandbox |= len(under) >= 2  # the forked child and a sandbox process of it
            time.sleep(0.02)
        out, err = (tmp_path / "warm.out").read_text(), (tmp_path / "warm.err").read_text()
        assert p.returncode == 0, err[-3000:]
        assert seen_sandbox and not client_kids, (seen_sandbox, client_kids)
        assert _log(home).count("flywheel-warm: forked ") == 1
        assert "rows written 6" in out and "Finished in state Completed" in err  # output reached the client's fds
        assert rows(tmp_path / "lake-warm") == rows(tmp_path / "lake-in-process") and len(rows(tmp_path / "lake-warm")) == 6

        # bad input through the starter: exit 2, one error line, nothing written
        bad = generate(tmp_path, env, "lake-bad", "--suite", "no-such-suite")
        assert bad.returncode == 2, bad.stderr
        assert [ln for ln in bad.stderr.splitlines() if ln.startswith("error:")] == [bad.stderr.strip()]
        assert _log(home).count("flywheel-warm: forked ") == 2 and not (tmp_path / "lake-bad").exists()

        # the forked child killed under a waiting client: one error line naming it, exit 1
        with open(tmp_path / "gone.err", "w") as e:
            p = subprocess.Popen([FLYWHEEL, "generate", "--backend", "local", "--samples", "1", "--n-tasks", "400",
                                  "--out", str(tmp_path / "lake-gone")], env=env, cwd=tmp_path,
                                 stdout=subprocess.DEVNULL, stderr=e)
        deadline = time.monotonic() + 120
        while len(under := descendants(starter)) < 2:  # the forked child and a sandbox of it: mid-rollout
            assert p.poll() is None and time.monotonic() < deadline, "no forked child"
            time.sleep(0.05)
        forked = [k for k in under if _parent(k) == starter]
        os.kill(forked[0], signal.SIGKILL)
        assert p.wait(timeout=60) == 1
        errors = [ln for ln in (tmp_path / "gone.err").read_text().splitlines() if ln.startswith("error:")]
        assert errors == [(f"error: the warm flywheel process (pid {forked[0]}) is gone without an exit status "
                           "(killed?); its output is above; run with FLYWHEEL_WARM=0 to run in this process")], errors

        # FLYWHEEL_WARM=0: in-process, no new starter
        off = generate(tmp_path, {**env, "FLYWHEEL_WARM": "0"}, "lake-off", "--n-tasks", "1")
        assert off.returncode == 0, off.stderr[-3000:]
        assert _log(home).count("flywheel-warm: forked ") == 3
        # another environment: another fingerprint, so in-process, and a second starter for it afterwards
        other = generate(tmp_path, {**env, "FW_OTHER_SETTING": "1"}, "lake-other", "--n-tasks", "1")
        assert other.returncode == 0, other.stderr[-3000:]
        assert _log(home).count("flywheel-warm: forked ") == 3
        both = wait_starters(home, 2)
        assert fp in both and both[fp] == starter
        status = subprocess.run([FLYWHEEL, "server", "status"], env=env, capture_output=True, text=True, timeout=60)
        assert status.returncode == 0 and status.stdout.count("warm starter: pid ") == 2, status.stdout
    finally:
        stop = subprocess.run([FLYWHEEL, "server", "stop"], env=env, capture_output=True, text=True, timeout=60)
    assert stop.returncode == 0, stop.stderr
    assert processes_with(marker) == [], processes_with(marker)  # server and starters gone
    assert not warm_starters(home) and not list((home / "flywheel-warm").glob("*.sock"))


def test_fingerprint_follows_code_and_environment(tmp_path, monkeypatch):
    """A touched .py of flywheel's packages, or another environment value, changes the fingerprint; the keys that
    differ from shell to shell do not."""
    from flows import warm

    env = {"A": "1", "PWD": "/x", "SHLVL": "2"}
    fp = warm.fingerprint(env, ["/p"])
    assert warm.fingerprint({**env, "PWD": "/y", "SHLVL": "3", "_": "/bin/x"}, ["/p"]) == fp
    assert warm.fingerprint({**env, "A": "2"}, ["/p"]) != fp
    assert warm.fingerprint(env, ["/q"]) != fp
    # a copy of the packages' tree (never the checkout's own files): a touched .py there is another fingerprint
    root = tmp_path / "tree"
    for pkg in warm.PACKAGES:
        shutil.copytree(warm.ROOT / pkg, root / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(warm, "ROOT", root)
    fp = warm.fingerprint(env, ["/p"])
    src = root / "flows" / "warm.py"
    st = src.stat()
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert warm.fingerprint(env, ["/p"]) != fp
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert warm.fingerprint(env, ["/p"]) == fp
