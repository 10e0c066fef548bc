"""The one rollout-to-lake path and the one config, as a user meets them through the console script: a scoring stage
takes its sandbox slots like generate's chunks do, a teacher mixture set in the config drives the teacher stage,
a moved rollout key names its new home, and the one scorer gives the same numbers everywhere."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

FLYWHEEL = str(Path(sys.executable).with_name("flywheel"))


def run(*args: str, env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([FLYWHEEL, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})}, check=False)


def error_line(p: subprocess.CompletedProcess) -> str:
    lines = [ln for ln in p.stderr.splitlines() if ln.startswith("error: ")]
    assert len(lines) == 1, p.stderr
    return lines[0]


def test_moved_rollout_key_names_its_new_home(tmp_path):
    p = run("generate", "--set", "generate.concurrency=3", "--out", str(tmp_path / "lake"))
    assert p.returncode == 2
    assert "'generate.concurrency'" in error_line(p) and "'rollout.concurrency'" in error_line(p)
    assert not (tmp_path / "lake").exists()


@pytest.mark.e2e
def test_evaluate_holds_the_sandbox_slots_of_its_rollout(tmp_path, prefect_api):
    # More episodes in flight than the flywheel-sandbox limit can ever grant: the scoring stage asks for its
    # slots before it loads the model, and fails at once with both numbers (it never ran unlimited).
    p = run("evaluate", "--model", str(tmp_path / "no-model"), "--out", str(tmp_path / "lake"), "--backend",
            "local", "--set", "rollout.concurrency=100000", env={"PREFECT_API_URL": prefect_api}, timeout=300)
    assert p.returncode == 2, p.stderr[-3000:]
    line = error_line(p)
    assert "100000 slots" in line and "'flywheel-sandbox'" in line, line


@pytest.mark.e2e
def test_generate_with_a_teacher_mixture_from_the_config(tmp_path, prefect_api):
    out = tmp_path / "lake"
    cfg = tmp_path / "mix.toml"
    cfg.write_text('[[teacher_mixture.policies]]\nkind = "reference"\nname = "ref-a"\nweight = 3\n\n'
                   '[[teacher_mixture.policies]]\nkind = "reference"\nname = "ref-b"\nweight = 1\n')
    p = run("generate", "--config", str(cfg), "--n-tasks", "12", "--samples", "2", "--backend", "local",
            "--out", str(out), "--run-id", "mix1", env={"PREFECT_API_URL": prefect_api})
    assert p.returncode == 0, p.stderr[-3000:]
    q = run("sql", "--root", str(out), "-f", "json",
            "SELECT policy, count(*) AS n FROM trajectories GROUP BY ALL ORDER BY policy")
    rows = json.loads(q.stdout)
    assert [r["policy"] for r in rows] == ["ref-a", "ref-b"] and sum(r["n"] for r in rows) == 24, rows
    saved = (out / "runs" / "mix1" / "config.toml").read_text()
    assert "[[teacher_mixture.policies]]" in saved and 'name = "ref-b"' in saved


def test_one_scorer_pass_at_1_and_pass_at_k_per_suite():
    from types import SimpleNamespace as Row

    from warehouse.score import pass_at_k, score_by_suite

    rows = [Row(task_id="a", suite="s", difficulty=1, verdict=v) for v in ("pass", "fail", "infra_error", "hack")]
    rows += [Row(task_id="b", suite="t", difficulty=2, verdict=v) for v in ("fail", "fail", "timeout")]
    one = {s.suite: (s.metric, s.value, s.episodes) for s in score_by_suite(rows)}
    assert one == {"all": ("pass@1", 1 / 6, 6), "s-d1": ("pass@1", 1 / 3, 3), "t-d2": ("pass@1", 0.0, 3)}
    two = {s.suite: s.value for s in score_by_suite(rows, k=2)}
    assert two == {"all": pytest.approx((pass_at_k(3, 1, 2) + 0.0) / 2), "s-d1": pytest.approx(2 / 3),
                   "t-d2": 0.0}


def test_readme_config_example_loads(tmp_path):
    """The README's configuration example (every section a user may set, [rollout] and the teacher mixture
    included) is a valid config."""
    from flows.config import load_config

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    block = readme.split("## Configuration", 1)[1].split("```toml", 1)[1].split("```", 1)[0]
    (tmp_path / "c.toml").write_text(block)
    cfg = load_config(tmp_path / "c.toml")
    assert cfg.rollout.concurrency == 8 and len(cfg.teacher_mixture.policies) == 2 and cfg.judge.model == "judge"


def test_the_flow_skips_only_a_preflight_this_process_passed_on_the_same_config(tmp_path):
    """The CLI checks before it starts the flow, the flow does not check twice (the run id aside); a config that
    never passed is still checked and refused."""
    from flows.config import load_config
    from flows.generate import preflight
    from tasks.suites import UnknownSuiteError

    sets = ['sandbox.backend="local"', f'run.out="{tmp_path / "lake"}"']
    good = load_config(None, sets)
    preflight(good)
    preflight(good.model_copy(update={"run": good.run.model_copy(update={"run_id": "gen-1"})}), recheck=False)
    bad = load_config(None, [*sets, 'generate.suite="no-such-suite"'])
    with pytest.raises(UnknownSuiteError, match="no-such-suite"):
        preflight(bad, recheck=False)
