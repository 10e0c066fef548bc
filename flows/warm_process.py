"""The process of a warm starter of `flywheel generate` (spawned by flows/warm.py `spawn_starter`, entered through
flows.cli.warm_starter): pre-import what a generate needs, listen on PREFECT_HOME/flywheel-warm/FP.sock, and fork a
child per connection that takes the client's fds, cwd, environment and argv and runs the command (flows.cli's
`main`).

The protocol and the life rules are flows/warm.py's docstring; this module is the starter's side of them: `boot`,
`serve` (listen until the shared server is gone, the idle timeout or SIGTERM), the accept (peer uid check, refusal
while threaded) and the forked child. The command side (fingerprint, connect, forward signals) is flows/warm.py.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import select
import signal
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable

from flows import shared_server, warm
from flows.prefect_home import prefect_home
from sandbox.procfs import start_time

PRELOAD = ("flows.generate", "flows.serve", "prefect", "prefect.flow_engine", "prefect.task_engine",
           "prefect.client.orchestration", "prefect.artifacts", "fastapi.encoders", "pyarrow", "pyarrow.parquet",
           "pandas", "duckdb", "agents.rollout", "agents.reference", "sandbox.backend", "warehouse.lake")


def _server_gone(server: dict) -> bool:
    st = shared_server.read_state()
    return not st or st.get("pid") != server["pid"] or start_time(int(server["pid"])) != server["start"]


def serve(fp: str, command: Callable[[], None]) -> None:
    """The starter: pre-import, listen on FP.sock, fork a child per connection that runs `command` (flows.cli's
    `main`) until the shared server is gone, it idles out (the server's idle timeout) or SIGTERM."""
    pending = warm.warm_dir() / f"{fp}.{os.getpid()}.json"
    try:
        _serve(fp, command)
    finally:
        pending.unlink(missing_ok=True)


def _serve(fp: str, command: Callable[[], None]) -> None:
    server = shared_server.shared_status()
    if server is None:
        print("flywheel-warm: no shared server runs: not starting", flush=True)
        return
    if any(st["fp"] == fp and st["pid"] != os.getpid() for st in warm.starters()):
        return
    t0 = time.monotonic()
    for mod in PRELOAD:
        __import__(mod)
    sock_path, state_path = warm.warm_dir() / f"{fp}.sock", warm.warm_dir() / f"{fp}.json"
    stopping = [False]
    signal.signal(signal.SIGTERM, lambda *_: stopping.__setitem__(0, True))
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children reaped by the kernel
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with warm.dir_fd() as dfd, open(warm.warm_dir() / f"{fp}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if any(st["fp"] == fp and st["pid"] != os.getpid() for st in warm.starters()):
            print(f"flywheel-warm: a starter of {fp[:12]} runs already", flush=True)
            return
        sock_path.unlink(missing_ok=True)
        listener.bind(warm.socket_address(sock_path, dfd))
        listener.listen(16)
        warm.write_state({"pid": os.getpid(), "start": start_time(os.getpid()), "fp": fp, "ready": True,
                          "server_pid": server["pid"], "server_url": server["url"], "started": time.time(),
                          "log": str(prefect_home() / "flywheel-warm.log")})
        (warm.warm_dir() / f"{fp}.{os.getpid()}.json").unlink(missing_ok=True)
    print(f"flywheel-warm: starter {os.getpid()} of {fp[:12]} ready after {time.monotonic() - t0:.1f} s", flush=True)
    idle_s = float(server.get("idle_s") or 0)
    last = time.monotonic()
    try:
        while not stopping[0]:
            try:
                ready, _, _ = select.select([listener], [], [], 1.0)
            except InterruptedError:
                continue
            if ready:
                conn, _ = listener.accept()
                last = time.monotonic()
                _accept(conn, listener, command)  # the forked child never returns from it
                continue
            if _server_gone(server) or (idle_s and time.monotonic() - last > idle_s):
                break
    finally:
        listener.close()
        with contextlib.suppress(OSError, ValueError):
            if json.loads(state_path.read_text())["pid"] == os.getpid():
                state_path.unlink(missing_ok=True)
                sock_path.unlink(missing_ok=True)
    print(f"flywheel-warm: starter {os.getpid()} exits", flush=True)


def _accept(conn: socket.socket, listener: socket.socket, command: Callable[[], None]) -> None:
    """Receive one request and fork its child (which runs the command and exits), or refuse it."""
    fds: list[int] = []
    try:
        uid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))[1]
        if uid != os.getuid():
            return
        conn.settimeout(10.0)
        data, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
        if len(data) < warm.HEADER.size or len(fds) != 3:
            return
        need = warm.HEADER.unpack_from(data)[0] + warm.HEADER.size
        while len(data) < need:
            chunk = conn.recv(need - len(data))
            if not chunk:
                return
            data += chunk
        req = json.loads(data[warm.HEADER.size:need])
        if threading.active_count() != 1:  # a fork of a threaded process can deadlock: let the client run it
            warm.send(conn, {"refused": f"{threading.active_count()} threads"})
            return
        pid = os.fork()
        if pid == 0:
            listener.close()
            _child(conn, req, fds, command)  # does not return
        print(f"flywheel-warm: forked {pid} for: {' '.join(req['argv'][1:])}", flush=True)
        return
    except (OSError, ValueError) as e:
        print(f"flywheel-warm: a request failed: {e!r}", flush=True)
        return
    finally:
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        conn.close()


def _child(conn: socket.socket, req: dict, fds: list[int], command: Callable[[], None]) -> None:
    """The forked command: the client's fds, cwd, environment and argv; `command()`; {"exit": code}."""
    code = 1
    try:
        warm.mark_forked()
        os.setpgid(0, 0)
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        for fd in fds:
            if fd > 2:
                os.close(fd)
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        sys.argv = list(req["argv"])
        unbuffered = bool(os.environ.get("PYTHONUNBUFFERED"))
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(AttributeError, ValueError):
                stream.reconfigure(line_buffering=stream is sys.stderr or stream.isatty(), write_through=unbuffered)
        conn.settimeout(None)

        def watch() -> None:  # any end of the client's connection: it is gone, however it died
            with contextlib.suppress(OSError):
                while conn.recv(1):
                    pass
            os.kill(os.getpid(), signal.SIGKILL)

        threading.Thread(target=watch, name="flywheel-warm-client", daemon=True).start()
        import prefect.context
        import prefect.logging.configuration

        prefect.context.refresh_global_settings_context()  # the client's PREFECT_* environment
        prefect.logging.configuration.setup_logging(incremental=False)  # handlers on the client's stderr
        warm.send(conn, {"pid": os.getpid()})
        try:
            command()
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            if not isinstance(e.code, (int, type(None))):
                print(e.code, file=sys.stderr)
        except BaseException:
            import traceback

            traceback.print_exc()
            code = 1
        import atexit

        # what the interpreter does at exit: threading's exit hooks (Prefect's log and event workers drain there)
        # and the join of non-daemon threads, then atexit
        threading._shutdown()
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        with contextlib.suppress(OSError):
            warm.send(conn, {"exit": code})
        os._exit(code)


def boot(command: Callable[[], None]) -> None:
    """The starter process's entry (flows.cli.warm_starter, spawned by flows/warm.py spawn_starter): FLYWHEEL_WARM_BOOT holds the
    fingerprint and the client's sys.path and PYTHONPATH; then `serve`."""
    spec = json.loads(os.environ.pop("FLYWHEEL_WARM_BOOT"))
    sys.path[:] = spec["path"]
    if spec["pythonpath"] is None:
        os.environ.pop("PYTHONPATH", None)
    else:
        os.environ["PYTHONPATH"] = spec["pythonpath"]
    serve(spec["fp"], command)
