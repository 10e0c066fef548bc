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

Reasoning: an assistant message's `reasoning` is kept apart from its content. Read from an endpoint's
`reasoning` / `reasoning_content` field (vLLM's reasoning parsers), or from model text that opens with a
`<think>...</think>` block (Qwen3 / DeepSeek-R1 style; `parse_text`, and `from_chat` for a server without a
reasoning parser). Rendered two ways: as a field of the message dict, for templates that render reasoning
themselves (`reasoning_key`: Qwen3's reads `reasoning_content`, GPT-OSS's harmony template `thinking`); else
inline, as `<think>\n{reasoning}\n</think>` opening the content (`inline_reasoning`), which is what the default
tiny student (TRL's qwen2_5 template, which has no reasoning of its own) is trained on and generates, and what
`parse_text` reads back: render -> parse -> render is the same text.

Rendering: `to_openai` is the OpenAI wire format (arguments as JSON strings; reasoning as `reasoning_content`, or
inline); `to_template` is what chat templates expect (content "" for None, arguments decoded to objects,
reasoning inline or as a field) and raises `ConversationError` for a message it cannot render faithfully (a
malformed call, arguments that are not a JSON object).

Dialects (`dialect_of(chat_template)` tells which a template writes; `parse_text(..., dialect=)` reads it):
- "hermes" (Qwen2.5, Qwen3, most templates): the blocks above; a leading `<think>...</think>` block (Qwen3) is the
  message's `reasoning`, the rest is read as above.
- "harmony" (GPT-OSS): the reply after the `<|start|>assistant` header is one or more harmony messages, each
  `[to=functions.NAME]<|channel|>CHANNEL[ to=functions.NAME][ <|constrain|>json| json]<|message|>BODY` ended by
  `<|end|>`, `<|call|>` or `<|return|>` and the next opened by `<|start|>assistant`. A message addressed
  `to=functions.NAME` is a tool call whose BODY is the JSON arguments (read as the block `{"name": NAME,
  "arguments": BODY}`, so a bad body is MALFORMED exactly as above); the analysis channel is `reasoning`; the
  final channel (or a message with no channel) is `content`. Text with no harmony header at all is content.
`to_template(messages, template=)` renders for the template it is given: harmony puts `reasoning` in `thinking`
(the analysis channel); GPT-OSS's template cannot show content and reasoning beside a tool call, so there the
analysis message is the reasoning, then the content, joined by a blank line. Other templates get it in the field
`reasoning_key(template)` names, else inline.

It depends only on the record's message shape. It does not know tokenizers, tools or verdicts.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from typing import Any

from warehouse.record import FunctionCall, Message, ToolCall

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
_THINK_RE = re.compile(r"\A\s*<think>(.*?)</think>", re.DOTALL)
MALFORMED = "<malformed>"  # the name of a call the model wrote but that cannot be read as one
_BLOCK_RE = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.DOTALL)
_HARMONY_END_RE = re.compile(r"<\|end\|>|<\|call\|>|<\|return\|>")
_HARMONY_RECIPIENT_RE = re.compile(r"to=functions\.([^\s<]+)")
_HARMONY_CHANNEL_RE = re.compile(r"<\|channel\|>\s*(\w+)")
HARMONY_START = "<|start|>assistant"
# what GPT-OSS's template refuses inside an assistant message's content or thinking
HARMONY_HEADERS = ("<|channel|>analysis<|message|>", "<|channel|>final<|message|>")
Dialect = str  # "hermes" | "harmony"
DIALECTS = ("hermes", "harmony")


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


def split_reasoning(text: str) -> tuple[str | None, str]:
    """(reasoning, the rest) of model text that opens with a `<think>...</think>` block; (None, text) otherwise."""
    m = _THINK_RE.match(text)
    if m is None:
        return None, text
    return _content(m.group(1)), text[m.end():]


def inline_reasoning(reasoning: str | None, content: str | None) -> str | None:
    """Content with the reasoning rendered into it as the model writes it: `<think>\nR\n</think>` then, when
    there is content, a blank line and the content. Without reasoning, the content unchanged."""
    if not reasoning:
        return content
    head = f"{THINK_OPEN}\n{reasoning}\n{THINK_CLOSE}"
    return f"{head}\n\n{content}" if content else head


_THINKING_RE = re.compile(r"""message\.thinking|["']thinking["'] in message|message\[["']thinking["']\]""")


def _template_text(chat_template: str | dict | None) -> str:
    """A tokenizer's chat_template (a string, or a dict of named templates) as the text of its default one."""
    if isinstance(chat_template, dict):
        return chat_template.get("default", "") or ""
    return chat_template or ""


def dialect_of(chat_template: str | dict | None) -> Dialect:
    """The dialect a chat template writes: "harmony" for GPT-OSS's (its `<|channel|>` markers), else "hermes"."""
    return _style(_template_text(chat_template))[0]


def reasoning_key(chat_template: str | dict | None) -> str | None:
    """The message field a chat template renders reasoning from: `reasoning_content` (Qwen3), `thinking` (GPT-OSS's
    harmony analysis channel), or None (TRL's qwen2_5 has none): then reasoning goes inline in the content."""
    return _style(_template_text(chat_template))[1]


@functools.lru_cache(maxsize=16)
def _style(template: str) -> tuple[Dialect, str | None]:
    """(dialect, reasoning field) of a template's text, read once per template (to_template asks on every render)."""
    if "<|channel|>" in template:
        return "harmony", "thinking"
    if "reasoning_content" in template:
        return "hermes", "reasoning_content"
    return "hermes", "thinking" if _THINKING_RE.search(template) else None


def template_hash(template: str | None) -> str | None:
    """The record's `chat_template_hash`: sha256 of the chat template's text, first 16 hex; None without one."""
    return hashlib.sha256(template.encode()).hexdigest()[:16] if template else None


def parse_text(text: str | None, *, turn: int, dialect: Dialect = "hermes") -> Message:
    """Model text -> assistant Message (see the module docstring); call ids from `call_id(turn, i)`. Hermes: an
    opening `<think>...</think>` block is the reasoning; harmony: the analysis channel is."""
    if dialect not in DIALECTS:
        raise ValueError(f"dialect must be one of {DIALECTS}, not {dialect!r}")
    if dialect == "harmony":
        return _parse_harmony(text or "", turn=turn)
    reasoning, text = split_reasoning(text or "")
    calls = [ToolCall(id=call_id(turn, i), function=FunctionCall(name=name, arguments=args))
             for i, (name, args) in enumerate(_read_block(raw.strip()) for raw in _BLOCK_RE.findall(text))]
    return Message(role="assistant", content=_content(_BLOCK_RE.sub("", text)), tool_calls=calls or None,
                   reasoning=reasoning)


def _parse_harmony(text: str, *, turn: int) -> Message:
    if "<|message|>" not in text:
        return Message(role="assistant", content=_content(_HARMONY_END_RE.sub("", text)))
    reasoning: list[str] = []
    content: list[str] = []
    calls: list[ToolCall] = []
    for part in text.split(HARMONY_START):
        if not part.strip():
            continue
        header, sep, body = part.partition("<|message|>")
        body = _HARMONY_END_RE.split(body, maxsplit=1)[0]
        if not sep:  # a header the model never finished: keep the text as content
            content.append(_HARMONY_END_RE.sub("", part))
            continue
        recipient = _HARMONY_RECIPIENT_RE.search(header)
        channel = _HARMONY_CHANNEL_RE.search(header)
        if recipient:
            name, args = _read_block('{"name": ' + json.dumps(recipient.group(1)) + ', "arguments": '
                                     + (body.strip() or "{}") + "}")
            calls.append(ToolCall(id=call_id(turn, len(calls)), function=FunctionCall(name=name, arguments=args)))
        elif channel and channel.group(1) == "analysis":
            reasoning.append(body)
        else:
            content.append(body)
    return Message(role="assistant", content=_content("\n\n".join(content)), tool_calls=calls or None,
                   reasoning=_content("\n\n".join(reasoning)))


def from_chat(d: dict[str, Any], *, turn: int, text_tool_calls: bool = True) -> Message:
    """A chat dict (an OpenAI response message, a TRL completion turn, a template message) -> Message.

    Assistant tool calls keep their id (else `call_id(turn, j)`); arguments go through `encode_arguments`; a call
    without a function name (or a non-function call) is kept as MALFORMED with its JSON as arguments. An assistant
    turn without calls whose content holds `<tool_call>` text, or harmony text (`<|message|>`: a GPT-OSS server
    that kept the special tokens but parsed nothing), is parsed with `parse_text` in that dialect when
    text_tool_calls. (A server that strips harmony's special tokens leaves nothing to parse: `transformers serve`
    does so unless the model folder carries a response template, see training/tiny.py.)
    Reasoning comes from `reasoning` (vLLM's current field), else `reasoning_content` (its older name, and
    DeepSeek's), else an opening `<think>` block of the content (a server without a reasoning parser).
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
    reasoning = next((_content(d[k]) for k in ("reasoning", "reasoning_content") if isinstance(d.get(k), str)), None)
    if reasoning is None and isinstance(content, str):
        reasoning, content = split_reasoning(content)
    if not calls and text_tool_calls and isinstance(content, str) and "<|message|>" in content:
        parsed = parse_text(content, turn=turn, dialect="harmony")  # harmony text a server left unparsed
        return parsed if reasoning is None else parsed.model_copy(update={"reasoning": reasoning})
    if not calls and text_tool_calls and isinstance(content, str) and CALL_OPEN in content:
        return parse_text(content, turn=turn).model_copy(update={"reasoning": reasoning})
    return Message(role="assistant", content=_content(content), tool_calls=calls or None, reasoning=reasoning)


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


def to_openai(messages: list[Message], *, reasoning: str = "field") -> list[dict[str, Any]]:
    """Messages in the OpenAI chat format (tool-call arguments as JSON strings, None fields omitted). An assistant
    message's reasoning goes as `reasoning_content` (what vLLM hands to the chat template) with reasoning="field",
    into the content (`inline_reasoning`) with "inline", nowhere with "drop"."""
    if reasoning not in ("field", "inline", "drop"):
        raise ValueError(f"reasoning must be 'field', 'inline' or 'drop', got {reasoning!r}")
    out = []
    for m in messages:
        d = m.to_openai()
        if m.reasoning and reasoning == "field":
            d["reasoning_content"] = m.reasoning
        elif m.reasoning and reasoning == "inline":
            d["content"] = inline_reasoning(m.reasoning, m.content)
        out.append(d)
    return out


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


def to_template(messages: list[Message], *, template: str | dict | None = None) -> list[dict[str, Any]]:
    """Messages as chat templates render them: content "" for None, tool-call arguments decoded to objects, and
    an assistant message's reasoning where `template` (a tokenizer's chat_template; None: a template with no
    reasoning of its own) reads it: harmony's `thinking`, the field `reasoning_key` names, else inline in the
    content (`inline_reasoning`). See the module docstring.

    Raises ConversationError for a call it cannot render faithfully (the template would show the model something
    it never wrote), and for harmony, an assistant content or reasoning that holds a harmony message header
    (`HARMONY_HEADERS`, which the template refuses)."""
    dialect, key = dialect_of(template), reasoning_key(template)
    out: list[dict[str, Any]] = []
    for m in messages:
        d = m.to_openai()
        if d.get("content") is None:
            d["content"] = ""
        if m.tool_calls:
            d["tool_calls"] = [template_call(tc) for tc in m.tool_calls]
        reasoning = m.reasoning if m.role == "assistant" else None
        if dialect == "harmony" and m.role == "assistant":
            for field, text in (("content", m.content), ("reasoning", reasoning)):
                if text and (marker := next((h for h in HARMONY_HEADERS if h in text), None)):
                    raise ConversationError(f"an assistant {field} holds harmony's message header {marker!r}: the "
                                            f"template would render a message inside a message (and refuses to)")
        if reasoning and dialect == "harmony":
            if m.tool_calls and d["content"]:
                d["thinking"], d["content"] = reasoning + "\n\n" + d["content"], ""
            else:
                d["thinking"] = reasoning
        elif reasoning and key:
            d[key] = reasoning
        elif reasoning:
            d["content"] = inline_reasoning(reasoning, m.content) or ""
        out.append(d)
    return out
