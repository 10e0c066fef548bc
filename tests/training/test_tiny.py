"""The tiny-model factory: an ordinary model folder, digits as single tokens, a chat template TRL recognises."""

from __future__ import annotations

import json

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from tasks.tools import tool_schemas
from training.tiny import TinyModelError, build_tiny_model, reference_conversation, task_corpus


def test_loads_as_ordinary_model_folder(tiny_model):
    tok = AutoTokenizer.from_pretrained(tiny_model)
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    assert model.config.model_type == "qwen2"
    assert model.config.vocab_size == len(tok)
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    assert json.loads((tiny_model / "config.json").read_text())["architectures"] == ["Qwen2ForCausalLM"]


def test_digits_are_single_tokens(tiny_model):
    tok = AutoTokenizer.from_pretrained(tiny_model)
    pieces = [tok.decode([i]) for i in tok("Ana has 4096 coins", add_special_tokens=False)["input_ids"]]
    assert [p for p in pieces if p.strip().isdigit()] == ["4", "0", "9", "6"]


def test_trl_recognises_the_template(tiny_model):
    from trl.chat_template_utils import (
        add_response_schema,
        get_training_chat_template,
        is_chat_template_prefix_preserving,
        supports_tool_calling,
    )

    tok = AutoTokenizer.from_pretrained(tiny_model)
    assert supports_tool_calling(tok)
    assert is_chat_template_prefix_preserving(tok)
    assert "generation" in get_training_chat_template(tok)
    add_response_schema(tok)  # raises ValueError for a template TRL does not know
    text = '<tool_call>\n{"name": "python", "arguments": {"code": "print(1 + 2)"}}\n</tool_call><|im_end|>'
    prefix = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=True, add_generation_prompt=True,
                                     return_dict=True)["input_ids"]
    parsed = tok.parse_response(tok(text, add_special_tokens=False)["input_ids"], prefix=list(prefix))
    assert parsed["tool_calls"][0]["function"]["name"] == "python"


def test_recurring_system_block_is_one_token(tiny_model, train_tasks):
    tok = AutoTokenizer.from_pretrained(tiny_model)
    conv = reference_conversation(train_tasks[0])
    ids = tok.apply_chat_template(conv, tools=tool_schemas(["python"]), tokenize=True, return_dict=True)["input_ids"]
    text = tok.apply_chat_template(conv, tools=tool_schemas(["python"]), tokenize=False)
    assert tok.decode(ids) == text  # lossless
    assert len(ids) < 120, len(ids)  # the ~200-token tool prompt costs one position
    # a different system prompt still tokenizes (ordinary BPE), just longer
    other = [{"role": "system", "content": "Be brief."}, *conv[1:]]
    ids2 = tok.apply_chat_template(other, tools=tool_schemas(["python"]), tokenize=True, return_dict=True)["input_ids"]
    assert tok.decode(ids2) == tok.apply_chat_template(other, tools=tool_schemas(["python"]), tokenize=False)
    assert len(ids2) > len(ids) + 50


def test_deterministic_and_validated(tmp_path, train_tasks):
    corpus = task_corpus(train_tasks[:8])
    a = build_tiny_model(tmp_path / "a", corpus, hidden=32, layers=1, heads=2, kv_heads=1, vocab_size=400)
    b = build_tiny_model(tmp_path / "b", corpus, hidden=32, layers=1, heads=2, kv_heads=1, vocab_size=400)
    assert (a / "tokenizer.json").read_text() == (b / "tokenizer.json").read_text()
    assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()
    with pytest.raises(TinyModelError, match="corpus is empty"):
        build_tiny_model(tmp_path / "c", [])
    with pytest.raises(TinyModelError, match="divide"):
        build_tiny_model(tmp_path / "d", corpus, hidden=30, heads=4)


def test_rare_word_share_keeps_one_text_words_out_of_the_vocabulary(tmp_path):
    # "galoza" recurs in one text only; "ledger" in every text. Learnt from every word, both become tokens; with
    # rare_word_share the one-text name splits into pieces while the common word stays whole.
    corpus = [f"Sum the ledger under `/app/galoza`: galoza galoza galoza, text {i}." if i == 0 else
              f"Sum the ledger under `/app/folder{i}`, text {i}." for i in range(20)]
    kw = {"hidden": 32, "layers": 1, "heads": 2, "kv_heads": 1, "vocab_size": 400}
    every = AutoTokenizer.from_pretrained(build_tiny_model(tmp_path / "every", corpus, **kw))
    common = AutoTokenizer.from_pretrained(build_tiny_model(tmp_path / "common", corpus, rare_word_share=0.1, **kw))
    assert every.tokenize(" galoza") == ["Ġgaloza"]
    assert len(common.tokenize(" galoza")) > 1
    assert common.tokenize(" ledger") == every.tokenize(" ledger") == ["Ġledger"]
    with pytest.raises(TinyModelError, match="rare_word_share"):
        build_tiny_model(tmp_path / "bad", corpus, rare_word_share=1.0, **kw)
