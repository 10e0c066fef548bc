"""Crash safety: kill -9 a writer at random moments 100+ times, then re-run it to the end.

After every kill a query must see no torn file (nothing quarantined, every visible file whole) and every row the
writer acknowledged; after the final run every row is there exactly once, also at the file level.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from warehouse.query import query, scan

WRITER = str(Path(__file__).with_name("crash_writer.py"))


class Zygote:
    """Drives crash_writer.py: forks writer children, kills them, collects their acknowledgements."""

    def __init__(self, root: str, n: int, batch: int):
        self.proc = subprocess.Popen([sys.executable, WRITER, root, str(n), str(batch)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, bufsize=0)
        self.acked: set[str] = set()
        self.done = False
        assert self._read() == "READY"

    def _read(self) -> str:
        line = self.proc.stdout.readline().decode().strip()
        assert line, f"writer zygote died (rc={self.proc.poll()})"
        if line.startswith("ACK "):
            self.acked.update(line[4:].split(","))
        elif line == "DONE":
            self.done = True
        return line

    def _send(self, cmd: str) -> None:
        self.proc.stdin.write((cmd + "\n").encode())

    def start(self) -> int:
        self._send("go")
        while not (line := self._read()).startswith("PID "):
            pass
        return int(line.split()[1])

    def reap(self) -> int:
        self._send("reap")
        while not (line := self._read()).startswith("REAPED "):
            pass
        return int(line.split()[2])

    def close(self) -> None:
        self._send("quit")
        self.proc.stdin.close()
        self.proc.wait(timeout=10)


def visible_ids(root: str) -> list[str]:
    return query(root, "SELECT trajectory_id FROM trajectories_raw").column(0).to_pylist()


@pytest.mark.parametrize(("kills_wanted", "n"), [pytest.param(12, 1000, id="quick"),
                                                 pytest.param(120, 1500, id="120-kills", marks=pytest.mark.slow)])
def test_kill_dash_9_writer_many_times_then_rerun(tmp_path, kills_wanted, n):
    root = str(tmp_path / "lake")
    batch = 5
    rng = random.Random(1234)
    z = Zygote(root, n, batch)
    kills = 0
    t0 = time.time()
    try:
        while kills < kills_wanted and not z.done:
            pid = z.start()
            time.sleep(rng.uniform(0.0, 0.08))
            os.kill(pid, signal.SIGKILL)
            status = z.reap()
            if os.WIFSIGNALED(status):
                kills += 1
            ids = visible_ids(root)
            assert not (tmp_path / "lake" / "quarantine").exists(), "a reader saw a torn file"
            assert z.acked <= set(ids), "an acknowledged row is missing after kill -9"
            assert len(ids) == len(set(ids)), "duplicate rows on disk"
        assert kills == kills_wanted, f"only {kills} kills landed before the workload finished; raise n"
        kill_phase = time.time() - t0
        acked_in_kill_phase = len(z.acked)
        z.start()
        while not z.done:
            z._read()
        assert z.reap() == 0
    finally:
        z.close()

    ids = visible_ids(root)
    assert len(ids) == n and len(set(ids)) == n
    assert z.acked == set(ids)
    assert query(root, "SELECT count(*) FROM trajectories").column(0)[0].as_py() == n
    # One writer at a time, however often killed: every file saw all files before it, so no partition needs
    # read-side de-duplication.
    assert scan(root).suspect == []
    files = list((tmp_path / "lake" / "trajectories").rglob("*.parquet"))
    for f in files:  # every visible file is whole
        pq.read_table(f)
    temps = [p for p in (tmp_path / "lake").rglob(".*.tmp")]
    print(f"\n{acked_in_kill_phase} rows acked during the kill phase; {kills} kills in {kill_phase:.1f}s, {len(files)} files, {len(temps)} temp files left by killed writers")
