"""The process of the shared local Prefect server: `python -m flows.server_process PORT IDLE_S`.

Prefect's server app (UI included) on 127.0.0.1:PORT behind a small middleware that notes the time of every API
request (but the watchdog's own, marked X-Flywheel-Watchdog) and hands the X-Flywheel-Client header to the lease
storage (flows/lease_storage.py), plus a watchdog thread that, every few seconds, releases the slots of dead
commands (flows/lease_reaper.py), kills the local sandboxes whose command is gone (sandbox/local.py), and stops the
server after IDLE_S seconds (0 = never) in which no API request came and no client command lived. It removes the
state file under the supervisor's lock before it exits. Started, found and stopped by flows/shared_server.py; this
module holds no command-side logic.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time

from flows.lease_reaper import reap_dead_leases
from flows.prefect_home import ID, self_id, state_file
from flows.shared_server import CLIENT_HEADER, WATCHDOG_HEADER, live_clients, read_state, state_lock


def serve_shared(port: int, idle_s: float) -> None:
    """Run Prefect's server app on 127.0.0.1:port with the activity middleware and the watchdog thread; returns when
    the server is idle for idle_s (or on SIGTERM)."""
    import uvicorn
    from prefect.server.api.server import create_app

    from flows.lease_storage import CLIENT

    app = create_app()
    last = [time.monotonic()]
    me = self_id()
    url = f"http://127.0.0.1:{port}/api"

    async def tracked(scope, receive, send):
        if scope["type"] not in ("http", "websocket"):
            return await app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        if WATCHDOG_HEADER.lower().encode() not in headers:
            last[0] = time.monotonic()
        client = headers.get(CLIENT_HEADER.lower().encode(), b"").decode()
        token = CLIENT.set(client if ID.match(client) else None)
        try:
            return await app(scope, receive, send)
        finally:
            CLIENT.reset(token)

    server = uvicorn.Server(uvicorn.Config(tracked, host="127.0.0.1", port=port, log_level="error", lifespan="on"))

    def watchdog() -> None:
        tick = 2.0 if not idle_s else max(0.5, min(5.0, idle_s / 4))
        while not server.started and not server.should_exit:
            time.sleep(0.1)
        last[0] = max(last[0], time.monotonic())  # idle from the moment it answers, not from its launch
        while not server.should_exit:
            time.sleep(tick)
            with contextlib.suppress(Exception):  # a failed reap is retried on the next tick
                reap_dead_leases(url)
            with contextlib.suppress(Exception):  # imported here: a sandbox module that fails to load stops no server
                from sandbox.reaper import reap_local

                reap_local()
            if not idle_s or time.monotonic() - last[0] < idle_s:
                continue
            with state_lock():
                if live_clients() or time.monotonic() - last[0] < idle_s:
                    continue
                st = read_state()
                if st and f"{st['pid']}-{st.get('start')}" == me:
                    state_file().unlink(missing_ok=True)
                print(f"flywheel: no API request and no client for {idle_s:.0f} s: stopping", flush=True)
                server.should_exit = True

    threading.Thread(target=watchdog, name="flywheel-idle-watchdog", daemon=True).start()
    server.run()


if __name__ == "__main__":
    serve_shared(int(sys.argv[1]), float(sys.argv[2]))
