"""What the judge runs INSIDE a fresh sandbox: the call server and the isolated test runner (standard library only).

Sent as `python3 -I -c SOURCE`, where SOURCE is tasks/plaindata.py followed by this file and one line that picks
the role; nothing here is imported on the host.

- The call server (`serve`) writes the agent's files to a temp folder, imports the solution module once, then
  answers calls `{"i", "func", "args", "kwargs"}` (arguments in plaindata's encoding): each call runs in a forked
  process of its own (own process group, wall-clock limit, killed as a group afterwards) and its result comes
  back encoded, or as an error, a timeout or "not plain data". Its replies go to a descriptor duplicated from
  stdout before the solution is imported; the solution's own prints go to /dev/null. In batch mode (the data
  path) the calls come in the request and the host compares the results with the expected values it kept; the
  solution can make the server say anything, but it never sees an expected value to say.
- The isolated runner (`runner`) is for tests that cannot be split into calls: it makes itself non-dumpable
  (no ptrace, no /proc/<pid>/mem, fd or environ for other processes of its uid), reads the tests and a per-run
  secret from stdin, starts the call server as a child with fresh pipes (no descriptor of its own), and runs each
  test in its own namespace where the solution's functions are proxies to that server and its plain globals are
  decoded copies. It never imports the solution. Its one report line carries the secret; the host accepts it only
  with that secret and exit status 0.
- Runner and server as different users where the backend allows (Docker): an exec as the sandbox user (nobody)
  runs `launch`, which starts a detached server listening on a Unix socket and returns; then an exec as another
  unprivileged uid (no capability either) runs the runner, which connects to it. The solution then cannot signal
  or stop the runner (EPERM), ptrace it, or open its /proc/<pid>/environ, maps, mem or fd (EACCES); only the
  world-readable cmdline and status remain, which hold no secret (the secret and the tests come on stdin). The
  report says `uid_split` from the server's socket credentials. The local backend (bubblewrap) maps one uid into
  its user namespace, so there the runner starts the server as its child on the same uid: the solution can
  signal it (a killed or stopped runner gives no report, which never passes) and read its cmdline/status, and
  only non-dumpability keeps its memory, environment and descriptors closed.
"""

import builtins as _builtins
import importlib as _importlib
import json as _json
import os as _os
import select as _select
import signal as _signal
import sys as _sys
import time as _time
import types as _types

MARKER = "__FLYWHEEL_JUDGE__"
_RESULT_LIMIT = 16 * 1024 * 1024


def _write_all(fd, data):
    view = memoryview(data)
    while view:
        n = _os.write(fd, view)
        view = view[n:]


def _tb(e):
    """The exception as `traceback.format_exception` words it (frames, source lines of real files, the exception
    line; no chained causes), without importing traceback and linecache: the call server starts on every verdict."""
    lines = ["Traceback (most recent call last):"]
    tb = e.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        lines.append('  File "%s", line %d, in %s' % (code.co_filename, tb.tb_lineno, code.co_name))
        src = _source_line(code.co_filename, tb.tb_lineno)
        if src:
            lines.append("    " + src)
        tb = tb.tb_next
    name = type(e).__qualname__
    mod = type(e).__module__
    if mod not in ("builtins", "__main__"):
        name = mod + "." + name
    try:
        text = str(e)
    except BaseException:  # noqa: BLE001 - a __str__ that raises
        text = "<exception str() failed>"
    lines.append(name + (": " + text if text else ""))
    return "\n".join(lines)[-800:] + "\n"


_LINES = {}


def _source_line(path, lineno):
    if path not in _LINES:
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                _LINES[path] = f.read(1 << 20).splitlines()
        except (OSError, ValueError):
            _LINES[path] = []
    lines = _LINES[path]
    return lines[lineno - 1].strip() if 0 < lineno <= len(lines) else ""


def _place_files(files):
    workdir = "/tmp/fwjudge-" + _os.urandom(8).hex()
    _os.mkdir(workdir, 0o700)
    for rel, content in files.items():
        path = _os.path.normpath(_os.path.join(workdir, rel))
        if not path.startswith(workdir + _os.sep):
            continue
        _os.makedirs(_os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(content)
    return workdir


class _Server:
    def __init__(self, req, out_fd):
        self.out_fd, self.token = out_fd, req["token"]
        self.timeout_s = float(req["timeout_s"])
        workdir = _place_files(req["files"])
        _os.chdir(workdir)
        _sys.path.insert(0, workdir)
        self.before = dict(vars(_builtins))
        self.module, self.import_error, self.import_events = None, None, []
        try:
            self.module = _importlib.import_module(req["module"])
        except SystemExit as e:
            self.import_error = "SystemExit(%r) raised while importing %s" % (e.code, req["module"])
            self.import_events = ["system_exit"]
        except BaseException as e:  # noqa: BLE001 - any failure to import is the solution's, reported as data
            self.import_error = "importing %s failed: %s" % (req["module"], _tb(e))

    def patched(self):
        now = vars(_builtins)
        missing = object()
        changed = sorted(k for k in set(self.before) | set(now) if self.before.get(k, missing) is not now.get(k, missing))
        return ["builtins_patched:" + ",".join(changed[:10])] if changed else []

    def send(self, msg):
        msg["token"] = self.token
        _write_all(self.out_fd, (_json.dumps(msg) + "\n").encode())

    def names(self):
        """Public names of the module: callables (proxied by the runner) and plain values (copied)."""
        out = {}
        if self.module is None:
            return out
        for k, v in list(vars(self.module).items()):
            if k.startswith("_"):
                continue
            if callable(v):
                out[k] = ["callable"]
                continue
            try:
                out[k] = ["value", encode(v)]  # noqa: F821 - plaindata's encode, concatenated before this file
            except Exception:  # noqa: BLE001 - a module global that is not plain data is simply not offered
                pass
        return out

    def call(self, i, func, args, kwargs):
        if self.module is None:
            return {"i": i, "status": "error", "error": self.import_error, "events": self.import_events}
        r, w = _os.pipe()
        pid = _os.fork()
        if pid == 0:
            _os.close(r)
            try:
                _os.setpgid(0, 0)
                msg = self._run(func, args, kwargs)
            except BaseException as e:  # noqa: BLE001
                msg = {"status": "error", "error": "the call could not run: %s" % _tb(e)}
            msg["events"] = msg.get("events", []) + self.patched()
            try:
                _write_all(w, _json.dumps(msg).encode())
            except BaseException:  # noqa: BLE001
                pass
            _os._exit(0)
        _os.close(w)
        try:
            _os.setpgid(pid, pid)
        except OSError:
            pass
        chunks, total, timed_out = [], 0, False
        deadline = _time.monotonic() + self.timeout_s
        while True:
            left = deadline - _time.monotonic()
            if left <= 0:
                timed_out = True
                break
            ready, _, _ = _select.select([r], [], [], min(left, 0.5))
            if not ready:
                continue
            b = _os.read(r, 65536)
            if not b:
                break
            chunks.append(b)
            total += len(b)
            if total > _RESULT_LIMIT:
                break
        _os.close(r)
        try:
            _os.killpg(pid, _signal.SIGKILL)
        except OSError:
            pass
        _, status = _os.waitpid(pid, 0)
        rc = -_os.WTERMSIG(status) if _os.WIFSIGNALED(status) else _os.WEXITSTATUS(status)
        if timed_out:
            return {"i": i, "status": "timeout", "error": "the call ran past %.1f s" % self.timeout_s, "rc": rc}
        if total > _RESULT_LIMIT:
            return {"i": i, "status": "error", "error": "the result is larger than %d bytes" % _RESULT_LIMIT}
        try:
            msg = _json.loads(b"".join(chunks).decode("utf-8"))
            if type(msg) is not dict:
                raise ValueError
        except ValueError:
            how = ("killed by signal %d" % -rc) if rc < 0 else "exited with code %d" % rc
            return {"i": i, "status": "no_result", "error": "the call's process %s before sending its result" % how,
                    "events": ["process_exit:" + how] if rc == 0 or (rc < 0 and -rc != _signal.SIGKILL) else []}
        msg["i"], msg["rc"] = i, rc
        return msg

    def _run(self, func, args, kwargs):
        f = getattr(self.module, func, None)
        if f is None or not callable(f):
            return {"status": "error", "error": "the solution defines no function %r" % func}
        try:
            a = decode(args)  # noqa: F821 - plaindata's decode
            kw = decode(kwargs)  # noqa: F821
            value = f(*a, **kw)
        except SystemExit as e:
            return {"status": "error", "error": "SystemExit(%r) raised during the call" % (e.code,),
                    "exc": "SystemExit", "events": ["system_exit"]}
        except BaseException as e:  # noqa: BLE001 - the solution's exception is the call's result
            return {"status": "error", "error": _tb(e), "exc": type(e).__name__}
        try:
            return {"status": "ok", "value": encode(value)}  # noqa: F821
        except NotPlainData as e:  # noqa: F821
            return {"status": "not_plain", "error": str(e), "type": e.type_name,
                    "events": ["not_plain_data:" + e.type_name]}


def _serve_on(in_fd, out_fd):
    """Answer one client: a header line, then (serve mode) one call per line until EOF; one reply line each."""
    reader = _os.fdopen(in_fd, "rb")
    req = _json.loads(reader.readline())
    server = _Server(req, out_fd)
    server.send({"kind": "ready", "error": server.import_error, "names": server.names()})
    if req.get("mode") == "batch":
        for i, c in enumerate(req["calls"]):
            server.send(dict(server.call(i, c["func"], c["args"], c["kwargs"]), kind="call"))
    else:
        for line in reader:
            c = _json.loads(line)
            server.send(dict(server.call(c["i"], c["func"], c["args"], c["kwargs"]), kind="call"))
    _os._exit(0)


def serve():
    """The call server on this process's stdin/stdout (the data path, and the runner's child on one uid)."""
    in_fd = _os.dup(0)
    out_fd = _os.dup(1)
    null = _os.open(_os.devnull, _os.O_RDWR)
    _os.dup2(null, 0)
    _os.dup2(null, 1)
    _serve_on(in_fd, out_fd)


def launch():
    """Start a detached call server (this exec's user, the sandbox user) listening on a Unix socket for the runner,
    which runs as another user in a later exec; print one ready line once it listens, then exit.

    The request (stdin) names the socket folder (created here, mode 0755) and how long to wait for the runner.
    The server accepts one connection, then serves it as `serve` does; it never imports the solution before the
    runner's header arrives.
    """
    import socket

    req = _json.loads(_sys.stdin.buffer.read())
    folder = req["folder"]
    _os.mkdir(folder, 0o755)
    path = _os.path.join(folder, "s")
    lsock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    lsock.bind(path)
    _os.chmod(path, 0o666)  # the runner, another uid, must be allowed to connect
    lsock.listen(1)
    r, w = _os.pipe()
    if _os.fork() == 0:
        _os.close(r)
        _os.setsid()
        if _os.fork() != 0:
            _os._exit(0)
        null = _os.open(_os.devnull, _os.O_RDWR)
        for fd in (0, 1, 2):
            _os.dup2(null, fd)
        _os.write(w, b"1")
        _os.close(w)
        lsock.settimeout(float(req["wait_s"]))
        try:
            conn, _ = lsock.accept()
        except OSError:
            _os._exit(1)
        lsock.close()
        _os.unlink(path)
        conn.setblocking(True)
        fd = conn.detach()
        _serve_on(_os.dup(fd), fd)
    _os.close(w)
    ok = _os.read(r, 1) == b"1"
    _os.wait()
    _sys.stdout.write(_json.dumps({"token": req["token"], "listening": ok}) + "\n")
    _sys.stdout.flush()
    _os._exit(0 if ok else 1)


# ---- the isolated runner: everything below is left out of the call server's program (tasks/unittests.py) ----


class _CallFailed(Exception):
    """A proxied call ended in an error of the server, a timeout or a value that is not plain data."""

    def __init__(self, status, error, events=()):
        self.status, self.events = status, list(events)
        super().__init__(error)


def runner():
    """The isolated test runner: tests run here, the solution in a child server reached only through proxies."""
    guarded = False
    try:
        import ctypes

        guarded = ctypes.CDLL(None).prctl(4, 0, 0, 0, 0) == 0  # PR_SET_DUMPABLE 0
    except Exception:  # noqa: BLE001 - reported in the result as guard=False
        pass
    req = _json.loads(_sys.stdin.buffer.read())
    secret, token, timeout_s = req.pop("secret"), req["token"], float(req["timeout_s"])
    proc = sock = None
    server_uid = None
    start_error = None
    if req.get("connect"):
        # uid split (Docker): the server was started by an earlier exec as the sandbox user; this runner runs as
        # another uid, so the solution can neither signal it, ptrace it nor open its /proc files
        import socket

        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(req["connect"])
            import struct

            _, server_uid, _ = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
        except OSError as e:
            start_error = "cannot reach the solution's server: %s" % e
        out = sock.fileno()

        def send(data):
            sock.sendall(data)
    else:
        # one uid (the local backend): the server is this runner's child, on fresh pipes
        import subprocess

        proc = subprocess.Popen([_sys.executable, "-I", "-c", req["server_source"]], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, close_fds=True,
                                start_new_session=True)
        server_uid = _os.getuid()
        out = proc.stdout.fileno()

        def send(data):
            proc.stdin.write(data)
            proc.stdin.flush()
    buf = bytearray()

    def reply(deadline):
        while b"\n" not in buf:
            left = deadline - _time.monotonic()
            if left <= 0 or not _select.select([out], [], [], left)[0]:
                raise _CallFailed("timeout", "the solution's server did not answer in time")
            b = _os.read(out, 65536)
            if not b:
                raise _CallFailed("no_result", "the solution's server ended (exit %s)"
                                  % (proc.poll() if proc is not None else "unknown"))
            buf.extend(b)
        line, _, rest = bytes(buf).partition(b"\n")
        buf[:] = rest
        msg = _json.loads(line)
        if type(msg) is not dict or msg.get("token") != token:
            raise _CallFailed("error", "the solution's server sent a malformed reply")
        return msg

    header = {"mode": "serve", "token": token, "files": req["files"], "module": req["module"],
              "timeout_s": timeout_s}
    results = []
    try:
        if start_error:
            raise _CallFailed("error", start_error)
        send((_json.dumps(header) + "\n").encode())
        ready = reply(_time.monotonic() + timeout_s + 5)
        import_error = ready.get("error")
        names = ready.get("names") or {}
    except (_CallFailed, OSError, ValueError) as e:
        import_error, names = "the solution's server did not start: %s" % e, {}
    counter = [0]

    def proxy(name):
        def call(*args, **kwargs):
            counter[0] += 1
            try:
                a, kw = encode(list(args)), encode(dict(kwargs))  # noqa: F821
            except NotPlainData as e:  # noqa: F821
                raise _CallFailed("error", "an argument to %s is not plain data: %s" % (name, e)) from None
            send((_json.dumps({"i": counter[0], "func": name, "args": a, "kwargs": kw}) + "\n").encode())
            msg = reply(_time.monotonic() + timeout_s + 5)
            events.extend(str(e) for e in msg.get("events") or [])
            status = msg.get("status")
            if status == "ok":
                return decode(msg.get("value"))  # noqa: F821
            if status == "error" and msg.get("exc") and msg.get("exc") != "SystemExit":
                exc = getattr(_builtins, str(msg["exc"]), None)
                if isinstance(exc, type) and issubclass(exc, Exception):
                    raise exc(msg.get("error"))  # the test may expect this exception
            raise _CallFailed("fail" if status == "not_plain" else
                              status if status in ("timeout", "no_result") else "error", msg.get("error"))
        call.__name__ = name
        return call

    fake = _types.ModuleType(req["module"])
    for k, v in names.items():
        if v and v[0] == "callable":
            setattr(fake, k, proxy(k))
        elif v and v[0] == "value":
            try:
                setattr(fake, k, decode(v[1]))  # noqa: F821
            except ValueError:
                pass
    _sys.modules[req["module"]] = fake
    for t in req["tests"]:
        events = []
        res = {"name": t["name"], "status": "pass", "error": None}
        if import_error:
            res.update(status="error", error=import_error)
        else:
            ns = {"__name__": "__flywheel_test__", **{k: getattr(fake, k) for k in vars(fake) if not k.startswith("_")}}
            try:
                exec(compile(t["code"], "<test " + t["name"] + ">", "exec"), ns)
            except _CallFailed as e:
                res.update(status=e.status, error=str(e))
            except AssertionError as e:
                res.update(status="fail", error=_tb(e))
            except BaseException as e:  # noqa: BLE001 - the test's own error
                res.update(status="error", error=_tb(e))
        res["events"] = events
        results.append(res)
    if proc is not None:
        try:
            proc.stdin.close()
        except OSError:
            pass
        try:
            _os.killpg(proc.pid, _signal.SIGKILL)
        except OSError:
            pass
        proc.wait()
    else:  # another uid: it cannot be killed from here; EOF ends an honest server, the sandbox's end any other
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        sock.close()
    split = server_uid is not None and server_uid != _os.getuid()
    _sys.stdout.write(MARKER + " " + _json.dumps({"token": token, "secret": secret, "guarded": guarded,
                                                  "uid_split": split, "results": results}) + "\n")
    _sys.stdout.flush()
    _os._exit(0)
