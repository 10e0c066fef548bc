"""Ids with quotes in them (a user's task folder `it's`, a policy named `o'brien`) go through the flywheel's
rollout read-back as values, not SQL: real episodes in a real bubblewrap sandbox, real Parquet, real DuckDB."""

from __future__ import annotations

from agents.reference import ReferencePolicy
from flows.config import FlywheelConfig
from flows.rollouts import rollout_rows
from sandbox.backend import open_backend
from tasks.suites import load_suite
from warehouse.query import query

QUOTED = ["it's", "say \"hi\"; DROP VIEW trajectories; --", "o''neil"]


def test_rollout_read_back_with_quoted_task_ids_and_policy_name(tmp_path):
    cfg = FlywheelConfig()
    cfg.run.out = str(tmp_path / "lake")
    cfg.sandbox.backend = "local"
    tasks = [t.model_copy(update={"id": tid}) for t, tid in zip(load_suite("arithmetic", 3), QUOTED, strict=True)]
    policy = ReferencePolicy(name="o'brien")
    with open_backend(cfg.sandbox, pool_size=2) as backend:
        first = rollout_rows(cfg, tasks, policy, run_id="quotes", round=1, samples=1, backend=backend,
                             progress=False)
        # The re-run writes nothing new: every row comes back through the read-back query.
        again = rollout_rows(cfg, tasks, policy, run_id="quotes", round=1, samples=1, backend=backend,
                             progress=False)
    assert sorted(r.task_id for r in first) == sorted(QUOTED)
    assert {r.trajectory_id: r for r in again} == {r.trajectory_id: r for r in first}
    assert {r.policy for r in again} == {"o'brien"}
    got = query(cfg.run.out, "SELECT task_id FROM trajectories WHERE task_id = ?", ["it's"]).column("task_id")
    assert got.to_pylist() == ["it's"]
