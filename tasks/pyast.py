"""`ast.parse` and `compile` of an AST behind one process-wide lock, for code that parses from many threads.

CPython 3.11 keeps the AST constructor's recursion depth in interpreter-wide state, so two threads converting
ASTs at once can fail with `SystemError: AST constructor recursion depth mismatch` (python/cpython#106905). Here
that happened when `flywheel verify --workers 4` ran forensics on several episodes at once, and when four threads
read BFCL's checker files. All host code parses through these two functions (tests/test_imports.py checks that
nothing else calls ast.parse); parsing is fast, so the lock costs little. This module does nothing else.
"""

from __future__ import annotations

import ast
import threading
from types import CodeType

_LOCK = threading.Lock()


def parse(source: str | bytes, filename: str = "<unknown>", mode: str = "exec") -> ast.AST:
    """ast.parse, one thread at a time."""
    with _LOCK:
        return ast.parse(source, filename=filename, mode=mode)


def compile_ast(tree: ast.AST, filename: str, mode: str) -> CodeType:
    """compile() of an AST object, one thread at a time."""
    with _LOCK:
        return compile(tree, filename, mode)
