"""The files flywheel's local Prefect servers keep under PREFECT_HOME, and how a command names itself there.

A command is named PID-STARTTIME (the kernel's start time guards against pid reuse; sandbox/procfs.py reads it):
its client registration of the shared server (PREFECT_HOME/flywheel-clients/ID) and its lease folder
(PREFECT_HOME/flywheel-leases/ID) carry that name, so a reader can tell whether the command still runs.
Also the one error of the local-server arrangement, LocalServerError, and the PYTHONPATH its helper processes run
with. This module starts, stops and signals nothing, and does not import prefect.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from sandbox.procfs import start_time

REPO = Path(__file__).resolve().parent.parent
ID = re.compile(r"^\d+-\d+$")  # PID-STARTTIME


class LocalServerError(RuntimeError):
    """The local Prefect server did not come up; the message names the fix."""


def prefect_home() -> Path:
    return Path(os.environ.get("PREFECT_HOME") or Path.home() / ".prefect").expanduser()


def lease_root() -> Path:
    return prefect_home() / "flywheel-leases"


def clients_dir() -> Path:
    return prefect_home() / "flywheel-clients"


def state_file() -> Path:
    return prefect_home() / "flywheel-server.json"


def alive(ident: str) -> bool:
    """Whether the process named PID-STARTTIME still runs (and is that process, not a reused pid)."""
    pid, _, start = ident.partition("-")
    return pid.isdigit() and start_time(int(pid)) == start


def self_id() -> str:
    return f"{os.getpid()}-{start_time(os.getpid())}"


def drop_if_empty(folder: Path) -> None:
    """Remove a command's lease folder when no lease is left in it."""
    if folder.is_dir() and not any(f.name != "expirations.json" for f in folder.glob("*.json")):
        shutil.rmtree(folder, ignore_errors=True)


def pythonpath_with_repo(current: str | None) -> str:
    """PYTHONPATH for a helper process (`python -m flows....`): the repository first, then `current`."""
    return os.pathsep.join([str(REPO), *filter(None, [current])])
