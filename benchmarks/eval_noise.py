"""The noise of the flywheel's held-out sampled pass@1: one checkpoint scored again and again, only the seed changing.

Scores a checkpoint on the default schedule's held-out tasks (flows/config.py's suites, run.seed 0) the way the
SFT-only control does (training.scoring.score_sampled, the one scoring path: flywheel.pass_k samples per task at
flywheel.sample_temperature, the [student] and [rollout] settings), once per sampling seed, and prints per seed the sampled pass@1 and its binomial
standard error, then the spread across seeds (sample standard deviation) and the standard error of a difference of
two such scores. This is the figure `flywheel.promote_margin` is set from: a GRPO checkpoint scored below SFT's
by less than the noise is not worse. Writes JSON to --out. It changes nothing and trains nothing.

    .venv/bin/python benchmarks/eval_noise.py --checkpoint ROOT/models/RUN-r1-sft --seeds 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

_HERE = str(Path(__file__).resolve().parent)  # benchmarks/sandbox.py would shadow the package
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", required=True, help="a student checkpoint folder (e.g. a round's SFT model)")
    ap.add_argument("--seeds", type=int, default=5, help="sampling seeds 0..N-1")
    ap.add_argument("--backend", default="local", choices=["local", "docker"])
    ap.add_argument("--out", default="/tmp/flywheel-eval-noise.json")
    args = ap.parse_args()

    from flows.config import FlywheelConfig
    from flows.rollouts import heldout_tasks
    from sandbox.backend import open_backend
    from training.scoring import Sampling, run_in_memory, score_sampled

    cfg = FlywheelConfig()
    fw, held = cfg.flywheel, heldout_tasks(cfg)
    rows: list[dict] = []
    with open_backend(cfg.sandbox.model_copy(update={"backend": args.backend})) as backend:
        run = run_in_memory(backend, cfg.rollout, run_id="eval-noise", round=0, rewards=cfg.rewards,
                            judge=cfg.judge)
        for seed in range(args.seeds):
            ev = score_sampled(args.checkpoint, held, student=cfg.student, run=run, name="eval",
                               sampling=Sampling(k=fw.pass_k, temperature=fw.sample_temperature, seed=seed))
            n = len(held) * fw.pass_k
            p = ev.pass_rate
            rows.append({"seed": seed, "sampled_pass@1": p, "episodes": n, "binomial_se": (p * (1 - p) / n) ** 0.5,
                         "wall_s": ev.wall_s})
    vals = [r["sampled_pass@1"] for r in rows]
    sd = statistics.stdev(vals) if len(vals) > 1 else float("nan")
    summary = {"tasks": len(held), "pass_k": fw.pass_k, "temperature": fw.sample_temperature,
               "mean": statistics.fmean(vals), "seed_sd": sd, "diff_sd": sd * 2 ** 0.5,
               "mean_binomial_se": statistics.fmean(r["binomial_se"] for r in rows)}
    print(f"{'seed':>4} {'sampled pass@1':>15} {'binomial se':>12} {'wall_s':>7}")
    for r in rows:
        print(f"{r['seed']:>4} {r['sampled_pass@1']:>15.3f} {r['binomial_se']:>12.3f} {r['wall_s']:>7.1f}")
    print(f"{len(held)} tasks x {fw.pass_k} samples at T={fw.sample_temperature:g}: mean {summary['mean']:.3f}, "
          f"seed sd {sd:.3f}, sd of a difference of two scores {summary['diff_sd']:.3f}, binomial se "
          f"{summary['mean_binomial_se']:.3f}")
    Path(args.out).write_text(json.dumps({"args": vars(args), "seeds": rows, "summary": summary}, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
