"""`flywheel tasks audit`: verifier health per task, in the lake, read back by `flywheel sql`, gating curation.

Through the console script: 10 HumanEval problems (every oracle passes, the null agent never does, the mutant kill
rate is printed and every row is in the lake's verifier_health table, read by `flywheel sql`); a task file with a
planted broken verifier (a hidden test that asserts nothing) is named unhealthy; bad input exits 2 with one line.
Curation skips the rows of unhealthy tasks, counted under their outcome and named with the reason; GRPO's task
list leaves them out, named in grpo_dropped; the run's report has a verifier-health table. The shipped
Harbor suite is audited in Docker (marker docker).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from curate.config import CurateConfig, CurriculumConfig, VerifierHealthConfig
from curate.curriculum import plan_curriculum
from curate.health import UNHEALTHY_VERIFIER, unhealthy_reason
from curate.stage import SELECTED, curate
from tasks import arithmetic
from tasks.judge.verify import UNIT_TESTS_VERIFIER_VERSION
from tests.conftest import FLYWHEEL, ROOT
from tests.curate.test_curate import row
from warehouse.lake import write_rows, write_trajectories
from warehouse.report import build_report

ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def flywheel(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([FLYWHEEL, *args], capture_output=True, text=True, env=ENV, timeout=timeout, check=False)


def sql(root: Path, query: str) -> list[dict]:
    r = flywheel("sql", query, "--root", str(root), "--format", "json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.mark.slow  # runs a HumanEval subset in sandboxes, k times each: not the fast core (make test-fast)
def test_humaneval_subset_audit_prints_the_figures_and_lands_in_the_lake(tmp_path):
    root, out = tmp_path / "lake", tmp_path / "audit.json"
    r = flywheel("tasks", "audit", "humaneval", "--n", "10", "--k", "2", "--backend", "local", "--root", str(root),
                 "--json", str(out))
    assert r.returncode == 0, r.stderr + r.stdout
    rows = json.loads(out.read_text())
    assert [x["task_id"] for x in rows] == [f"HumanEval/{i}" for i in range(10)]
    assert all(x["oracle_pass"] and not x["null_pass"] and x["error"] is None for x in rows), rows
    assert all(x["n_mutants"] >= 3 and x["k_regrades"] == 2 for x in rows)
    killed, n_mut = sum(x["mutants_killed"] for x in rows), sum(x["n_mutants"] for x in rows)
    assert f"oracle passes 10/10; null agent passes 0/10; mutant kill rate {killed}/{n_mut} = " in r.stdout
    assert "HumanEval/9" in r.stdout and "kill rate" in r.stdout
    lake = sql(root, "SELECT task_id, task_version, verifier_version, oracle_pass, null_pass, mutant_kill_rate, "
                     "flake_rate, wall_s FROM verifier_health ORDER BY task_id")
    assert sorted(x["task_id"] for x in lake) == sorted(x["task_id"] for x in rows)
    by_id = {x["task_id"]: x for x in rows}
    for x in lake:
        want = by_id[x["task_id"]]
        assert (x["task_version"], x["verifier_version"], x["oracle_pass"], x["null_pass"]) == \
            ("1", UNIT_TESTS_VERIFIER_VERSION, True, False)
        assert x["mutant_kill_rate"] == pytest.approx(want["mutant_kill_rate"]) and x["wall_s"] > 0


def test_a_verifier_that_asserts_nothing_is_named_unhealthy(tmp_path):
    spec = tmp_path / "code.jsonl"
    r = flywheel("tasks", "export", "code", str(spec), "--n", "2")
    assert r.returncode == 0, r.stderr
    tasks = [json.loads(line) for line in spec.read_text().splitlines()]
    broken = tasks[1]["id"]
    tasks[1]["hidden_tests"] = ["assert True"]
    tasks[1]["visible_tests"] = []
    spec.write_text("".join(json.dumps(t) + "\n" for t in tasks))
    root = tmp_path / "lake"
    r = flywheel("tasks", "audit", str(spec), "--k", "1", "--backend", "local", "--root", str(root))
    assert r.returncode == 0, r.stderr + r.stdout
    assert f"unhealthy 1: {broken}" in r.stdout, r.stdout
    got = {x["task_id"]: x for x in sql(root, "SELECT task_id, null_pass, mutant_kill_rate FROM verifier_health")}
    assert got[broken]["null_pass"] is True and got[broken]["mutant_kill_rate"] == 0.0
    assert got[tasks[0]["id"]]["null_pass"] is False and got[tasks[0]["id"]]["mutant_kill_rate"] > 0.5


def test_bad_input_is_one_error_line_and_exit_2(tmp_path):
    r = flywheel("tasks", "audit", "no-such-suite", "--root", str(tmp_path / "lake"))
    assert r.returncode == 2 and "no-such-suite" in r.stderr and "Traceback" not in r.stderr
    r = flywheel("tasks", "audit", "arithmetic", "--k", "-1", "--root", str(tmp_path / "lake"))
    assert r.returncode == 2 and "--k" in r.stderr
    assert not (tmp_path / "lake" / "verifier_health").exists()


def _health(task, **over) -> dict:
    base = {"task_id": task.id, "suite": task.suite, "task_version": task.version, "verifier": "numeric",
            "verifier_version": "1", "oracle_pass": True, "null_pass": False, "n_mutants": 0, "mutants_killed": 0,
            "mutant_kill_rate": None, "k_regrades": 3, "flake_rate": 0.0, "wall_s": 0.1}
    return {**base, **over}


def test_thresholds_name_each_reason():
    t = arithmetic.generate(1, split="train", seed=0, difficulty=1)[0]
    cfg = VerifierHealthConfig()
    assert unhealthy_reason(_health(t), cfg) is None
    assert unhealthy_reason(_health(t, oracle_pass=False), cfg) == "oracle fails"
    assert unhealthy_reason(_health(t, null_pass=True), cfg) == "null agent passes"
    assert unhealthy_reason(_health(t, mutant_kill_rate=0.25), cfg) == "mutant kill rate 0.25 < 0.50"
    assert unhealthy_reason(_health(t, flake_rate=1 / 3), cfg) == "flake rate 0.33 > 0.00"
    assert unhealthy_reason(_health(t, error="boom"), cfg) == "audit error: boom"


def test_curation_skips_rows_of_unhealthy_tasks_counted_and_named(tmp_path):
    root = str(tmp_path / "lake")
    tasks = arithmetic.generate(4, split="train", seed=3, difficulty=1)
    write_trajectories(root, [row(t) for t in tasks])
    write_rows(root, "verifier_health", [_health(tasks[0]), _health(tasks[1], null_pass=True),
                                         _health(tasks[2], flake_rate=0.5)])
    res = curate(root, CurateConfig(), run_id="run1", round=0, heldout_tasks=[])
    by_task = {tid: res.outcomes[t] for t, tid in ((r.trajectory_id, r.task_id) for r in map(row, tasks))}
    assert by_task == {tasks[0].id: SELECTED, tasks[1].id: UNHEALTHY_VERIFIER, tasks[2].id: UNHEALTHY_VERIFIER,
                       tasks[3].id: SELECTED}
    assert res.skipped_tasks == {tasks[1].id: "null agent passes", tasks[2].id: "flake rate 0.50 > 0.00"}
    assert res.dropped_by_reason[UNHEALTHY_VERIFIER] == 2 and res.unaudited_tasks == 1
    strict = CurateConfig(verifier_health=VerifierHealthConfig(require_audit=True))
    res = curate(root, strict, run_id="run1", round=0, heldout_tasks=[])
    assert res.n_selected == 1 and tasks[3].id in res.skipped_tasks
    off = CurateConfig(verifier_health=VerifierHealthConfig(enabled=False))
    assert curate(root, off, run_id="run1", round=0, heldout_tasks=[]).n_selected == 4
    report = build_report(root, "run1")
    assert "## Verifier health (flywheel tasks audit)" in report.markdown
    assert "| arithmetic | 3 | 3 | 1 | 0 | 0 |" in report.markdown, report.markdown


def test_grpo_leaves_out_tasks_whose_verifier_is_unhealthy(tmp_path):
    root = str(tmp_path / "lake")
    tasks = arithmetic.generate(3, split="train", seed=4, difficulty=1)
    write_trajectories(root, [row(t, source="student", policy="student", sample=i, verdict=v)
                              for t in tasks for i, v in enumerate(("pass", "fail"))])
    write_rows(root, "verifier_health", [_health(tasks[0]), _health(tasks[1], oracle_pass=False)])
    plan = plan_curriculum(root, CurriculumConfig(), run_id="run1", task_ids=[t.id for t in tasks])
    assert plan.grpo_tasks == [tasks[0].id, tasks[2].id]
    assert plan.grpo_dropped == {tasks[1].id: "unhealthy_verifier: oracle fails"}
    strict = CurriculumConfig(verifier_health=VerifierHealthConfig(require_audit=True))
    plan = plan_curriculum(root, strict, run_id="run1", task_ids=[t.id for t in tasks])
    assert plan.grpo_tasks == [tasks[0].id] and tasks[2].id in plan.grpo_dropped


@pytest.mark.docker
def test_shipped_harbor_suite_audit(tmp_path):
    root, out = tmp_path / "lake", tmp_path / "audit.json"
    # the suite's images: built here, as a user's `tasks import` would (a fresh engine has none; reused by hash)
    imp = flywheel("tasks", "import", "harbor", str(ROOT / "data" / "harbor"))
    assert imp.returncode == 0, imp.stderr[-2000:]
    r = flywheel("tasks", "audit", str(ROOT / "data" / "harbor"), "--k", "1", "--workers", "2", "--backend",
                 "docker", "--root", str(root), "--json", str(out))
    assert r.returncode == 0, r.stderr + r.stdout
    rows = json.loads(out.read_text())
    assert len(rows) == 12 and all(x["verifier"] == "harbor" for x in rows)
    bad = [(x["task_id"], x["oracle_pass"], x["null_pass"], x["error"]) for x in rows
           if not (x["oracle_pass"] and not x["null_pass"] and x["error"] is None)]
    assert not bad, bad
    assert all(x["mutant_kill_rate"] is None and x["flake_rate"] == 0.0 for x in rows)
    assert "oracle passes 12/12; null agent passes 0/12" in r.stdout
    assert len(sql(root, "SELECT task_id FROM verifier_health WHERE verifier = 'harbor'")) == 12
