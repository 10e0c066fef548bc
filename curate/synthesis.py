"""The task factory's funnel: candidates from a writer, admitted only by verifier health, as Harbor folders.

`synthesize(candidates, cfg, out=..., backend=...)` takes candidates (a draft, or the reason a writer's reply was
no draft) and, per candidate:
1. static checks (curate/admission.py): resource limits, leaks of the test or the answer into the instruction,
   a copy of a held-out task (the decontamination rules against the held-out tasks of `cfg.heldout`); the draft
   is written to a staging folder and loaded as a Harbor task (invalid_task when it does not load);
2. its image is built (build_failed);
3. agents/audit.py audits it with the perturbed oracles on: the oracle must pass and K re-grades agree with it,
   the null agent fail, every perturbed oracle fail;
4. a candidate that passed everything is a duplicate when the decontamination rules match it to a task admitted
   before it (in candidate order) or already in `out`;
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

from pydantic import BaseModel, ConfigDict, Field

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
from curate.config import DecontamConfig
from curate.decontam import Decontaminator
from sandbox.result import Backend, SandboxUnavailable
from tasks.factory.draft import Candidate, write_folder
from tasks.spec import Task

ADMITTED = "admitted"
REFUSED = "refused"


class SynthesisConfig(BaseModel):
    """What `flywheel tasks synthesize` admits, and what it checks against."""

    model_config = ConfigDict(extra="forbid")
    k: int = Field(default=3, ge=1, le=20, description="Re-grades of the oracle's final state (count); any that "
                                                       "disagrees with the oracle's own verdict refuses as flaky.")
    workers: int = Field(default=2, ge=1, le=16, description="Candidates audited at once (count).")
    heldout: list[str] = Field(
        default_factory=lambda: ["arithmetic", "code", "mathword"],
        description="Suites whose held-out split no candidate may copy: built-in suite names, task files or "
                    "Harbor folders (their tasks marked split = \"heldout\").")
    heldout_n: int = Field(default=50, ge=1, description="Held-out tasks taken of each built-in suite (count).")
    heldout_seed: int = Field(default=0, description="Seed of the built-in suites' held-out tasks.")
    max_bytes: int = Field(default=256 * 1024, gt=0, description="Largest task folder (bytes of its texts).")
    max_files: int = Field(default=64, gt=0, description="Most files in a task folder (count).")
    max_memory_mb: int = Field(default=512, gt=0, description="Largest [environment] memory_mb a task may ask (MB).")
    max_cpus: float = Field(default=1.0, gt=0, description="Most [environment] cpus a task may ask (cores).")
    max_timeout_s: float = Field(default=120.0, gt=0, description="Longest agent or verifier timeout (seconds).")
    min_leak_line: int = Field(default=24, ge=8, description="Shortest tests/ line whose presence in the "
                                                            "instruction is a leak of the test (characters).")
    decontam: DecontamConfig = Field(default_factory=DecontamConfig,
                                     description="The decontamination rules used for held-out copies and duplicates.")


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
               synthesis_id: str) -> SynthesisResult:
    """Admit or refuse every candidate (see the module docstring); admitted folders end up in `out`."""
    from tasks.harbor import build_images

    out.mkdir(parents=True, exist_ok=True)
    staging = out / f".staging-{synthesis_id}"
    staging.mkdir()
    try:
        heldout = Decontaminator(with_files(load_heldout(cfg)), cfg.decontam)
        rows: dict[str, SynthesisRow] = {}
        tasks: dict[str, Task] = {}
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
            if (out / d.name).exists() or (staging / d.name).exists():
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
                hit = heldout.match(as_episode(task))
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
        existing = [t for p in sorted(out.iterdir()) if p.is_dir() and not p.name.startswith(".")
                    and (t := _load(p)[0]) is not None]
        dups = DuplicateIndex(existing, cfg.decontam)
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

