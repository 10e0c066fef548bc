"""ATIF (Agent Trajectory Interchange Format, v1.8, as the `harbor` package's harbor/models/trajectories defines it)
out of and into the one record.

`row_to_atif(row)` gives one ATIF document per episode: `session_id` the run, `trajectory_id` the row's id, `agent`
(name = policy, version = the record schema, tool_definitions = the tools offered), `steps` in order (system and
user messages as `system` / `user` steps; each assistant message an `agent` step with its message, its reasoning in
ATIF's `reasoning_content`,
`tool_calls` (arguments as an object; the exact JSON string in the call's `extra` when it is not the canonical
dump, e.g. a malformed call) and an `observation` whose results are the tool messages that answered it, by
`source_call_id`; that turn's prompt token ids, completion token ids and logprobs in `metrics` when the row has
them),
`final_metrics` (tokens, cost, steps; turns, tool calls, latency in its `extra`) and the row's provenance (every
other field) in `extra.flywheel`. A message whose content is None says so in its step's `extra`.
`atif_to_row(doc)` reads one back: with `extra.flywheel` the row exactly as it was; without (ATIF from another
producer) the messages, tools and metrics plus `missing`, the evidence the document does not carry (token ids,
logprobs, tool timings). `REQUIRED` is the field set this writer fills; the tests check it against the spec.
This module reads and writes no files (flows/cli.py and warehouse/export.py do).
"""

from __future__ import annotations

import json
from typing import Any

from warehouse.record import SCHEMA_VERSION, FunctionCall, Message, ToolCall, Trajectory

ATIF_VERSION = "ATIF-v1.8"
_CONVERSATION = ("messages", "tools_json", "completion_token_ids", "completion_logprobs", "prompt_token_ids")


def _args(raw: str) -> tuple[dict[str, Any], str | None]:
    """(arguments as an object, the raw string when the object does not give it back exactly)."""
    try:
        val = json.loads(raw) if raw else {}
    except ValueError:
        return {}, raw
    if not isinstance(val, dict):
        return {}, raw
    return val, (None if json.dumps(val) == raw else raw)


def row_to_atif(row: Trajectory) -> dict[str, Any]:
    """One ATIF v1.8 document for one row (see the module docstring)."""
    steps: list[dict[str, Any]] = []
    turn = 0
    for m in row.messages:
        if m.role == "tool":
            result: dict[str, Any] = {"content": m.content}
            extra: dict[str, Any] = {}
            if m.name is not None:
                extra["name"] = m.name
            agent = next((s for s in reversed(steps) if s["source"] == "agent"), None)
            ids = {c["tool_call_id"] for c in (agent or {}).get("tool_calls") or []}
            if agent is not None and m.tool_call_id in ids:
                result["source_call_id"] = m.tool_call_id
            else:
                extra["tool_call_id"] = m.tool_call_id
            if extra:
                result["extra"] = extra
            if agent is None:
                raise ValueError(f"row {row.trajectory_id}: a tool message comes before any assistant message")
            agent.setdefault("observation", {"results": []})["results"].append(result)
            continue
        step: dict[str, Any] = {"step_id": len(steps) + 1, "source": "agent" if m.role == "assistant" else m.role,
                                "message": m.content if m.content is not None else ""}
        if m.content is None:
            step["extra"] = {"content_null": True}
        if m.role == "assistant":
            if m.reasoning is not None:
                step["reasoning_content"] = m.reasoning
            calls = []
            for tc in m.tool_calls or []:
                obj, raw = _args(tc.function.arguments)
                call: dict[str, Any] = {"tool_call_id": tc.id, "function_name": tc.function.name, "arguments": obj}
                if raw is not None:
                    call["extra"] = {"arguments_json": raw}
                calls.append(call)
            if calls:
                step["tool_calls"] = calls
            metrics: dict[str, Any] = {}
            if row.prompt_token_ids is not None and turn < len(row.prompt_token_ids):
                metrics["prompt_token_ids"] = row.prompt_token_ids[turn]
            if row.completion_token_ids is not None and turn < len(row.completion_token_ids):
                metrics["completion_token_ids"] = row.completion_token_ids[turn]
            if row.completion_logprobs is not None and turn < len(row.completion_logprobs):
                metrics["logprobs"] = row.completion_logprobs[turn]
            if metrics:
                step["metrics"] = metrics
            turn += 1
        elif m.tool_calls or m.tool_call_id is not None or m.name is not None:
            step.setdefault("extra", {})["message_fields"] = m.model_dump(exclude={"role", "content"})
        steps.append(step)
    provenance = row.model_dump(mode="json", exclude=set(_CONVERSATION))
    provenance["has_token_ids"] = row.completion_token_ids is not None
    provenance["has_logprobs"] = row.completion_logprobs is not None
    provenance["has_prompt_token_ids"] = row.prompt_token_ids is not None
    return {
        "schema_version": ATIF_VERSION,
        "session_id": row.run_id,
        "trajectory_id": row.trajectory_id,
        "agent": {"name": row.policy, "version": f"flywheel-record-{SCHEMA_VERSION}",
                  "tool_definitions": json.loads(row.tools_json or "[]")},
        "steps": steps,
        "final_metrics": {"total_prompt_tokens": row.prompt_tokens, "total_completion_tokens": row.completion_tokens,
                          "total_cost_usd": row.cost_usd, "total_steps": len(steps),
                          "extra": {"turns": row.turns, "n_tool_calls": row.n_tool_calls,
                                    "latency_ms": row.latency_ms}},
        "extra": {"flywheel": provenance},
    }


def atif_messages(doc: dict[str, Any]) -> tuple[list[Message], list[list[int]], list[list[float]], list[str]]:
    """(messages, per-turn token ids, per-turn logprobs, what is missing) of an ATIF document (per-turn prompt
    token ids: `atif_prompt_ids`)."""
    msgs: list[Message] = []
    ids: list[list[int]] = []
    lps: list[list[float]] = []
    have_ids = have_lps = True
    timed = False
    for step in doc.get("steps") or []:
        extra = step.get("extra") or {}
        content = None if extra.get("content_null") else step.get("message")
        if isinstance(content, list):  # multimodal parts: the text ones
            content = "".join(p.get("text") or "" for p in content if p.get("type") == "text")
        timed = timed or step.get("timestamp") is not None
        src = step.get("source")
        if src != "agent":
            msgs.append(Message(role=src, content=content, **(extra.get("message_fields") or {})))
            continue
        calls = [ToolCall(id=c["tool_call_id"], function=FunctionCall(
            name=c["function_name"], arguments=(c.get("extra") or {}).get("arguments_json", json.dumps(c["arguments"]))))
            for c in step.get("tool_calls") or []]
        reasoning = step.get("reasoning_content")
        msgs.append(Message(role="assistant", content=content, tool_calls=calls or None,
                            reasoning=reasoning if isinstance(reasoning, str) else None))
        m = step.get("metrics") or {}
        have_ids &= m.get("completion_token_ids") is not None
        have_lps &= m.get("logprobs") is not None
        ids.append(list(m.get("completion_token_ids") or []))
        lps.append(list(m.get("logprobs") or []))
        for r in (step.get("observation") or {}).get("results") or []:
            rx = r.get("extra") or {}
            out = r.get("content")
            if isinstance(out, list):
                out = "".join(p.get("text") or "" for p in out if p.get("type") == "text")
            msgs.append(Message(role="tool", content=out, tool_call_id=r.get("source_call_id") or rx.get("tool_call_id"),
                                name=rx.get("name")))
    missing = [name for name, ok in (("token_ids", have_ids and ids), ("logprobs", have_lps and lps),
                                     ("tool_timings", timed)) if not ok]
    return msgs, ids, lps, missing


def atif_prompt_ids(doc: dict[str, Any]) -> list[list[int]]:
    """Per agent step, the prompt token ids its `metrics` carry ([] where none)."""
    return [list((s.get("metrics") or {}).get("prompt_token_ids") or []) for s in doc.get("steps") or []
            if s.get("source") == "agent"]


def atif_to_row(doc: dict[str, Any]) -> tuple[Trajectory | None, list[Message], list[str]]:
    """(the row, when the document carries flywheel provenance; the messages; the evidence it lacks)."""
    msgs, ids, lps, missing = atif_messages(doc)
    prov = dict(((doc.get("extra") or {}).get("flywheel")) or {})
    if not prov:
        return None, msgs, missing
    has_ids, has_lps = prov.pop("has_token_ids", False), prov.pop("has_logprobs", False)
    has_prompt = prov.pop("has_prompt_token_ids", False)
    tools = (doc.get("agent") or {}).get("tool_definitions") or []
    row = Trajectory.model_validate({**prov, "messages": msgs, "tools_json": json.dumps(tools),
                                     "completion_token_ids": ids if has_ids else None,
                                     "completion_logprobs": lps if has_lps else None,
                                     "prompt_token_ids": atif_prompt_ids(doc) if has_prompt else None})
    return row, msgs, [m for m in missing if not (m == "token_ids" and has_ids or m == "logprobs" and has_lps)]


# The fields this writer fills, per object; tests/warehouse/test_atif.py checks them against the spec's models.
REQUIRED = {
    "Trajectory": {"schema_version", "agent", "steps"},
    "Agent": {"name", "version"},
    "Step": {"step_id", "source", "message"},
    "ToolCall": {"tool_call_id", "function_name", "arguments"},
}
