"""Tiny-model factory for offline runs: a tokenizer trained on the task corpus plus a small Qwen2-style model.

`build_tiny_model(out_dir, corpus)` writes an ordinary model folder (config, safetensors weights, tokenizer, chat
template) that AutoModelForCausalLM / AutoTokenizer and `transformers serve` load like any hub model. Any local or
hub model id can stand in its place in training and policies; this module is only how the offline default gets
one without a download.

Design choices (measured on 2 cores):
- Chat template: TRL's own `qwen2_5_chat_template`, verbatim, so TRL recognises it (tool-call response schema,
  training template with generation markers for assistant-only loss) and `transformers serve` parses tool calls.
- Tokenizer: byte-level BPE trained on the corpus under Qwen2's own pre-tokenizer (transformers 5 loads every
  qwen2 model folder as Qwen2Tokenizer and imposes that split; a custom split would be silently replaced). It
  puts every digit in a token of its own, so operands are copied digit by digit. `<tool_call>`-style tags are
  added tokens so that tokenization agrees between training and generation.
- Prompt tokens: a system block (system prompt + tool schemas as rendered) that recurs in the corpus becomes one
  added token, so the constant ~200-token tool prompt costs one position (steps ~3x cheaper on CPU). Any other
  prompt still tokenizes, through ordinary BPE.
- Weights are random (seeded): a fresh student knows nothing; SFT teaches it.

It does not train the model (see sft.py / grpo.py).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import torch
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM
from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX as QWEN2_PRETOKENIZE_REGEX
from transformers.utils.chat_template_utils import render_jinja_template
from trl.chat_template_utils import qwen2_5_chat_template

from tasks.spec import Task
from tasks.tools import tool_schemas
from warehouse import chat
from warehouse.record import FunctionCall, Message, ToolCall

CHAT_TEMPLATE = qwen2_5_chat_template
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Added (non-special) tokens: the template's tags, kept whole so that they decode as text and stay boundaries.
TAG_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
SYSTEM_BLOCK_RE = re.compile(r"<\|im_start\|>system\n(.*?)<\|im_end\|>", re.DOTALL)


class TinyModelError(ValueError):
    """The tiny model cannot be built from these inputs (empty corpus, bad size)."""


def reference_conversation(task: Task) -> list[dict[str, Any]]:
    """The task's reference episode as chat messages (warehouse.chat.to_template: arguments as objects), opening
    with the same system and user messages the episode loop sends."""
    from agents.loop import initial_messages

    msgs = initial_messages(task)
    for i, step in enumerate(task.reference.steps):
        call = ToolCall(id=chat.call_id(len(msgs), 0),
                        function=FunctionCall(name=step.tool, arguments=chat.encode_arguments(step.arguments)))
        msgs.append(Message(role="assistant", tool_calls=[call]))
        # The tool output is not known without running it; the corpus only needs its shape (digits, newline).
        msgs.append(Message(role="tool", name=step.tool, tool_call_id=call.id, content=task.verifier.answer or ""))
    msgs.append(Message(role="assistant", content=task.reference.final))
    return chat.to_template(msgs)


def render_conversations(conversations: list[list[dict[str, Any]]],
                         tools: list[dict[str, Any]] | None = None) -> list[str]:
    """Render conversations with the tiny model's chat template (text, no tokenizer needed)."""
    if not conversations:
        return []
    rendered, _ = render_jinja_template(conversations, tools=tools, chat_template=CHAT_TEMPLATE)
    return rendered


def task_corpus(tasks: list[Task]) -> list[str]:
    """Training text for the tokenizer: every task's reference episode rendered with the chat template and tools."""
    out: list[str] = []
    for t in tasks:
        out += render_conversations([reference_conversation(t)], tools=tool_schemas(t.tools))
    return out


def prompt_blocks(corpus: list[str], *, min_count: int = 2) -> list[str]:
    """System blocks (system prompt plus tool schemas, as the template renders them) that recur in the corpus.

    Each becomes one added token: a constant prompt of ~200 BPE tokens then costs one position, which makes tiny-model
    steps several times cheaper. A prompt that differs by one character falls back to ordinary BPE tokens.
    """
    counts: dict[str, int] = {}
    for text in corpus:
        for block in SYSTEM_BLOCK_RE.findall(text):
            counts[block] = counts.get(block, 0) + 1
    return sorted(b for b, c in counts.items() if c >= min_count and len(b) > 16)


def _train_tokenizer(corpus: list[str], vocab_size: int, blocks: list[str]) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE(unk_token=None))
    # Exactly Qwen2Tokenizer's normaliser and pre-tokenizer: AutoTokenizer loads any qwen2 model folder as
    # Qwen2Tokenizer, which imposes them, so merges must be learnt under the same split. It puts every digit in a
    # token of its own.
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS + TAG_TOKENS, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), min_frequency=2,
    )
    # Added tokens are atomic at encode time, so they must be boundaries at training time too.
    cut = re.compile("|".join(re.escape(t) for t in sorted(SPECIAL_TOKENS + TAG_TOKENS + blocks, key=len,
                                                             reverse=True)))
    pieces = [p for text in corpus for p in cut.split(text) if p]
    tok.train_from_iterator(pieces, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=None, eos_token="<|im_end|>", pad_token="<|endoftext|>",
        unk_token=None, additional_special_tokens=["<|im_start|>", "<|im_end|>"],
        clean_up_tokenization_spaces=False, model_max_length=4096,
    )
    fast.add_tokens(TAG_TOKENS + blocks, special_tokens=False)
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_tiny_model(out_dir: str | Path, corpus: list[str], *, hidden: int = 128, layers: int = 4,
                     heads: int = 4, kv_heads: int = 2, intermediate: int | None = None, vocab_size: int = 2048,
                     max_positions: int = 1024, seed: int = 0, compress_prompts: bool = True) -> Path:
    """Train a tokenizer on `corpus`, build a randomly initialised Qwen2ForCausalLM, save both to `out_dir`.

    `corpus` is text the model will read and write (use `task_corpus(tasks)` for a suite); the chat template's own
    text and the tool schemas are always added. With `compress_prompts`, system blocks that recur in the corpus
    become single added tokens (see `prompt_blocks`). Returns `out_dir` as a Path. Deterministic for the same inputs.
    """
    if not corpus:
        raise TinyModelError("corpus is empty: pass task texts, e.g. training.tiny.task_corpus(tasks)")
    if hidden % heads or heads % kv_heads:
        raise TinyModelError(f"hidden={hidden} must divide by heads={heads}, heads by kv_heads={kv_heads}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    skeleton = render_conversations([[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}]],
                                    tools=tool_schemas(["python"]))
    blocks = prompt_blocks(corpus) if compress_prompts else []
    tokenizer = _train_tokenizer(list(corpus) + skeleton + [json.dumps(tool_schemas(["python"]))], vocab_size,
                                 blocks)
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
        num_key_value_heads=kv_heads, intermediate_size=intermediate or 4 * hidden,
        max_position_embeddings=max_positions, tie_word_embeddings=True, rope_theta=10000.0,
        bos_token_id=None, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        use_cache=True,
    )
    model = Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.bos_token_id = None
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def n_parameters(model_dir: str | Path) -> int:
    """Number of parameters of a saved model folder."""
    from transformers import AutoModelForCausalLM

    return sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(model_dir).parameters())
