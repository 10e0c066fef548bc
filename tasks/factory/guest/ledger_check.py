"""The check of a ledger task (tasks/factory/ledger.py), run by tests/test.sh as /tests/ledger_check.py.

Reads /tests/expected.json ({"output": path, "groups": {group: number}}) and the agent's output file, parses it in
the format its extension names (.json: a JSON object, .csv: a `group,value` table, .txt: `group: value` lines)
and exits 0 only when it holds exactly the expected groups with the expected numbers (within 0.01), in the order
the format asks for. Standard library only; it writes no reward file (test.sh
does)."""

from __future__ import annotations

import json
import sys


def parse(text: str, fmt: str) -> list[tuple[str, float]]:
    """(group, number) pairs in file order; ValueError when the text is not in the format."""
    if fmt == "json":
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        return [(str(k), float(v)) for k, v in data.items()]
    lines = [line for line in text.splitlines() if line.strip()]
    if fmt == "csv":
        if not lines or lines[0].replace(" ", "") != "group,value":
            raise ValueError("the header must be 'group,value'")
        pairs = [line.split(",") for line in lines[1:]]
    else:
        pairs = [line.split(":", 1) for line in lines]
    if any(len(p) != 2 for p in pairs):
        raise ValueError("a line is not 'group<sep>value'")
    return [(g.strip(), float(v)) for g, v in pairs]


FORMATS = {"json": "json", "csv": "csv", "txt": "lines"}


def check(expected: dict, text: str) -> str | None:
    """Why the output is wrong, or None when it is right."""
    fmt = FORMATS[expected["output"].rsplit(".", 1)[-1]]
    try:
        got = parse(text, fmt)
    except ValueError as e:
        return f"unreadable output: {e}"
    want = expected["groups"]
    if sorted(g for g, _ in got) != sorted(want) or len(got) != len(want):
        return f"groups {sorted(g for g, _ in got)} != {sorted(want)}"
    for g, v in got:
        if abs(v - float(want[g])) > 0.01:
            return f"{g}: {v} is wrong"
    names = [g for g, _ in got]
    if fmt == "csv" and names != sorted(names):
        return "rows are not sorted by group"
    if fmt == "lines" and names != sorted(want, key=lambda g: (-float(want[g]), g)):
        return "lines are not ordered by value, largest first"
    return None


def main() -> int:
    with open("/tests/expected.json") as f:
        expected = json.load(f)
    try:
        with open(expected["output"]) as f:
            text = f.read()
    except OSError as e:
        print(f"no output: {e}")
        return 1
    why = check(expected, text)
    print(why or "ok")
    return 1 if why else 0


if __name__ == "__main__":
    sys.exit(main())
