"""Benchmark: the task factory's funnel on the reference family, and the time per admitted task.

For each --n (e.g. 100 500), runs the installed console script `flywheel tasks synthesize --writer reference --n N`
into a fresh output folder and lake (Docker backend), times it, and reads the task_synthesis rows back with SQL:
the funnel (admitted, and candidates per reason code), the audit of the admitted (oracle pass share, null-agent pass
share, flaky count, perturbed-oracle kill rate over every judged perturbation), writer tokens and USD, build and
audit seconds, and the wall seconds per candidate and per admitted task. Prints a table, writes JSON (--out).

Usage: python benchmarks/synthesis.py [--n 100 500] [--k 3] [--workers 2] [--seed 0] [--out benchmarks/synthesis.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from warehouse.query import query

FLYWHEEL = str(Path(sys.executable).with_name("flywheel"))


def run_one(n: int, *, k: int, workers: int, seed: int, tmp: Path) -> dict:
    out, lake = tmp / f"tasks-{n}", tmp / f"lake-{n}"
    t0 = time.perf_counter()
    r = subprocess.run([FLYWHEEL, "tasks", "synthesize", "--writer", "reference", "--n", str(n), "--seed",
                        str(seed), "--k", str(k), "--workers", str(workers), "--out", str(out), "--root", str(lake)],
                       capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"synthesize --n {n} exited {r.returncode}: {r.stderr[-2000:]}")
    rows = query(str(lake), "SELECT * FROM task_synthesis").to_pylist()
    funnel: dict[str, int] = {}
    for x in rows:
        for code in x["reason_codes"] or []:
            funnel[code] = funnel.get(code, 0) + 1
    adm = [x for x in rows if x["decision"] == "admitted"]
    audited = [x for x in rows if x["oracle_pass"] is not None]
    n_pert = sum(x["n_perturbed"] or 0 for x in audited)
    killed = sum(x["perturbed_killed"] or 0 for x in audited)
    return {
        "n": n, "admitted": len(adm), "refused": len(rows) - len(adm), "funnel": dict(sorted(funnel.items())),
        "wall_s": round(wall, 1), "s_per_candidate": round(wall / n, 2),
        "s_per_admitted": round(wall / len(adm), 2) if adm else None,
        "admitted_oracle_pass": sum(bool(x["oracle_pass"]) for x in adm), "admitted_null_pass":
        sum(bool(x["null_pass"]) for x in adm), "admitted_flaky": sum((x["flake_rate"] or 0) > 0 for x in adm),
        "audited": len(audited), "perturbed_judged": n_pert, "perturbed_killed": killed,
        "perturbed_kill_rate": round(killed / n_pert, 4) if n_pert else None,
        "build_s_mean": round(sum(x["build_s"] for x in rows) / len(rows), 2),
        "audit_s_mean": round(sum(x["audit_s"] for x in audited) / len(audited), 2) if audited else None,
        "writer_tokens": sum(x["prompt_tokens"] + x["completion_tokens"] for x in rows),
        "writer_usd": sum(x["writer_usd"] for x in rows),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, nargs="+", default=[100, 500], help="Candidate counts, one run each.")
    ap.add_argument("--k", type=int, default=3, help="Re-grades per candidate.")
    ap.add_argument("--workers", type=int, default=2, help="Candidates audited at once.")
    ap.add_argument("--seed", type=int, default=0, help="Seed of the reference family.")
    ap.add_argument("--out", default="benchmarks/synthesis.json", help="JSON results file.")
    a = ap.parse_args()
    results = []
    with tempfile.TemporaryDirectory(prefix="fw-synth-bench-") as tmp:
        for n in a.n:
            results.append(run_one(n, k=a.k, workers=a.workers, seed=a.seed, tmp=Path(tmp)))
            print(json.dumps(results[-1]), flush=True)
    head = f"{'n':>5} {'admitted':>8} {'wall s':>8} {'s/cand':>7} {'s/admitted':>10} {'oracle':>7} {'null':>5} " \
           f"{'flaky':>5} {'kill rate':>9}  funnel"
    print(head)
    for x in results:
        print(f"{x['n']:>5} {x['admitted']:>8} {x['wall_s']:>8} {x['s_per_candidate']:>7} "
              f"{x['s_per_admitted'] or '-':>10} {x['admitted_oracle_pass']:>7} {x['admitted_null_pass']:>5} "
              f"{x['admitted_flaky']:>5} {x['perturbed_kill_rate'] or '-':>9}  {x['funnel']}")
    Path(a.out).write_text(json.dumps({"machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
                                       "k": a.k, "workers": a.workers, "seed": a.seed, "results": results},
                                      indent=1) + "\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
