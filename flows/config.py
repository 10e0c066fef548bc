"""The one typed config of a flywheel run: loaded from TOML, overridden from the CLI, saved beside every output.

Each stage owns its section's model (sandbox/, agents/, warehouse/, training/); this module composes them,
reads TOML, applies `section.key=value` overrides and reports bad keys or values as one `ConfigError` line that
names the key, the file and the fix. It does not import prefect and runs nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tomllib
import typing
import zoneinfo
from pathlib import Path
from typing import Annotated, Any, Literal

import tomli_w
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from agents.config import MixtureConfig, PolicyConfig, RolloutConfig
from agents.reference import ReferenceNoise
from curate.config import CurateConfig, CurriculumConfig, SynthesizeStageConfig
from flows.concurrency import LimitsConfig
from sandbox.result import SandboxConfig
from tasks.judge.api import JudgeConfig, RewardConfig
from training.config import (
    TINY_SFT_LEARNING_RATES,
    DiagnosticsThresholds,
    GRPOConfig,
    MismatchThresholds,
    SFTConfig,
    StudentConfig,
)


def _shipped_demos() -> list[str]:
    """The human demonstrations shipped with the project (a source checkout), if present: eight tool-using
    arithmetic demos, judged on import like every episode (curate/demos.py)."""
    path = Path(__file__).resolve().parent.parent / "data" / "demos" / "arithmetic_demos.jsonl"
    return [str(path)] if path.is_file() else []


# The offline teacher makes mistakes and cheats now and then, so that verification and curation have work.
OFFLINE_TEACHER_NOISE = ReferenceNoise(wrong_answer=0.05, malformed_call=0.03, no_tool=0.05)


# The flows `flywheel serve` can deploy (flows/serve.py maps each to its module); also the [serve] schedule keys.
SERVED_FLOWS = ("generate", "curate", "train_sft", "train_grpo", "evaluate", "flywheel")

_CRON_FIELDS = ((0, 59, {}), (0, 23, {}), (1, 31, {}),
                (1, 12, {m: i for i, m in enumerate("jan feb mar apr may jun jul aug sep oct nov dec".split(), 1)}),
                (0, 7, {d: i for i, d in enumerate("sun mon tue wed thu fri sat".split())}))


def valid_cron(expr: str) -> bool:
    """A standard 5-field cron expression: each field `*`, N, N-M, lists of those, each with an optional /STEP;
    month and weekday names (jan, mon) allowed. Random or hashed forms (R, H) are not cron."""
    fields = expr.split()
    if len(fields) != 5:
        return False
    for text, (lo, hi, names) in zip(fields, _CRON_FIELDS, strict=True):
        for part in text.lower().split(","):
            rng, _, step = part.partition("/")
            if step and not (step.isdigit() and int(step) > 0):
                return False
            if rng == "*":
                continue
            ends = [names.get(x, x) for x in rng.split("-")]
            if len(ends) > 2 or not all(isinstance(x, int) or x.isdigit() for x in ends):
                return False
            nums = [int(x) for x in ends]
            if not all(lo <= n <= hi for n in nums) or (len(nums) == 2 and nums[0] > nums[1]):
                return False
    return True


class ScheduleConfig(BaseModel):
    """When a deployment runs by itself. Empty (no cron, no interval): only when triggered (UI, API, CLI)."""

    model_config = ConfigDict(extra="forbid")
    cron: str | None = Field(default=None, description="Cron expression, 5 fields, in `timezone` "
                             "(e.g. '0 3 * * *' = every day at 03:00). Exclusive with interval_s.")
    interval_s: float | None = Field(default=None, gt=0, description="Run every this many seconds (e.g. 21600 = "
                                     "every 6 h). Exclusive with cron.")
    timezone: str = Field(default="UTC", description="IANA time zone of the cron expression (e.g. Europe/Paris).")
    active: bool = Field(default=True, description="False registers the schedule paused (resume it in the UI).")

    @field_validator("cron")
    @classmethod
    def _cron(cls, v: str | None) -> str | None:
        if v is None:
            return v
        if not valid_cron(v.strip()):
            raise ValueError(f"{v!r} is not a 5-field cron expression; e.g. '0 3 * * *' (03:00 daily) or "
                             "'*/30 * * * *' (every 30 min)")
        return v.strip()

    @field_validator("timezone")
    @classmethod
    def _tz(cls, v: str) -> str:
        try:
            zoneinfo.ZoneInfo(v)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"{v!r} is not an IANA time zone; e.g. UTC or Europe/Paris") from None
        return v

    @model_validator(mode="after")
    def _one(self) -> ScheduleConfig:
        if self.cron and self.interval_s:
            raise ValueError("set either cron or interval_s, not both")
        return self

    @property
    def is_set(self) -> bool:
        return bool(self.cron or self.interval_s)


class ServeConfig(BaseModel):
    """The `[serve]` config section: which flows `flywheel serve` deploys, their schedules, and its capacity."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(default="flywheel", pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$",
                      description="Deployment name; deployments appear as '<flow>/<name>' (e.g. generate/flywheel).")
    flows: list[str] = Field(default_factory=lambda: list(SERVED_FLOWS),
                             description="Flows to deploy: any of generate, curate, train_sft, train_grpo, "
                             "evaluate, flywheel.")
    limit: int = Field(default=1, ge=1, description="Flow runs this serve process executes at once; more wait in "
                       "Scheduled state (start more serve processes, or use a work pool, to run more).")
    concurrency_per_flow: int | None = Field(default=None, ge=1, description="Runs of one deployment at once, "
                                             "across all serve processes; empty = no per-deployment limit.")
    tags: list[str] = Field(default_factory=lambda: ["flywheel"], description="Tags on every deployment.")
    generate: ScheduleConfig = Field(default_factory=ScheduleConfig, description="Schedule of the generate flow.")
    curate: ScheduleConfig = Field(default_factory=ScheduleConfig, description="Schedule of the curate flow.")
    train_sft: ScheduleConfig = Field(default_factory=ScheduleConfig, description="Schedule of the train-sft flow.")
    train_grpo: ScheduleConfig = Field(default_factory=ScheduleConfig, description="Schedule of the train-grpo "
                                       "flow.")
    evaluate: ScheduleConfig = Field(default_factory=ScheduleConfig, description="Schedule of the evaluate flow.")
    flywheel: ScheduleConfig = Field(default_factory=ScheduleConfig, description="Schedule of the flywheel flow "
                                     "(one full round).")

    @field_validator("flows")
    @classmethod
    def _known(cls, v: list[str]) -> list[str]:
        known = list(SERVED_FLOWS)
        bad = [f for f in v if f not in known]
        if bad:
            raise ValueError(f"unknown flow(s) {', '.join(bad)}; choose from {', '.join(known)}")
        if not v:
            raise ValueError(f"no flow to serve; list some of {', '.join(known)}")
        return list(dict.fromkeys(v))

    def schedule(self, flow: str) -> ScheduleConfig:
        return getattr(self, flow)


class ConfigError(ValueError):
    """The config file or an override is wrong; the message names the key and how to fix it."""


class RunConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    run_id: str | None = Field(default=None, description="Run id; a new one is made when empty. Reuse it to resume.")
    out: str = Field(default="runs/default", description="Lake root: a folder or an fsspec URL (file://, s3://).")
    seed: int = Field(default=0, description="Seed for task generation, sampling and training.")
    ray_address: str | None = Field(default=None, description="Run Prefect tasks on this Ray cluster "
                                    "(e.g. ray://host:10001 or 'auto'); threads when empty.")
    max_workers: int = Field(default=2, ge=1, description="Threads of Prefect's task runner on one machine.")
    viewer_url: str | None = Field(default=None, description="Base URL of a `flywheel view` over this lake (e.g. "
                                   "http://127.0.0.1:8765): the run's Prefect artifacts link to its pages.")

    @field_validator("run_id")
    @classmethod
    def _run_id_chars(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}", v):
            raise ValueError("run ids use letters, digits, '.', '_' and '-' only (e.g. run-1)")
        return v


class GenerateConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    suite: str = Field(default="arithmetic", description="Built-in suite name, or a task file (.jsonl/.parquet).")
    split: str = Field(default="train", description="train or heldout.")
    n_tasks: int = Field(default=50, gt=0, description="How many tasks to draw from the suite.")
    samples: int = Field(default=2, gt=0, description="Episodes per task.")
    difficulty: int = Field(default=1, ge=1, le=3, description="Difficulty level of built-in suites.")
    round: int = Field(default=0, ge=0, description="Round number recorded on the rows.")
    chunks: int = Field(default=1, ge=1, description="Split the tasks into this many Prefect tasks (parallel on "
                        "the task runner: threads, or Ray workers with run.ray_address).")


class SuiteStep(BaseModel):
    """One suite of the flywheel's schedule: from which round it is trained, how many tasks of each split."""

    model_config = ConfigDict(extra="forbid")
    suite: str = Field(default="arithmetic", description="Built-in suite name or task file.")
    difficulty: int = Field(default=1, ge=1, le=3, description="Difficulty level (built-in suites).")
    from_round: int = Field(default=1, ge=1, description="First round whose teacher, SFT and GRPO use it; every "
                                                         "round scores the student on all suites' held-out split.")
    train_tasks: int = Field(default=150, ge=0, description="Train tasks drawn from it; 0: a suite only scored "
                             "(held-out), never trained, e.g. ledger-combos.")
    heldout_tasks: int = Field(default=40, gt=0, description="Held-out tasks drawn from it.")


class FlywheelSection(BaseModel):
    """The rounds of `flywheel run`."""

    model_config = ConfigDict(extra="forbid")
    rounds: int = Field(default=2, ge=1, description="Rounds of teacher -> curate -> SFT -> GRPO -> student.")
    suites: list[SuiteStep] = Field(
        default_factory=lambda: [
            SuiteStep(suite="arithmetic", difficulty=1, from_round=1, train_tasks=4000, heldout_tasks=50),
            SuiteStep(suite="arithmetic", difficulty=2, from_round=2, train_tasks=1000, heldout_tasks=50)],
        description="The schedule: each suite with the round it joins training.")
    teacher_samples: int = Field(default=1, ge=1, description="Teacher episodes per chosen train task.")
    student_train_samples: int = Field(default=1, ge=0, description="Student episodes per train task after each "
                                                                    "round (its successes feed the next); 0: none.")
    student_train_tasks: int = Field(default=200, ge=0, description="At most this many train tasks per round for "
                                                                    "the student's own rollouts.")
    later_sft_steps: int | None = Field(default=800, description="SFT steps in rounds after the first (the student "
                                        "continues from the previous one, at sft.batch_size); None: sft.max_steps. "
                                        "The default is what kept arithmetic-d1 while round 2 learned d2 (README, "
                                        "'What `make run` does').")
    sft_from: Literal["incumbent", "base"] = Field(
        default="incumbent", description="What each round's SFT starts from: 'incumbent' (the student the round "
        "started from; rounds after the first run later_sft_steps, and curate.replay_share keeps earlier rounds' "
        "data in play) or 'base' (the base student every round, sft.max_steps on the round's snapshot: pair it with "
        "curate.exclude_previous_snapshots=false so that the snapshot is the cumulative curated data).")
    pass_k: int = Field(default=4, ge=1, description="k of the held-out pass@k (k sampled episodes per task); "
                                                     "1 skips the sampled evaluation.")
    sample_temperature: float = Field(default=0.8, gt=0, description="Temperature of sampled student episodes.")
    grpo: bool = Field(default=True, description="Run GRPO after SFT in each round (`--set flywheel.grpo=false` "
                       "for SFT alone), with the SFT-only control scoring both checkpoints (flywheel.promote). Its "
                       "gain in the offline default is reported per round in the rounds table and the report "
                       "(subject promotion), whatever it is, zero included.")
    teacher_ahead: bool = Field(default=True, description="Roll the teacher out on the suites joining round r+1 "
                                                          "in a child process while round r trains (they depend on no "
                                                          "student); off: inside round r+1's teacher stage.")
    grpo_max_tasks: int = Field(default=64, gt=0, description="At most this many GRPO tasks per round.")
    synthesize: SynthesizeStageConfig = Field(
        default_factory=SynthesizeStageConfig, description="The opt-in task factory stage: after each round but the "
        "last, tasks near the student's failed train tasks (their family and knobs), admitted by verifier health, "
        "join the train pool from the next round on, with their lineage in the task_synthesis table.")
    promote: Literal["grpo_unless_worse", "grpo", "sft"] = Field(
        default="grpo_unless_worse", description="In a round with GRPO, which checkpoint goes on (scored as the "
        "student, rolls out, seeds the next round), after both are scored on the held-out split: "
        "'grpo_unless_worse' keeps GRPO's unless its held-out sampled pass@1 is below SFT's by more than "
        "promote_margin or its greedy pass@1 is below SFT's by more than promote_greedy_margin; 'grpo' or 'sft' "
        "always that one.")
    promote_margin: float = Field(default=0.035, ge=0, le=1, description="The noise margin of 'grpo_unless_worse' "
                                  "on held-out sampled pass@1 (absolute): one standard deviation of the difference "
                                  "of two scores. Measured (benchmarks/eval_noise.py, one SFT checkpoint rescored "
                                  "with 3 sampling seeds on the default held-out split, 100 tasks x 4 samples at "
                                  "T=0.8): per-score seed sd 0.023 (binomial se 0.024), so a difference of two "
                                  "scores has sd 0.033.")
    incumbent_z: float = Field(default=2.0, ge=0, description="Promotion against the incumbent (the student the "
                               "round started from; the base in round 1; training/promotion.py): the round's "
                               "candidate replaces it only when it is not below the incumbent on any held-out suite "
                               "by more than this many standard errors of the difference of two binomial scores "
                               "(greedy pass@1, and sampled pass@1 where both were measured), and better on the whole "
                               "held-out set (greedy pass@1 higher, or equal with sampled pass@1 higher); otherwise "
                               "the next round starts from the incumbent. Unit: standard errors. At the default's sizes 2 "
                               "is about 0.044 of sampled pass@1 (400 episodes at 0.89) and 0.12 of greedy pass@1 (a "
                               "50-task suite at 0.9); the measured noise is in the README (benchmarks/eval_noise.py).")
    promote_greedy_margin: float = Field(default=0.0, ge=0, le=1, description="'grpo_unless_worse' also refuses "
                                         "GRPO's checkpoint when its held-out greedy pass@1 is below SFT's by more "
                                         "than this (absolute; 0: any drop). Default 0, measured: a make run "
                                         "promoted a round-2 GRPO checkpoint on sampled pass@1 (+0.005) whose "
                                         "greedy pass@1 was 0.86 against SFT's 0.89.")


def _sections() -> dict[str, type[BaseModel]]:
    """Section name -> model, from the fields of FlywheelConfig (an optional section: its model)."""
    out = {}
    for name, f in FlywheelConfig.model_fields.items():
        models = [a for a in typing.get_args(f.annotation) if isinstance(a, type) and issubclass(a, BaseModel)]
        out[name] = models[0] if models else f.annotation
    return out  # type: ignore[return-value]


class FlywheelConfig(BaseModel):
    """Everything a flywheel run needs, one section per stage. Saved beside every output as config.toml."""

    model_config = ConfigDict(extra="forbid")
    run: RunConfig = Field(default_factory=RunConfig, description="Run id, lake root, seed, task runner.")
    generate: GenerateConfig = Field(default_factory=GenerateConfig, description="`generate`: suite, tasks, "
                                     "samples, chunks.")
    rollout: RolloutConfig = Field(default_factory=RolloutConfig, description="Episodes of every stage: "
                                   "concurrency, turns, batch size, infra retries.")
    teacher: PolicyConfig = Field(default_factory=lambda: PolicyConfig(noise=OFFLINE_TEACHER_NOISE),
                                  description="The teacher policy (offline default: reference replay with noise "
                                              "and injected hacks so the filters have work).")
    teacher_mixture: MixtureConfig | None = Field(default=None, description="Several teachers in one run, each "
                                                  "(task, sample) assigned to one by weight; set, it replaces "
                                                  "[teacher] in every teacher stage (generate, the flywheel's "
                                                  "teacher and baseline). Empty: [teacher] alone.")
    rewards: RewardConfig = Field(default_factory=RewardConfig, description="Weights of the reward's parts, on "
                                  "every rollout's rows and in GRPO (default: the outcome alone).")
    judge: JudgeConfig | None = Field(default=None, description="The LLM judge of tasks whose verifier is "
                                      "llm_judge, in every rollout; empty: such episodes cannot be verified "
                                      "(VerifierUnavailable, retried as infra_error, never scored).")
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig, description="Sandbox backend and limits.")
    student: StudentConfig = Field(default_factory=StudentConfig, description="Base student and its generation.")
    flywheel: FlywheelSection = Field(default_factory=FlywheelSection, description="Rounds and suite schedule.")
    curate: CurateConfig = Field(default_factory=lambda: CurateConfig(demo_paths=_shipped_demos()),
                                 description="Filters, dedup, decontamination, mix; the offline default mixes in "
                                             "the human demos shipped in data/demos/.")
    curriculum: CurriculumConfig = Field(default_factory=CurriculumConfig, description="Task choice per round.")
    sft: SFTConfig = Field(default_factory=lambda: SFTConfig(max_steps=2000, batch_size=8, learning_rate=5e-3,
                                                             weight_decay=0.3),
                           description="Supervised fine-tuning (TRL SFTTrainer); the offline default is the measured "
                                       "recipe that takes the tiny student (after its copy warm-up, "
                                       "student.tiny.copy_warmup_steps) to 100% on held-out arithmetic-d1: with "
                                       "weight decay 0.1 or less, or without the warm-up, some data orders stalled "
                                       "at 54-74% (the student added the numbers in its head instead of copying "
                                       "the tool's output). Batch 8 scores as batch 16 did on round 1 in half the "
                                       "time (README, 'What `make run` does'). A config that picks a tiny "
                                       "family and sets no sft.learning_rate gets the family's rate "
                                       "(training.config.TINY_SFT_LEARNING_RATES: tiny-gptoss 1e-3).")
    grpo: GRPOConfig = Field(default_factory=lambda: GRPOConfig(max_steps=16, num_generations=8, prompts_per_step=4,
                                                                      learning_rate=1e-4),
                             description="GRPO (TRL GRPOTrainer) in our sandboxes; on the CPU default the measured "
                                         "schedule of flywheel.grpo: 16 steps of 4 tasks x 8 samples (64 tasks, "
                                         "flywheel.grpo_max_tasks), about 170-330 s on a loaded 2-core machine.")
    diagnostics: DiagnosticsThresholds = Field(default_factory=DiagnosticsThresholds, description="When GRPO's "
                                               "per-step diagnostics warn (training/diagnostics.py).")
    mismatch: MismatchThresholds = Field(default_factory=MismatchThresholds, description="The mismatch panel "
                                         "after each round's student rollouts (training/mismatch.py) and when it "
                                         "refuses to promote the round's checkpoint to the next round.")
    serve: ServeConfig = Field(default_factory=ServeConfig, description="`flywheel serve`: deployments, schedules.")
    limits: LimitsConfig = Field(default_factory=LimitsConfig, description="Prefect global concurrency limits.")

    @model_validator(mode="after")
    def _late_phase_fits(self) -> FlywheelConfig:
        """sft.late_sources needs every round's SFT to run more steps than its late phase."""
        for key, steps in (("sft.max_steps", self.sft.max_steps),
                           ("flywheel.later_sft_steps", self.flywheel.later_sft_steps)):
            if problem := self.sft.late_phase_problem(key, steps):
                raise ValueError(problem)
        return self

    @model_validator(mode="after")
    def _synthesize_can_run(self) -> FlywheelConfig:
        """flywheel.synthesize writes near the student's train failures, into a local folder."""
        syn = self.flywheel.synthesize
        if syn.enabled and (self.flywheel.student_train_samples == 0 or self.flywheel.student_train_tasks == 0):
            raise ValueError("flywheel.synthesize.enabled needs the student's train rollouts (their failures are what "
                             "it writes near); set flywheel.student_train_samples and flywheel.student_train_tasks "
                             "to 1 or more, or turn it off")
        out = self.run.out
        if syn.enabled and not syn.folder and "://" in out and not out.startswith("file://"):
            raise ValueError(f"flywheel.synthesize writes Harbor task folders, and run.out ({out}) is not a local "
                             "folder; set flywheel.synthesize.folder to a local folder")
        return self

    def to_toml(self) -> str:
        return tomli_w.dumps(_drop_none(self.model_dump(mode="json")))

    def digest(self) -> str:
        """A short hash of the config (run_id excluded), recorded beside outputs."""
        d = self.model_dump(mode="json")
        d["run"].pop("run_id", None)
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]


def _drop_none(d: Any) -> Any:
    if isinstance(d, dict):
        return {k: _drop_none(v) for k, v in d.items() if v is not None}
    if isinstance(d, list):
        return [_drop_none(v) for v in d]
    return d


def _parse_value(raw: str) -> Any:
    """An override value: TOML syntax if it parses (numbers, booleans, quoted strings, lists), else a bare string."""
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw


def apply_override(data: dict[str, Any], override: str) -> None:
    """Apply one `section.key=value` override to raw config data."""
    if "=" not in override:
        raise ConfigError(f"override {override!r} is not of the form section.key=value (e.g. generate.n_tasks=10)")
    key, raw = override.split("=", 1)
    parts = key.strip().split(".")
    if len(parts) < 2:
        raise ConfigError(f"override key {key!r} needs a section, e.g. generate.{key.strip()}={raw}")
    node = data
    for p in parts[:-1]:
        node = node.setdefault(p, {})
        if not isinstance(node, dict):
            raise ConfigError(f"override key {key!r}: {p!r} is not a section")
    node[parts[-1]] = _parse_value(raw.strip())


# Keys that moved to another section: the error names the new key instead of only listing the section's keys.
MOVED_KEYS = {f"generate.{k}": f"rollout.{k}" for k in ("concurrency", "max_turns", "batch_size", "infra_retries")}


def _check_keys(data: dict[str, Any], origin: str) -> None:
    sections = _sections()
    for name, body in data.items():
        if name not in sections:
            raise ConfigError(f"unknown config section [{name}] in {origin}; known sections: {', '.join(sections)}")
        if not isinstance(body, dict):
            raise ConfigError(f"[{name}] in {origin} must be a table of keys")
        fields = sections[name].model_fields
        for k in body:
            if f"{name}.{k}" in MOVED_KEYS:
                raise ConfigError(f"config key '{name}.{k}' in {origin} is now '{MOVED_KEYS[f'{name}.{k}']}' "
                                  f"(one setting for the rollouts of every stage); rename it")
            if k not in fields:
                raise ConfigError(
                    f"unknown config key '{name}.{k}' in {origin}; known keys in [{name}]: {', '.join(fields)}")


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """`over` laid on `base`, tables merged key by key (lists and values replaced whole)."""
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> FlywheelConfig:
    """Read TOML (optional), apply overrides, validate. Raises ConfigError naming the problem and the fix.

    The file and the overrides are laid over the full defaults key by key, so setting one key of a section keeps
    the section's other defaults (`--set sft.learning_rate=1e-3` keeps the default's max_steps)."""
    data: dict[str, Any] = {}
    origin = "the defaults"
    if path is not None:
        p = Path(path)
        origin = str(p)
        if not p.is_file():
            raise ConfigError(f"config file {p} does not exist; pass an existing TOML file to --config")
        try:
            data = tomllib.loads(p.read_text())
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"config file {p} is not valid TOML: {e}") from None
    for o in overrides or []:
        apply_override(data, o)
    if overrides:
        origin = f"{origin} (with overrides)" if path else "the overrides"
    _check_keys(data, origin)
    return _validated(FlywheelConfig().model_dump(mode="json"), data, origin)


def _validated(base: dict[str, Any], data: dict[str, Any], origin: str) -> FlywheelConfig:
    merged = _merge(base, data)
    family = data.get("student", {}).get("base")
    if family in TINY_SFT_LEARNING_RATES and "learning_rate" not in data.get("sft", {}):
        # the student's family picked here, its SFT rate not: the family's own (training.config)
        merged["sft"]["learning_rate"] = TINY_SFT_LEARNING_RATES[family]
    try:
        return FlywheelConfig.model_validate(merged)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(x) for x in err["loc"])
        raise ConfigError(f"config value '{loc}' in {origin} is invalid: {err['msg']} "
                          f"(got {err.get('input')!r})") from None


# The plain parameters of each served flow's run form: parameter -> the config key it sets (flows/serve.py shows
# the served value as the form's default; the flow lays the values over the served config, then `overrides`).
RUN_PARAMETERS: dict[str, dict[str, str]] = {
    "generate": {"suite": "generate.suite", "split": "generate.split", "n_tasks": "generate.n_tasks",
                 "samples": "generate.samples", "teacher_kind": "teacher.kind", "teacher_model": "teacher.model",
                 "teacher_endpoint": "teacher.base_url", "backend": "sandbox.backend"},
    "flywheel": {"rounds": "flywheel.rounds", "suites": "flywheel.suites", "student_base": "student.base",
                 "grpo": "flywheel.grpo"},
    "curate": {}, "train_sft": {}, "train_grpo": {}, "evaluate": {},
}


def form_type(key: str) -> Any:
    """The type of config key `section.key` with the key's bounds (its annotation, Annotated with the field's
    constraints: gt=0 stays gt=0), for a served flow's plain run parameter of RUN_PARAMETERS: Prefect's parameter
    schema, the run form and the server's schema check then refuse what the config refuses, before a run starts,
    and the bound is written once, here in the config."""
    model: type[BaseModel] = FlywheelConfig
    *path, leaf = key.split(".")
    for name in path:
        model = _sections()[name] if model is FlywheelConfig else model.model_fields[name].annotation
    f = model.model_fields[leaf]
    return Annotated[f.annotation, *f.metadata] if f.metadata else f.annotation


def run_config(cfg: FlywheelConfig, values: dict[str, Any], overrides: list[str] | None = None) -> FlywheelConfig:
    """The config of one run: `values` (config key -> value; None keeps the config's) and then the
    `section.key=value` overrides laid over `cfg` (the served config). ConfigError names a bad key or value; the
    [serve] section belongs to the serve process and cannot change per run."""
    origin = "the run's parameters"
    data: dict[str, Any] = {}
    for key, value in values.items():
        if value is not None:
            *path, leaf = key.split(".")
            node = data
            for p in path:
                node = node.setdefault(p, {})
            node[leaf] = value.model_dump(mode="json") if isinstance(value, BaseModel) else (
                [v.model_dump(mode="json") if isinstance(v, BaseModel) else v for v in value]
                if isinstance(value, list) else value)
    for o in overrides or []:
        apply_override(data, o)
    if "serve" in data:
        raise ConfigError("override of [serve] in the run's parameters: the serve section configures `flywheel "
                          "serve`, not a run; change it in the served config and restart serve")
    _check_keys(data, origin)
    return _validated(cfg.model_dump(mode="json"), data, origin) if data else cfg


def save_config(cfg: FlywheelConfig, root: str, run_id: str, name: str = "config.toml") -> str:
    """Write the config as TOML beside the outputs it made: ROOT/runs/RUN_ID/NAME (atomic on local roots)."""
    import fsspec

    fs, base = fsspec.core.url_to_fs(str(root))
    folder = f"{base.rstrip('/')}/runs/{run_id}"
    fs.makedirs(folder, exist_ok=True)
    path, tmp = f"{folder}/{name}", f"{folder}/.{name}.{os.getpid()}.tmp"
    with fs.open(tmp, "w") as f:
        f.write(cfg.to_toml())
    fs.mv(tmp, path)
    return path
