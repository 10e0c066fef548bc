"""Plain data across the sandbox wall: a strict, tagged JSON encoding of values, and equality on plain values.

Standard library only: this file's source also runs INSIDE sandboxes (tasks/judge/unittests.py sends it before
callserver.py), where it encodes what a solution's call returned. Plain data is None, bool, int, float (NaN and infinities too), complex,
str, bytes, list, tuple, dict, set and frozenset, nested, checked by exact type. A few standard-library subclasses
that keep their base's equality (namedtuples, OrderedDict, defaultdict, Counter) travel as their base type; any
other value (an object with a forged `__eq__`, a generator, a user class, a subclass that overrides equality)
raises NotPlainData naming its type. `decode` rebuilds values on the host and rejects anything malformed, so what
the host compares is made of builtin types alone, whatever ran in the sandbox. `equal` compares plain values
exactly (Python's `==`) or with a float tolerance. This module runs nothing and judges nothing.
"""

import base64
import math

MAX_DEPTH = 64
MAX_ITEMS = 1_000_000


class NotPlainData(ValueError):
    """A value that is not plain data; `type_name` names what it was."""

    def __init__(self, type_name, why=""):
        self.type_name = type_name
        super().__init__("result is not plain data: %s%s" % (type_name, (" (" + why + ")") if why else ""))


_BASES = {list: "l", tuple: "t", dict: "d", set: "S", frozenset: "F"}


def _plain_base(obj):
    """The builtin type `obj` may travel as, or None: itself, or the base of a known equality-keeping subclass."""
    t = type(obj)
    if t in _BASES:
        return t
    if isinstance(obj, dict) and t.__module__ == "collections" and t.__name__ in ("OrderedDict", "defaultdict",
                                                                                  "Counter"):
        return dict  # each compares with a plain dict exactly as dict does
    if isinstance(obj, tuple) and hasattr(t, "_fields") and all(
            getattr(t, m) is getattr(tuple, m) for m in ("__eq__", "__ne__", "__hash__")):
        return tuple  # a namedtuple
    return None


def encode(obj, _depth=0, _count=None):
    """`obj` as JSON-ready tagged lists, e.g. ["i", "0x2a"]; raises NotPlainData for anything else."""
    count = _count if _count is not None else [0]
    count[0] += 1
    if count[0] > MAX_ITEMS:
        raise NotPlainData(type(obj).__name__, "more than %d items" % MAX_ITEMS)
    if _depth > MAX_DEPTH:
        raise NotPlainData(type(obj).__name__, "nested deeper than %d" % MAX_DEPTH)
    t = type(obj)
    if obj is None:
        return ["N"]
    if t is bool:
        return ["b", obj]
    if t is int:
        return ["i", hex(obj)]
    if t is float:
        return ["f", obj.hex()]
    if t is complex:
        return ["c", obj.real.hex(), obj.imag.hex()]
    if t is str:
        return ["s", obj]
    if t is bytes:
        return ["y", base64.b64encode(obj).decode("ascii")]
    base = _plain_base(obj)
    if base is None:
        raise NotPlainData("%s.%s" % (t.__module__, t.__qualname__) if t.__module__ != "builtins" else t.__name__)
    if base is dict:
        return ["d", [[encode(k, _depth + 1, count), encode(v, _depth + 1, count)] for k, v in dict.items(obj)]]
    items = list(base.__iter__(obj))
    return [_BASES[base], [encode(x, _depth + 1, count) for x in items]]


def decode(data, _depth=0):
    """The plain value of an encoded one; ValueError for anything malformed (a wrong tag, type or shape)."""
    if _depth > MAX_DEPTH + 1:
        raise ValueError("encoded value nested too deep")
    if type(data) is not list or not data or type(data[0]) is not str:
        raise ValueError("an encoded value is a list starting with its tag, not %r" % (type(data).__name__,))
    tag, rest = data[0], data[1:]

    def one(kind):
        if len(rest) != 1 or type(rest[0]) is not kind:
            raise ValueError("tag %r needs one %s" % (tag, kind.__name__))
        return rest[0]

    if tag == "N" and not rest:
        return None
    if tag == "b":
        return one(bool)
    if tag == "i":
        return int(one(str), 16)
    if tag == "f":
        return float.fromhex(one(str))
    if tag == "c":
        if len(rest) != 2 or not all(type(x) is str for x in rest):
            raise ValueError("tag 'c' needs two hex floats")
        return complex(float.fromhex(rest[0]), float.fromhex(rest[1]))
    if tag == "s":
        return one(str)
    if tag == "y":
        return base64.b64decode(one(str).encode("ascii"), validate=True)
    if tag in ("l", "t", "S", "F"):
        items = [decode(x, _depth + 1) for x in one(list)]
        return {"l": list, "t": tuple, "S": set, "F": frozenset}[tag](items)
    if tag == "d":
        out = {}
        for pair in one(list):
            if type(pair) is not list or len(pair) != 2:
                raise ValueError("a dict item is a [key, value] pair")
            out[decode(pair[0], _depth + 1)] = decode(pair[1], _depth + 1)
        return out
    raise ValueError("unknown tag %r" % (tag,))


def equal(got, expected, tolerance=0.0):
    """`got == expected` on plain values; with tolerance > 0, numbers (not bools) inside match within it."""
    if tolerance <= 0:
        return got == expected
    num = (int, float)
    if type(got) in num and type(expected) in num and (type(got) is float or type(expected) is float):
        return math.isclose(got, expected, rel_tol=tolerance, abs_tol=tolerance)
    if type(got) in (list, tuple) and type(expected) in (list, tuple):
        return (type(got) is type(expected) and len(got) == len(expected)
                and all(equal(g, e, tolerance) for g, e in zip(got, expected)))
    if type(got) is dict and type(expected) is dict:
        return got.keys() == expected.keys() and all(equal(got[k], expected[k], tolerance) for k in got)
    return got == expected


def short(value, limit=200):
    """A repr of a plain value cut to `limit` characters, for verifier details."""
    try:
        r = repr(value)
    except Exception as e:  # noqa: BLE001 - a repr that fails is reported, not raised
        r = "<unrepresentable: %s>" % type(e).__name__
    return r if len(r) <= limit else r[:limit] + "..."
