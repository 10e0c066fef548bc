"""Helper process for test_crash.py (not a test): a zygote that imports the lake once, then forks writer
children on demand, so the test can kill -9 a hundred writers in seconds.

Protocol on stdin/stdout, one line each:
  go    -> fork a child that writes every batch of the workload in order (write_trajectories skips what is
           already there), printing "ACK id,id,..." after each write_trajectories call returned (the rows are
           durable) and "DONE" at the end; the zygote prints "PID <pid>"
  reap  -> wait for the last child, print "REAPED <pid> <status>"
  quit  -> exit
Usage: python crash_writer.py ROOT N_ROWS BATCH
"""

from __future__ import annotations

import os
import sys

# Import everything a child needs now, once: forked children must start writing at once, not import for 0.3 s.
import pyarrow.compute
import pyarrow.json
import pyarrow.parquet  # noqa: F401

import warehouse.query  # noqa: F401
from warehouse.lake import write_trajectories
from warehouse.record import Message, Trajectory, trajectory_id


def row(i: int) -> Trajectory:
    run_id, rnd = f"crash-{(i // 50) % 2}", (i // 100) % 3
    return Trajectory(
        trajectory_id=trajectory_id(run_id, rnd, f"t{i}", "p", 0), run_id=run_id, round=rnd, source="teacher",
        policy="p", task_id=f"t{i}", suite="s", split="train", task_version="1", verifier="v", verifier_version="1",
        messages=[Message(role="user", content=f"q{i}" * 20), Message(role="assistant", content=f"a{i}" * 20)],
        verdict="pass", success=True, reward=1.0,
    )


def child(root: str, n: int, batch: int) -> None:
    for start in range(0, n, batch):
        rows = [row(i) for i in range(start, min(n, start + batch))]
        write_trajectories(root, rows)
        os.write(1, ("ACK " + ",".join(r.trajectory_id for r in rows) + "\n").encode())
    os.write(1, b"DONE\n")


def main() -> None:
    root, n, batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    last = None
    os.write(1, b"READY\n")
    for line in sys.stdin:
        cmd = line.strip()
        if cmd == "go":
            pid = os.fork()
            if pid == 0:
                try:
                    child(root, n, batch)
                finally:
                    os._exit(0)
            last = pid
            os.write(1, f"PID {pid}\n".encode())
        elif cmd == "reap" and last is not None:
            _, status = os.waitpid(last, 0)
            os.write(1, f"REAPED {last} {status}\n".encode())
            last = None
        elif cmd == "quit":
            break


if __name__ == "__main__":
    main()
