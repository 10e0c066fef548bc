"""Judge every row of a run's training snapshots again, with today's verifiers and forensics, and count the rows whose
stored label the judge contradicts (one judge for every row: none should).

A teacher or student row of a numeric task is judged against its task, rebuilt from the run's saved config (the
schedule's suites); a human demo is judged again from its messages, tools and expected answer (curate/demos.py);
rows whose verifier needs a sandbox (code, Harbor, BFCL) are counted and left to `flywheel verify`. Prints, per round and
source, the rows judged and the disagreements (stored verdict vs the judge's), and exits 1 when there is any. Reads
the lake; writes nothing.

    .venv/bin/python scripts/rejudge_snapshots.py runs/default [RUN_ID]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root", help="lake root")
    ap.add_argument("run_id", nargs="?", help="run id (default: the lake's only run)")
    args = ap.parse_args()

    from curate.demos import record_to_row
    from flows.config import load_config
    from flows.rollouts import heldout_tasks, schedule_train_tasks
    from tasks.verify import verify
    from warehouse.query import query, read_trajectories

    runs = [r["run_id"] for r in query(args.root, "SELECT DISTINCT run_id FROM datasets ORDER BY 1").to_pylist()]
    run_id = args.run_id or (runs[0] if len(runs) == 1 else None)
    if run_id is None:
        print(f"error: name the run: the lake holds {runs}", file=sys.stderr)
        return 2
    cfg = load_config(os.path.join(args.root, "runs", run_id, "config.toml"))
    tasks = {t.id: t for t in schedule_train_tasks(cfg) + heldout_tasks(cfg)}
    rows = read_trajectories(args.root, "trajectory_id IN (SELECT m.trajectory_id FROM manifests m JOIN datasets d "
                                        "USING (snapshot_id) WHERE d.run_id = ?)", [run_id])
    judged: Counter[tuple[str, str]] = Counter()
    skipped: Counter[str] = Counter()
    bad: list[str] = []
    for r in rows:
        stored = (r.verdict, tuple(r.hack_flags))
        if r.source == "human":
            details = json.loads(r.verifier_details_json)
            rec = {"messages": [m.to_openai() for m in r.messages], "tools": json.loads(r.tools_json),
                   "suite": r.suite, "split": r.split, "task_id": r.task_id}
            if details.get("expected") is not None:
                rec["expected_answer"] = details["expected"]
            again, errs = record_to_row(rec, file="snapshot", where=r.trajectory_id, run_id=run_id, round=r.round,
                                        suite=r.suite, default_tools=None)
            now = (again.verdict, tuple(again.hack_flags)) if again else ("invalid", tuple(str(e) for e in errs))
        elif r.task_id in tasks and tasks[r.task_id].verifier.kind == "numeric":
            out = verify(tasks[r.task_id], r.messages)
            now = (out.verdict, tuple(out.hack_flags))
        elif r.task_id in tasks:  # code, Harbor and BFCL tasks need sandboxes: `flywheel verify` judges those
            skipped[r.source] += 1
            continue
        else:
            now = ("unknown_task", ())
        judged[(f"round {r.round}", r.source)] += 1
        if now != stored or stored != ("pass", ()):
            bad.append(f"{r.trajectory_id} round {r.round} {r.source} {r.task_id}: stored {stored}, judge {now}")
    for (rnd, src), n in sorted(judged.items()):
        print(f"{rnd:>8} {src:<8} {n:>6} snapshot rows judged")
    print(f"{len(rows)} snapshot rows of run {run_id}: {len(bad)} whose label the judge contradicts "
          "(or that are no unflagged pass)" + (f"; not judged here (their verifier needs a sandbox: use flywheel "
                                                f"verify): {dict(skipped)}" if skipped else ""))
    for line in bad[:20]:
        print("  " + line)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
