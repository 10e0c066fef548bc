"""Curation of one round: from the run's trajectories (and human demos) to a registered training snapshot.

`curate` is the plain function the `flywheel curate` command and the Prefect flow call. In order it
  1. imports the configured human demonstrations (idempotent; invalid records are counted, not fatal),
  2. reads the run's candidate rows (this round, and earlier rounds unless configured otherwise; rollouts only:
     GRPO's own episodes, stage grpo, are data for preference exports, not SFT candidates),
  3. drops rows already trained on in an earlier round's snapshot (reuse_sources excepted), then the rows of tasks
     whose verifier is unhealthy by their latest `flywheel tasks audit` row (curate/health.py; outcome
     unhealthy_verifier, each such task named with its reason in `skipped_tasks`; with require_audit, rows of
     tasks never audited too, as unaudited_verifier),
  4. applies the quality filters (held-out split, verdict, hack flags, tool-call validity, size limits),
  5. decontaminates against the held-out tasks,
  6. removes exact and near-duplicates, within the candidates and against earlier snapshots' rows,
  7. mixes (source weights, caps, shares), adds the replay share of earlier snapshots' rows (replay_share, so a
     later round does not forget what earlier ones taught; outcome "replayed") and writes the manifest and the
     datasets row (with the manifest hash: the snapshot's run-independent fingerprint).
Every candidate ends with exactly one outcome ("selected" or a drop reason); the result carries the counts by
source, verdict and outcome as plain data, plus each row's outcome. This module does not train or roll out.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from typing import Any

from pydantic import BaseModel, Field

from curate.config import CurateConfig, config_hash
from curate.decontam import find_contamination
from curate.dedup import dedup_rows
from curate.demos import import_demos
from curate.filters import filter_rows
from curate.health import UNAUDITED, UNHEALTHY_VERIFIER, task_health
from curate.mixing import manifest_hash, mix, order_key, write_snapshot
from tasks.spec import Task
from warehouse.record import Trajectory, example_key, from_dict

SELECTED = "selected"
REPLAYED = "replayed"
IN_EARLIER_SNAPSHOT = "in_earlier_snapshot"
INVALID_DEMO = "invalid_demo"


class CountRow(BaseModel):
    """How many candidates of one source and verdict ended with one outcome (selected or a drop reason)."""

    source: str
    verdict: str
    outcome: str
    n: int


class CurateResult(BaseModel):
    snapshot_id: str = Field(description="Id of the training snapshot written (manifest + datasets row).")
    run_id: str
    round: int
    config_hash: str
    manifest_path: str
    manifest_hash: str = Field(default="", description="curate.mixing.manifest_hash: equal for the same snapshot in "
                               "two runs of one config and seed.")
    n_replayed: int = Field(default=0, description="Examples replayed from the run's earlier snapshots.")
    parent_snapshot_id: str | None = Field(description="The run's latest snapshot of an earlier round, if any.")
    n_candidates: int
    n_selected: int
    selected_by_source: dict[str, int]
    selected_by_suite: dict[str, int]
    dropped_by_reason: dict[str, int]
    counts: list[CountRow] = Field(description="Counts by source, verdict and outcome: the table artifact.")
    outcomes: dict[str, str] = Field(description="trajectory_id -> 'selected' or its drop reason.")
    duplicate_of: dict[str, str] = Field(description="Dropped duplicate id -> id of the row it duplicates.")
    contaminated_by: dict[str, str] = Field(description="Dropped contaminated id -> held-out task id.")
    contamination: dict[str, str] = Field(
        default_factory=dict, description="Dropped contaminated id -> 'rule:held-out task id' (curate/decontam.py).")
    skipped_tasks: dict[str, str] = Field(
        default_factory=dict, description="Task id -> why its verifier is unhealthy (its rows were skipped).")
    unaudited_tasks: int = Field(default=0, description="Candidate tasks with no verifier_health row.")
    demos_written: int = 0
    demo_errors: list[str] = Field(default_factory=list, description="One line per problem of a rejected demo.")

    def table(self) -> list[dict[str, Any]]:
        """The counts as a list of dicts (for a Prefect table artifact or a CLI table)."""
        return [c.model_dump() for c in self.counts]


def _read(con: Any, sql: str, params: list[object]) -> list[Trajectory]:
    return [from_dict(d) for d in con.sql(sql, params=params).to_arrow_table().to_pylist()]


def curate(root: str, cfg: CurateConfig, *, run_id: str, round: int, heldout_tasks: list[Task]) -> CurateResult:
    """Build and register round `round`'s training snapshot of run `run_id` (see the module docstring)."""
    from warehouse.query import connect

    demo_errors: list[str] = []
    demos_written = 0
    n_invalid_demos = 0
    if cfg.demo_paths:
        imp = import_demos(root, cfg.demo_paths, run_id=run_id, round=cfg.demo_round, suite=cfg.demo_suite,
                           default_tools=cfg.demo_tools)
        demos_written = imp.written
        demo_errors = [str(e) for e in imp.errors]
        n_invalid_demos = imp.rejected_records

    con = connect(root)
    try:
        op = "<=" if cfg.include_earlier_rounds else "="
        candidates = _read(con, f"SELECT * FROM trajectories WHERE run_id = ? AND CAST(round AS INTEGER) {op} ? "
                                "AND coalesce(stage, 'rollout') = 'rollout' ORDER BY trajectory_id", [run_id, round])
        earlier = ("SELECT DISTINCT m.trajectory_id FROM manifests m JOIN datasets d USING (snapshot_id) "
                   "WHERE d.run_id = ? AND d.round < ?")
        prior = _read(con, f"SELECT * FROM trajectories WHERE trajectory_id IN ({earlier}) ORDER BY trajectory_id",
                      [run_id, round])
        health = (task_health(con, {(r.task_id, r.task_version, r.verifier_version) for r in candidates
                                    if r.source != "human"}, cfg.verifier_health)
                  if cfg.verifier_health.enabled else {})
        parent = con.execute("SELECT snapshot_id FROM datasets WHERE run_id = ? AND round < ? "
                             "ORDER BY round DESC, created_at DESC, snapshot_id LIMIT 1", [run_id, round]).fetchall()
    finally:
        con.close()

    outcomes: dict[str, str] = {}
    reuse = set(cfg.reuse_sources)
    if cfg.exclude_previous_snapshots:
        prior = [p for p in prior if p.source not in reuse]
        prior_ids = {p.trajectory_id for p in prior}
        rows = []
        for r in candidates:
            if r.trajectory_id in prior_ids:
                outcomes[r.trajectory_id] = IN_EARLIER_SNAPSHOT
            else:
                rows.append(r)
    else:
        prior, rows = [], list(candidates)

    skipped_tasks: dict[str, str] = {}
    unaudited: set[str] = set()
    if cfg.verifier_health.enabled:
        kept = []
        for r in rows:
            key = (r.task_id, r.task_version, r.verifier_version)
            if r.source == "human":
                kept.append(r)
            elif key not in health:
                unaudited.add(r.task_id)
                if cfg.verifier_health.require_audit:
                    outcomes[r.trajectory_id] = UNAUDITED
                    skipped_tasks[r.task_id] = "never audited (verifier_health.require_audit)"
                else:
                    kept.append(r)
            elif (why := health[key]) is not None:
                outcomes[r.trajectory_id] = UNHEALTHY_VERIFIER
                skipped_tasks[r.task_id] = why
            else:
                kept.append(r)
        rows = kept
    rows, dropped = filter_rows(rows, cfg.filters)
    outcomes.update(dropped)
    hits = find_contamination(rows, heldout_tasks, cfg.decontam)
    rows = [r for r in rows if r.trajectory_id not in hits]
    outcomes.update({k: h.reason for k, h in hits.items()})
    contaminated_by = {k: h.heldout_id for k, h in hits.items()}
    contamination = {k: f"{h.rule}:{h.heldout_id}" for k, h in sorted(hits.items())}
    rows, dropped, duplicate_of = dedup_rows(rows, cfg.dedup, prior)
    outcomes.update(dropped)
    mixed = mix(rows, cfg.mix)
    outcomes.update(mixed.left_out)
    for r, _w in mixed.selected:
        outcomes[r.trajectory_id] = SELECTED
    replayed = replay_rows(prior, len(mixed.selected), cfg) if cfg.exclude_previous_snapshots else []
    for r, _w in replayed:
        outcomes[r.trajectory_id] = REPLAYED
    if replayed:
        mixed.selected = sorted(mixed.selected + replayed,
                                key=lambda rw: (rw[0].source, rw[0].suite, rw[0].task_id, rw[0].round,
                                                example_key(rw[0])))
    assert len(outcomes) == len(candidates), "every candidate must end with exactly one outcome"

    by = Counter((r.source, r.verdict, outcomes[r.trajectory_id]) for r in candidates)
    mhash = manifest_hash(mixed.selected)
    if n_invalid_demos:
        by[("human", "n/a", INVALID_DEMO)] += n_invalid_demos
    counts = [CountRow(source=s, verdict=v, outcome=o, n=n) for (s, v, o), n in sorted(by.items())]
    selected_by_source = dict(sorted(Counter(r.source for r, _ in mixed.selected).items()))
    selected_by_suite = dict(sorted(Counter(r.suite for r, _ in mixed.selected).items()))
    dropped_by_reason = dict(sorted(Counter(o for o in outcomes.values() if o not in (SELECTED, REPLAYED)).items()))
    if n_invalid_demos:
        dropped_by_reason[INVALID_DEMO] = n_invalid_demos

    cfg_hash = config_hash(cfg)
    heldout_digest = hashlib.sha256(json.dumps(sorted(t.id for t in heldout_tasks)).encode()).hexdigest()
    counts_json = {
        "by_source": selected_by_source, "by_suite": selected_by_suite, "dropped_by_reason": dropped_by_reason,
        "table": [c.model_dump() for c in counts], "n_candidates": len(candidates),
        "heldout_tasks": len(heldout_tasks), "heldout_ids_sha256": heldout_digest,
        "contamination": contamination, "invalid_demos": demo_errors,
        "skipped_tasks": dict(sorted(skipped_tasks.items())), "unaudited_tasks": len(unaudited),
        "replayed": len(replayed),
    }
    parent_id = parent[0][0] if parent else None
    sid, path = write_snapshot(root, run_id=run_id, round=round, selected=mixed.selected, cfg_hash=cfg_hash,
                               config_json=cfg.model_dump_json(), counts=counts_json, parent_snapshot_id=parent_id)
    return CurateResult(
        snapshot_id=sid, run_id=run_id, round=round, config_hash=cfg_hash, manifest_path=path,
        manifest_hash=mhash, n_replayed=len(replayed),
        parent_snapshot_id=parent_id, n_candidates=len(candidates), n_selected=len(mixed.selected),
        selected_by_source=selected_by_source, selected_by_suite=selected_by_suite,
        dropped_by_reason=dropped_by_reason, counts=counts, outcomes=outcomes, duplicate_of=duplicate_of,
        contaminated_by=contaminated_by, contamination=contamination, demos_written=demos_written,
        demo_errors=demo_errors, skipped_tasks=dict(sorted(skipped_tasks.items())), unaudited_tasks=len(unaudited),
    )


def replay_rows(prior: list[Trajectory], n_new: int, cfg: CurateConfig) -> list[tuple[Trajectory, float]]:
    """The earlier snapshots' rows that rejoin this one: up to replay_share / (1 - replay_share) per new example,
    the first in the seeded mixing order (curate.mixing.order_key over example keys), each with its source weight;
    rows of sources without a weight are never replayed."""
    share = cfg.replay_share
    if share <= 0 or n_new <= 0:
        return []
    pool = sorted({example_key(p): p for p in prior if cfg.mix.source_weights.get(p.source, 0.0) > 0}.items(),
                  key=lambda kv: order_key(cfg.mix.seed, kv[0]))
    n = min(len(pool), int(share / (1 - share) * n_new + 1e-9))
    return [(p, float(cfg.mix.source_weights[p.source])) for _k, p in pool[:n]]
