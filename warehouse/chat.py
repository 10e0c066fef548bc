"""The one conversation codec: model text -> our `Message`, chat dicts -> `Message`, `Message` -> chat dicts.

Every policy, the episode loop, SFT, GRPO and export go through these functions, so inference, training and the
exported data see the same messages for the same model output (tests/training/test_chat_parity.py proves it).

Model text is read the way Hermes / Qwen2.5 chat templates write tool calls: each
`<tool_call>{"name": ..., "arguments": {...}}</tool_call>` block is one call, and the text outside the blocks,
stripped, is the content (None when nothing is left). A block may be left unterminated at the end of the text, as
vLLM's hermes parser accepts. Arguments given as an object are re-encoded with `encode_arguments` (one encoding
everywhere), and so are string arguments that hold a JSON object (a model that double-encodes); any other
string is kept verbatim for the loop to refuse; missing arguments are `{}`.

A block that is not a JSON object with a string `name` and object/string arguments is never dropped: it becomes a
call named `MALFORMED` whose arguments are the block's raw text, so the turn stays in the row as data and the loop
(and GRPO's reward) score it as a model error (`malformed_reason` says why). An empty reply is an assistant
message with neither content nor calls (`is_empty`); judging it is the caller's business.

Rendering: `to_openai` is the OpenAI wire format (arguments as JSON strings); `to_template` is what chat templates
expect (content "" for None, arguments decoded to objects) and raises `ConversationError` for a message it cannot
render faithfully (a malformed call, arguments that are not a JSON object).

It depends only on the record's message shape. It does not know tokenizers, tools or verdicts; messages will
later carry reasoning and token ids: extend `Message`, `parse_text` and the two renderers together.
"""

from __future__ import annotations

import json
import re
from typing import Any

from warehouse.record import FunctionCall, Message, ToolCall

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
MALFORMED = "<malformed>"  # the name of a call the model wrote but that cannot be read as one
_BLOCK_RE = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.DOTALL)


class ConversationError(ValueError):
    """A message cannot be rendered for a chat template (malformed call, arguments that are not a JSON object)."""


def call_id(turn: int, index: int) -> str:
    """The id of the index-th call of the assistant message at position `turn` of its conversation."""
    return f"call_{turn}_{index}"


def encode_arguments(arguments: Any) -> str:
    """Tool-call arguments as the record stores them: a string verbatim, anything else as JSON; None -> ""."""
    if arguments is None:
        return ""
    return arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)


def _content(text: Any) -> str | None:
    return (text.strip() or None) if isinstance(text, str) else None


def _read_block(raw: str) -> tuple[str, str]:
    """(name, arguments) of one block's inner text; (MALFORMED, raw text) when it is not a usable call."""
    try:
        obj = json.loads(raw)
    except json.JSONDecodeError:
        return MALFORMED, raw
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return MALFORMED, raw
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # double-encoded: one encoding when it holds an object, else verbatim
        try:
            decoded = json.loads(args)
        except json.JSONDecodeError:
            decoded = None
        return obj["name"], encode_arguments(decoded) if isinstance(decoded, dict) else args
    if not isinstance(args, dict):
        return MALFORMED, raw
    return obj["name"], encode_arguments(args)


def parse_text(text: str | None, *, turn: int) -> Message:
    """Model text -> assistant Message (see the module docstring); call ids from `call_id(turn, i)`."""
    text = text or ""
    calls = [ToolCall(id=call_id(turn, i), function=FunctionCall(name=name, arguments=args))
             for i, (name, args) in enumerate(_read_block(raw.strip()) for raw in _BLOCK_RE.findall(text))]
    return Message(role="assistant", content=_content(_BLOCK_RE.sub("", text)), tool_calls=calls or None)


def from_chat(d: dict[str, Any], *, turn: int, text_tool_calls: bool = True) -> Message:
    """A chat dict (an OpenAI response message, a TRL completion turn, a template message) -> Message.

    Assistant tool calls keep their id (else `call_id(turn, j)`); arguments go through `encode_arguments`; a call
    without a function name (or a non-function call) is kept as MALFORMED with its JSON as arguments. An assistant
    turn without calls whose content holds `<tool_call>` text is parsed with `parse_text` when text_tool_calls.
    Tool, user and system messages keep their content, tool_call_id and name.
    """
    role = d.get("role")
    if role != "assistant":
        content = d.get("content")
        return Message(role=role, content=content if isinstance(content, str) or content is None
                       else json.dumps(content, ensure_ascii=False), tool_call_id=d.get("tool_call_id"),
                       name=d.get("name"))
    calls: list[ToolCall] = []
    for j, tc in enumerate(d.get("tool_calls") or []):
        fn = tc.get("function") if isinstance(tc, dict) else None
        if isinstance(fn, dict) and isinstance(fn.get("name"), str) and fn["name"]:
            name, args = fn["name"], encode_arguments(fn.get("arguments"))
        else:
            name, args = MALFORMED, json.dumps(tc, ensure_ascii=False, default=str)
        cid = tc.get("id") if isinstance(tc, dict) else None
        calls.append(ToolCall(id=cid if isinstance(cid, str) and cid else call_id(turn, j),
                              function=FunctionCall(name=name, arguments=args)))
    content = d.get("content")
    if not calls and text_tool_calls and isinstance(content, str) and CALL_OPEN in content:
        return parse_text(content, turn=turn)
    return Message(role="assistant", content=_content(content), tool_calls=calls or None)


def is_malformed(call: ToolCall) -> bool:
    """Whether the model wrote this call but it cannot be read as one (see MALFORMED)."""
    return call.function.name == MALFORMED


def malformed_reason(call: ToolCall) -> str:
    """Why a MALFORMED call is not a call, naming its text."""
    raw = call.function.arguments
    try:
        obj = json.loads(raw)
    except json.JSONDecodeError as e:
        return f"the tool call is not valid JSON ({e.msg} at char {e.pos}): {raw[:200]!r}"
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return f"the tool call needs a JSON object with a string 'name': {raw[:200]!r}"
    return f"the tool call's 'arguments' must be a JSON object: {raw[:200]!r}"


def is_empty(message: Message) -> bool:
    """An assistant turn with neither content nor tool calls."""
    return not message.tool_calls and not (message.content or "").strip()


def to_openai(messages: list[Message]) -> list[dict[str, Any]]:
    """Messages in the OpenAI chat format (tool-call arguments as JSON strings, None fields omitted)."""
    return [m.to_openai() for m in messages]


def template_call(call: ToolCall) -> dict[str, Any]:
    """One call as chat templates expect it (arguments as an object); ConversationError when it cannot be."""
    if is_malformed(call):
        raise ConversationError(f"tool call {call.id}: {malformed_reason(call)}")
    raw = call.function.arguments
    try:
        args = json.loads(raw) if raw.strip() else {}
    except json.JSONDecodeError as e:
        raise ConversationError(f"tool call {call.id} arguments are not valid JSON ({e.msg}): {raw[:80]!r}") from None
    if not isinstance(args, dict):
        raise ConversationError(f"tool call {call.id} arguments are not a JSON object: {raw[:80]!r}")
    return {"id": call.id, "type": call.type, "function": {"name": call.function.name, "arguments": args}}


def to_template(messages: list[Message]) -> list[dict[str, Any]]:
    """Messages as chat templates render them: content "" for None, tool-call arguments decoded to objects.

    Raises ConversationError for a call it cannot render faithfully (the template would show the model something
    it never wrote)."""
    out: list[dict[str, Any]] = []
    for m in messages:
        d = m.to_openai()
        if d.get("content") is None:
            d["content"] = ""
        if m.tool_calls:
            d["tool_calls"] = [template_call(tc) for tc in m.tool_calls]
        out.append(d)
    return out
