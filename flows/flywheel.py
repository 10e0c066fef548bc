"""Prefect flow `flywheel`: N rounds of teacher -> curate -> SFT -> GRPO -> student re-rollout, with a report.

Round 0 builds (or names) the base student, imports human demos and scores the base and the teacher on the held-out
split. Round r (1..N): the teacher rolls out on the curriculum's train tasks; curation mixes teacher rows, demos and
the earlier student's successes into snapshot r; SFT from the previous student (or the base), then GRPO on the tasks
that still give signal; the promotion stage scores the round's checkpoints on the held-out split, `[flywheel]
promote` picks the candidate between SFT's and GRPO's (the SFT-only control), and the candidate replaces the
incumbent (the student the round started from; the base in round 1) only when it is not worse on any held-out suite
beyond the noise and better on the whole set (`[flywheel] incumbent_z`, training/promotion.py); otherwise the next
round starts from the incumbent (the decision, per-suite deltas and a reason code logged, in the rounds table and
the ledger). The student that goes on is recorded with its held-out scores as the round's student and rolls out on
the train tasks (its successes enter round r+1 as source student); the mismatch panel compares those rollouts'
logprobs with the trainer's (flows/train.py `stage_mismatch`) and a crossed `[mismatch]` threshold keeps the
previous student for round r+1 (a warning names it); with `flywheel.synthesize` on, the synthesize stage
(flows/synthesize.py) then admits tasks near the student's failed train tasks, which join the train pool from round
r+1 on; metrics land in the rounds table and the report is rebuilt. The
teacher's rollouts on the suites that join round r+1 need no student, so they run in a low-priority child process
while round r trains, and round 1's while round 0 builds and scores the base (`flywheel.teacher_ahead`; training
holds one core, they use the other); round r+1's teacher stage finds them written and adds only the tasks the
student still fails. Training stages hold the `flywheel-gpu` slot and
every rollout its `flywheel-sandbox` slots, as in `flywheel generate`, so round r's student rollouts wait for the
ahead rollouts' slots when both together need more than `limits.sandbox_slots`.

Every stage records itself in the ledger (flows/stages.py) when its outputs are durable; `--resume RUN_ID`
skips finished stages. Each stage's Prefect task lives in its stage flow: the teacher in flows/generate.py,
curation in flows/curate.py, base/SFT/GRPO in flows/train.py, scoring and the student's rollouts in
flows/evaluate.py; this module holds only the round wiring, the preflight and the summary.
"""

from __future__ import annotations

import multiprocessing
import sys
import time
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from functools import partial
from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from pydantic import BaseModel, Field

from flows.artifacts import viewer_links
from flows.config import FlywheelConfig, SuiteStep, form_type
from flows.curate import stage_curate
from flows.evaluate import stage_baseline, stage_control, stage_student
from flows.generate import new_run_id, stage_teacher, teacher_ahead_process
from flows.rollouts import check_teacher_and_sandbox, preflight_once
from flows.stages import Ledger
from flows.synthesize import stage_synthesize
from flows.train import stage_base, stage_grpo, stage_mismatch, stage_sft


class FlywheelSummary(BaseModel):
    run_id: str
    root: str
    rounds: int
    heldout: list[dict[str, Any]] = Field(default_factory=list, description="subject, round, suite, pass@1")
    report_md: str = ""
    report_html: str = ""
    wall_s: float = 0.0


def _stage(ledger: Ledger, round: int, name: str, run: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """`run()` (a stage task with its named arguments bound) unless the ledger says stage `name` of `round`
    finished; record its outputs when it does."""
    logger = get_run_logger()
    done = ledger.get(round, name)
    if done is not None:
        logger.info("round %d %s: done earlier, skipped", round, name)
        return done
    logger.info("round %d %s: starting", round, name)
    return ledger.done(round, name, run())


def _promote(ledger: Ledger, cfg: FlywheelConfig, run_id: str, round: int, student: dict[str, Any],
             previous: dict[str, Any]) -> dict[str, Any]:
    """The student the next round starts from: this round's, unless its mismatch panel crosses a threshold
    (cfg.mismatch), then the previous round's, with a warning naming the thresholds."""
    if not cfg.mismatch.enabled:
        return student
    mm = _stage(ledger, round, "mismatch", partial(stage_mismatch, cfg=cfg, run_id=run_id, round=round,
                                                   student=student))
    logger = get_run_logger()
    if mm.get("skipped"):
        logger.info("round %d mismatch panel skipped: %s", round, mm["skipped"])
    if mm.get("refused"):
        logger.warning("round %d: checkpoint %s NOT promoted to round %d, mismatch panel crossed: %s; round %d "
                       "starts from %s", round, student.get("checkpoint_id"), round + 1, "; ".join(mm["refused"]),
                       round + 1, previous.get("checkpoint_id"))
        return previous
    return student


Rounds = form_type("flywheel.rounds")  # the run form's parameter: the config key's type and bounds


@flow(name="flywheel", log_prints=True)
def flywheel_flow(cfg: FlywheelConfig, resume: bool = False, rounds: Rounds | None = None,
                  suites: list[SuiteStep] | None = None, student_base: str | None = None, grpo: bool | None = None,
                  overrides: list[str] | None = None) -> FlywheelSummary:
    """Rounds of teacher -> curate -> SFT -> GRPO -> student re-rollout, then the report.

    Args:
        cfg: The run's config, one section per stage; a deployment fills it with the served config and keeps it
            out of the run form.
        resume: Continue the run of run.run_id (set it in overrides) from its last finished stage.
        rounds: Rounds of teacher -> curate -> SFT -> GRPO -> student.
        suites: The schedule: each suite with the round it joins training and its task counts.
        student_base: The base student: 'tiny' (built from the task corpus) or a model folder / hub id.
        grpo: Run GRPO after SFT in each round.
        overrides: Any other config key, as section.key=value (e.g. sft.max_steps=200, run.run_id=fw-1), laid
            over the served config after the fields above.
    """
    from flows.serve import run_config_of

    cfg = run_config_of(cfg, "flywheel", {"rounds": rounds, "suites": suites, "student_base": student_base,
                                          "grpo": grpo}, overrides)
    from flows.config import save_config
    from warehouse.lake import compact
    from warehouse.report import build_report, heldout_table

    t0 = time.perf_counter()
    run_id = cfg.run.run_id or new_run_id("fw")
    cfg = cfg.model_copy(update={"run": cfg.run.model_copy(update={"run_id": run_id})})
    root = cfg.run.out
    if not resume:
        preflight(cfg, recheck=False)  # the CLI checked this config already; other starts are checked here
        save_config(cfg, root, run_id)
    ledger = Ledger(root, run_id)
    logger = get_run_logger()
    logger.info("flywheel run %s -> %s (%d rounds)", run_id, root, cfg.flywheel.rounds)

    ahead = _start_teacher_ahead(ledger, cfg, run_id, 0)
    try:
        base = _stage(ledger, 0, "base", partial(stage_base, cfg=cfg, run_id=run_id))
        _stage(ledger, 0, "baseline", partial(stage_baseline, cfg=cfg, run_id=run_id, base_path=base["path"]))
    finally:
        _finish_teacher_ahead(ahead, 1)
    student = {**base, "scored_round": 0, "scored_subject": "base"}  # the incumbent of round 1
    for r in range(1, cfg.flywheel.rounds + 1):
        _stage(ledger, r, "teacher", partial(stage_teacher, cfg=cfg, run_id=run_id, round=r))
        snap = _stage(ledger, r, "curate", partial(stage_curate, cfg=cfg, run_id=run_id, round=r))
        ahead = _start_teacher_ahead(ledger, cfg, run_id, r)
        try:
            incumbent = student
            parent = incumbent if cfg.flywheel.sft_from == "incumbent" else base
            sft = grpo = None
            if snap.get("n_selected") == 0:  # nothing new to learn: no candidate, the incumbent goes on
                logger.warning("round %d: snapshot %s holds no example; no SFT or GRPO this round", r,
                               snap["snapshot_id"])
            else:
                sft = _stage(ledger, r, "sft", partial(stage_sft, cfg=cfg, run_id=run_id, round=r, parent=parent,
                                                       snapshot_id=snap["snapshot_id"]))
            if cfg.flywheel.grpo and sft is not None:
                grpo = _stage(ledger, r, "grpo", partial(stage_grpo, cfg=cfg, run_id=run_id, round=r, parent=sft))
                if "skipped" in grpo:
                    logger.info("round %d GRPO skipped (%s): SFT's checkpoint is the candidate", r, grpo["skipped"])
                    grpo = None
            ctrl = _stage(ledger, r, "control", partial(stage_control, cfg=cfg, run_id=run_id, round=r, sft=sft,
                                                        grpo=grpo, incumbent=incumbent))
            logger.info("round %d: %s goes on (%s; %s)", r, ctrl["promoted"], ctrl["incumbent_code"],
                        ctrl["incumbent_reason"])
            goes_on = incumbent if ctrl["promoted"] == "incumbent" else (grpo if ctrl["promoted"] == "grpo" else sft)
            goes_on = {**goes_on, "scored_round": r, "scored_subject": "student"}
            _stage(ledger, r, "student", partial(stage_student, cfg=cfg, run_id=run_id, round=r, student=goes_on,
                                                 scored=ctrl["student_metrics"]))
            student = _promote(ledger, cfg, run_id, r, goes_on, incumbent)
            if cfg.flywheel.synthesize.enabled and r < cfg.flywheel.rounds:
                _stage(ledger, r, "synthesize", partial(stage_synthesize, cfg=cfg, run_id=run_id, round=r))
        finally:
            _finish_teacher_ahead(ahead, r + 1)
        compact(root, run_id)
        report = build_report(root, run_id)
        create_markdown_artifact(key="flywheel-report", markdown=report.markdown + viewer_links(
                                     cfg.run.viewer_url, run_id, [snap["snapshot_id"]]),
                                 description=f"flywheel {run_id} after round {r}")
    report = build_report(root, run_id)
    table = heldout_table(root, run_id)
    create_table_artifact(key="flywheel-heldout", table=table, description=f"held-out pass@1 of run {run_id}")
    return FlywheelSummary(run_id=run_id, root=str(root), rounds=cfg.flywheel.rounds, heldout=table,
                           report_md=report.markdown_path, report_html=report.html_path,
                           wall_s=time.perf_counter() - t0)


def _start_teacher_ahead(ledger: Ledger, cfg: FlywheelConfig, run_id: str, r: int) -> Future | None:
    """Start the teacher's rollouts on the suites joining round r+1 in a low-priority child process, while round r
    trains (round 0: builds and scores the base), when `flywheel.teacher_ahead` is on and they are not done."""
    if not (cfg.flywheel.teacher_ahead and r < cfg.flywheel.rounds and ledger.get(r + 1, "teacher") is None
            and any(step.from_round == r + 1 for step in cfg.flywheel.suites)):
        return None
    get_run_logger().info("round %d teacher on the suites joining it: in a child process, while round %d %s",
                          r + 1, r, "builds the base" if r == 0 else "trains")
    pool = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"))
    ahead = pool.submit(teacher_ahead_process, cfg_json=cfg.model_dump_json(), run_id=run_id, round=r + 1)
    pool.shutdown(wait=False)
    return ahead


def _finish_teacher_ahead(ahead: Future | None, r: int) -> None:
    """Wait for round r's ahead rollouts (before round r's teacher stage, which must not run the same tasks
    beside them). Their rows are durable as they land; whatever they missed, round r's teacher stage runs."""
    if ahead is None:
        return
    logger = get_run_logger()
    try:
        logger.info("round %d teacher ahead: %s", r, ahead.result())
    except Exception as e:  # noqa: BLE001 - a failed child is a warning: the teacher stage covers its tasks
        logger.warning("round %d teacher ahead failed (%s: %s); round %d's teacher stage runs those tasks instead",
                       r, type(e).__name__, e, r)


def preflight(cfg: FlywheelConfig, *, recheck: bool = True) -> None:
    """Fail fast before anything is written: suites, teacher(s), sandbox engine. recheck=False skips a config
    this process already passed (flows.rollouts.preflight_once)."""
    from tasks.suites import check_suite
    from training.attention import sink_warning

    def check(c: FlywheelConfig) -> None:
        for step in c.flywheel.suites:
            check_suite(step.suite)
        check_teacher_and_sandbox(c)
        if c.flywheel.synthesize.enabled:
            check_synthesize(c)
        line = sink_warning(c.student.base, c.student.train_attention)
        if line:
            print(line, file=sys.stderr)

    preflight_once("flywheel", cfg, check, recheck=recheck)


def check_synthesize(cfg: FlywheelConfig) -> None:
    """Preflight of flywheel.synthesize: SandboxUnavailable without Docker (the tasks it admits are Harbor tasks),
    EndpointError for an openai writer that does not answer (the config's own checks are FlywheelConfig's)."""
    from sandbox.backend import check_backend
    from sandbox.result import SandboxConfig, SandboxUnavailable

    try:
        check_backend(SandboxConfig(backend="docker"))
    except SandboxUnavailable as e:
        raise SandboxUnavailable(f"flywheel.synthesize admits Harbor tasks, which need Docker: {e}") from None
    if cfg.flywheel.synthesize.writer == "openai" and cfg.flywheel.synthesize.writer_policy is not None:
        from agents.config import check_policy

        check_policy(cfg.flywheel.synthesize.writer_policy)


def print_summary(s: FlywheelSummary) -> None:
    from rich.console import Console
    from rich.table import Table

    c = Console(width=max(100, Console().width))
    t = Table(title=f"flywheel {s.run_id}: held-out pass@1 by round")
    suites = sorted({row["suite"] for row in s.heldout})
    t.add_column("round")
    t.add_column("subject")
    for su in suites:
        t.add_column(su, justify="right")
    keyed: dict[tuple[int, str], dict[str, float]] = {}
    for row in s.heldout:
        keyed.setdefault((row["round"], row["subject"]), {})[row["suite"]] = row["pass@1"]
    for (rnd, subj), vals in sorted(keyed.items()):
        t.add_row(str(rnd), subj, *(f"{vals[su]:.0%}" if su in vals else "-" for su in suites))
    c.print(t)
    c.print(f"{s.wall_s / 60:.1f} min\nreport: {s.report_md}\n        {s.report_html}\n"
            f"query:  flywheel sql --root {s.root} \"SELECT * FROM rounds WHERE run_id = '{s.run_id}'\"")
