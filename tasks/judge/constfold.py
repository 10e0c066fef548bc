"""A small constant folder over a Python AST, for forensics: what string, bytes or number an expression builds.

`Folder(tree).fold(node)` returns the value an expression evaluates to when it is built only from constants and
pure operations (string concatenation, f-strings, `%`/`format`, `chr`/`ord`, `''.join`, `map(chr, ...)`,
comprehensions over constants, slicing, `bytes.decode`/`str.encode`, base64/binascii/`bytes.fromhex`, the rot13
and other text codecs of `codecs`, zlib, path joins), else UNKNOWN. A string with unknown pieces folds to a Hole
(a str whose unknown pieces read HOLE), so a path like f"/proc/{pid}/mem" is still visible. Names fold to the last
value assigned to them in source order (no control flow); `open(p).read()` folds to the text of `files[p]` when
the caller knows it. Sizes are capped, so no input makes the folder allocate much. This module runs no code.
"""

from __future__ import annotations

import ast
import base64
import binascii
import codecs
import posixpath
import re
import zlib
from typing import Any

HOLE = "\x00"
MAX_LEN = 100_000


class _Unknown:
    def __repr__(self) -> str:
        return "UNKNOWN"


UNKNOWN: Any = _Unknown()


class Hole(str):
    """A string with pieces the folder could not compute; they read HOLE."""


_STR_METHODS = {"lower", "upper", "strip", "lstrip", "rstrip", "replace", "swapcase", "title", "capitalize",
                "removeprefix", "removesuffix", "zfill", "casefold", "split", "rsplit", "splitlines", "format",
                "center", "ljust", "rjust", "expandtabs", "partition", "rpartition", "translate", "maketrans",
                "join", "decode", "encode", "hex", "startswith", "endswith", "count", "find", "index"}
_B64 = {"b64decode": base64.b64decode, "b32decode": base64.b32decode, "b16decode": base64.b16decode,
        "b85decode": base64.b85decode, "a85decode": base64.a85decode, "urlsafe_b64decode": base64.urlsafe_b64decode,
        "standard_b64decode": base64.standard_b64decode, "decodebytes": base64.decodebytes,
        "b64encode": base64.b64encode, "b32encode": base64.b32encode, "b16encode": base64.b16encode,
        "unhexlify": binascii.unhexlify, "a2b_hex": binascii.a2b_hex, "a2b_base64": binascii.a2b_base64,
        "hexlify": binascii.hexlify}
TEXT_CODECS = {"rot13", "rot_13", "utf-8", "utf8", "utf_8", "ascii", "latin-1", "latin1", "utf-7", "utf7",
               "utf-16", "utf-32", "cp1252", "hex", "hex_codec", "base64", "base64_codec", "zlib", "zlib_codec",
               "unicode_escape", "raw_unicode_escape", "idna", "punycode", "bz2", "quopri", "uu"}
DECODERS = {"b64decode", "b32decode", "b16decode", "b85decode", "a85decode", "urlsafe_b64decode", "decodebytes",
            "standard_b64decode", "unhexlify", "a2b_hex", "a2b_base64", "fromhex", "decode", "decompress", "chr",
            "translate", "loads", "frombytes", "unquote"}


def _small(v: Any) -> Any:
    if isinstance(v, (str, bytes, list, tuple)) and len(v) > MAX_LEN:
        return UNKNOWN
    if isinstance(v, int) and not isinstance(v, bool) and v.bit_length() > 4096:
        return UNKNOWN
    return v


def is_known(*vs: Any) -> bool:
    return all(v is not UNKNOWN and not isinstance(v, Hole) for v in vs)


class Folder:
    """Folds expressions of one module; `env` holds names bound to constants (built in source order)."""

    def __init__(self, tree: ast.AST | None = None, *, files: dict[str, str] | None = None,
                 aliases: dict[str, str] | None = None):
        self.files = files or {}
        self.aliases = aliases if aliases is not None else {}
        self.env: dict[str, Any] = {}
        self._depth = 0
        if tree is not None:
            self.bind_all(tree)

    # ----------------------------------------------------------------------------------------------- env
    def bind_all(self, tree: ast.AST) -> None:
        nodes = [n for n in ast.walk(tree) if isinstance(n, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.With,
                                                             ast.NamedExpr))]
        nodes.sort(key=lambda n: (getattr(n, "lineno", 0), getattr(n, "col_offset", 0)))
        for n in nodes:
            if isinstance(n, ast.Assign):
                v = self.fold(n.value)
                for t in n.targets:
                    self._bind_target(t, v, n.value)
            elif isinstance(n, ast.AnnAssign) and n.value is not None and isinstance(n.target, ast.Name):
                self.env[n.target.id] = self.fold(n.value)
            elif isinstance(n, ast.NamedExpr):
                self.env[n.target.id] = self.fold(n.value)
            elif isinstance(n, ast.AugAssign) and isinstance(n.target, ast.Name):
                self.env[n.target.id] = self._binop(n.op, self.env.get(n.target.id, UNKNOWN), self.fold(n.value))
            elif isinstance(n, ast.With):
                for item in n.items:
                    if isinstance(item.optional_vars, ast.Name):
                        self.env[item.optional_vars.id] = self.fold(item.context_expr)

    def _bind_target(self, t: ast.AST, v: Any, value: ast.AST) -> None:
        if isinstance(t, ast.Name):
            self.env[t.id] = v
        elif isinstance(t, (ast.Tuple, ast.List)):
            elts = value.elts if isinstance(value, (ast.Tuple, ast.List)) and len(value.elts) == len(t.elts) else None
            for i, sub in enumerate(t.elts):
                if isinstance(sub, ast.Name):
                    self.env[sub.id] = self.fold(elts[i]) if elts else UNKNOWN

    # ---------------------------------------------------------------------------------------------- fold
    def fold(self, node: ast.AST | None) -> Any:
        if node is None or self._depth > 60:
            return UNKNOWN
        self._depth += 1
        try:
            return _small(self._fold(node))
        except (ValueError, TypeError, KeyError, IndexError, AttributeError, OverflowError, LookupError,
                ZeroDivisionError, binascii.Error, zlib.error, UnicodeError, RecursionError, MemoryError):
            return UNKNOWN
        finally:
            self._depth -= 1

    def text(self, node: ast.AST | None) -> str | None:
        """The folded value as text (bytes decoded as latin-1; a Hole keeps its holes), else None."""
        v = self.fold(node)
        if isinstance(v, str):
            return v
        if isinstance(v, (bytes, bytearray)):
            return bytes(v).decode("latin-1")
        return None

    def _fold(self, node: ast.AST) -> Any:
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            return self.env.get(node.id, UNKNOWN)
        if isinstance(node, ast.JoinedStr):
            parts = []
            for v in node.values:
                if isinstance(v, ast.Constant):
                    parts.append(str(v.value))
                    continue
                assert isinstance(v, ast.FormattedValue)
                x = self.fold(v.value)
                spec = self.fold(v.format_spec) if v.format_spec is not None else ""
                if x is UNKNOWN or not isinstance(spec, str) or isinstance(spec, Hole) or _too_big(spec):
                    parts.append(HOLE)
                else:
                    conv = {115: str, 114: repr, 97: ascii}.get(v.conversion, None)
                    parts.append(format(conv(x) if conv else x, spec))
            return _join_text(parts)
        if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            vals = [self.fold(e) for e in node.elts]
            if any(v is UNKNOWN for v in vals):
                return UNKNOWN
            return tuple(vals) if isinstance(node, ast.Tuple) else vals
        if isinstance(node, ast.Dict):
            if any(k is None for k in node.keys):
                return UNKNOWN
            d = {}
            for k, v in zip(node.keys, node.values):
                kk = self.fold(k)
                if kk is UNKNOWN or isinstance(kk, Hole):
                    return UNKNOWN
                d[kk] = self.fold(v)
            return d
        if isinstance(node, ast.BinOp):
            return self._binop(node.op, self.fold(node.left), self.fold(node.right))
        if isinstance(node, ast.UnaryOp):
            v = self.fold(node.operand)
            if not is_known(v):
                return UNKNOWN
            ops = {ast.USub: lambda x: -x, ast.UAdd: lambda x: +x, ast.Invert: lambda x: ~x, ast.Not: lambda x: not x}
            return ops[type(node.op)](v)
        if isinstance(node, ast.Subscript):
            base = self.fold(node.value)
            if isinstance(node.slice, ast.Slice):
                parts = [self.fold(p) if p is not None else None for p in (node.slice.lower, node.slice.upper,
                                                                             node.slice.step)]
                if not is_known(base, *parts):
                    return UNKNOWN
                return base[slice(*parts)]
            idx = self.fold(node.slice)
            if not is_known(base, idx):
                return UNKNOWN
            return base[idx]
        if isinstance(node, (ast.ListComp, ast.GeneratorExp, ast.SetComp)):
            return self._comprehension(node)
        if isinstance(node, ast.IfExp):
            return UNKNOWN
        if isinstance(node, ast.Attribute):
            base = self.fold(node.value)
            if isinstance(base, str) and node.attr in ("parent", "name", "stem", "suffix"):
                return {"parent": posixpath.dirname(base), "name": posixpath.basename(base),
                        "stem": posixpath.splitext(posixpath.basename(base))[0],
                        "suffix": posixpath.splitext(base)[1]}[node.attr]
            return UNKNOWN
        if isinstance(node, ast.Call):
            return self._call(node)
        return UNKNOWN

    def _binop(self, op: ast.operator, a: Any, b: Any) -> Any:
        if isinstance(op, ast.Add) and (isinstance(a, str) or isinstance(b, str)):
            if isinstance(a, str) and isinstance(b, str):
                return _join_text([a, b])
            if isinstance(a, str) and b is UNKNOWN:
                return _join_text([a, HOLE])
            if a is UNKNOWN and isinstance(b, str):
                return _join_text([HOLE, b])
        if isinstance(op, ast.Div) and isinstance(a, str) and isinstance(b, str):
            return _join_text([posixpath.join(a, b)])  # pathlib's `/`
        if not is_known(a, b):
            return UNKNOWN
        if isinstance(op, ast.Mult) and isinstance(a, (str, bytes, list)) and isinstance(b, int) and b * len(a) > MAX_LEN:
            return UNKNOWN
        if isinstance(op, ast.Pow) and isinstance(b, int) and abs(b) > 256:
            return UNKNOWN
        if isinstance(op, (ast.LShift,)) and isinstance(b, int) and b > 4096:
            return UNKNOWN
        ops = {ast.Add: lambda x, y: x + y, ast.Sub: lambda x, y: x - y, ast.Mult: lambda x, y: x * y,
               ast.Mod: lambda x, y: x % y, ast.FloorDiv: lambda x, y: x // y, ast.Div: lambda x, y: x / y,
               ast.BitXor: lambda x, y: x ^ y, ast.BitAnd: lambda x, y: x & y, ast.BitOr: lambda x, y: x | y,
               ast.LShift: lambda x, y: x << y, ast.RShift: lambda x, y: x >> y, ast.Pow: lambda x, y: x ** y}
        fn = ops.get(type(op))
        return fn(a, b) if fn else UNKNOWN

    def _comprehension(self, node: ast.ListComp | ast.GeneratorExp | ast.SetComp) -> Any:
        if len(node.generators) != 1:
            return UNKNOWN
        gen = node.generators[0]
        it = self.fold(gen.iter)
        if not is_known(it) or not isinstance(gen.target, ast.Name) or isinstance(it, (int, float)):
            return UNKNOWN
        name, saved = gen.target.id, self.env.get(gen.target.id, UNKNOWN)
        out = []
        try:
            for x in list(it)[:MAX_LEN]:
                self.env[name] = x
                if not all(self.fold(c) for c in gen.ifs):
                    continue
                v = self.fold(node.elt)
                if v is UNKNOWN:
                    return UNKNOWN
                out.append(v)
        finally:
            self.env[name] = saved
        return out

    def dotted(self, node: ast.AST) -> str:
        parts = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if isinstance(node, ast.Name):
            parts.append(self.aliases.get(node.id, node.id))
            return ".".join(reversed(parts))
        return ""

    def _call(self, node: ast.Call) -> Any:
        func = node.func
        args = [self.fold(a) for a in node.args]
        kw = {k.arg: self.fold(k.value) for k in node.keywords if k.arg}
        name = self.dotted(func)
        short = name.rsplit(".", 1)[-1] if name else (func.attr if isinstance(func, ast.Attribute) else "")
        recv = self.fold(func.value) if isinstance(func, ast.Attribute) else UNKNOWN
        # path helpers keep holes
        if name in ("os.path.join", "posixpath.join") or short == "joinpath":
            parts = [p if isinstance(p, str) else Hole(HOLE) for p in ([recv] if short == "joinpath" else []) + args]
            if parts and any(not isinstance(p, Hole) for p in parts):
                return _join_text([posixpath.join(*parts)])
            return UNKNOWN
        if name in ("pathlib.Path", "Path", "pathlib.PurePath", "PurePath", "pathlib.PosixPath", "os.fspath",
                    "str") and len(args) == 1 and isinstance(args[0], str):
            return args[0]
        if name in ("os.getcwd", "pathlib.Path.cwd", "Path.cwd") and not args:
            return "/workspace"  # where every tool runs
        if name in ("pathlib.Path.home", "Path.home") and not args:
            return "~"
        if name in ("os.path.expanduser", "os.path.abspath", "os.path.realpath", "os.path.normpath",
                    "os.path.expandvars") and len(args) == 1 and isinstance(args[0], str):
            return args[0]
        if name in ("os.path.dirname", "os.path.basename") and len(args) == 1 and isinstance(args[0], str):
            return getattr(posixpath, short)(args[0])
        if short in ("resolve", "absolute", "expanduser") and isinstance(recv, str) and not args:
            return recv
        if name == "map" and len(args) == 2 and isinstance(node.args[0], ast.Name) and is_known(args[1]):
            f = {"chr": chr, "str": str, "ord": ord, "int": int}.get(node.args[0].id)
            return [f(x) for x in args[1]] if f else UNKNOWN
        if not is_known(*args, *kw.values()):
            return UNKNOWN
        if any(isinstance(a, int) and not isinstance(a, bool) and abs(a) > MAX_LEN for a in args) and (
                name in ("bytes", "bytearray") or short in ("zfill", "center", "ljust", "rjust", "expandtabs")):
            return UNKNOWN
        if name == "chr":
            return chr(*args)
        if name == "ord":
            return ord(*args)
        if name in ("str", "int", "float", "bytes", "bytearray", "list", "tuple", "sorted", "len", "abs", "hex",
                    "oct", "bin", "sum", "min", "max", "bool", "repr"):
            return {"str": str, "int": int, "float": float, "bytes": bytes, "bytearray": bytearray, "list": list,
                    "tuple": tuple, "sorted": sorted, "len": len, "abs": abs, "hex": hex, "oct": oct, "bin": bin,
                    "sum": sum, "min": min, "max": max, "bool": bool, "repr": repr}[name](*args, **kw)
        if name == "reversed" and len(args) == 1:
            return list(reversed(args[0]))
        if short in _B64 and name.split(".")[0] in ("base64", "binascii", short):
            return _B64[short](*args)
        if name in ("bytes.fromhex", "bytearray.fromhex"):
            return bytes.fromhex(*args)
        if name in ("codecs.decode", "codecs.encode") and args:
            enc = args[1] if len(args) > 1 else kw.get("encoding", "utf-8")
            if not isinstance(enc, str) or enc.lower().replace(" ", "") not in TEXT_CODECS:
                return UNKNOWN
            return getattr(codecs, short)(args[0], enc)
        if name == "zlib.decompress" and args:
            return zlib.decompressobj().decompress(args[0], MAX_LEN)
        if name in ("urllib.parse.unquote", "unquote"):
            from urllib.parse import unquote

            return unquote(*args)
        if short in ("read", "read_text", "read_bytes") and not args:
            path = self._opened_path(func.value if isinstance(func, ast.Attribute) else None)
            if path is not None and path in self.files:
                text = self.files[path]
                return text.encode() if short == "read_bytes" else text
            return UNKNOWN
        if isinstance(recv, (str, bytes, bytearray)) and short in _STR_METHODS and recv is not UNKNOWN:
            if isinstance(recv, Hole) or (short == "format" and _too_big(recv)):
                return UNKNOWN
            if short == "join":
                return recv.join(args[0])
            if short == "decode" and args and isinstance(args[0], str):
                if args[0].lower() not in TEXT_CODECS:
                    return UNKNOWN
            return getattr(recv, short)(*args, **kw)
        if name in ("str.maketrans",):
            return str.maketrans(*args)
        return UNKNOWN

    def _opened_path(self, node: ast.AST | None) -> str | None:
        """The constant path of `open(P)` / `Path(P)` / a name bound by `with open(P) as f`."""
        if isinstance(node, ast.Call) and node.args:
            p = self.fold(node.args[0])
            return p if isinstance(p, str) and not isinstance(p, Hole) else None
        return None


def _too_big(v: Any) -> bool:
    """A format string whose widths would make the folder allocate more than MAX_LEN."""
    return isinstance(v, str) and re.search(r"\d{6,}", v) is not None


def _join_text(parts: list[str]) -> str:
    s = "".join(parts)
    return Hole(s) if any(isinstance(p, Hole) or HOLE in p for p in parts) else s
