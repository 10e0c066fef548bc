"""The `flywheel server` group: start, stop and show the shared local Prefect server (flows/shared_server.py) and
the warm starters of `generate` (flows/warm.py). It prints; the supervision is theirs.
"""

from __future__ import annotations

import os
import sys
from typing import Annotated

import typer

from flows.cli_options import (
    UsageError,
)

server_app = typer.Typer(no_args_is_help=True, help="A local Prefect server (with UI) that every command reuses.")


@server_app.command("start")
def server_start(
    port: Annotated[int | None, typer.Option(help="Port on 127.0.0.1 (default: a free one).")] = None,
    idle_timeout: Annotated[float | None, typer.Option(
        "--idle-timeout", help="Seconds without API requests and client commands after which the server stops "
                               "itself (default FLYWHEEL_SERVER_IDLE_S or 900; 0: never).")] = None,
) -> None:
    """Start the local Prefect server (UI included) that commands without PREFECT_API_URL reuse; they also start
    it on first use. It outlives this command, found through PREFECT_HOME/flywheel-server.json."""
    from flows import shared_server

    if os.environ.get("PREFECT_API_URL"):
        raise UsageError(f"PREFECT_API_URL is set ({os.environ['PREFECT_API_URL']}): commands use that server; "
                         "unset it to use a local one")
    if idle_timeout is not None and idle_timeout < 0:
        raise UsageError(f"--idle-timeout must be 0 (never) or more seconds, not {idle_timeout}")
    st = shared_server.start_shared(port, idle_timeout)
    if port and not st["url"].endswith(f":{port}/api"):
        print(f"note: a local server runs already on {st['url']}; stop it first to use port {port}",
              file=sys.stderr)
    print(f"running: {st['url']} (pid {st['pid']}, log {st['log']}, {_idle_words(st)}); "
          f"UI: {st['url'].removesuffix('/api')}")


def _idle_words(st: dict) -> str:
    idle = float(st.get("idle_s") or 0)
    return f"stops after {idle:.0f} s idle" if idle else "no idle timeout"


@server_app.command("stop")
def server_stop() -> None:
    """Stop the local server and the warm starters of `generate` (and release nothing else: runs and slots are kept
    in PREFECT_HOME's database)."""
    from flows import shared_server, warm

    users = shared_server.live_clients()
    # the starters first: one that saw the server gone would drop its state file and exit on its own, and a starter
    # not listed is one stop_starters cannot wait for (it was still exiting when `server stop` returned)
    for w in warm.stop_starters():
        print(f"stopped: warm starter (pid {w['pid']})")
    st = shared_server.stop_shared()
    if st and users:
        print(f"warning: stopped while {len(users)} command(s) used it (pid {', '.join(u.split('-')[0] for u in users)})",
              file=sys.stderr)
    print(f"stopped: {st['url']} (pid {st['pid']})" if st else "not running")


@server_app.command("status")
def server_status() -> None:
    """Whether the local server runs (exit 0, its URL and the warm starters) or not (exit 1)."""
    from flows import shared_server

    st = shared_server.shared_status()
    if not st:
        print("not running")
        raise typer.Exit(1)
    from flows import warm

    users = shared_server.live_clients()
    print(f"running: {st['url']} (pid {st['pid']}, log {st['log']}, {_idle_words(st)}, {len(users)} client "
          "command(s))")
    for w in warm.starters():
        print(f"warm starter: pid {w['pid']}, fingerprint {w['fp'][:12]}, {'ready' if w.get('ready') else 'starting'}"
              f", log {w['log']}")
