"""Configuration of curation: what a training snapshot may contain and how sources are mixed.

`CurateConfig` gathers the knobs of the filters, de-duplication, decontamination, human-demo import and mixing;
`CurriculumConfig` those of the next round's task choice; `SynthesisConfig` what the task factory admits and
`SynthesizeStageConfig` the flywheel's opt-in stage in front of it. All are plain pydantic models (a Prefect flow
shows them as forms). `config_hash` is the hash recorded beside every snapshot made with a config.
This module does no curation itself.
"""

from __future__ import annotations

import hashlib
import json
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from agents.config import PolicyConfig

SourceName = Literal["teacher", "student", "human", "reference", "env"]


class FilterConfig(BaseModel):
    """Which rows are good enough to train on."""

    model_config = ConfigDict(extra="forbid")
    verdicts: list[str] = Field(default_factory=lambda: ["pass"],
                                description="Verdicts a row must have to be kept (everything else is dropped).")
    drop_hack_flags: bool = Field(default=True, description="Drop rows with any reward-hack flag, even on a pass.")
    max_turns: int | None = Field(default=16, description="Drop rows with more assistant turns; None: no limit.")
    max_tool_calls: int | None = Field(default=16, description="Drop rows with more tool calls; None: no limit.")
    max_completion_tokens: int | None = Field(
        default=None, description="Drop rows whose recorded completion tokens exceed this; None: no limit.")
    max_chars: int | None = Field(
        default=16000,
        description="Drop rows whose conversation (all message contents and tool-call arguments) is longer than "
                    "this many characters: a tokenizer-free guard against SFT's silent drop past max_length.")
    require_valid_tool_calls: bool = Field(
        default=True,
        description="Drop rows with a tool call whose tool is not declared, whose arguments are not a JSON object "
                    "or miss a required argument, or whose tool reply names no pending call.")


class DedupConfig(BaseModel):
    """Exact and near-duplicate removal (MinHash/LSH from datasketch)."""

    model_config = ConfigDict(extra="forbid")
    exact: bool = Field(default=True, description="Drop rows whose normalised conversation equals a kept one.")
    near: bool = Field(default=True, description="Drop rows whose MinHash Jaccard to a kept one reaches threshold.")
    threshold: float = Field(
        default=0.5, ge=0.0, le=1.0,
        description="Jaccard similarity of token 3-shingles of the normalised conversations at which two rows of "
                    "the same problem are near-duplicates. Agentic episodes are short: a copy with a reworded final "
                    "line scores 0.5-0.6, distinct problems of one template up to about 0.55 (same_problem keeps "
                    "them apart); measured in benchmarks/decontam.py.")
    near_scope: Literal["all", "task"] = Field(
        default="all",
        description="'all': any two rows can be near-duplicates; 'task': only rows of the same suite and task.")
    same_problem: bool = Field(
        default=True,
        description="Near-duplicates must also share the defining constants of their user messages (numbers, "
                    "quoted literals, identifiers, paths) and, for Harbor tasks, the task's environment (its "
                    "task_version): two problems of one template are never near-duplicates.")
    num_perm: int = Field(default=128, ge=16, le=1024, description="MinHash permutations (accuracy vs. speed).")
    shingle: int = Field(default=3, ge=1, le=16, description="Tokens per shingle of the normalised conversation.")
    include_system: bool = Field(
        default=False,
        description="Include system messages in near-duplicate shingles. Off: the shared tool instructions would "
                    "make every pair of rows look alike.")
    prefer: list[SourceName] = Field(
        default_factory=lambda: ["human", "teacher", "student", "reference", "env"],
        description="Which copy of a duplicate group survives: earlier sources in this list first, then the "
                    "earlier round, the lower sample index, the smaller trajectory id.")


class DecontamConfig(BaseModel):
    """Removal of training rows that overlap the held-out split."""

    model_config = ConfigDict(extra="forbid")
    enabled: bool = Field(default=True, description="Run decontamination against the held-out tasks given.")
    ngram: int = Field(default=3, ge=1, le=32,
                       description="Token n-gram size of the prompt_ngram rule; a held-out prompt shorter than this "
                                   "is one n-gram whole. Short: one changed word breaks only n of a prompt's n-grams "
                                   "(benchmarks/decontam.py measures 2-8).")
    threshold: float = Field(
        default=0.8, gt=0.0, le=1.0,
        description="Share of a held-out prompt's n-grams (weighted by rarity across all task prompts, so template "
                    "phrases count little) that a training row must contain to be dropped as contaminated.")
    expression: bool = Field(
        default=True,
        description="Rules expression and answer_tuple: the held-out task's expression in the episode's tool calls "
                    "or assistant text, or its answer in the final message with all its defining numbers.")
    minhash: bool = Field(default=True, description="Rule prompt_minhash: MinHash/LSH similarity of user messages "
                                                    "to held-out prompts.")
    minhash_threshold: float = Field(
        default=0.5, gt=0.0, le=1.0,
        description="Jaccard similarity of prompt shingles (confirmed exactly) at which a user message that also "
                    "holds the held-out prompt's constants is a paraphrase of it (measured: benchmarks/decontam.py).")
    minhash_shingle: int = Field(default=1, ge=1, le=8, description="Tokens per shingle of the prompt_minhash rule "
                                 "(1: short prompts lose too many 2-shingles to one swapped word).")
    num_perm: int = Field(default=128, ge=16, le=1024, description="MinHash permutations of the prompt_minhash rule.")


class MixConfig(BaseModel):
    """How kept rows from each source become one training snapshot."""

    model_config = ConfigDict(extra="forbid")
    source_weights: dict[str, float] = Field(
        default_factory=lambda: {"teacher": 1.0, "human": 2.0, "student": 0.5, "reference": 1.0},
        description="Per-example training weight by source, written into the manifest's weight column. A source "
                    "missing here has weight 0 and is left out of the snapshot (so is 'env', the episodes clients "
                    "played through `flywheel env serve`, until given a weight).")
    source_ratios: dict[str, float] | None = Field(
        default=None,
        description="Target share of the snapshot per source (normalised to sum 1), e.g. {'teacher': 0.7, "
                    "'human': 0.1, 'student': 0.2}. The snapshot is then the largest that meets the shares "
                    "without repeating rows. None: take every kept row of every weighted source.")
    max_per_task: int | None = Field(default=4, ge=1, description="At most this many examples per task.")
    max_per_suite: int | None = Field(default=None, ge=1, description="At most this many examples per suite.")
    difficulty_ratios: dict[int, float] | None = Field(
        default=None,
        description="Target share per difficulty level (normalised to sum 1), e.g. {1: 0.3, 2: 0.4, 3: 0.3}; "
                    "levels not named are left out. None: no balancing.")
    max_examples: int | None = Field(default=None, ge=1, description="At most this many examples in the snapshot.")
    seed: int = Field(default=0, description="Seed of the deterministic choice among rows when a cap or share bites.")


class VerifierHealthConfig(BaseModel):
    """Which tasks' verifiers count as healthy (`flywheel tasks audit` rows); curation skips the others' rows."""

    model_config = ConfigDict(extra="forbid")
    enabled: bool = Field(default=True, description="Skip the rows of tasks whose latest audit is unhealthy.")
    min_mutant_kill_rate: float = Field(default=0.5, ge=0, le=1,
                                        description="Least share of the oracle's mutants the verifier must fail "
                                                    "(tasks without mutants are not held to it).")
    max_flake_rate: float = Field(default=0.0, ge=0, le=1,
                                  description="Most share of re-grades of the oracle's final state that may "
                                              "disagree with the oracle episode's verdict.")
    require_audit: bool = Field(default=False,
                                description="Also skip rows of tasks that have no audit row (off: unaudited "
                                            "tasks are kept, and counted as unaudited).")


class CurateConfig(BaseModel):
    """Everything that decides which trajectories a round's training snapshot holds."""

    model_config = ConfigDict(extra="forbid")
    filters: FilterConfig = Field(default_factory=FilterConfig, description="Quality filters.")
    dedup: DedupConfig = Field(default_factory=DedupConfig, description="Exact and near-duplicate removal.")
    decontam: DecontamConfig = Field(default_factory=DecontamConfig, description="Held-out decontamination.")
    mix: MixConfig = Field(default_factory=MixConfig, description="Source mixing, caps and difficulty balance.")
    verifier_health: VerifierHealthConfig = Field(default_factory=VerifierHealthConfig,
                                                  description="Skip rows of tasks whose verifier audit is unhealthy.")
    include_earlier_rounds: bool = Field(
        default=True,
        description="Candidates are the run's rows of this round and of every earlier round (so earlier student "
                    "successes and human demos stay available); off: this round's rows only.")
    exclude_previous_snapshots: bool = Field(
        default=True,
        description="Drop rows already trained on in an earlier round's snapshot of the run, by id or by "
                    "(near-)duplicate content. Turn off when each round trains from the base model on everything.")
    replay_share: float = Field(
        default=0.5, ge=0.0, lt=1.0,
        description="Share of a round's snapshot made of examples from the run's earlier snapshots (replay, so a "
                    "round that adds a new suite does not forget what the earlier rounds taught): up to "
                    "replay_share / (1 - replay_share) replayed examples per new one, chosen in the seeded mixing "
                    "order (mix.seed) among the earlier snapshots' rows of the non-reuse sources, with their source "
                    "weights. 0: no replay (each round trains on new rows only). Only with "
                    "exclude_previous_snapshots, which would otherwise keep them all out.")
    reuse_sources: list[SourceName] = Field(
        default_factory=lambda: ["human"],
        description="Sources whose rows may appear again in later snapshots even when exclude_previous_snapshots "
                    "is on (the few human demos).")
    demo_paths: list[str] = Field(
        default_factory=list,
        description="Human demonstrations to import before curating (JSONL files, Parquet files or datasets "
                    "folders); imported idempotently into round demo_round of the run, so they are candidates of "
                    "every later round while include_earlier_rounds is on.")
    demo_round: int = Field(default=0, ge=0, description="Round under which imported demos are stored.")
    demo_suite: str = Field(default="human", description="Suite of demos whose records name none.")
    demo_tools: list[str] | None = Field(
        default=None, description="Tool names (from tasks.tools) for demos whose records declare no tools.")

    @model_validator(mode="after")
    def _check(self) -> CurateConfig:
        for name, ratios in (("mix.source_ratios", self.mix.source_ratios),
                             ("mix.difficulty_ratios", self.mix.difficulty_ratios)):
            if ratios is not None and (any(v < 0 for v in ratios.values()) or sum(ratios.values()) <= 0):
                raise ValueError(f"{name} {ratios!r}: shares must be >= 0 with a positive sum")
        if any(w < 0 for w in self.mix.source_weights.values()):
            raise ValueError(f"mix.source_weights {self.mix.source_weights!r}: weights must be >= 0")
        return self


class CurriculumConfig(BaseModel):
    """How the next round's tasks are chosen from the pass@k history."""

    model_config = ConfigDict(extra="forbid")
    verifier_health: VerifierHealthConfig = Field(
        default_factory=VerifierHealthConfig,
        description="GRPO leaves out tasks whose latest verifier audit is unhealthy by these thresholds.")
    k: int = Field(default=4, ge=1, description="k of the pass@k reported per task and round.")
    teacher_below: float = Field(
        default=0.5, ge=0.0, le=1.0,
        description="A task goes to the teacher when the student's success rate on it in its latest attempted "
                    "round is below this.")
    unseen_to_teacher: bool = Field(default=True,
                                    description="Tasks the student never attempted go to the teacher.")
    unseen_to_grpo: bool = Field(default=True,
                                 description="Tasks the student never attempted go to GRPO (their advantage is "
                                             "unknown, not zero).")
    grpo_min_signal: float = Field(
        default=0.0, ge=0.0, lt=1.0,
        description="GRPO leaves out a task with at least a group's worth of student samples (GRPO's "
                    "num_generations) whose estimated chance of a mixed group, pass@G - pass^G, is below this; 0 "
                    "leaves out only tasks whose samples all passed or all failed.")
    grpo_window: int | None = Field(
        default=None, ge=1,
        description="Judge 'always passed / always failed' over the student's last N attempted rounds; None: all.")


def config_hash(cfg: BaseModel) -> str:
    """sha256 of the config's canonical JSON: the same settings give the same hash in any process."""
    blob = json.dumps(cfg.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()


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


class SynthesizeStageConfig(BaseModel):
    """`flywheel.synthesize`: after each round but the last, grow the train pool with tasks near the student's
    failures (curate/frontier.py), admitted as `flywheel tasks synthesize` admits (needs Docker)."""

    model_config = ConfigDict(extra="forbid")
    enabled: bool = Field(default=False, description="Run the stage (opt-in).")
    candidates: int = Field(default=8, ge=1, le=1000, description="Candidates written per round (count), split "
                                                                 "over the frontier's cells by their failures.")
    folder: str = Field(default="", description="Where admitted tasks go, one folder per run and round "
                                                "(FOLDER/RUN_ID/round-R); empty: RUN_OUT/synthesized (run.out "
                                                "must then be a local folder).")
    writer: Literal["reference", "openai"] = Field(
        default="reference", description="'reference': the ledger family, offline, near failed ledger tasks (their "
        "knobs fixed); 'openai': an OpenAI-compatible endpoint (writer_policy) shown the failed tasks of each cell "
        "as seeds, near failed Harbor tasks of any kind.")
    writer_policy: PolicyConfig | None = Field(default=None, description="The openai writer's endpoint: kind "
                                               "'openai' with base_url and model (prices apply; max_tokens "
                                               "4096 unless set, as `flywheel tasks synthesize`); required with "
                                               "writer = 'openai'.")
    writer_seeds: int = Field(default=3, ge=1, le=20, description="Failed tasks of a cell shown to the openai "
                                                                  "writer as seeds (count).")
    admission: SynthesisConfig = Field(default_factory=SynthesisConfig,
                                       description="The admission's knobs; the run's own held-out tasks are "
                                                   "always checked beside admission.heldout.")

    @model_validator(mode="after")
    def _writer_has_an_endpoint(self) -> SynthesizeStageConfig:
        if self.writer == "openai" and (self.writer_policy is None or self.writer_policy.kind != "openai"):
            raise ValueError("flywheel.synthesize.writer = 'openai' needs writer_policy = {kind = 'openai', "
                             "base_url = '...', model = '...'}")
        if self.writer_policy is not None and "max_tokens" not in self.writer_policy.model_fields_set:
            # a whole task in JSON: a chat reply's default 512 tokens cut most of them
            self.writer_policy = self.writer_policy.model_copy(update={"max_tokens": 4096})
        return self
