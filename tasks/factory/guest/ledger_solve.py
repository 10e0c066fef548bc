"""The oracle of a ledger task (tasks/factory/ledger.py), run inside the task's sandbox as /solution/ledger_solve.py.

Reads /solution/params.json (the task's parameters: folder, delimiter, key column and value, value column,
grouping, aggregate, output path and format), walks the folder, aggregates the matching rows and writes the output
file. Standard library only. It does not grade anything (tests/ledger_check.py does)."""

from __future__ import annotations

import csv
import json
import os
import sys


def _number(text: str) -> float:
    return float(text.strip())


def aggregate(params: dict) -> dict[str, float]:
    """group -> aggregate of the value column over matching rows of every .csv file under the folder."""
    values: dict[str, list[float]] = {}
    for dirpath, dirnames, filenames in os.walk(params["folder"]):
        dirnames.sort()
        for name in sorted(filenames):
            if not name.endswith(".csv"):
                continue
            path = os.path.join(dirpath, name)
            group = name[: -len(".csv")] if params["group_by"] == "file" else os.path.basename(dirpath)
            with open(path, newline="") as f:
                for row in csv.DictReader(f, delimiter=params["delimiter"]):
                    if row[params["key_column"]].strip() == params["key_value"]:
                        values.setdefault(group, []).append(_number(row[params["value_column"]]))
    ops = {"sum": sum, "count": len, "max": max, "min": min}
    return {g: ops[params["aggregate"]](v) for g, v in values.items()}


def render(result: dict[str, float], fmt: str) -> str:
    """The output file's text in the task's format (json | csv | lines)."""
    def num(v: float) -> int | float:
        return int(v) if float(v).is_integer() else round(v, 2)

    if fmt == "json":
        return json.dumps({g: num(result[g]) for g in sorted(result)}, indent=2) + "\n"
    if fmt == "csv":
        return "group,value\n" + "".join(f"{g},{num(result[g])}\n" for g in sorted(result))
    order = sorted(result, key=lambda g: (-result[g], g))
    return "".join(f"{g}: {num(result[g])}\n" for g in order)


def main(argv: list[str]) -> int:
    with open(argv[1] if len(argv) > 1 else "/solution/params.json") as f:
        params = json.load(f)
    out = params["output"]
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    with open(out, "w") as f:
        f.write(render(aggregate(params), params["format"]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
