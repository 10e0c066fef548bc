"""The one trajectory record: every episode from any source is one row of this schema.

Holds the typed model (`Trajectory`), its pyarrow schema (`TRAJECTORY_SCHEMA`), the verdict vocabulary, the
deterministic trajectory id, and conversions between the two. It does not write or read files (see lake.py).

Messages follow the OpenAI / TRL chat format: role, content, tool_calls (id, type, function{name, arguments as
a JSON string}), tool_call_id, name. Free-form structures (sampling params, tool schemas, verifier details) are
stored as JSON strings so that the Parquet schema stays stable while they evolve.
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    import pyarrow as pa

SCHEMA_VERSION = 3  # 2: verifier_strength; 3: stage/grpo_step/group_id/advantage, reasoning, prompt ids, template

Verdict = Literal["pass", "fail", "hack", "model_error", "timeout", "infra_error"]
VERDICTS: tuple[str, ...] = ("pass", "fail", "hack", "model_error", "timeout", "infra_error")
# The model's failures are scored; the infrastructure's are retried and never scored 0.
SCORED_VERDICTS: tuple[str, ...] = ("pass", "fail", "hack", "model_error", "timeout")

# 'env': an episode a client played through `flywheel env serve` (agents/env_server.py): the policy is the client's.
Source = Literal["teacher", "student", "human", "reference", "env"]
# Where the episode was played: a rollout (generate, evaluation, the loop's student rollouts) or inside GRPO training.
Stage = Literal["rollout", "grpo"]


class FunctionCall(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    arguments: str = Field(description="JSON-encoded arguments, exactly as the model produced them.")


class ToolCall(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str
    type: str = "function"
    function: FunctionCall


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "user", "assistant", "tool"]
    content: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    name: str | None = None
    reasoning: str | None = Field(
        default=None, description="An assistant message's reasoning, kept apart from its content: the endpoint's "
        "`reasoning_content` (vLLM for gpt-oss, Qwen3, DeepSeek-R1), the harmony analysis channel, Qwen3 <think>.")

    def to_openai(self) -> dict[str, Any]:
        """The message as the OpenAI client and TRL chat templates expect it (None fields omitted)."""
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = [tc.model_dump() for tc in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            out["name"] = self.name
        return out


class Trajectory(BaseModel):
    """One episode. Field groups: ids/provenance, conversation, outcome, cost, training extras, errors."""

    model_config = ConfigDict(extra="forbid")

    # ids and provenance
    trajectory_id: str
    run_id: str
    round: int = 0
    source: Source
    policy: str = Field(description="Policy name, e.g. 'reference' or the served model name.")
    endpoint: str | None = Field(default=None, description="Base URL of the policy endpoint, if any.")
    sampling_json: str = Field(default="{}", description="Sampling parameters as JSON.")
    sample_index: int = 0
    task_id: str
    suite: str
    split: str
    task_version: str
    difficulty: int = 0
    sandbox_backend: str | None = None
    sandbox_image: str | None = Field(default=None, description="Image id/digest the episode ran in.")
    verifier: str
    verifier_version: str
    verifier_strength: str | None = Field(
        default=None, description="How the verdict was reached: 'data' (plain results or answers compared outside "
                                  "the sandbox), 'isolated' (a test runner apart from the solution), 'llm' (an LLM "
                                  "judge); None for rows written before schema 2 or never judged.")
    # conversation
    messages: list[Message]
    tools_json: str = Field(default="[]", description="Tool schemas offered to the policy (JSON list).")
    # outcome
    answer: str | None = None
    reward: float = 0.0
    success: bool = False
    verdict: Verdict
    hack_flags: list[str] = Field(default_factory=list)
    reward_terms_json: str = Field(default="{}", description="Process reward terms, apart from the outcome.")
    verifier_details_json: str = "{}"
    # cost
    turns: int = 0
    n_tool_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    latency_ms: float = 0.0
    # training extras (filled only when the policy returns them)
    completion_token_ids: list[list[int]] | None = None
    completion_logprobs: list[list[float]] | None = None
    prompt_token_ids: list[list[int]] | None = Field(
        default=None, description="Per policy turn, the prompt's token ids exactly as the policy saw them.")
    chat_template_hash: str | None = Field(
        default=None, description="sha256 (first 16 hex) of the chat template that rendered the prompts, if known.")
    model_version: str | None = Field(
        default=None, description="The policy's model version: a checkpoint's content hash or the served model id.")
    # GRPO (stage 'grpo': the episode was a generation inside GRPO training)
    stage: Stage = Field(default="rollout", description="'rollout', or 'grpo' for an episode played inside GRPO.")
    grpo_step: int | None = Field(default=None, description="GRPO's optimizer step that produced the episode.")
    group_id: str | None = Field(default=None, description="GRPO's group (one prompt's generations) it belongs to.")
    advantage: float | None = Field(default=None, description="GRPO's advantage for the episode (group-relative).")
    # errors
    error_class: str | None = None
    error_message: str | None = None
    schema_version: int = SCHEMA_VERSION
    created_at: datetime = Field(default_factory=lambda: datetime.now(timezone.utc))


def trajectory_id(run_id: str, round: int, task_id: str, policy: str, sample_index: int, *,
                  stage: str = "rollout", grpo_step: int | None = None) -> str:
    """Deterministic id: a re-run of the same episode yields the same id, so writers can skip it. A GRPO episode's
    key adds its stage and step (its sample index counts within the step), so it never collides with a rollout's;
    a rollout's key is what it always was."""
    parts: list[Any] = [run_id, round, task_id, policy, sample_index]
    if stage != "rollout":
        parts += [stage, grpo_step]
    key = json.dumps(parts, separators=(",", ":"))
    return hashlib.sha256(key.encode()).hexdigest()[:32]


def example_key(row: Trajectory) -> str:
    """The run-independent identity of an example: sha256 (32 hex) of its source, policy, round, stage, GRPO step,
    task, sample index and conversation (roles, contents, reasoning, tool calls). Unlike `trajectory_id` it leaves
    out the run id, so the same episode of two runs of one config and seed has the same key: curation orders and
    breaks ties by it (curate/mixing.py, curate/dedup.py), SFT reads a snapshot in its order, and a snapshot's
    manifest hash is built from it, so what enters a snapshot never depends on the run's id."""
    convo = [[m.role, m.content, m.reasoning, m.name, m.tool_call_id,
              [[c.id, c.function.name, c.function.arguments] for c in m.tool_calls or []]] for m in row.messages]
    parts: list[Any] = [row.source, row.policy, int(row.round), row.stage, row.grpo_step, row.task_id,
                        row.sample_index, convo]
    return hashlib.sha256(json.dumps(parts, separators=(",", ":"), ensure_ascii=False).encode()).hexdigest()[:32]


def _arrow_types() -> dict[str, Any]:
    """The Arrow types of a row, built on first use (module __getattr__ below): importing pyarrow costs every
    command that only reads its config about 0.3 s."""
    if _ARROW:
        return _ARROW
    import pyarrow as pa

    FUNCTION_TYPE = pa.struct([("name", pa.string()), ("arguments", pa.string())])
    TOOL_CALL_TYPE = pa.struct([("id", pa.string()), ("type", pa.string()), ("function", FUNCTION_TYPE)])
    MESSAGE_TYPE = pa.struct(
        [
            ("role", pa.string()),
            ("content", pa.string()),
            ("tool_calls", pa.list_(TOOL_CALL_TYPE)),
            ("tool_call_id", pa.string()),
            ("name", pa.string()),
            ("reasoning", pa.string()),
        ]
    )

    TRAJECTORY_SCHEMA = pa.schema(
        [
            ("trajectory_id", pa.string()),
            ("run_id", pa.string()),
            ("round", pa.int32()),
            ("source", pa.string()),
            ("policy", pa.string()),
            ("endpoint", pa.string()),
            ("sampling_json", pa.string()),
            ("sample_index", pa.int32()),
            ("task_id", pa.string()),
            ("suite", pa.string()),
            ("split", pa.string()),
            ("task_version", pa.string()),
            ("difficulty", pa.int32()),
            ("sandbox_backend", pa.string()),
            ("sandbox_image", pa.string()),
            ("verifier", pa.string()),
            ("verifier_version", pa.string()),
            ("verifier_strength", pa.string()),
            ("messages", pa.list_(MESSAGE_TYPE)),
            ("tools_json", pa.string()),
            ("answer", pa.string()),
            ("reward", pa.float64()),
            ("success", pa.bool_()),
            ("verdict", pa.string()),
            ("hack_flags", pa.list_(pa.string())),
            ("reward_terms_json", pa.string()),
            ("verifier_details_json", pa.string()),
            ("turns", pa.int32()),
            ("n_tool_calls", pa.int32()),
            ("prompt_tokens", pa.int64()),
            ("completion_tokens", pa.int64()),
            ("cost_usd", pa.float64()),
            ("latency_ms", pa.float64()),
            ("completion_token_ids", pa.list_(pa.list_(pa.int32()))),
            ("completion_logprobs", pa.list_(pa.list_(pa.float32()))),
            ("prompt_token_ids", pa.list_(pa.list_(pa.int32()))),
            ("chat_template_hash", pa.string()),
            ("model_version", pa.string()),
            ("stage", pa.string()),
            ("grpo_step", pa.int32()),
            ("group_id", pa.string()),
            ("advantage", pa.float64()),
            ("error_class", pa.string()),
            ("error_message", pa.string()),
            ("schema_version", pa.int32()),
            ("created_at", pa.timestamp("us", tz="UTC")),
        ]
    )
    assert set(TRAJECTORY_SCHEMA.names) == set(Trajectory.model_fields), "schema and model drifted apart"
    _ARROW.update(FUNCTION_TYPE=FUNCTION_TYPE, TOOL_CALL_TYPE=TOOL_CALL_TYPE, MESSAGE_TYPE=MESSAGE_TYPE,
                  TRAJECTORY_SCHEMA=TRAJECTORY_SCHEMA)
    return _ARROW


_ARROW: dict[str, Any] = {}


def __getattr__(name: str) -> Any:
    """FUNCTION_TYPE, TOOL_CALL_TYPE, MESSAGE_TYPE and TRAJECTORY_SCHEMA (pyarrow types), built when first asked for."""
    if name in ("FUNCTION_TYPE", "TOOL_CALL_TYPE", "MESSAGE_TYPE", "TRAJECTORY_SCHEMA"):
        return _arrow_types()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# Hive partition columns: they live in the folder names, not inside the files.
PARTITION_COLUMNS = ("run_id", "round")

def to_table(rows: list[Trajectory]) -> pa.Table:
    """Rows -> an Arrow table with exactly TRAJECTORY_SCHEMA."""
    import pyarrow as pa

    dicts = [r.model_dump(mode="python") for r in rows]
    return pa.Table.from_pylist(dicts, schema=_arrow_types()["TRAJECTORY_SCHEMA"])


def from_dict(d: dict[str, Any]) -> Trajectory:
    """A row read back (from Arrow, DuckDB or JSON) -> the typed model. Unknown newer columns are ignored."""
    known = {k: v for k, v in d.items() if k in Trajectory.model_fields}
    msgs = []
    for m in known.get("messages") or []:
        m = {k: v for k, v in dict(m).items() if v is not None or k == "content"}
        msgs.append(m)
    known["messages"] = msgs
    if known.get("hack_flags") is None:
        known["hack_flags"] = []
    if known.get("stage") is None:  # written before schema 3
        known["stage"] = "rollout"
    if isinstance(known.get("round"), str):
        known["round"] = int(known["round"])
    return Trajectory.model_validate(known)
