"""What the judge runs INSIDE a fresh sandbox: the call server, and the parts the isolated runner shares with it
(standard library only).

Sent as `python3 -I -c SOURCE`, where SOURCE is plaindata.py, this file, for the runner runner.py (all three in
tasks/judge/guest/), and one line that picks the role: `serve`, `launch` or `runner`
(tasks.judge.unittests.guest_program builds it). Nothing here is imported on the host; tests/tasks/test_guest.py
runs the programs with the host's python3.

- The call server (`serve`) writes the agent's files to a temp folder, imports the solution module once, then
  answers calls `{"i", "func", "args", "kwargs"}` (arguments in plaindata's encoding): each call runs in a forked
  process of its own (own process group, wall-clock limit, killed as a group afterwards) and its result comes
  back encoded, or as an error, a timeout or "not plain data". Its replies go to a descriptor duplicated from
  stdout before the solution is imported; the solution's own prints go to /dev/null. In batch mode (the data
  path) the calls come in the request and the host compares the results with the expected values it kept; the
  solution can make the server say anything, but it never sees an expected value to say. A test's calls after
  its first one that is not "ok" (an error, a timeout) are not run: that call is already the test's result.
- The isolated runner (`runner`) is for tests that cannot be split into calls: it makes itself non-dumpable
  (no ptrace, no /proc/<pid>/mem, fd or environ for other processes of its uid), reads the tests and a per-run
  secret from stdin, starts the call server as a child with fresh pipes (no descriptor of its own), and runs each
  test in its own namespace: the real builtins, the task's own code (the pristine file at the solution's path, run
  here: its helpers are the task's), and, from the solution, only the functions the tests are meant to call (the
  entry points, and names the tests use that neither the task's code nor the builtins define) as proxies to that
  server. A name the solution defines (`range`, `sorted`, a helper of the task) never reaches the tests otherwise;
  no plain global of the solution is copied. What the solution raises reaches the test as SolutionRaised (a
  builtin type keeps its type for `except`, but never as StopIteration, StopAsyncIteration or a BaseException-only
  type, which a loop, `map`, `all` or a generator would take as control flow), and a call that failed (timeout, no
  result, not plain data) is the test's result even when the test's code catches it. It never imports the
  solution. Its one report line carries the secret; the host accepts it only with that secret and exit status 0.
- Every path starts with a census (`census`): a process of this sandbox left by an earlier command (an orphan of
  PID 1: a double fork, a daemon) or a tracer of the runner is reported, and the host then gives that path no
  result (tasks/judge/unittests.py also gives each path a fresh sandbox, so there is none to find).
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


def _builtin_base(cls):
    """The name of the nearest builtin class of an exception type (a solution's `class E(ValueError)` travels as
    ValueError); the runner decides what a test may catch of it."""
    for c in cls.__mro__:
        if c.__module__ == "builtins":
            return c.__name__
    return "BaseException"


def census(exclude=()):
    """Processes of this sandbox left by an earlier command: orphans (parent PID 1) other than `exclude`, as
    [pid, comm] pairs. Every process a backend starts on its own (PID 1, a zygote or interpreter, an exec'd command)
    is entered from outside the sandbox (parent 0) or is the child of one; a process whose parent is PID 1 was
    left behind by a command that ended (a double fork, a daemon), so a judging path that sees one does not start."""
    out = []
    me = _os.getpid()
    for d in _os.listdir("/proc"):
        if not d.isdigit() or int(d) in (1, me) or int(d) in exclude:
            continue
        try:
            with open("/proc/%s/stat" % d, "rb") as f:
                stat = f.read()
        except OSError:
            continue
        head, _, tail = stat.rpartition(b")")
        fields = tail.split()
        if len(fields) >= 2 and fields[1] == b"1" and fields[0] != b"Z":
            out.append([int(d), head.partition(b"(")[2].decode("utf-8", "replace")[:32]])
    return sorted(out)


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
    def __init__(self, req, out_fd, exclude=()):
        self.out_fd, self.token = out_fd, req["token"]
        self.strays = census(exclude)  # before the solution is imported: what earlier commands left
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
        """The module's public callables: the runner proxies those of them its tests may call (plain values of the
        module are never offered: the tests see the task's own code, not the solution's globals)."""
        if self.module is None:
            return []
        return sorted(k for k, v in list(vars(self.module).items()) if not k.startswith("_") and callable(v))

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
            return {"status": "error", "error": _tb(e), "exc": _builtin_base(type(e))}
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
    server.send({"kind": "ready", "error": server.import_error, "names": server.names(), "strays": server.strays})
    if req.get("mode") == "batch":
        ended = set()  # tests whose result is already decided: a call of theirs was not "ok"
        for i, c in enumerate(req["calls"]):
            if c.get("test") in ended:
                continue  # the host reads a test's calls only up to its first one that is not "ok"
            msg = server.call(i, c["func"], c["args"], c["kwargs"])
            if msg.get("status") != "ok":
                ended.add(c.get("test"))
            server.send(dict(msg, kind="call"))
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
        _os.write(w, str(_os.getpid()).encode())  # the runner's census spares this server
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
    pid = _os.read(r, 16)
    ok = pid.isdigit()
    _os.wait()
    _sys.stdout.write(_json.dumps({"token": req["token"], "listening": ok, "pid": int(pid) if ok else None}) + "\n")
    _sys.stdout.flush()
    _os._exit(0 if ok else 1)
