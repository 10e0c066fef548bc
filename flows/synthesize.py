"""The flywheel's opt-in task factory stage (`flywheel.synthesize`): after round r's student rolled out on the
train pool, new tasks near the ones it failed join the pool from round r+1 on.

`synthesize_round(cfg, run_id, round)` reads the student's train episodes of the round from the lake, takes their
failure frontier (curate/frontier.py: the family and knobs of each failed task), writes
`flywheel.synthesize.candidates` candidates near it (the reference writer: ledger tasks with a failed cell's knobs;
the openai writer: an endpoint shown a cell's failed task folders as seeds) and admits them exactly as `flywheel
tasks synthesize` does (curate/synthesis.py: every check, with the run's own held-out tasks beside
`admission.heldout`, and the pool's Harbor tasks as possible duplicates), in containers of the run's [sandbox]
settings. Admitted tasks land in FOLDER/RUN_ID/round-R (written beside it and renamed in, so the folder is whole or
absent); every candidate is a task_synthesis row carrying its lineage (run_id, round, the frontier cell, the failed
trajectory ids of that cell), and the task's task.toml carries the run, round and cell. flows/rollouts.py
`synthesized_tasks` hands them to the teacher, curation and the student's rollouts of later rounds (suite
`synthesized`); GRPO's task list stays the schedule's. Nothing to write near (no failure on a task of a factory
family) is a stage with zero candidates, said in the log and the rounds table, not an error.
"""

from __future__ import annotations

import logging
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prefect import get_run_logger, task

from flows.config import FlywheelConfig
from flows.rollouts import heldout_tasks, synthesized_folder, train_pool
from flows.stages import StageTimer, metric

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from curate.config import SynthesizeStageConfig
    from curate.frontier import Frontier, FrontierCell
    from tasks.factory.draft import Candidate


@dataclass
class SynthesizeOutcome:
    """What one round's stage did."""

    candidates: int
    admitted: int
    folder: str
    frontier_cells: int
    failures: int  # the student's failed train episodes of the round
    outside: int  # of them on tasks no factory family makes
    funnel: dict[str, int]
    wall_s: float


def student_train_episodes(root: str, run_id: str, round: int) -> list:
    """The student's train rollouts of `round` (curate/frontier.py Episodes), in trajectory id order."""
    from curate.frontier import Episode
    from warehouse.query import query

    t = query(root, "SELECT trajectory_id, task_id, success, verdict FROM trajectories WHERE run_id = ? AND "
                    "round = ? AND source = 'student' AND split = 'train' AND coalesce(stage, 'rollout') = 'rollout' "
                    "ORDER BY trajectory_id", [run_id, round])
    return [Episode(**r) for r in t.to_pylist()]


def synthesize_round(cfg: FlywheelConfig, run_id: str, round: int) -> SynthesizeOutcome:
    """The stage's work (see the module docstring); writes the admitted folder and the task_synthesis and rounds
    rows."""
    from curate.frontier import failure_frontier, frontier_candidates
    from curate.synthesis import synthesize
    from sandbox.backend import open_backend
    from warehouse.lake import write_rows

    timer = StageTimer()
    syn = cfg.flywheel.synthesize
    root = cfg.run.out
    pool = train_pool(cfg, run_id, lambda joins: joins <= round)
    frontier = failure_frontier(student_train_episodes(root, run_id, round), pool,
                                any_harbor=syn.writer == "openai")
    if syn.writer == "reference":
        asked = frontier_candidates(frontier, syn.candidates, seed=cfg.run.seed, round=round)
    else:
        asked = openai_candidates(frontier, syn, pool, seed=cfg.run.seed, round=round)
    cell_of = {c.candidate_id: cell for c, cell in asked}
    for c, cell in asked:  # the lineage travels with the task too
        if c.draft is not None:
            c.draft.metadata.update({"lineage_run": run_id, "lineage_round": round, "lineage_cell": cell.key})
    dest = synthesized_folder(cfg, run_id, round)
    partial = dest.with_name(dest.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)  # an attempt that died before its rename
    funnel: dict[str, int] = {}
    admitted = 0
    if asked:
        existing = [t for t in pool if t.metadata.get("source_format") == "harbor"]
        sid = f"{run_id}-r{round}-synthesize"
        try:
            with open_backend(cfg.sandbox.model_copy(update={"backend": "docker"}),
                              pool_size=max(2, min(2 * syn.admission.workers, 8))) as backend:
                res = synthesize([c for c, _ in asked], syn.admission, out=partial, backend=backend,
                                 synthesis_id=sid, heldout=heldout_tasks(cfg), existing=existing)
        finally:
            from tasks.harbor import shutdown

            shutdown()
        for row in res.rows:
            cell = cell_of[row.candidate_id]
            row.run_id, row.round, row.frontier, row.asked_by = run_id, round, cell.key, list(cell.failures)
            if row.folder:
                row.folder = str(dest / Path(row.folder).name)
        shutil.rmtree(dest, ignore_errors=True)
        partial.rename(dest)  # the admitted tasks appear together, or not at all
        write_rows(root, "task_synthesis", [r.model_dump() for r in res.rows])
        funnel, admitted = res.funnel(), len(res.admitted)
    out = SynthesizeOutcome(candidates=len(asked), admitted=admitted, folder=str(dest),
                            frontier_cells=len(frontier.cells), failures=frontier.failures, outside=frontier.outside,
                            funnel=funnel, wall_s=timer.s)
    m = [metric(run_id, round, "synthesize", "stage", "train", "all", k, v) for k, v in (
        ("candidates", out.candidates), ("admitted", out.admitted), ("frontier_cells", out.frontier_cells),
        ("student_failures", out.failures), ("failures_outside_families", out.outside))]
    m.append(metric(run_id, round, "synthesize", "stage", "-", "all", "wall_s", out.wall_s))
    write_rows(root, "rounds", m)
    return out


def openai_candidates(frontier: Frontier, syn: SynthesizeStageConfig, tasks: list, *, seed: int,
                      round: int) -> list[tuple[Candidate, FrontierCell]]:
    """The openai writer's candidates near the frontier (curate/frontier.py allot): per cell, up to
    `syn.writer_seeds` of its failed tasks' folders are the seeds it is shown. Request k of the round carries seed
    `seed + k` (the client adds the sample index); candidate ids are openai-r{round}-{k}, and the task a reply
    names N is named r{round}-{k}-N (two rounds' writers may pick one name)."""
    from agents.config import build_policy
    from agents.task_writer import write_candidates
    from curate.frontier import allot
    from tasks.factory.draft import read_folder

    by_id = {t.id: t for t in tasks}
    policy = build_policy(syn.writer_policy)
    out: list[tuple[Candidate, FrontierCell]] = []
    for cell, count in allot(frontier, syn.candidates):
        seeds, shown = [], []
        for tid in cell.tasks[: syn.writer_seeds]:
            try:  # named after its id: Harbor takes any folder name, a draft does not
                seeds.append(read_folder(Path(by_id[tid].metadata["harbor"]["dir"]), name=_slug(tid)))
                shown.append(tid)
            except (ValueError, OSError) as e:
                log.warning("synthesize: task %s cannot be shown to the writer as a seed: %s", tid, e)
        if not seeds:
            log.warning("synthesize: no seed of frontier cell %s could be read; its %d candidate(s) are not written",
                        cell.key, count)
            continue
        policy.seed = seed + len(out)
        for c in write_candidates(policy, seeds, n=count):
            c.candidate_id, c.seed_tasks = f"openai-r{round}-{len(out)}", shown
            if c.draft is not None:  # the writer's name, made unique in the run (a valid name stays valid)
                c.draft.name = f"r{round}-{len(out)}-{c.draft.name}"[:63]
            out.append((c, cell))
    return out


def _slug(task_id: str) -> str:
    """A valid draft name from a task id (synth/Count_Lines -> count-lines)."""
    s = re.sub(r"[^a-z0-9-]+", "-", task_id.split("/", 1)[-1].lower()).strip("-")[:63]
    return s if len(s) >= 2 else f"seed-{s}".strip("-")


@task(name="synthesize")
def stage_synthesize(cfg: FlywheelConfig, run_id: str, round: int) -> dict[str, Any]:
    """The flywheel's synthesize stage of `round` (synthesize_round), logged."""
    out = synthesize_round(cfg, run_id, round)
    log = get_run_logger()
    if out.candidates == 0:
        log.info("round %d synthesize: no failure of the student on a task of a factory family (%d failed train "
                 "episodes, %d on other tasks); nothing written", round, out.failures, out.outside)
    else:
        log.info("round %d synthesize: %d candidate(s) near %d frontier cell(s), %d admitted to %s (funnel: %s); "
                 "they join the train pool in round %d", round, out.candidates, out.frontier_cells, out.admitted,
                 out.folder, ", ".join(f"{k} {v}" for k, v in sorted(out.funnel.items())), round + 1)
    return {"candidates": out.candidates, "admitted": out.admitted, "folder": out.folder, "wall_s": out.wall_s}
