"""Judge every row of a run's training snapshots again, with today's verifiers and forensics, and count the rows whose
stored label the judge contradicts (one judge for every row: none should).

A teacher or student row of a numeric task is judged against its task, rebuilt from the run's saved config (the
schedule's suites); a human demo is judged again from its messages, tools and expected answer (curate/demos.py);
rows whose verifier needs a sandbox (code, Harbor, BFCL) are counted and left to `flywheel verify`. Prints, per round and
source, the rows judged and the disagreements (stored verdict vs the judge's), and exits 1 when there is any. Reads
the lake; writes nothing.

With --all: every trajectory row of the lake instead (every run unless RUN_ID is given; all rounds, stages and
sources, held-out evaluation and GRPO rows included), judged again with the run's reward weights, and compared with
what is stored (verdict, reward, hack flags). Rows of numeric tasks are rebuilt from the run's config, or, where the
config does not hold the task, from the row itself (prompt, expected answer, the suite's required tool); human demos
as above; rows the loop labelled (model_error, timeout, infra_error) and rows whose verifier needs a sandbox are
counted, not judged. Prints per stored verdict how many rows were judged and how many changed (old verdict/reward ->
new), the first changes, and exits 1 on any change.

    .venv/bin/python scripts/rejudge_snapshots.py runs/default [RUN_ID]
    .venv/bin/python scripts/rejudge_snapshots.py --all runs/default [RUN_ID]
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
    ap.add_argument("run_id", nargs="?", help="run id (default: the lake's only run; with --all: every run)")
    ap.add_argument("--all", action="store_true", help="every trajectory row, not only the snapshots' rows")
    args = ap.parse_args()
    if args.all:
        return rejudge_all(args.root, args.run_id)

    from curate.demos import record_to_row
    from flows.config import load_config
    from flows.rollouts import heldout_tasks, schedule_train_tasks
    from tasks.judge.api import verify
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


LOOP_VERDICTS = ("model_error", "timeout", "infra_error")


def _row_task(r, by_id: dict):
    """The row's numeric task: from the run's config when it holds the task, else rebuilt from the row."""
    from curate.demos import _required_tool
    from tasks.spec import ReferenceSolution, Task, VerifierSpec

    if r.task_id in by_id:
        return by_id[r.task_id]
    expected = json.loads(r.verifier_details_json or "{}").get("expected")
    if r.verifier_name != "numeric" or expected is None:
        return None
    prompt = next((m.content for m in r.messages if m.role == "user"), "") or ""
    return Task(id=r.task_id, suite=r.suite, version="0", split=r.split or "train", prompt=prompt,
                tools=json.loads(r.tools_json or "[]") or ["python"],
                verifier=VerifierSpec(kind="numeric", answer=str(expected), requires_tool=_required_tool(r.suite)),
                reference=ReferenceSolution(final=""))


def rejudge_all(root: str, run_id: str | None) -> int:
    """Every trajectory row (of one run, or of all): stored vs judged-again verdict, reward and hack flags."""
    from curate.demos import record_to_row
    from flows.config import load_config
    from flows.rollouts import heldout_tasks, schedule_train_tasks
    from tasks.judge.api import RewardConfig, verify
    from warehouse.query import iter_trajectories, query
    from warehouse.record import from_dict

    runs = [r["run_id"] for r in query(root, "SELECT DISTINCT run_id FROM trajectories ORDER BY 1").to_pylist()]
    if run_id is not None and run_id not in runs:
        print(f"error: the lake holds no rows of run {run_id!r}; it holds {runs}", file=sys.stderr)
        return 2
    judged: Counter[str] = Counter()
    changed: Counter[tuple[str, str]] = Counter()
    skipped: Counter[str] = Counter()
    examples: list[str] = []
    total = 0
    for run in [run_id] if run_id else runs:
        cfg_path = os.path.join(root, "runs", run, "config.toml")
        cfg = load_config(cfg_path) if os.path.exists(cfg_path) else None
        by_id = {t.id: t for t in schedule_train_tasks(cfg) + heldout_tasks(cfg)} if cfg else {}
        rewards = cfg.rewards if cfg else RewardConfig()
        for batch in iter_trajectories(root, "run_id = ?", [run]):
            for d in batch.to_pylist():
                r = from_dict(d)
                total += 1
                stored = (r.verdict, r.reward, tuple(r.hack_flags))
                if r.verdict in LOOP_VERDICTS:
                    skipped[f"loop verdict {r.verdict}"] += 1
                    continue
                if r.source == "human":
                    details = json.loads(r.verifier_details_json)
                    rec = {"messages": [m.to_openai() for m in r.messages], "tools": json.loads(r.tools_json),
                           "suite": r.suite, "split": r.split, "task_id": r.task_id}
                    if details.get("expected") is not None:
                        rec["expected_answer"] = details["expected"]
                    again, errs = record_to_row(rec, file="lake", where=r.trajectory_id, run_id=run, round=r.round,
                                                suite=r.suite, default_tools=None)
                    now = (again.verdict, again.reward, tuple(again.hack_flags)) if again else \
                        ("invalid", None, tuple(str(e) for e in errs))
                else:
                    task = _row_task(r, by_id)
                    if task is None or task.verifier.kind != "numeric":
                        skipped[f"needs a sandbox or its task ({r.verifier_name})"] += 1
                        continue
                    out = verify(task, r.messages, rewards=rewards)
                    now = (out.verdict, out.reward, tuple(out.hack_flags))
                judged[r.verdict] += 1
                same = now[0] == stored[0] and now[2] == stored[2] and (
                    now[1] is not None and stored[1] is not None and abs(now[1] - stored[1]) <= 1e-9)
                if not same:
                    changed[(stored[0], now[0])] += 1
                    if len(examples) < 20:
                        examples.append(f"{r.trajectory_id} run {run} round {r.round} {r.stage} {r.source} "
                                        f"{r.task_id}: stored {stored}, judge {now}")
    print(f"{'stored verdict':<15} {'judged':>7} {'changed':>8}")
    for v, n in sorted(judged.items()):
        print(f"{v:<15} {n:>7} {sum(c for (a, _), c in changed.items() if a == v):>8}")
    for (a, b), n in sorted(changed.items()):
        print(f"  {a} -> {b}: {n}")
    print(f"{total} rows in {len(runs) if run_id is None else 1} run(s): {sum(judged.values())} judged again, "
          f"{sum(changed.values())} changed; not judged: {dict(skipped)}")
    for line in examples:
        print("  " + line)
    return 1 if changed else 0


if __name__ == "__main__":
    sys.exit(main())
