"""Enter a running local sandbox and run one command in it: how every `exec`, file write and zygote of the local
backend (sandbox/local.py) gets inside, like `docker exec` does.

Run by the host's python3 -S as `python3 -S -c SOURCE HOLDER_PID STATUS_FD SPEC COMMAND...` (sandbox/programs.py).
It joins the namespaces of the holder (first the user namespace that owns them, then the sandbox's own nested
one), chroots to its root, writes "ok" on STATUS_FD (or why it could not enter, then exits 125), forks (to land in
the pid namespace), and in the child applies SPEC, a JSON object (rlimits, CPU affinity, uid/gid, environment,
working directory; the sandbox's pid namespace, checked first against pid reuse), sets no-new-privileges and a
death signal, and execs the command. The parent waits and exits with the child's status (re-raising its signal), so
the host sees the command's exit status. Standard library only; it decides no limit itself.
"""

# No `from __future__ import annotations`: importing __future__ costs a start that runs once per `exec` call; the
# annotations here evaluate on any python3 >= 3.9 (as os.waitstatus_to_exitcode needs anyway).
import ctypes
import fcntl
import json
import os
import resource
import signal
import sys

NS_GET_USERNS = 0xB701
PR_SET_NO_NEW_PRIVS, PR_SET_PDEATHSIG = 38, 1
NAMESPACES = ("user", "mnt", "pid", "net", "ipc", "uts")


def _setns(libc: ctypes.CDLL, fd: int, what: str) -> None:
    if libc.setns(fd, 0) != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"setns({what}): {os.strerror(e)}")


def _join(libc: ctypes.CDLL, holder: str, spec: dict) -> None:
    """Join the holder's namespaces and root; raises OSError when it is not the sandbox's PID 1 any more."""
    ns = {n: os.open(f"/proc/{holder}/ns/{n}", os.O_RDONLY | os.O_CLOEXEC) for n in NAMESPACES}
    root = os.open(f"/proc/{holder}/root", os.O_RDONLY | os.O_CLOEXEC | os.O_DIRECTORY)
    # the pid may have been reused by another process: go on only if it still is this sandbox's PID 1
    if (f"pid:[{os.fstat(ns['pid']).st_ino}]" != spec["pidns"]
            or os.readlink(f"/proc/{holder}/ns/pid") != spec["pidns"]):
        raise OSError(3, f"process {holder} is no longer the sandbox's PID 1")
    owner = fcntl.ioctl(ns["mnt"], NS_GET_USERNS)  # the user namespace owning the sandbox's namespaces
    if os.fstat(owner).st_ino != os.stat("/proc/self/ns/user").st_ino:
        _setns(libc, owner, "owner user")
    for n in ("mnt", "pid", "net", "ipc", "uts"):
        _setns(libc, ns[n], n)
    if os.fstat(owner).st_ino != os.fstat(ns["user"]).st_ino:
        _setns(libc, ns["user"], "user")
    os.fchdir(root)
    os.chroot(".")
    os.chdir(spec["cwd"])


def _become(libc: ctypes.CDLL, spec: dict, argv: list[str], parent: int) -> None:
    """In the forked child: apply the spec and exec the command (never returns)."""
    try:
        for name, (soft, hard) in spec["rlimits"].items():
            resource.setrlimit(getattr(resource, name), (soft, hard))
        if spec["cpus"]:
            os.sched_setaffinity(0, spec["cpus"])
        os.setgid(spec["gid"])
        os.setuid(spec["uid"])
        libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # after setuid, which clears it
        if os.getppid() != parent and os.getppid() != 0:
            os._exit(137)
        os.execvpe(argv[0], argv, spec["env"])
    except FileNotFoundError:
        os.write(2, (f"{argv[0]}: command not found\n").encode())
        os._exit(127)
    except OSError as e:
        os.write(2, (f"cannot run {argv[0]}: {e}\n").encode())
        os._exit(126)


def main(args: list[str]) -> None:
    """`HOLDER_PID STATUS_FD SPEC COMMAND...`: enter, run, exit with the command's status."""
    holder, status_fd, spec, argv = args[0], int(args[1]), json.loads(args[2]), args[3:]
    if os.geteuid() == 0:
        os.setgroups([])  # root's supplementary groups never enter a sandbox
    libc = ctypes.CDLL(None, use_errno=True)
    try:
        _join(libc, holder, spec)
    except OSError as e:
        os.write(status_fd, (f"cannot enter sandbox {holder}: {e}").encode())
        os._exit(125)
    os.write(status_fd, b"ok")
    os.close(status_fd)
    parent = os.getpid()
    child = os.fork()
    if child == 0:
        _become(libc, spec, argv, parent)
    while True:
        try:
            _, status = os.waitpid(child, 0)
            break
        except InterruptedError:
            continue
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if sig not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    os._exit(os.waitstatus_to_exitcode(status))


if __name__ == "__main__":  # run as `python3 -c SOURCE ARG...` (sandbox/programs.py)
    main(sys.argv[1:])
