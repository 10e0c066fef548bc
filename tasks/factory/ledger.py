"""The reference writer's family `ledger`: multi-step shell and file work, procedurally generated.

Each task puts a folder of CSV files (in subfolders, beside distractor files that are not CSV) under /app and asks
the agent to explore it, read every CSV file, keep the rows whose key column holds one value, aggregate a value
column (sum, count, max or min) per file or per subfolder, and write the result in one of three formats (a JSON
object, a CSV table sorted by group, or `group: value` lines largest first) to a given path. Folder, subfolder and
file names, column names and order, delimiter, data values, the key value, aggregate, grouping, output path and
format and the instruction's wording all vary: with the vocabularies below, many millions of distinct tasks.
`ledger_drafts(n, seed=...)` is deterministic: candidate i depends on (seed, i) only. `ledger_near(knobs, ...)`
writes a task with some of the family's KNOBS fixed (the aggregate, the grouping, the output format: what sets a
task's difficulty) and everything else new: how the flywheel's synthesize stage asks for tasks near the ones its
student fails (curate/frontier.py).
`ledger_suite_drafts(n, split=..., seed=...)` draws the built-in suites' tasks (tasks/factory/suite.py): every
folder, subfolder, file stem, output folder and file name, the key and value columns and the key's values coined
afresh per task from syllables, train and held-out names disjoint by rule (`coined_names`), and the aggregate x
grouping x format combinations of HELD_COMBOS only in the `combos` split, never in train.
The oracle (guest/ledger_solve.py, one short program that solve.sh runs with the task's values; `solve_script`)
and the check (guest/ledger_check.py, with the expected output in tests/expected.json, never in the instruction)
are real modules, copied into each folder with test.sh. This module writes no folder (tasks/factory/draft.py does)
and admits nothing.
"""

from __future__ import annotations

import json
import random
import zlib
from dataclasses import dataclass
from pathlib import Path

from tasks.factory.draft import TaskDraft

FAMILY = "ledger"
GUEST = Path(__file__).with_name("guest")

ROOTS = ["records", "ledgers", "exports", "inbox", "reports", "archive", "data", "batches", "logs", "uploads",
         "shipments", "orders", "readings", "surveys", "invoices"]
SUBS = ["north", "south", "east", "west", "alpha", "beta", "gamma", "delta", "q1", "q2", "q3", "q4", "jan",
        "feb", "mar", "apr", "may", "jun", "team-red", "team-blue", "site-a", "site-b", "site-c", "lab1", "lab2"]
STEMS = ["sales", "batch", "week", "run", "part", "store", "desk", "shift", "lot", "crate", "depot", "route",
         "bin", "pallet", "dock", "lane", "unit", "cell", "rack", "tray"]
KEYS = {"status": ["open", "closed", "late", "void", "held", "paid"],
        "category": ["tools", "food", "books", "toys", "parts", "paint"],
        "kind": ["refund", "sale", "fee", "credit", "debit", "bonus"],
        "label": ["urgent", "normal", "low", "backlog", "review", "done"],
        "region": ["coast", "hills", "plain", "delta", "metro", "rural"]}
VALUES = {"amount": (1, 500), "qty": (1, 60), "hours": (1, 12), "weight": (2, 90), "score": (0, 100),
          "price": (3, 250), "units": (1, 40), "minutes": (5, 180)}
EXTRA = ["note", "ref", "clerk", "batch_code", "comment"]
DISTRACTORS = [("README.txt", "These files were exported by the nightly job.\n"),
               ("notes.md", "# notes\nThe totals here were never reconciled.\n"),
               ("old.csv.bak", None), ("manifest.json", None), ("summary.tsv", None)]
AGGREGATES = ["sum", "count", "max", "min"]
FORMATS = ["json", "csv", "lines"]

OPENERS = ["Under `/app/{root}` there are CSV files, some of them in subfolders.",
           "The folder `/app/{root}` holds CSV exports spread over several subfolders.",
           "Look through `/app/{root}`: it contains CSV files (and a few other files) in nested folders.",
           "Several CSV files live somewhere below `/app/{root}`."]
# the delimiter is named in words, as people write it (the oracle's program reads each file's from its header)
DELIMITERS = {",": "comma", ";": "semicolon", "|": "pipe"}
FORMAT_LINES = ["Each CSV file has a header row and uses a {delim_name} as its delimiter.",
                "Every CSV file starts with a header line; fields are separated by a {delim_name}.",
                "The CSV files have headers, and their separator is a {delim_name}."]
TASK_LINES = {
    "sum": ["For the rows whose `{key}` is `{value}`, add up the `{col}` column", ("Take the rows where `{key}` equals "
            "`{value}` and total their `{col}` values"), "Sum `{col}` over the rows with `{key}` = `{value}`"],
    "count": ["Count the rows whose `{key}` is `{value}`", "Find how many rows have `{key}` equal to `{value}`",
              "Count rows where `{key}` = `{value}` (the `{col}` column does not matter here)"],
    "max": ["Among the rows whose `{key}` is `{value}`, find the largest `{col}`", ("Find the maximum `{col}` of "
            "the rows where `{key}` equals `{value}`"), "Take the highest `{col}` among rows with `{key}` = `{value}`"],
    "min": ["Among the rows whose `{key}` is `{value}`, find the smallest `{col}`", ("Find the minimum `{col}` of "
            "the rows where `{key}` equals `{value}`"), "Take the lowest `{col}` among rows with `{key}` = `{value}`"],
}
GROUP_LINES = {"file": [", separately for each CSV file (the group is the file name without `.csv`).",
                        ", per file: use the file's name without the `.csv` extension as its group."],
               "folder": [", separately for each subfolder (the group is the name of the folder the file is in).",
                          ", grouped by the folder each file sits in (the folder's own name is the group)."]}
SKIP_LINES = ["Only files ending in `.csv` count; leave every other file alone.",
              "Ignore anything that is not a `.csv` file.",
              "Files with other extensions are not data and must be skipped."]
EMPTY_LINE = "Groups without a matching row are left out."
OUT_LINES = {
    "json": ["Write the result to `{out}` as a JSON object mapping each group to its number.",
             "Save a JSON object `{{group: number}}` to `{out}`."],
    "csv": [("Write the result to `{out}` as CSV with the header `group,value`, one row per group, sorted by group "
            "name."), "Save it to `{out}` as a CSV table: header `group,value`, rows sorted alphabetically by group."],
    "lines": [("Write one line per group to `{out}`, formatted `group: value`, largest value first (ties by group "
              "name)."), ("Put `group: value` lines in `{out}`, ordered from the largest value to the smallest "
              "(equal values by name).")],
}
OUT_DIRS = ["out", "results", "summary", "report", "output"]
OUT_NAMES = ["totals", "result", "summary", "by_group", "answer", "figures", "tally"]
EXT = {"json": "json", "csv": "csv", "lines": "txt"}
KNOBS = {"aggregate": AGGREGATES, "group_by": ["file", "folder"], "format": FORMATS}  # knob -> its values


@dataclass(frozen=True)
class Names:
    """The vocabularies a task's names are drawn from: file and folder names, and its columns (the key column with
    its values, the value column with its range)."""

    roots: list[str]
    subs: list[str]
    stems: list[str]
    out_dirs: list[str]
    out_names: list[str]
    keys: dict[str, list[str]]
    values: dict[str, tuple[int, int]]


ALL_NAMES = Names(ROOTS, SUBS, STEMS, OUT_DIRS, OUT_NAMES, KEYS, VALUES)  # ledger_draft / ledger_near
# the built-in suites coin every name (files, folders, columns, key values) from these syllables (2-3 of them), a
# fresh set per task, so that a student must read each name from the instruction; a coined name is a train name
# when its crc32 is even, a held-out one when it is odd: the splits never share one
SYLLABLES = ["ba", "ke", "lo", "mi", "nu", "ra", "so", "ti", "vo", "za", "de", "fu", "ga", "pe", "ru", "xi"]


def coined_names(rng: random.Random, split: str) -> Names:
    """A fresh set of names for one task of the `split` (train | heldout), all distinct: 1 root, 4 subfolders, 12
    file stems, 1 output folder, 1 output name, a key column with 6 values and a value column (values 1-99)."""
    parity = 0 if split == "train" else 1
    words: list[str] = []
    while len(words) < 27:
        w = "".join(rng.choice(SYLLABLES) for _ in range(rng.randint(2, 3)))
        if zlib.crc32(w.encode()) % 2 == parity and w not in words:
            words.append(w)
    return Names(words[:1], words[1:5], words[5:17], words[17:18], words[18:19], {words[19]: words[20:26]},
                 {words[26]: (1, 99)})


# (aggregate, group_by, format) never drawn for train or held-out tasks: the `combos` split holds only these, so it
# scores steps the student has seen, but never together (every value of each knob is in train)
HELD_COMBOS = [("max", "folder", "lines"), ("min", "file", "csv"), ("count", "folder", "json"),
               ("sum", "file", "lines")]
SEEN_COMBOS = [(a, g, f) for a in AGGREGATES for g in KNOBS["group_by"] for f in FORMATS
               if (a, g, f) not in HELD_COMBOS]


def _guest(name: str) -> str:
    return (GUEST / name).read_text()


def _value(rng: random.Random, span: tuple[int, int]) -> str:
    return str(rng.randint(*span))


def ledger_draft(seed: int, index: int) -> TaskDraft:
    """Candidate `index` of the family for `seed` (deterministic)."""
    return _draft(random.Random(f"ledger:{seed}:{index}"), name=f"ledger-{seed}-{index}", seed=seed, index=index)


def ledger_near(knobs: dict[str, str], *, seed: int, round: int, index: int) -> TaskDraft:
    """A task with `knobs` (a subset of KNOBS, e.g. {"aggregate": "max", "format": "lines"}) fixed and its data,
    names and wording new; deterministic in (knobs, seed, round, index), named after all four
    (ledger-s{seed}-r{round}-{index}-{knob values}), so that two tasks of one name are the same task.
    ValueError for a knob or value the family does not have."""
    for k, v in knobs.items():
        if v not in KNOBS.get(k, ()):
            raise ValueError(f"ledger has no knob {k}={v!r}; its knobs: {KNOBS}")
    fixed = ",".join(f"{k}={knobs[k]}" for k in sorted(knobs))
    name = "-".join([f"ledger-s{seed}-r{round}-{index}", *(knobs[k] for k in sorted(knobs))])
    d = _draft(random.Random(f"ledger-near:{seed}:{round}:{index}:{fixed}"), name=name, seed=seed, index=index,
               knobs=knobs)
    d.metadata.update({"near_round": round, "near": fixed})  # ledger_draft(seed, index) is another task
    return d


def ledger_suite_drafts(n: int, *, split: str, seed: int = 0) -> list[TaskDraft]:
    """The first n tasks of a built-in suite's split: 'train' and 'heldout' (coined_names of the split,
    SEEN_COMBOS) or 'combos' (held-out names, HELD_COMBOS); task i depends on (split, seed, i) only and is named
    ledger-{split}-s{seed}-{i}; its task.toml [metadata] split is 'train' or 'heldout'."""
    if split not in ("train", "heldout", "combos"):
        raise ValueError(f"the ledger suites have splits train, heldout and combos, not {split!r}")
    if n < 0:
        raise ValueError(f"n must be >= 0, not {n}")
    combos = HELD_COMBOS if split == "combos" else SEEN_COMBOS
    out = []
    for i in range(n):
        rng = random.Random(f"ledger-suite:{split}:{seed}:{i}")
        names = coined_names(random.Random(f"ledger-names:{split}:{seed}:{i}"),
                             "train" if split == "train" else "heldout")
        agg, group_by, fmt = rng.choice(combos)
        d = _draft(rng, name=f"ledger-{split}-s{seed}-{i}", seed=seed, index=i, names=names,
                   knobs={"aggregate": agg, "group_by": group_by, "format": fmt})
        d.metadata["split"] = "train" if split == "train" else "heldout"
        out.append(d)
    return out


def solve_script(params: dict[str, str]) -> str:
    """solve.sh of a task: guest/ledger_solve.py's program (below its docstring) run by `python3 -`, its PARAMS
    line holding `params`' values."""
    source = _guest("ledger_solve.py")
    program = "".join(x for x in source.split('"""', 2)[2].lstrip("\n").splitlines(keepends=True)
                      if not x.startswith("# ruff:")).lstrip("\n")
    line = next(x for x in program.splitlines() if x.endswith("# PARAMS"))
    names = line.split(" = ", 1)[0]
    # a count reads no value column (two of its three wordings name none), so the oracle writes none either; the
    # delimiter is no value: the program reads each file's from its header
    params = {**params, "value_column": "" if params["aggregate"] == "count" else params["value_column"]}
    values = [params[k] for k in ("folder", "key_column", "key_value", "value_column", "aggregate", "group_by",
                                  "format", "output")]
    program = program.replace(line, f"{names} = {', '.join(json.dumps(v) for v in values)}")
    return f"#!/bin/bash\nset -euo pipefail\npython3 - <<'EOF'\n{program}EOF\n"


def _draft(rng: random.Random, *, name: str, seed: int, index: int, knobs: dict[str, str] | None = None,
           names: Names = ALL_NAMES) -> TaskDraft:
    """One task from `rng`, its file and folder names from `names`; a knob in `knobs` replaces the value drawn for
    it (the draws themselves are the same with or without knobs, so that ledger_draft's stream never changes)."""
    knobs = knobs or {}
    root = rng.choice(names.roots)
    delim, delim_name = rng.choice(list(DELIMITERS.items()))
    key = rng.choice(sorted(names.keys))
    key_values = names.keys[key]
    target = rng.choice(key_values)
    col = rng.choice(sorted(names.values))
    agg = knobs.get("aggregate", rng.choice(AGGREGATES))
    group_by = knobs.get("group_by", rng.choice(["file", "folder"]))
    fmt = knobs.get("format", rng.choice(FORMATS))
    out = f"/app/{rng.choice(names.out_dirs)}/{rng.choice(names.out_names)}.{EXT[fmt]}"
    columns = ["id", key, col] + rng.sample(EXTRA, rng.randint(0, 2))
    rng.shuffle(columns)
    subs = rng.sample(names.subs, rng.randint(2, 4))
    files: dict[str, str] = {}
    stems = rng.sample(names.stems, len(names.stems))
    for sub in subs:
        for _ in range(rng.randint(1, 3)):
            stem = f"{stems.pop()}-{rng.randint(1, 99)}"
            rows = []
            for _ in range(rng.randint(4, 12)):
                cells = {"id": str(rng.randint(1000, 9999)), key: rng.choice(key_values), col: _value(rng, names.values[col])}
                for extra in columns:
                    cells.setdefault(extra, rng.choice(["x", "ok", "n/a", "tbd", "see-ref"]) + str(rng.randint(1, 9)))
                rows.append(delim.join(cells[c] for c in columns))
            files[f"{root}/{sub}/{stem}.csv"] = delim.join(columns) + "\n" + "\n".join(rows) + "\n"
    # the target occurs at least once, so the task always has a non-empty answer
    first = min(files)
    head, *body = files[first].rstrip("\n").split("\n")
    cells = body[0].split(delim)
    cells[columns.index(key)] = target
    body[0] = delim.join(cells)
    files[first] = "\n".join([head, *body]) + "\n"
    for extra_name, text in rng.sample(DISTRACTORS, rng.randint(1, 3)):
        where = f"{root}/{rng.choice(subs)}/{extra_name}"
        # a distractor with the CSV's shape: a wrong answer for an agent that does not skip it
        files[where] = text if text is not None else files[first]
    params = {"folder": f"/app/{root}", "delimiter": delim, "key_column": key, "key_value": target,
              "value_column": col, "group_by": group_by, "aggregate": agg, "output": out, "format": fmt}
    expected = _expected(files, params)
    parts = [rng.choice(OPENERS), rng.choice(FORMAT_LINES)]
    rng.shuffle(parts)
    task_line = rng.choice(TASK_LINES[agg]) + rng.choice(GROUP_LINES[group_by])
    instruction = "\n\n".join([
        " ".join(parts).format(root=root, delim_name=delim_name),
        task_line.format(key=key, value=target, col=col),
        " ".join([rng.choice(SKIP_LINES), EMPTY_LINE]),
        rng.choice(OUT_LINES[fmt]).format(out=out)])
    return TaskDraft(
        name=name, family=FAMILY, instruction=instruction, files=files,
        tests={"test.sh": _guest("test.sh"), "ledger_check.py": _guest("ledger_check.py"),
               "expected.json": json.dumps({"output": out, "groups": expected}, indent=1) + "\n"},
        solution={"solve.sh": solve_script(params)},
        difficulty=1 + (group_by == "folder") + (fmt == "lines"),
        metadata={"aggregate": agg, "group_by": group_by, "format": fmt, "seed": seed, "index": index})


def _expected(files: dict[str, str], params: dict) -> dict[str, float]:
    """The answer, computed on the host from the same files (not by running the oracle)."""
    import csv
    import io

    ops = {"sum": sum, "count": len, "max": max, "min": min}
    found: dict[str, list[float]] = {}
    for rel in sorted(files):
        if not rel.endswith(".csv"):
            continue
        parts = rel.split("/")
        group = parts[-1][: -len(".csv")] if params["group_by"] == "file" else parts[-2]
        for row in csv.DictReader(io.StringIO(files[rel]), delimiter=params["delimiter"]):
            if row[params["key_column"]].strip() == params["key_value"]:
                found.setdefault(group, []).append(float(row[params["value_column"]]))
    return {g: (int(v) if float(v).is_integer() else v)
            for g, v in ((g, ops[params["aggregate"]](vals)) for g, vals in sorted(found.items()))}


def ledger_drafts(n: int, *, seed: int = 0, start: int = 0) -> list[TaskDraft]:
    """Candidates start .. start+n-1 of the family for `seed`."""
    if n < 0:
        raise ValueError(f"n must be >= 0, not {n}")
    return [ledger_draft(seed, i) for i in range(start, start + n)]
