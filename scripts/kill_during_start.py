"""Loop: SIGKILL a process that churns local sandboxes (start, one call, close, from a few threads) at a random moment,
then look for any process of a sandbox it started (its bwrap or PID 1, found by its owner= argument) still alive a
few seconds later. Prints runs and leftovers; a leftover is what tests/flows/test_kill.py saw intermittently.

    python scripts/kill_during_start.py --runs 40 [--threads 4] [--settle 3] [--repo CHECKOUT]

Only the processes of the churn children this script starts are ever killed (each leftover by pid, after counting).
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from sandbox import procfs

CHURN = r"""
import sys, threading
from sandbox.local import LocalBackend
from sandbox.result import SandboxConfig
backend = LocalBackend(SandboxConfig(backend="local"), pool_size=2)
def churn():
    while True:
        sb = backend.acquire()
        try:
            sb.exec(["true"], timeout_s=5)
        finally:
            sb.close()
for _ in range(int(sys.argv[1])):
    threading.Thread(target=churn, daemon=True).start()
print("churning", flush=True)
threading.Event().wait()
"""


def owned_by(owner: str) -> list[tuple[int, str]]:
    """(pid, command line) of every live non-zombie process whose argv holds owner=OWNER."""
    out = []
    for pid in procfs.pids():
        argv = procfs.cmdline(pid)
        if f"owner={owner}".encode() in argv and procfs.running(pid):
            out.append((pid, b" ".join(argv[:3]).decode(errors="replace")))
    return out


def describe(pid: int) -> str:
    """State, kernel wait channel, parent and open descriptors of pid (what a stuck process waits on)."""
    st = procfs.stat(pid)
    try:
        wchan = Path(f"/proc/{pid}/wchan").read_text()
        fds = {f.name: os.readlink(f) for f in Path(f"/proc/{pid}/fd").iterdir()}
    except OSError as e:
        return f"gone ({e})"
    if st is None:
        return "gone"
    return f"state {st.state} ppid {st.ppid} wchan {wchan} fds {fds}"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=40)
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--settle", type=float, default=3.0, help="seconds after the kill before looking")
    ap.add_argument("--watch", type=float, default=30.0, help="how much longer a leftover is watched")
    ap.add_argument("--repo", type=Path, default=Path(__file__).resolve().parent.parent,
                    help="the checkout whose sandbox/ the churn imports (default: this one)")
    args = ap.parse_args()
    leftovers = not_started = stuck = 0
    for i in range(args.runs):
        p = subprocess.Popen([sys.executable, "-c", CHURN, str(args.threads)], stdout=subprocess.PIPE,
                             cwd=args.repo)
        assert p.stdout is not None
        if p.stdout.readline().strip() != b"churning":  # e.g. a first sandbox slower than START_TIMEOUT_S
            p.kill()
            p.wait()
            not_started += 1
            continue
        owner = f"{p.pid}-{procfs.start_time(p.pid)}"
        time.sleep(random.uniform(0.5, 2.0))
        p.send_signal(signal.SIGKILL)
        p.wait()
        time.sleep(args.settle)
        left = owned_by(owner)
        if left:
            leftovers += 1
            print(f"run {i}: {len(left)} process(es) left after {args.settle} s: {left}", flush=True)
            for pid, _ in left:
                print(f"  {pid}: {describe(pid)}", flush=True)
            deadline = time.monotonic() + args.watch
            while (still := owned_by(owner)) and time.monotonic() < deadline:
                time.sleep(0.5)
            print(f"  after {args.watch} s more: {len(still)} left", flush=True)
            if still:
                stuck += 1
                for pid, _ in still:
                    print(f"  {pid}: {describe(pid)}", flush=True)
            left = still
            for pid, _ in left:  # ours: started by the churn child this loop started
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
    print(f"runs {args.runs}, churn did not start {not_started}, runs with a sandbox process left after "
          f"{args.settle} s {leftovers}, of them still there {args.watch} s later {stuck}", flush=True)
    return 1 if stuck else 0


if __name__ == "__main__":
    sys.exit(main())
