"""Verifier health against the config's thresholds: which audited tasks are unhealthy, and why.

`unhealthy_reason(row, cfg)`: why one verifier_health row (a dict: a lake row or agents.audit.HealthRow dumped)
fails curate.config.VerifierHealthConfig, or None when it is healthy. `task_health(con, task_ids, cfg)`: for the
given task ids, the reason per task of its latest audit rows (matched on task id, task version and verifier
version) from the lake's verifier_health view; `latest_by_task(root, task_ids, cfg)`: the same from each task's
latest audit whatever its versions (GRPO's task list knows ids only). This module does not audit (agents/audit.py does) or drop rows.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from curate.config import VerifierHealthConfig

UNHEALTHY_VERIFIER = "unhealthy_verifier"
UNAUDITED = "unaudited_verifier"


def unhealthy_reason(row: Mapping[str, Any], cfg: VerifierHealthConfig) -> str | None:
    """Why the audited task is unhealthy, or None."""
    if row.get("error"):
        return f"audit error: {row['error']}"
    if not row["oracle_pass"]:
        return "oracle fails"
    if row["null_pass"]:
        return "null agent passes"
    kill = row.get("mutant_kill_rate")
    if kill is not None and kill < cfg.min_mutant_kill_rate:
        return f"mutant kill rate {kill:.2f} < {cfg.min_mutant_kill_rate:.2f}"
    if row["flake_rate"] > cfg.max_flake_rate:
        return f"flake rate {row['flake_rate']:.2f} > {cfg.max_flake_rate:.2f}"
    return None


def task_health(con: Any, keys: Iterable[tuple[str, str, str]],
                cfg: VerifierHealthConfig) -> dict[tuple[str, str, str], str | None]:
    """(task_id, task_version, verifier_version) -> reason it is unhealthy (None: healthy); keys never audited are
    absent."""
    wanted = sorted(set(keys))
    if not wanted:
        return {}
    con.execute("CREATE OR REPLACE TEMP TABLE _health_keys (task_id VARCHAR, task_version VARCHAR, "
                "verifier_version VARCHAR)")
    con.executemany("INSERT INTO _health_keys VALUES (?, ?, ?)", wanted)
    tbl = con.sql("SELECT h.* FROM verifier_health h JOIN _health_keys k USING (task_id, task_version, "
                  "verifier_version)").to_arrow_table()
    return {(r["task_id"], r["task_version"], r["verifier_version"]): unhealthy_reason(r, cfg)
            for r in tbl.to_pylist()}


def latest_by_task(root: str, task_ids: Iterable[str], cfg: VerifierHealthConfig) -> dict[str, str | None]:
    """task id -> reason its latest audit is unhealthy (None: healthy); tasks never audited are absent."""
    from warehouse.query import connect

    ids = sorted(set(task_ids))
    if not ids:
        return {}
    con = connect(root)
    try:
        tbl = con.sql("SELECT * FROM verifier_health WHERE list_contains(?::VARCHAR[], task_id) QUALIFY "
                      "row_number() OVER (PARTITION BY task_id ORDER BY created_at DESC) = 1",
                      params=[ids]).to_arrow_table()
    finally:
        con.close()
    return {r["task_id"]: unhealthy_reason(r, cfg) for r in tbl.to_pylist()}
