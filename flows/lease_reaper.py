"""Slots of dead commands: release the global concurrency slots a killed flywheel command still holds.

Every lease a command takes is filed in PREFECT_HOME/flywheel-leases/PID-STARTTIME of that command (the server
side is flows/lease_storage.py). `reap_dead_leases` releases the slots of folders whose command is gone (pid dead,
or reused by another process) and deletes them: each command runs it before its first flow, and the shared
server's watchdog every few seconds. A lease on disk after a power loss is reaped the same way. A command's own
server can be killed between counting a slot and filing its lease; `reset_orphan_slots` sets such counts back to
0 when a command finds no other flywheel command alive.
It talks to the server over its REST API with urllib (this module does not import prefect) and starts or stops no
server.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path

from flows.prefect_home import alive, lease_root
from flows.shared_server import WATCHDOG_HEADER, live_clients, read_state, usable
from sandbox.procfs import start_time


def _api(url: str, method: str, path: str, body: dict | None = None, timeout: float = 10.0):
    req = urllib.request.Request(f"{url}{path}", method=method, data=None if body is None else
                                 json.dumps(body).encode(), headers={"Content-Type": "application/json",
                                                                     WATCHDOG_HEADER: "1"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read() or b"null")


def reap_dead_leases(api_url: str, own: Path | None = None) -> dict[str, int]:
    """Release, on the server at api_url, the slots of every lease folder whose command is gone (never `own`, this
    command's folder); returns limit name -> slots released."""
    released: Counter[str] = Counter()
    root = lease_root()
    for folder in sorted(root.glob("*-*")) if root.is_dir() else []:
        pid, _, start = folder.name.partition("-")
        if not pid.isdigit() or folder == own or start_time(int(pid)) == start:
            continue  # ours, or a live command's
        claimed = folder.with_name(f".reaping-{os.getpid()}-{folder.name}")
        try:
            folder.rename(claimed)  # one reaper per folder, even with several commands starting at once
        except OSError:
            continue
        per_limit: Counter[str] = Counter()
        for f in claimed.glob("*.json"):
            if f.name == "expirations.json":
                continue
            try:
                lease = json.loads(f.read_text())
            except (OSError, ValueError):
                continue
            for rid in lease.get("resource_ids", []):
                per_limit[rid] += int((lease.get("metadata") or {}).get("slots", 0))
        unreleased = False
        for rid, slots in per_limit.items():
            if slots <= 0:
                continue
            name = _release(api_url, rid, slots)
            if name is None:
                continue  # the limit was deleted meanwhile: nothing to release
            if name is False:
                unreleased = True
                continue
            released[name] += slots
            print(f"released {slots} slot(s) of concurrency limit {name!r} held by a command that died "
                  f"(pid {pid})", file=sys.stderr, flush=True)
        if unreleased and not released:  # the server did not answer: leave the folder for the next reaper
            try:
                claimed.rename(folder)
            except OSError:
                pass
            print(f"warning: could not release the slots of a command that died (pid {pid}): the server did not "
                  "answer; the next command or the shared server's watchdog tries again", file=sys.stderr,
                  flush=True)
            continue
        shutil.rmtree(claimed, ignore_errors=True)
    return dict(released)


def _other_command_lives(own: Path) -> bool:
    """Whether a flywheel command other than the one of lease folder `own` may use PREFECT_HOME's database: a live
    command's lease folder (an own-server command makes its folder before its server starts), a live client of the
    shared server, or a shared server that lives or may be starting."""
    root = lease_root()
    folders = root.glob("*-*") if root.is_dir() else []
    return (any(f != own and alive(f.name) for f in folders) or bool(live_clients())
            or usable(read_state()))


def reset_orphan_slots(api_url: str, own: Path) -> dict[str, int]:
    """On a command's own server (at api_url; `own` its lease folder), before its first flow: when no other
    flywheel command lives, set the taken slots of every `flywheel-*` concurrency limit to 0; returns limit name ->
    slots reset.

    Prefect's server commits a slot count before it files the lease (`increment-with-lease`); an own server dies
    with its command, so a command killed between the two leaves slots counted that no lease folder names:
    `reap_dead_leases` cannot see them, and every later command would wait for them forever. With no other command
    alive, no slot counted in the database has a holder. A command that starts while this one resets has not taken
    a slot yet (its server is still starting)."""
    if _other_command_lives(own):
        return {}
    reset: dict[str, int] = {}
    for attempt in range(5):  # a fresh server on a loaded machine answers 503 for a while
        try:
            for lim in _api(api_url, "POST", "/v2/concurrency_limits/filter", {"limit": 200}, timeout=30.0) or []:
                if str(lim.get("name", "")).startswith("flywheel-") and int(lim.get("active_slots") or 0) > 0:
                    _api(api_url, "PATCH", f"/v2/concurrency_limits/{lim['id']}", {"active_slots": 0}, timeout=30.0)
                    reset[lim["name"]] = int(lim["active_slots"])
                    print(f"reset {reset[lim['name']]} slot(s) of concurrency limit {lim['name']!r} that no live "
                          "command holds (a command killed while its server took them)", file=sys.stderr, flush=True)
            return reset
        except OSError as e:  # urllib's errors included
            if attempt == 4:  # the command goes on, as with a lease the reaper cannot release
                print(f"warning: could not reset the slots that no live command holds: the server did not answer "
                      f"({e})", file=sys.stderr, flush=True)
            else:
                time.sleep(1.0 + 2 * attempt)
    return reset


def _release(api_url: str, rid: str, slots: int) -> str | None | bool:
    """Decrement limit `rid` by `slots`: its name, None when the limit no longer exists, False when the server did
    not answer (three tries; a loaded machine's fresh server can take more than the default timeout)."""
    for attempt in range(3):
        try:
            name = _api(api_url, "GET", f"/v2/concurrency_limits/{rid}", timeout=30.0)["name"]
            _api(api_url, "POST", "/v2/concurrency_limits/decrement", {"slots": slots, "names": [name]}, timeout=30.0)
            return name
        except urllib.error.HTTPError as e:
            if e.code == 404:
                return None
        except (KeyError, TypeError):
            return None
        except (OSError, urllib.error.URLError):
            pass
        time.sleep(1.0 + attempt)
    return False
