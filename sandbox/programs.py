"""How the host starts an in-sandbox program (sandbox/guest/): its command line.

A program of sandbox/guest/ runs as `python3 [FLAGS] -c BOOT ENTRY N NAME SOURCE ... ARG...`
(sandbox/guest/boot.py), or, when it is one module, as `python3 [FLAGS] -c SOURCE ARG...` through that module's
`__main__` block (boot's own start-up is then not paid: the enter helper starts once per local `exec` call). The
module files are read from this package at run time and handed over with the command, so nothing of ours has to be
in the sandbox's image or on its (read-only) root, and the same text runs on the local and the Docker backend.
`PROGRAMS` lists, per program, the modules it needs (dependencies first); `FLAGS`, the interpreter's options it
runs with: unbuffered for the protocol speakers, no `site` for the small helpers that start often.
This module starts no process itself and decides no limit.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BOOT = "sandbox.guest.boot"
PROCFS = "sandbox.procfs"
PROGRAMS: dict[str, tuple[str, ...]] = {
    "kernel": (PROCFS, "sandbox.guest.kernel"),
    "zygote": (PROCFS, "sandbox.guest.reset", "sandbox.guest.kernel", "sandbox.guest.zygote"),
    "keeper": (PROCFS, "sandbox.guest.reset", "sandbox.guest.kernel", "sandbox.guest.pid1", "sandbox.guest.keeper"),
    "cleanup": (PROCFS, "sandbox.guest.cleanup"),
    "holder": ("sandbox.guest.holder",),
    "enter": ("sandbox.guest.enter",),
    "pid1": ("sandbox.guest.pid1",),
    "write": ("sandbox.guest.write",),
}

FLAGS: dict[str, tuple[str, ...]] = {"kernel": ("-u",), "zygote": ("-u",), "keeper": ("-u",), "cleanup": ("-S",),
                                     "holder": ("-S",), "enter": ("-S",), "pid1": ("-S",),
                                     "write": ("-S",)}


@cache
def source(module: str) -> str:
    """The text of one of our modules, by dotted name."""
    return (ROOT / (module.replace(".", "/") + ".py")).read_text(encoding="utf-8")


@cache
def _shipped(program: str) -> tuple[str, ...]:
    modules = PROGRAMS[program]
    if len(modules) == 1:
        return (source(modules[0]),)
    return (source(BOOT), modules[-1], str(len(modules)),
            *(x for m in modules for x in (m, source(m))))


def command(python: str, program: str, *args: str) -> list[str]:
    """The argv that runs `program` (a key of PROGRAMS) with `python` and the given arguments."""
    return [python, *FLAGS[program], "-c", *_shipped(program), *args]
