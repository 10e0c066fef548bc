"""flows/evaluate.py's scoring rows: a checkpoint scored through training.scoring lands in the rounds table as the
flywheel wrote it before the one scoring path (pass@1 + episodes, sampled_pass@1 + sampled_episodes, pass@k), and
the promotion reads it back."""

from __future__ import annotations

from flows.stages import checkpoint_rows, score_rows
from training.promotion import HeldoutScores
from training.scoring import CheckpointScore, Scored
from warehouse.record import Trajectory
from warehouse.score import score_by_suite, scored


def _rows(policy: str, samples: int) -> list[Trajectory]:
    out = []
    for d in (1, 2):
        for t in range(3):
            for i in range(samples):
                verdict = "pass" if (t + i + d) % 3 else ("infra_error" if t == 1 else "fail")
                out.append(Trajectory(trajectory_id=f"{policy}-{d}-{t}-{i}", run_id="r", source="student",
                                      policy=policy, task_id=f"t{d}{t}", suite="arithmetic", difficulty=d,
                                      split="heldout", task_version="1", verifier="v", verifier_version="1",
                                      messages=[], verdict=verdict))
    return out


def _strip(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "created_at"} for r in rows]


def test_checkpoint_rows_match_the_rows_the_flywheel_wrote_before():
    greedy, sampled = _rows("g", 1), _rows("g-t0.8", 4)
    score = CheckpointScore(greedy=Scored(policy="g", scores=score_by_suite(greedy), rows=greedy),
                            sampled=Scored(policy="g-t0.8", scores=score_by_suite(sampled), rows=sampled),
                            pass_k=score_by_suite(sampled, 4))
    where = {"run_id": "r", "round": 1, "subject": "sft", "stage": "eval", "split": "heldout"}
    before = score_rows(greedy, **where)
    before += [{**m, "metric": "sampled_" + m["metric"]} for m in score_rows(sampled, **where)]
    before += [m for m in score_rows(sampled, k=4, **where) if m["metric"] != "episodes"]
    now = checkpoint_rows(score, **where)
    assert _strip(now) == _strip(before)
    read = HeldoutScores.from_metrics(now).suites
    assert set(read) == {"all", "arithmetic-d1", "arithmetic-d2"} and read["all"].sampled_n == len(scored(sampled)) < 24


def test_checkpoint_rows_greedy_only():
    greedy = _rows("g", 1)
    score = CheckpointScore(greedy=Scored(policy="g", scores=score_by_suite(greedy), rows=greedy))
    where = {"run_id": "r", "round": 0, "subject": "eval", "stage": "eval", "split": "heldout"}
    assert _strip(checkpoint_rows(score, **where)) == _strip(score_rows(greedy, **where))
