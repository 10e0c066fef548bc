"""The task factory's funnel: candidates from a writer, admitted only by verifier health, as Harbor folders.

`synthesize(candidates, cfg, out=..., backend=...)` takes candidates (a draft, or the reason a writer's reply was
no draft) and, per candidate:
1. static checks (curate/admission.py): resource limits, leaks of the test or the answer into the instruction,
   a copy of a held-out task (the decontamination rules against the held-out tasks of `cfg.heldout` and those the
   caller adds: the flywheel's synthesize stage adds its run's); the draft
   is written to a staging folder and loaded as a Harbor task (invalid_task when it does not load);
2. its image is built (build_failed);
3. agents/audit.py audits it with the perturbed oracles on: the oracle must pass and K re-grades agree with it,
   the null agent fail, every perturbed oracle fail;
4. a candidate that passed everything is a duplicate when the decontamination rules match it to a task admitted
   before it (in candidate order), already in `out`, or among the caller's `existing` tasks (a candidate named
   like one of those is refused as a duplicate before anything is built);
and moves the admitted folders into `out` (one rename each: a folder is there whole or not at all; refused ones
are deleted). A candidate refused by a static check is not built or audited (its reason codes are the static
ones). Every candidate becomes one `SynthesisRow` (the lake's task_synthesis table). This module does not call a
writer (tasks/factory/ledger.py, agents/task_writer.py) and does not write the lake (the CLI does).
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from agents.audit import HealthRow, audit_tasks
from curate.admission import (
    BUILD_FAILED,
    DUPLICATE,
    HELDOUT_COPY,
    INVALID_TASK,
    DuplicateIndex,
    as_episode,
    audit_reasons,
    leak_reasons,
    limit_reasons,
    with_files,
)
from curate.config import SynthesisConfig
from curate.decontam import Decontaminator
from sandbox.result import Backend, SandboxUnavailable
from tasks.factory.draft import Candidate, write_folder
from tasks.spec import Task

ADMITTED = "admitted"
REFUSED = "refused"


class SynthesisRow(BaseModel):
    """One row of the lake's task_synthesis table: one candidate and what became of it."""

    synthesis_id: str = Field(description="The synthesize call this candidate belongs to.")
    candidate_id: str
    writer: str = Field(description="reference | openai")
    family: str
    task_id: str | None = Field(default=None, description="synth/<name> when the candidate was a task.")
    decision: Literal["admitted", "refused"]
    reason_codes: list[str] = Field(default_factory=list, description="Why it was refused (empty when admitted).")
    detail: str | None = Field(default=None, description="The first refusal's particulars (held-out id, error).")
    folder: str | None = Field(default=None, description="The admitted task's folder.")
    seed_tasks: list[str] = Field(default_factory=list, description="Tasks the writer was shown.")
    oracle_pass: bool | None = None
    null_pass: bool | None = None
    k_regrades: int | None = None
    flake_rate: float | None = None
    n_perturbed: int | None = Field(default=None, description="Perturbed oracles judged.")
    perturbed_killed: int | None = Field(default=None, description="Perturbed oracles that failed.")
    prompt_tokens: int = 0
    completion_tokens: int = 0
    writer_usd: float = 0.0
    writer_s: float = 0.0
    build_s: float = 0.0
    audit_s: float = 0.0
    run_id: str | None = Field(default=None, description="The flywheel run whose synthesize stage asked for it "
                                                          "(None from `flywheel tasks synthesize`).")
    round: int | None = Field(default=None, description="The round whose failures asked for it.")
    frontier: str | None = Field(default=None, description="The failure frontier's cell it was written near "
                                                           "(curate/frontier.py FrontierCell.key).")
    asked_by: list[str] = Field(default_factory=list, description="Trajectory ids of the student's failed "
                                                                  "episodes in that cell.")


@dataclass
class SynthesisResult:
    """The rows (in candidate order) and the admitted folders."""

    rows: list[SynthesisRow]
    admitted: list[Path]

    def funnel(self) -> dict[str, int]:
        """reason code -> candidates refused with it (a candidate may count under several), plus 'admitted'."""
        out: dict[str, int] = {ADMITTED: sum(r.decision == ADMITTED for r in self.rows)}
        for r in self.rows:
            for code in r.reason_codes:
                out[code] = out.get(code, 0) + 1
        return out


def load_heldout(cfg: SynthesisConfig) -> list[Task]:
    """The held-out tasks of every source of cfg.heldout (nothing is built)."""
    from tasks.harbor import is_harbor_dir, load_harbor
    from tasks.suites import load_suite

    out: list[Task] = []
    for src in cfg.heldout:
        if Path(src).is_dir() and is_harbor_dir(src):
            out += [t for t in load_harbor(src) if t.split == "heldout"]
        elif Path(src).is_file():
            from tasks.loaders import load_tasks

            out += [t for t in load_tasks(src) if t.split == "heldout"]
        else:
            out += load_suite(src, cfg.heldout_n, split="heldout", seed=cfg.heldout_seed)
    return out


def _load(folder: Path) -> tuple[Task | None, str | None]:
    from tasks.harbor import load_one

    problems: list[str] = []
    task = load_one(folder, "synthesized", problems)
    return task, "; ".join(problems)[:500] if problems else None


def synthesize(candidates: list[Candidate], cfg: SynthesisConfig, *, out: Path, backend: Backend,
               synthesis_id: str, heldout: list[Task] | None = None, existing: list[Task] | None = None
               ) -> SynthesisResult:
    """Admit or refuse every candidate (see the module docstring); admitted folders end up in `out`. `heldout`:
    more held-out tasks no candidate may copy, beside those of cfg.heldout (the flywheel's run passes its own);
    `existing`: more tasks no candidate may duplicate, beside those in `out` (the run's train pool)."""
    from tasks.harbor import build_images

    out.mkdir(parents=True, exist_ok=True)
    staging = out / f".staging-{synthesis_id}"
    staging.mkdir()
    try:
        heldout_index = Decontaminator(with_files(load_heldout(cfg) + list(heldout or [])), cfg.decontam)
        rows: dict[str, SynthesisRow] = {}
        tasks: dict[str, Task] = {}
        taken = {t.id for t in existing or []}
        for c in candidates:
            row = SynthesisRow(synthesis_id=synthesis_id, candidate_id=c.candidate_id, writer=c.writer,
                               family=c.family, decision=REFUSED, seed_tasks=c.seed_tasks,
                               prompt_tokens=c.prompt_tokens, completion_tokens=c.completion_tokens,
                               writer_usd=c.usd, writer_s=c.writer_s)
            rows[c.candidate_id] = row
            if c.draft is None:
                row.reason_codes, row.detail = [c.problem or "malformed_reply"], c.detail
                continue
            d = c.draft
            row.task_id = f"synth/{d.name}"
            codes = limit_reasons(d, max_bytes=cfg.max_bytes, max_files=cfg.max_files,
                                  max_memory_mb=cfg.max_memory_mb, max_cpus=cfg.max_cpus,
                                  max_timeout_s=cfg.max_timeout_s)
            codes += leak_reasons(d, min_leak_line=cfg.min_leak_line)
            if (out / d.name).exists() or (staging / d.name).exists() or f"synth/{d.name}" in taken:
                codes.append(DUPLICATE)
                row.detail = f"a task named {d.name} exists already"
            task = None
            if not codes:
                t0 = time.perf_counter()
                write_folder(d, staging / d.name)
                task, problem = _load(staging / d.name)
                row.build_s = time.perf_counter() - t0
                if task is None:
                    codes.append(INVALID_TASK)
                    row.detail = problem
            if task is not None:
                hit = heldout_index.match(as_episode(task))
                if hit is not None:
                    codes.append(HELDOUT_COPY)
                    row.detail = f"{hit.rule}: {hit.heldout_id}"
            row.reason_codes = codes
            if not codes and task is not None:
                tasks[c.candidate_id] = task
        for cid, task in list(tasks.items()):
            t0 = time.perf_counter()
            try:
                build_images([task])
            except (SandboxUnavailable, OSError) as e:
                rows[cid].reason_codes = [BUILD_FAILED]
                rows[cid].detail = str(e)[:500]
                del tasks[cid]
            rows[cid].build_s += time.perf_counter() - t0
        audited = list(tasks.items())
        health = audit_tasks([t for _, t in audited], backend, k=cfg.k, workers=cfg.workers, perturb=True)
        for (cid, _), h in zip(audited, health):
            _audit_figures(rows[cid], h)
        there = [t for p in sorted(out.iterdir()) if p.is_dir() and not p.name.startswith(".")
                 and (t := _load(p)[0]) is not None]
        dups = DuplicateIndex(there + list(existing or []), cfg.decontam)
        admitted: list[Path] = []
        for cid, task in audited:
            row = rows[cid]
            if row.reason_codes:
                continue
            same = dups.match(task)
            if same is not None:
                row.reason_codes, row.detail = [DUPLICATE], f"copies {same}"
                continue
            dups.add(task)
            name = task.id.split("/", 1)[1]
            (staging / name).rename(out / name)
            row.decision, row.folder = ADMITTED, str(out / name)
            admitted.append(out / name)
        return SynthesisResult(rows=[rows[c.candidate_id] for c in candidates], admitted=admitted)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _audit_figures(row: SynthesisRow, h: HealthRow) -> None:
    row.reason_codes = audit_reasons(h)
    row.detail = h.error or (f"surviving perturbations: {', '.join(h.mutant_survivors)}" if h.mutant_survivors
                             else None)
    row.oracle_pass, row.null_pass, row.k_regrades, row.flake_rate = h.oracle_pass, h.null_pass, h.k_regrades, \
        h.flake_rate
    row.n_perturbed, row.perturbed_killed, row.audit_s = h.n_mutants, h.mutants_killed, h.wall_s

