"""The conversation codec's rules: how model text and chat dicts become messages, and how messages render."""

from __future__ import annotations

import json

import pytest

from warehouse import chat
from warehouse.record import FunctionCall, Message, ToolCall


def test_text_becomes_content_and_calls():
    m = chat.parse_text('Let me compute.\n<tool_call>\n{"name": "python", "arguments": {"code": "print(2+3)"}}\n'
                        '</tool_call>\n<tool_call>{"name": "python", "arguments": "{\\"code\\":\\"1\\"}"}</tool_call>'
                        ' done', turn=4)
    assert m.content == "Let me compute.\n\n done"
    assert [c.id for c in m.tool_calls] == ["call_4_0", "call_4_1"]
    assert m.tool_calls[0].function.arguments == '{"code": "print(2+3)"}'
    assert m.tool_calls[1].function.arguments == '{"code": "1"}'  # double-encoded object: one encoding
    assert chat.parse_text("  Answer: 5\n", turn=2) == Message(role="assistant", content="Answer: 5")
    assert chat.parse_text('<tool_call>{"name": "f", "parameters": {"a": 1}}', turn=0).tool_calls[0].function \
        == FunctionCall(name="f", arguments='{"a": 1}')  # unterminated at the end, `parameters`: as vLLM's hermes


@pytest.mark.parametrize("raw, why", [
    ('{"name": "python", "arguments": {"code": "x"', "not valid JSON"),
    ('{"arguments": {}}', "string 'name'"),
    ('{"name": "python", "arguments": [1]}', "'arguments' must be a JSON object"),
    ("", "not valid JSON"),
])
def test_a_block_that_is_not_a_call_is_kept_marked(raw, why):
    m = chat.parse_text(f"Thinking. <tool_call>{raw}</tool_call>", turn=2)
    (call,) = m.tool_calls
    assert chat.is_malformed(call) and call.function.arguments == raw and m.content == "Thinking."
    assert why in chat.malformed_reason(call)
    with pytest.raises(chat.ConversationError, match=why):
        chat.to_template([m])


def test_empty_text_is_an_empty_turn():
    for text in ("", "  \n", None):
        m = chat.parse_text(text, turn=2)
        assert m == Message(role="assistant") and chat.is_empty(m)


def test_chat_dicts_keep_server_calls_verbatim():
    m = chat.from_chat({"role": "assistant", "content": "\n", "tool_calls": [
        {"id": "abc", "type": "function", "function": {"name": "python", "arguments": '{"code":1'}},
        {"type": "function", "function": {"name": "python", "arguments": {"code": "1"}}},
        {"type": "custom", "custom": {"input": "x"}}]}, turn=3)
    assert m.content is None
    assert [(c.id, c.function.name) for c in m.tool_calls] == [("abc", "python"), ("call_3_1", "python"),
                                                                ("call_3_2", chat.MALFORMED)]
    assert m.tool_calls[0].function.arguments == '{"code":1' and m.tool_calls[1].function.arguments == '{"code": "1"}'
    text = chat.from_chat({"role": "assistant", "content": '<tool_call>{"name": "f"}</tool_call>'}, turn=1)
    assert text.tool_calls[0].function == FunctionCall(name="f", arguments="{}")
    assert chat.from_chat({"role": "assistant", "content": "<tool_call>x</tool_call>"}, turn=1,
                          text_tool_calls=False).content == "<tool_call>x</tool_call>"
    assert chat.from_chat({"role": "tool", "content": "4", "name": "python", "tool_call_id": "abc"}, turn=4) == \
        Message(role="tool", content="4", name="python", tool_call_id="abc")


def test_templates_get_objects_and_openai_gets_strings():
    call = ToolCall(id="c", function=FunctionCall(name="python", arguments='{"code": "1"}'))
    msgs = [Message(role="user", content="q"), Message(role="assistant", tool_calls=[call])]
    assert chat.to_template(msgs)[1] == {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "python", "arguments": {"code": "1"}}}]}
    assert chat.to_openai(msgs)[1]["tool_calls"][0]["function"]["arguments"] == '{"code": "1"}'
    bad = call.model_copy(update={"function": FunctionCall(name="python", arguments=json.dumps([1]))})
    with pytest.raises(chat.ConversationError, match="not a JSON object"):
        chat.to_template([Message(role="assistant", tool_calls=[bad])])


def test_harmony_replies_read_into_reasoning_content_and_calls():
    assert chat.dialect_of("x<|channel|>y") == "harmony" and chat.dialect_of("{{ '<tool_call>' }}") == "hermes"
    text = ('<|channel|>analysis<|message|>add them<|end|><|start|>assistant to=functions.python'
            '<|channel|>commentary json<|message|>{"code": "print(1 + 2)"}')
    m = chat.parse_text(text, turn=2, dialect="harmony")
    assert m.reasoning == "add them" and m.content is None
    assert m.tool_calls == [ToolCall(id="call_2_0", function=FunctionCall(name="python",
                                                                          arguments='{"code": "print(1 + 2)"}'))]
    # the recipient may also follow the channel (harmony allows both orders); a bad body is MALFORMED, kept
    bad = chat.parse_text('<|channel|>commentary to=functions.python <|constrain|>json<|message|>{"code": ',
                          turn=1, dialect="harmony")
    assert chat.is_malformed(bad.tool_calls[0]) and "not valid JSON" in chat.malformed_reason(bad.tool_calls[0])
    final = chat.parse_text("<|channel|>final<|message|>Answer: 3", turn=4, dialect="harmony")
    assert (final.content, final.reasoning, final.tool_calls) == ("Answer: 3", None, None)
    assert chat.parse_text("just words", turn=1, dialect="harmony").content == "just words"
    assert chat.is_empty(chat.parse_text("", turn=1, dialect="harmony"))
    with pytest.raises(ValueError, match="dialect"):
        chat.parse_text("x", turn=1, dialect="llama")
    # a server that returns harmony text unparsed (special tokens kept): the same codec reads it
    served = chat.from_chat({"role": "assistant", "content": text + "<|call|>"}, turn=2)
    assert (served.reasoning, served.content, served.tool_calls) == (m.reasoning, None, m.tool_calls)
    assert chat.from_chat({"role": "assistant", "content": text}, turn=2, text_tool_calls=False).tool_calls is None


def test_think_blocks_are_reasoning_and_reasoning_renders_per_dialect():
    m = chat.parse_text('<think>\nsum\n</think>\n\n<tool_call>{"name": "f", "arguments": {}}</tool_call>', turn=1)
    assert m.reasoning == "sum" and m.content is None and m.tool_calls[0].function.name == "f"
    assert chat.parse_text("<think>\n\n</think>\n\nok", turn=1).reasoning is None
    call = ToolCall(id="c", function=FunctionCall(name="f", arguments="{}"))
    msg = Message(role="assistant", content="see", reasoning="why", tool_calls=[call])
    from trl.chat_template_utils import gptoss_chat_template, qwen3_chat_template

    assert chat.to_template([msg], template=qwen3_chat_template)[0]["reasoning_content"] == "why"
    harmony = chat.to_template([msg], template=gptoss_chat_template)[0]  # gpt-oss cannot show both beside a call
    assert (harmony["thinking"], harmony["content"]) == ("why\n\nsee", "")
    assert "thinking" not in chat.to_template([Message(role="assistant", content="a")],
                                              template=gptoss_chat_template)[0]


def test_reasoning_is_read_from_think_text_and_endpoint_fields():
    m = chat.parse_text('<think>\nadd them\n</think>\n<tool_call>\n{"name": "python", "arguments": {"code": "1"}}\n'
                        '</tool_call>', turn=2)
    assert (m.reasoning, m.content, m.tool_calls[0].function.name) == ("add them", None, "python")
    assert chat.parse_text("no thoughts <think>late</think>", turn=0).reasoning is None  # only an opening block
    # vLLM's current field wins over its deprecated copy; a server without a reasoning parser leaves <think> text
    assert chat.from_chat({"role": "assistant", "content": "Answer: 5", "reasoning": "r", "reasoning_content": "old"},
                          turn=1).reasoning == "r"
    assert chat.from_chat({"role": "assistant", "content": "Answer: 5", "reasoning_content": "old"},
                          turn=1).reasoning == "old"
    m = chat.from_chat({"role": "assistant", "content": "<think>x</think>\n\nAnswer: 5"}, turn=1)
    assert (m.reasoning, m.content) == ("x", "Answer: 5")
    m = chat.from_chat({"role": "assistant", "content": '<think>y</think><tool_call>{"name": "f", "arguments": {}}'
                        '</tool_call>'}, turn=3)
    assert (m.reasoning, m.content, m.tool_calls[0].id) == ("y", None, "call_3_0")


def test_reasoning_renders_inline_or_as_a_field_and_inline_reads_back():
    m = Message(role="assistant", content="Answer: 5", reasoning="add them")
    assert chat.to_template([m])[0]["content"] == "<think>\nadd them\n</think>\n\nAnswer: 5"
    from trl.chat_template_utils import gptoss_chat_template, qwen2_5_chat_template, qwen3_chat_template

    assert chat.to_template([m], template=qwen3_chat_template)[0] == {
        "role": "assistant", "content": "Answer: 5", "reasoning_content": "add them"}
    assert chat.to_template([m], template=gptoss_chat_template)[0]["thinking"] == "add them"
    assert chat.to_template([m], template=qwen2_5_chat_template) == chat.to_template([m])  # no field: inline
    assert chat.to_openai([m])[0]["reasoning_content"] == "add them"
    assert chat.to_openai([m], reasoning="inline")[0]["content"] == chat.to_template([m])[0]["content"]
    assert "reasoning_content" not in chat.to_openai([m], reasoning="drop")[0]
    assert chat.to_openai([m], reasoning="drop")[0]["content"] == "Answer: 5"
    with pytest.raises(ValueError, match="reasoning must be"):
        chat.to_openai([m], reasoning="hidden")
    assert chat.parse_text(chat.to_template([m])[0]["content"], turn=0) == m  # render -> parse -> the same message
    assert chat.reasoning_key(qwen3_chat_template) == "reasoning_content"
    assert chat.reasoning_key(gptoss_chat_template) == "thinking"
    assert chat.reasoning_key(qwen2_5_chat_template) is None and chat.reasoning_key(None) is None
    assert chat.template_hash("t") == chat.template_hash("t") != chat.template_hash("u")
    assert chat.template_hash(None) is None and len(chat.template_hash("t")) == 16
