"""The oracle of a ledger task (tasks/factory/ledger.py): the program its solution/solve.sh runs with `python3 -`.

tasks/factory/ledger.py `solve_script(params)` puts this file's code below the docstring into solve.sh with the
PARAMS line replaced by the task's values: F the folder, K and V the key column and value, C the value column (empty
for a count, which reads no value: two of its three wordings name none), A the aggregate, G the grouping (file |
folder), T the format (json | csv | lines), O the output path. The delimiter is no parameter: each file's is read
from its header line (the one of `,;|` it holds most), as robust code does whatever the instruction says. It is
written short (one-letter names, one-space indents) because it is the reference episode's one shell call, what a
small student learns to write. It walks the folder, aggregates the matching rows of every .csv file and writes the
output file. Standard library only. It does not grade anything (tests/ledger_check.py does).
"""
# ruff: noqa: I001, SIM115

import csv, json, os
F, K, V, C, A, G, T, O = "", "", "", "", "sum", "file", "json", ""  # PARAMS
r = {}
for d, _, fs in os.walk(F):
 for f in fs:
  if f.endswith(".csv"):
   p = d + "/" + f
   for w in csv.DictReader(open(p), delimiter=max(",;|", key=open(p).readline().count)):
    if w[K] == V: r.setdefault(f[:-4] if G == "file" else d.split("/")[-1], []).append(float(w[C]) if C else 0)
r = {g: {"sum": sum, "count": len, "max": max, "min": min}[A](v) for g, v in r.items()}
s = {g: int(v) if v == int(v) else round(v, 2) for g, v in r.items()}
k = sorted(s, key=lambda g: (-r[g], g)) if T == "lines" else sorted(s)
os.makedirs(os.path.dirname(O), exist_ok=True)
if T == "json": open(O, "w").write(json.dumps({g: s[g] for g in k}))
if T == "csv": open(O, "w").write("group,value\n" + "".join(f"{g},{s[g]}\n" for g in k))
if T == "lines": open(O, "w").write("".join(f"{g}: {s[g]}\n" for g in k))
