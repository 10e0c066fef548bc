"""The vocabulary of forensics' Python reader: the calls, modules and dunders it looks for (exits, hooks, patches,
lookups, code from data), and the Resolver that names what an expression refers to through aliases, getattr,
__import__ and sys.modules. Shared by tasks/judge/forensics_python.py and tasks/judge/forensics_reach.py; runs no
code and finds nothing by itself.
"""

from __future__ import annotations

import ast
from typing import Any

from tasks.judge.constfold import Folder, Hole

CMP_DUNDERS = ("__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__")
# signal.alarm/setitimer are not here: a self-timeout is honest, and a process the alarm kills gives the judge no
# result (never a pass; the call server reports it as process_exit, an early_exit at run time)
EXIT_CALLS = {"sys.exit", "exit", "quit", "os._exit", "os.abort", "os.kill", "os.killpg", "signal.raise_signal",
              "signal.pthread_kill", "builtins.exit", "builtins.quit",
              "_thread.interrupt_main", "posix._exit", "posix.kill", "posix.abort", "os.system('kill"}
# the calls that end a process a solution forked itself (`if pid == 0: ...; os._exit(0)`): a worker's own end
CHILD_EXITS = {"os._exit", "posix._exit", "sys.exit", "exit", "quit", "builtins.exit", "builtins.quit"}
FORK_CALLS = {"os.fork", "posix.fork", "os.forkpty", "pty.fork"}
# calls that return descriptors the code opened itself (os.write on them borrows nothing)
OWN_FD_CALLS = {"os.pipe", "os.pipe2", "os.open", "os.dup", "os.openpty", "os.memfd_create", "os.eventfd",
                "posix.pipe", "posix.open", "pty.openpty"}
LOOKUP_CALLS = {"sys._getframe", "inspect.currentframe", "inspect.stack", "inspect.getouterframes", "inspect.trace",
                "traceback.extract_stack", "traceback.walk_stack", "gc.get_objects", "gc.get_referrers",
                "gc.get_referents", "readline.get_history_item", "sys._current_frames"}
# calls that hook the interpreter the tests run in (flagged in code the tests import; trace hooks everywhere).
# atexit.register and signal.signal are judged apart (_hook_is_honest): an atexit handler that only cleans up and
# a handler of the timer signals (a SIGALRM self-timeout) are honest; one that prints, writes a descriptor or exits,
# or a handler of any other signal (SIGTERM ignored), is not
HONEST_HOOKS = {"atexit.register", "signal.signal"}
TIMER_SIGNALS = {"SIGALRM", "SIGVTALRM", "SIGPROF"}
HOOK_CALLS = {"sys.settrace", "sys.setprofile", "threading.settrace", "threading.setprofile", "sys.addaudithook",
              "os.register_at_fork", "atexit.register", "signal.signal", "faulthandler.register",
              "sys.monitoring.register_callback", "sys.monitoring.use_tool_id", "sys.set_asyncgen_hooks",
              "threading.excepthook", "sys.unraisablehook"}
# modules whose attributes code under test must not assign (sys.path, os.environ: ordinary configuration)
PATCH_MODULES = ("builtins.", "unittest.", "pytest.", "_pytest.", "operator.", "math.", "doctest.", "sys.",
                 "numpy.testing", "numpy.allclose", "numpy.isclose", "numpy.array_equal", "os.", "posix.", "json.",
                 "signal.", "atexit.", "traceback.", "io.", "subprocess.", "gc.", "inspect.", "importlib.", "types.",
                 "functools.", "threading.", "time.", "marshal.", "pickle.", "copy.", "re.", "collections.",
                 "itertools.", "random.", "typing.", "__main__.")
PATCH_ALLOWED = ("os.environ", "sys.path", "sys.argv", "sys.dont_write_bytecode", "sys.ps1", "sys.ps2",
                 "sys.tracebacklimit", "sys.maxsize")
# modules where a computed attribute name hides what is reached (reads flagged), and where any write is a patch
SENSITIVE = {"builtins", "sys", "os", "posix", "signal", "subprocess", "ctypes", "_ctypes", "gc", "inspect",
             "importlib", "__main__", "_thread", "shutil", "unittest", "pytest", "_pytest", "atexit", "operator",
             "pty", "socket", "io", "_io", "pathlib", "glob", "marshal", "pickle"}
FD_CALLS = {"os.write", "os.read", "os.fdopen", "os.dup", "os.dup2", "os.lseek", "os.pwrite", "os.writev",
            "os.sendfile", "socket.fromfd", "socket.socket", "posix.write", "io.open", "io.FileIO", "open",
            "builtins.open", "os.ftruncate", "os.set_inheritable"}
CODE_FROM_DATA = {"marshal.loads", "pickle.loads", "_pickle.loads", "types.FunctionType", "types.CodeType",
                  "dill.loads", "cloudpickle.loads"}
EXEC_CALLS = {"exec", "eval", "compile", "builtins.exec", "builtins.eval", "builtins.compile"}
IMPORT_CALLS = {"__import__", "builtins.__import__", "importlib.import_module", "importlib.__import__"}
GETATTR_CALLS = {"getattr", "builtins.getattr", "object.__getattribute__", "type.__getattribute__",
                 "operator.attrgetter"}
SUPPORTED = [(3, m) for m in range(11, 15)]  # the Python versions a sandbox may run (requires-python >= 3.11)


class Resolver:
    """Dotted names of expressions, through aliases, getattr/vars/__dict__, __import__/import_module and
    sys.modules[...], with names built at run time folded by tasks.constfold. An unresolvable piece reads '?'."""

    def __init__(self, aliases: dict[str, str], folder: Folder, loops: dict[str, list[Any]] | None = None):
        self.aliases, self.folder, self.loops = aliases, folder, loops or {}

    def key(self, node: ast.AST | None) -> str:
        v = self.folder.fold(node)
        return v if isinstance(v, str) and not isinstance(v, Hole) and v else "?"

    def keys(self, node: ast.AST | None) -> list[str]:
        """Every name an argument may be: its folded value, or each value of the constant list a for loop binds
        it to (`for m in ('numpy', 'pandas'): import_module(m)`), else '?'."""
        k = self.key(node)
        if k == "?" and isinstance(node, ast.Name) and node.id in self.loops:
            vals = self.loops[node.id]
            return [v if isinstance(v, str) and v else "?" for v in vals] or ["?"]
        return [k]

    def name(self, node: ast.AST | None, depth: int = 0) -> str:
        if node is None or depth > 30:
            return ""
        if isinstance(node, ast.Name):
            if node.id == "__builtins__":
                return "builtins"
            return self.aliases.get(node.id, node.id)
        if isinstance(node, ast.Attribute):
            base = self.name(node.value, depth + 1)
            return f"{base}.{node.attr}" if base else ""
        if isinstance(node, ast.Subscript):
            base = self.name(node.value, depth + 1)
            if base == "sys.modules":
                return self.key(node.slice)
            if base.endswith(".__dict__"):
                return f"{base[:-len('.__dict__')]}.{self.key(node.slice)}"
            if base == "globals()" and self.key(node.slice) == "__builtins__":
                return "builtins"
            if base == "builtins":
                return f"builtins.{self.key(node.slice)}"
            return ""
        if isinstance(node, ast.Call):
            fn = self.name(node.func, depth + 1)
            if fn in GETATTR_CALLS and len(node.args) >= 2:
                base = self.name(node.args[0], depth + 1) or "?"
                return f"{base}.{self.key(node.args[1])}"
            if isinstance(node.func, ast.Attribute) and node.func.attr in ("__getattribute__", "__getattr__") \
                    and node.args:
                base = self.name(node.func.value, depth + 1) or "?"
                return f"{base}.{self.key(node.args[0])}"
            if fn in IMPORT_CALLS and node.args:
                return self.key(node.args[0])
            if fn == "sys.modules.get" and node.args:
                return self.key(node.args[0])
            if fn == "vars" and len(node.args) == 1:
                base = self.name(node.args[0], depth + 1)
                return f"{base}.__dict__" if base else ""
            if fn in ("globals", "builtins.globals"):
                return "globals()"
            return f"{fn}()" if fn else ""
        return ""
