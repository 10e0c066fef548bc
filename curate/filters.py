"""Quality filters for training rows: verdict, hack flags, size limits and well-formed tool calls.

`filter_rows` keeps the rows fit to train on and names one drop reason for every other row (the first rule it
breaks, in the order of DROP_REASONS). `conversation_problems` checks a chat-format conversation with tools
(also used to validate human demonstrations). This module reads no files and does not de-duplicate.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from curate.config import FilterConfig
from warehouse.record import Trajectory

# Drop reasons of the filters, in the order they are checked.
DROP_REASONS: tuple[str, ...] = (
    "heldout_split",        # a row of the held-out split (evaluation rollouts are never training data)
    "verdict",              # verdict not in FilterConfig.verdicts (reason is 'verdict_<verdict>')
    "hack_flags",
    "invalid_tool_call",
    "too_many_turns",
    "too_many_tool_calls",
    "too_many_tokens",
    "too_long",
)

ROLES = ("system", "user", "assistant", "tool")


def tool_names(tools: list[Any]) -> dict[str, dict[str, Any]]:
    """Declared tool name -> its JSON-schema parameters, from OpenAI-style tool schemas.

    Raises ValueError naming the entry when a schema has no function name.
    """
    out: dict[str, dict[str, Any]] = {}
    for i, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, dict) else None
        name = fn.get("name") if isinstance(fn, dict) else None
        if not isinstance(name, str) or not name:
            raise ValueError(f"tools[{i}] is not an OpenAI function schema with function.name: {t!r:.120}")
        params = fn.get("parameters") if isinstance(fn.get("parameters"), dict) else {}
        out[name] = params
    return out


def conversation_problems(messages: list[dict[str, Any]], tools: dict[str, dict[str, Any]]) -> list[tuple[str, str]]:
    """Problems of a chat conversation with tools, as (field path, what is wrong); empty when it is valid.

    Rules: known roles; a system message only first; a user message before the first assistant one; every tool
    call has a non-empty unique id, a declared tool name, and arguments that are a JSON object (string) holding
    the tool's required arguments; every tool message answers a pending call of the latest assistant message by
    tool_call_id; no call is left unanswered; the conversation ends with an assistant message without calls.
    """
    problems: list[tuple[str, str]] = []
    pending: dict[str, str] = {}
    seen_ids: set[str] = set()
    seen_user = False
    if not messages:
        return [("messages", "is empty")]
    unknown = [(f"messages[{i}].role", f"{m.get('role')!r} is not one of {list(ROLES)}") for i, m in enumerate(messages)
               if isinstance(m, dict) and m.get("role") not in ROLES]
    if unknown:  # the order rules would only repeat it ("an assistant message comes before any user message")
        return unknown
    for i, m in enumerate(messages):
        at = f"messages[{i}]"
        if not isinstance(m, dict):
            problems.append((at, f"is not an object: {m!r:.80}"))
            continue
        role = m.get("role")
        content = m.get("content")
        if content is not None and not isinstance(content, str):
            problems.append((f"{at}.content", f"must be a string or null, got {type(content).__name__}"))
        if role != "tool" and pending:
            problems.append((at, f"tool call(s) {sorted(pending)} got no tool message before this {role} message"))
            pending = {}
        if role == "system":
            if i != 0:
                problems.append((f"{at}.role", "a system message may only come first"))
        elif role == "user":
            seen_user = True
        elif role == "assistant":
            if not seen_user:
                problems.append((at, "an assistant message comes before any user message"))
            calls = m.get("tool_calls") or []
            if not isinstance(calls, list):
                problems.append((f"{at}.tool_calls", "must be a list"))
                calls = []
            if not calls and not (isinstance(content, str) and content.strip()):
                problems.append((at, "an assistant message has neither content nor tool calls"))
            for j, c in enumerate(calls):
                cat = f"{at}.tool_calls[{j}]"
                if not isinstance(c, dict):
                    problems.append((cat, "is not an object"))
                    continue
                cid = c.get("id")
                fn = c.get("function") if isinstance(c.get("function"), dict) else {}
                name = fn.get("name")
                if not isinstance(cid, str) or not cid:
                    problems.append((f"{cat}.id", "is missing"))
                elif cid in seen_ids:
                    problems.append((f"{cat}.id", f"{cid!r} is used twice"))
                else:
                    seen_ids.add(cid)
                    pending[cid] = name if isinstance(name, str) else ""
                if name not in tools:
                    problems.append((f"{cat}.function.name", f"{name!r} is not a declared tool {sorted(tools)}"))
                    continue
                args_s = fn.get("arguments")
                if not isinstance(args_s, str):
                    problems.append((f"{cat}.function.arguments", "must be a JSON string"))
                    continue
                try:
                    args = json.loads(args_s) if args_s.strip() else {}
                except json.JSONDecodeError as e:
                    problems.append((f"{cat}.function.arguments", f"is not valid JSON ({e.msg}): {args_s!r:.80}"))
                    continue
                if not isinstance(args, dict):
                    problems.append((f"{cat}.function.arguments", "must be a JSON object"))
                    continue
                missing = [k for k in tools[name].get("required", []) if k not in args]
                if missing:
                    problems.append((f"{cat}.function.arguments", f"misses required argument(s) {missing}"))
        else:  # tool
            tcid = m.get("tool_call_id")
            if tcid not in pending:
                why = f"{tcid!r} answers no pending tool call (pending: {sorted(pending)})"
                problems.append((f"{at}.tool_call_id", why))
            else:
                expected = pending.pop(tcid)
                if m.get("name") not in (None, "", expected):
                    problems.append((f"{at}.name", f"{m.get('name')!r} differs from the call's tool {expected!r}"))
    if pending:
        problems.append(("messages", f"tool call(s) {sorted(pending)} are never answered"))
    last = messages[-1]
    if isinstance(last, dict) and (last.get("role") != "assistant" or last.get("tool_calls")):
        problems.append((f"messages[{len(messages) - 1}]",
                         "the conversation must end with an assistant message without tool calls"))
    return problems


def row_tool_problems(row: Trajectory) -> list[tuple[str, str]]:
    """conversation_problems of a stored row against the tools it declared (tools_json)."""
    try:
        tools = tool_names(json.loads(row.tools_json or "[]"))
    except (json.JSONDecodeError, ValueError) as e:
        return [("tools_json", str(e))]
    return conversation_problems([m.model_dump() for m in row.messages], tools)


def conversation_chars(row: Trajectory) -> int:
    n = 0
    for m in row.messages:
        n += len(m.content or "")
        for c in m.tool_calls or []:
            n += len(c.function.name) + len(c.function.arguments)
    return n


def drop_reason(row: Trajectory, cfg: FilterConfig) -> str | None:
    """The first filter the row fails, or None when it is fit to train on."""
    if row.split == "heldout":
        return "heldout_split"
    if row.verdict not in cfg.verdicts:
        return f"verdict_{row.verdict}"
    if cfg.drop_hack_flags and row.hack_flags:
        return "hack_flags"
    if cfg.require_valid_tool_calls and row_tool_problems(row):
        return "invalid_tool_call"
    turns = row.turns or sum(1 for m in row.messages if m.role == "assistant")
    if cfg.max_turns is not None and turns > cfg.max_turns:
        return "too_many_turns"
    calls = row.n_tool_calls or sum(len(m.tool_calls or []) for m in row.messages)
    if cfg.max_tool_calls is not None and calls > cfg.max_tool_calls:
        return "too_many_tool_calls"
    if cfg.max_completion_tokens is not None and row.completion_tokens > cfg.max_completion_tokens:
        return "too_many_tokens"
    if cfg.max_chars is not None and conversation_chars(row) > cfg.max_chars:
        return "too_long"
    return None


def filter_rows(rows: Iterable[Trajectory], cfg: FilterConfig) -> tuple[list[Trajectory], dict[str, str]]:
    """(kept rows in input order, {dropped trajectory_id: reason})."""
    kept: list[Trajectory] = []
    dropped: dict[str, str] = {}
    for r in rows:
        reason = drop_reason(r, cfg)
        if reason is None:
            kept.append(r)
        else:
            dropped[r.trajectory_id] = reason
    return kept, dropped
