"""The judge's isolated test runner, INSIDE a fresh sandbox (standard library only): the `runner` role of the
judge's in-sandbox program, for tests that cannot be split into calls (what it guarantees: callserver.py's
docstring).

Not a program alone: it is sent after plaindata.py and callserver.py in one `python3 -I -c SOURCE`, and uses their
globals (MARKER, census, _tb: marked `noqa: F821` where used). It imports the standard library modules it uses
itself, under callserver's names. Nothing here is imported on the host.
"""

import builtins as _builtins
import json as _json
import os as _os
import select as _select
import signal as _signal
import sys as _sys
import time as _time
import types as _types


class _CallFailed(Exception):
    """A proxied call ended in an error of the server, a timeout or a value that is not plain data. The test's
    result is this failure even when the test's code catches it (it is recorded before it is raised); the test's
    later calls are not sent to the server, they raise at once."""

    def __init__(self, status, error, events=()):
        self.status, self.events = status, list(events)
        super().__init__(error)


class SolutionRaised(Exception):
    """What the solution raised, carried across the proxy. A builtin exception keeps its type for the test's
    `except` clauses (a class derived from it and from this one), except the types a language construct treats as
    control flow: StopIteration and StopAsyncIteration (which end a loop, a `map`, `all` or a generator silently)
    and the BaseException-only ones (SystemExit, KeyboardInterrupt, GeneratorExit) arrive as this class alone."""


_CONTROL_FLOW = (StopIteration, StopAsyncIteration)
_CARRIERS = {}


def _solution_error(name, text):
    """The exception a proxy raises for the solution's builtin exception `name` with the error text `text`."""
    exc = getattr(_builtins, str(name), None)
    if isinstance(exc, type) and issubclass(exc, Exception) and not issubclass(exc, _CONTROL_FLOW):
        for base in exc.__mro__:
            if base is Exception or not issubclass(base, Exception):
                break
            try:
                carrier = _CARRIERS.get(base)
                if carrier is None:
                    carrier = _CARRIERS[base] = type(base.__name__, (base, SolutionRaised),
                                                     {"__module__": "builtins"})
                return carrier(text)
            except TypeError:  # a type whose constructor takes other arguments (UnicodeDecodeError): its base
                continue
    return SolutionRaised("%s raised by the solution: %s" % (name, text))


def _own_module(name, source):
    """The task's own code (the pristine file at the solution's path) as module `name`, run here with the real
    builtins: the helpers the tests call (HumanEval/32's `poly`) are the task's, never the solution's."""
    mod = _types.ModuleType(name)
    mod.__dict__["__builtins__"] = _builtins
    if source:
        exec(compile(source, "<the task's own %s>" % name, "exec"), mod.__dict__)
    return mod


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
    server_uid = server_pid = None
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
            server_pid = req.get("server_pid")  # the launch's report: the server is an orphan of PID 1 by design
        except OSError as e:
            start_error = "cannot reach the solution's server: %s" % e
        out = sock.fileno()

        def send(data):
            sock.sendall(data)
    # before the solution's server imports anything: no process of an earlier command alive, none tracing us
    strays = census(exclude=(server_pid,) if isinstance(server_pid, int) else ())  # noqa: F821 - callserver's
    try:
        with open("/proc/self/status", "rb") as f:
            traced = [ln for ln in f.read().splitlines() if ln.startswith(b"TracerPid:")]
        if traced and traced[0].split()[1:] != [b"0"]:
            strays.append([-1, "tracer of the runner: " + traced[0].decode("ascii", "replace")])
    except OSError:
        pass
    if not req.get("connect"):
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
    callables = []
    try:
        if start_error:
            raise _CallFailed("error", start_error)
        send((_json.dumps(header) + "\n").encode())
        ready = reply(_time.monotonic() + timeout_s + 5)
        import_error = ready.get("error")
        callables = [str(n) for n in ready.get("names") or [] if isinstance(n, str)]
        strays += [s for s in ready.get("strays") or [] if isinstance(s, list)]
    except (_CallFailed, OSError, ValueError) as e:
        import_error = "the solution's server did not start: %s" % e
    counter = [0]
    failures = []  # the current test's failed calls: the test's result whatever its code caught

    def proxy(name):
        def call(*args, **kwargs):
            if failures:  # the test's result is decided (its first failed call): a later call is not run
                raise _CallFailed(failures[0].status, "not run: an earlier call of this test failed (%s)"
                                  % failures[0])
            counter[0] += 1
            try:
                a, kw = encode(list(args)), encode(dict(kwargs))  # noqa: F821
            except NotPlainData as e:  # noqa: F821
                raise _CallFailed("error", "an argument to %s is not plain data: %s" % (name, e)) from None
            try:
                send((_json.dumps({"i": counter[0], "func": name, "args": a, "kwargs": kw}) + "\n").encode())
                msg = reply(_time.monotonic() + timeout_s + 5)
            except _CallFailed as e:
                failures.append(e)
                raise
            except (OSError, ValueError) as e:
                failures.append(_CallFailed("no_result", "the solution's server failed: %s" % e))
                raise failures[-1] from None
            events.extend(str(e) for e in msg.get("events") or [])
            status = msg.get("status")
            if status == "ok":
                return decode(msg.get("value"))  # noqa: F821
            if status == "error" and msg.get("exc") and msg.get("exc") != "SystemExit":
                raise _solution_error(msg["exc"], msg.get("error"))  # the test may expect this exception
            failures.append(_CallFailed("fail" if status == "not_plain" else
                                        status if status in ("timeout", "no_result") else "error", msg.get("error")))
            raise failures[-1]
        call.__name__ = name
        return call

    own_error = None
    try:
        own = _own_module(req["module"], req.get("own_source") or "")
    except BaseException as e:  # noqa: BLE001 - the task's own code must run; if it does not, nothing passes
        own, own_error = _types.ModuleType(req["module"]), "the task's own code failed in the runner: %s" % _tb(e)  # noqa: F821 - callserver's
    entries = set(req.get("entry_points") or [])
    offered = set(callables)
    for name in req.get("call_names") or []:
        # the functions the tests are meant to call: the entry points, and names the tests use that neither the
        # task's own code nor the builtins define
        if name in offered and (name in entries or (name not in vars(own) and not hasattr(_builtins, name))):
            setattr(own, name, proxy(name))
    _sys.modules[req["module"]] = own
    for t in req["tests"]:
        events = []
        del failures[:]
        res = {"name": t["name"], "status": "pass", "error": None}
        if strays:
            res.update(status="no_result", error="processes of an earlier command were alive when the isolated "
                                                 "path started: %s" % (strays[:5],))
            events.append("process_alive")
        elif own_error or import_error:
            res.update(status="error", error=own_error or import_error)
        else:
            ns = {"__name__": "__flywheel_test__", "__builtins__": _builtins,
                  **{k: v for k, v in vars(own).items() if not (k.startswith("__") and k.endswith("__"))}}
            try:
                exec(compile(t["code"], "<test " + t["name"] + ">", "exec"), ns)
            except _CallFailed as e:
                res.update(status=e.status, error=str(e))
            except AssertionError as e:
                res.update(status="fail", error=_tb(e))  # noqa: F821 - callserver's
            except BaseException as e:  # noqa: BLE001 - the test's own error
                res.update(status="error", error=_tb(e))  # noqa: F821 - callserver's
            if failures and res["status"] == "pass":  # the test caught a failed call: the call's failure stands
                res.update(status=failures[0].status, error="%s (caught by the test)" % failures[0])
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
    _sys.stdout.write(MARKER + " " + _json.dumps({"token": token, "secret": secret, "guarded": guarded,  # noqa: F821 - callserver's
                                                  "uid_split": split, "strays": strays, "results": results}) + "\n")
    _sys.stdout.flush()
    _os._exit(0)
