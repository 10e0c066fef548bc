"""Start an in-sandbox program from the sources of its modules, handed over with the command: no file of ours has to
exist in the sandbox (its root is read-only, and its writable folders belong to the episode and are emptied).

The host (sandbox/programs.py) reads the program's module files from this package and runs
`python3 -c BOOT ENTRY N NAME SOURCE ... ARG...`, BOOT being the text of this file, ENTRY a module name
(`sandbox.guest.kernel`) and N pairs of a module name and its source following, dependencies first (plain arguments,
no JSON: the holder and the enter helper start with `-S` and import next to nothing). `run` installs the
modules under their own names (so they import each other as on the host: `from sandbox import procfs`), then
takes them out of `sys.modules` again, so the sandbox's own code never imports ours by accident nor has a module
named `sandbox` shadowed, and calls `ENTRY.main(ARGS)` with `sys.argv` set to `["-c"]`, as for `python3 -c`.
A program imports everything it needs at the top of its modules. A program of one module does not need this: it
runs as `python3 -c SOURCE ARG...` through its own `__main__` block.

Standard library only. This module decides nothing about what runs where.
"""

import sys


def install(modules: list[list[str]]) -> list[str]:
    """Execute each [name, source] as module `name` (parent packages made empty); the names it added."""
    added = []
    for name, source in modules:
        parts = name.split(".")
        for i in range(1, len(parts)):
            pkg = ".".join(parts[:i])
            if pkg not in sys.modules:
                package = type(sys)(pkg)
                package.__path__ = []
                sys.modules[pkg] = package
                added.append(pkg)
                if i > 1:
                    setattr(sys.modules[".".join(parts[: i - 1])], parts[i - 1], package)
        module = type(sys)(name)
        sys.modules[name] = module
        added.append(name)
        exec(compile(source, f"<{name}>", "exec", dont_inherit=True), module.__dict__)  # noqa: S102 - our own code
        if len(parts) > 1:
            setattr(sys.modules[".".join(parts[:-1])], parts[-1], module)
    return added


def run(entry: str, modules: list[list[str]], args: list[str]) -> None:
    """Install the modules, forget them, and run `entry`'s main(args)."""
    added = install(modules)
    program = sys.modules[entry]
    for name in added:
        sys.modules.pop(name, None)
    program.main(args)


if __name__ == "__main__":
    _n = int(sys.argv[2])
    _entry, _modules, _args = sys.argv[1], [sys.argv[3 + 2 * i : 5 + 2 * i] for i in range(_n)], sys.argv[3 + 2 * _n :]
    sys.argv[:] = ["-c"]
    run(_entry, _modules, _args)
