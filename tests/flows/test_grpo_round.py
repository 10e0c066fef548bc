"""One flywheel round with GRPO through `flywheel run`, on a small config: GRPO's own episodes land in the lake
(stage grpo), the SFT-only control scores both checkpoints on the held-out split (greedy and sampled pass@1), the
promotion rule's choice and reason are in the rounds table and the ledger, the student's held-out scores are the
promoted checkpoint's, and the report shows SFT vs GRPO and GRPO's steps."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from tests.conftest import FLYWHEEL

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ONE_ROUND = [
    "--set", 'flywheel.suites=[{suite="arithmetic",train_tasks=40,heldout_tasks=8}]',
    "--set", "sft.max_steps=120", "--set", "grpo.max_steps=2", "--set", "grpo.num_generations=2",
    "--set", "grpo.prompts_per_step=2", "--set", "flywheel.pass_k=2", "--set", "flywheel.student_train_samples=0",
    "--set", "student.tiny.hidden=64", "--set", "student.tiny.layers=2", "--set", "student.tiny.copy_warmup_steps=20",
    "--set", "flywheel.grpo=true", "--set", "flywheel.teacher_ahead=false", "--rounds", "1", "--backend", "local",
    "--set", 'run.run_id="g1"',
]


def _sql(root, q):
    p = subprocess.run([FLYWHEEL, "sql", "--root", str(root), "-f", "json", q], capture_output=True, text=True,
                       timeout=120, check=False)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def test_round_with_grpo_scores_both_checkpoints_and_promotes_by_the_rule(tmp_path, prefect_api):
    out = tmp_path / "lake"
    p = subprocess.run([FLYWHEEL, "run", "--out", str(out), *ONE_ROUND],
                       env={**os.environ, "PREFECT_API_URL": prefect_api}, capture_output=True, text=True,
                       timeout=1500, check=False)
    assert p.returncode == 0, p.stderr[-4000:]
    ledger = out / "runs" / "g1" / "stages"
    grpo = json.loads((ledger / "001-grpo.json").read_text())
    assert "skipped" not in grpo, grpo
    ctrl = json.loads((ledger / "001-control.json").read_text())
    assert ctrl["promoted"] in ("sft", "grpo") and ctrl["reason"] and ctrl["code"]
    assert f"round 1 promotes {ctrl['promoted']}" in p.stdout + p.stderr

    steps = _sql(out, "SELECT grpo_step, policy, source, count(*) AS n FROM trajectories WHERE stage = 'grpo' "
                      "GROUP BY ALL ORDER BY ALL")
    assert [(s["grpo_step"], s["policy"], s["source"], s["n"]) for s in steps] == [
        (0, "grpo-r1", "student", 4), (1, "grpo-r1", "student", 4)]

    rounds = _sql(out, "SELECT subject, metric, value FROM rounds WHERE round = 1 AND suite = 'all' "
                       "AND split = 'heldout' ORDER BY ALL")
    val = {(r["subject"], r["metric"]): r["value"] for r in rounds}
    for subject in ("sft", "grpo", "student"):
        for name in ("pass@1", "sampled_pass@1", "pass@2"):
            assert (subject, name) in val, (subject, name, sorted(val))
    assert val[("sft", "sampled_episodes")] == val[("grpo", "sampled_episodes")] == 16  # 8 tasks x pass_k 2
    gain = val[("grpo", "sampled_pass@1")] - val[("sft", "sampled_pass@1")]
    assert val[("promotion", "grpo_gain_sampled_pass@1")] == pytest.approx(gain)
    assert ctrl["promoted"] == ("sft" if gain < -0.05 else "grpo")  # the default rule and margin
    assert val[("promotion", "promoted_grpo")] == float(ctrl["promoted"] == "grpo")
    assert val[("promotion", f"reason:{ctrl['code']}")] == 1.0
    for name in ("pass@1", "sampled_pass@1", "pass@2"):  # the student's scores are the promoted checkpoint's
        assert val[("student", name)] == val[(ctrl["promoted"], name)]
    # the held-out episodes of both checkpoints are rows under their own policy names
    pols = {r["policy"] for r in _sql(out, "SELECT DISTINCT policy FROM trajectories WHERE split = 'heldout'")}
    assert {"student-r1-sft", "student-r1-sft-t0.8", "student-r1-grpo", "student-r1-grpo-t0.8"} <= pols

    report = out / "runs" / "g1" / "report"
    md = (report / "report.md").read_text()
    assert "SFT-only control" in md and "GRPO steps" in md
    assert (report / "sft_vs_grpo.png").stat().st_size > 1000 and (report / "grpo_steps.png").stat().st_size > 1000
