"""A later round's SFT at several step counts, from one finished run's round-1 student on its round-2 snapshot.

Trains round 2's SFT again from a `make run` lake (the round-1 student that round 2 started from, the round-2
snapshot, the run's saved config `runs/RUN/config.toml`: its seeds, SFT recipe and suites) once per step count in
--steps (the first is the baseline; the default is the pre-change 400 beside today's `flywheel.later_sft_steps`),
and scores each checkpoint on the held-out split the way the promotion stage does (training.scoring.
score_checkpoint, the one scoring path: greedy pass@1, then flywheel.pass_k samples at flywheel.sample_temperature
with seed = the round, the run's [student] and [rollout] settings): per suite, beside the round-1
student's figures from the lake's rounds table. This is the measurement `flywheel.later_sft_steps` is set from.
It writes checkpoints under --work and JSON to --out; the lake is only read (episodes are scored, not written).

    cd CLONE && .venv/bin/python benchmarks/later_sft.py --root runs/default --steps 400 800
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

_HERE = str(Path(__file__).resolve().parent)  # benchmarks/sandbox.py would shadow the package
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

ROUND = 2


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", required=True, help="the lake of a finished run with 2 rounds (make run's runs/default)")
    ap.add_argument("--run-id", default=None, help="the run in that lake (default: its only or newest run)")
    ap.add_argument("--steps", type=int, nargs="+", default=[400, 800], help="round-2 SFT steps, the baseline first")
    ap.add_argument("--backend", default="local", choices=["local", "docker"])
    ap.add_argument("--work", default="/tmp/flywheel-later-sft", help="folder for the trained checkpoints")
    ap.add_argument("--out", default="/tmp/flywheel-later-sft.json")
    args = ap.parse_args()

    from flows.config import load_config
    from flows.rollouts import heldout_tasks
    from flows.stages import checkpoint_rows
    from sandbox.backend import open_backend
    from training.promotion import HeldoutScores
    from training.registry import list_checkpoints
    from training.scoring import Sampling, run_in_memory, score_checkpoint
    from training.sft import train_sft
    from warehouse.query import query

    def sql(q: str, params: list) -> list[dict]:
        return query(root, q, params).to_pylist()

    root = args.root
    run_id = args.run_id or max(list_checkpoints(root), key=lambda c: c.created_at).run_id
    cfg = load_config(Path(root, "runs", run_id, "config.toml"))
    cfg = cfg.model_copy(update={"run": cfg.run.model_copy(update={"out": root})})
    cks = {(c.round, c.stage): c for c in list_checkpoints(root, run_id=run_id)}
    sft2 = cks.get((ROUND, "sft"))
    if sft2 is None or sft2.parent_id is None:
        sys.exit(f"error: run {run_id} in {root} has no round-{ROUND} SFT checkpoint; pass the lake of a finished "
                 f"2-round run (--root) and its --run-id")
    parent = next(c for c in cks.values() if c.checkpoint_id == sft2.parent_id)
    if not Path(parent.path).exists():
        sys.exit(f"error: the round-1 student {parent.path} is not there; run this from the folder the run was made "
                 f"in (the paths of a lake's checkpoints are relative to it)")
    incumbent = HeldoutScores.from_metrics(sql(
        "SELECT suite, metric, value, split FROM rounds WHERE run_id = ? AND round = 1 AND subject = 'student' "
        "AND stage = 'eval'", [run_id]))
    held, fw = heldout_tasks(cfg), cfg.flywheel

    def score(path: str, name: str, backend) -> HeldoutScores:
        """Greedy, then sampled, as flows/evaluate.py heldout_scores scores a round-2 checkpoint."""
        res = score_checkpoint(path, held, student=cfg.student, name=name,
                               sampling=Sampling(k=fw.pass_k, temperature=fw.sample_temperature, seed=ROUND),
                               run=run_in_memory(backend, cfg.rollout, run_id=run_id, round=ROUND,
                                                 rewards=cfg.rewards, judge=cfg.judge))
        return HeldoutScores.from_metrics(checkpoint_rows(res, run_id=run_id, round=ROUND, stage="eval",
                                                          subject="bench", split="heldout"))

    rows = []
    with open_backend(cfg.sandbox.model_copy(update={"backend": args.backend})) as backend:
        for steps in args.steps:
            t = time.perf_counter()
            res = train_sft(parent.path, None, Path(args.work, f"{run_id}-s{steps}"),
                            cfg.sft.model_copy(update={"max_steps": steps}),
                            snapshot_id=sft2.snapshot_id, root=root)
            sft_s = time.perf_counter() - t
            scores = score(res.checkpoint_path, f"student-r{ROUND}-s{steps}", backend)
            rows.append({"steps": steps, "sft_s": sft_s, "suites": {k: v.model_dump() for k, v in
                                                                    scores.suites.items()}})

    suites = sorted(incumbent.suites)
    print(f"run {run_id}, seed {cfg.run.seed}: held-out greedy / sampled pass@1 per suite")
    print(f"{'model':<22} {'sft_s':>6} " + " ".join(f"{s:>22}" for s in suites))

    def cells(sc: dict) -> str:
        return " ".join(f"{sc[s]['greedy']:>10.3f} / {sc[s]['sampled'] or 0:>9.3f}" if s in sc else f"{'-':>22}"
                        for s in suites)

    print(f"{'round-1 student':<22} {'':>6} " + cells({k: v.model_dump() for k, v in incumbent.suites.items()}))
    for r in rows:
        print(f"{'round-2 SFT ' + str(r['steps']) + ' steps':<22} {r['sft_s']:>6.0f} " + cells(r["suites"]))
    Path(args.out).write_text(json.dumps({"args": vars(args), "run_id": run_id,
                                          "incumbent": {k: v.model_dump() for k, v in incumbent.suites.items()},
                                          "variants": rows}, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
