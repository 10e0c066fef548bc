"""Tiny-model factory for offline runs: a tokenizer trained on the task corpus plus a small model of a real family.

Three families (`FAMILIES`, keyed by the `student.base` name that selects them):
- `tiny`: a Qwen2-style dense model with TRL's `qwen2_5` template (Hermes `<tool_call>` blocks): the default.
- `tiny-gptoss`: transformers' GPT-OSS architecture (GptOssForCausalLM: mixture-of-experts with top-k routing,
  attention sinks, alternating sliding-window and full attention layers) with TRL's `gptoss` template (harmony:
  `<|channel|>analysis` reasoning, `to=functions.NAME ... <|call|>` tool calls, `<|return|>` ends the answer).
- `tiny-qwen3`: the Qwen3 architecture (q/k norms) with TRL's `qwen3` template (`<think>` reasoning, thinking on
  by default, off with the template's `enable_thinking=False`; Hermes tool calls).

`build_tiny_model(out_dir, corpus, family=...)` writes an ordinary model folder (config, safetensors weights,
tokenizer, chat template) that AutoModelForCausalLM / AutoTokenizer and `transformers serve` load like any hub
model. Any local or hub model id can stand in its place in training and policies; this module is only how the
offline default gets one without a download.

Design choices (measured on 2 cores):
- Chat template: TRL's own template of the family (`qwen2_5`, `gptoss`, `qwen3`), verbatim, so TRL recognises it
  (tool-call response schema, training template with generation markers for assistant-only loss) and
  `transformers serve` parses tool calls and reasoning: the tokenizer is saved with TRL's response template
  (`response_template` in tokenizer_config.json), which serve reads; GPT-OSS needs it (serve has no fallback for
  its model type and would return the reply with harmony's markers stripped, tool calls unparsed).
- Tokenizer: byte-level BPE trained on the corpus under Qwen2's own pre-tokenizer (transformers 5 loads every
  qwen2 model folder as Qwen2Tokenizer and imposes that split; a custom split would be silently replaced). It
  puts every digit in a token of its own, so operands are copied digit by digit. The templates' special tokens
  (`<|im_start|>`..., or harmony's `<|start|>`, `<|channel|>`, `<|message|>`, `<|end|>`, `<|call|>`, `<|return|>`)
  are special tokens; `<tool_call>`/`<think>`-style tags are added tokens, so that tokenization agrees between
  training and generation. The GPT-OSS folder loads as a PreTrainedTokenizerFast (transformers maps no tokenizer
  class to gpt_oss), so it keeps the same pre-tokenizer.
- Prompt tokens: a system block (system prompt + tool schemas as rendered; harmony's developer block, and its
  system message in two blocks around the date) that recurs in the corpus becomes one added token, so the
  constant ~200-token tool prompt costs one position (steps ~3x cheaper on CPU). Any other prompt still
  tokenizes, through ordinary BPE.
- Weights are random (seeded): a fresh student knows nothing; SFT teaches it.

It does not train the model (see sft.py / grpo.py).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast
from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX as QWEN2_PRETOKENIZE_REGEX
from transformers.utils.chat_template_utils import render_jinja_template
from trl.chat_template_utils import (
    add_response_schema,
    gptoss_chat_template,
    qwen2_5_chat_template,
    qwen3_chat_template,
)

from tasks.spec import Task
from tasks.tools import tool_schemas
from training.config import TINY_FAMILIES
from warehouse import chat
from warehouse.record import FunctionCall, Message, ToolCall


@dataclass(frozen=True)
class Family:
    """What a tiny family is made of: its chat template and the tokens that template needs."""

    architecture: str  # transformers model class
    chat_template: str
    special_tokens: tuple[str, ...]  # the first is the padding token
    eos_token: str  # ends an answer (the tokenizer's eos)
    stop_tokens: tuple[str, ...]  # every token that ends a generated turn (generation_config.eos_token_id)
    tag_tokens: tuple[str, ...]  # added, non-special tags kept whole
    system_block: re.Pattern  # the recurring prompt blocks (system prompt + tools): each group becomes one token


FAMILIES: dict[str, Family] = {  # keyed by the student.base name
    "tiny": Family(
        "Qwen2ForCausalLM", qwen2_5_chat_template, ("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
        "<|im_end|>", ("<|im_end|>",), ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"),
        re.compile(r"<\|im_start\|>system\n(.*?)<\|im_end\|>", re.DOTALL)),
    "tiny-qwen3": Family(
        "Qwen3ForCausalLM", qwen3_chat_template, ("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
        "<|im_end|>", ("<|im_end|>",),
        ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"),
        re.compile(r"<\|im_start\|>system\n(.*?)<\|im_end\|>", re.DOTALL)),
    "tiny-gptoss": Family(
        "GptOssForCausalLM", gptoss_chat_template,
        ("<|endoftext|>", "<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|return|>",
         "<|call|>"),
        "<|return|>", ("<|return|>", "<|call|>"), (),
        # harmony's system message (model identity, cutoff, reasoning effort, channels) around its date, which the
        # template writes as today's, and the developer message (instructions and tools): three blocks
        re.compile(r"<\|start\|>system<\|message\|>(.*?Current date: )\d{4}-\d{2}-\d{2}(.*?)<\|end\|>"
                   r"|<\|start\|>developer<\|message\|>(.*?)<\|end\|>", re.DOTALL)),
}
assert set(FAMILIES) == set(TINY_FAMILIES), "training.config.TINY_FAMILIES must name FAMILIES"
CHAT_TEMPLATE = qwen2_5_chat_template  # the default family's


class TinyModelError(ValueError):
    """The tiny model cannot be built from these inputs (empty corpus, bad size, unknown family)."""


def tiny_family(base: str) -> Family:
    """The tiny family named `base` (a `student.base` value); TinyModelError naming the choices otherwise."""
    if base not in FAMILIES:
        raise TinyModelError(f"unknown tiny family {base!r}: choose one of {sorted(FAMILIES)} (student.base), or "
                             f"give a model folder / hub id")
    return FAMILIES[base]


def reference_conversation(task: Task, *, family: str = "tiny") -> list[dict[str, Any]]:
    """The task's reference episode as chat messages (warehouse.chat.to_template: arguments as objects, reasoning
    in the family's field), opening with the same system and user messages the episode loop sends, with every later
    user turn of a multi-turn task and the reference's answer to it."""
    from agents.loop import initial_messages

    msgs = initial_messages(task)
    turns = [task.reference, *task.reference.later_turns]
    for k, ref in enumerate(turns):
        if k:  # a multi-turn task's later user turn (BFCL's), answered by the reference's later turn
            msgs.append(Message(role="user", content=task.later_turns[k - 1]))
        for step in ref.steps:
            call = ToolCall(id=chat.call_id(len(msgs), 0),
                            function=FunctionCall(name=step.tool, arguments=chat.encode_arguments(step.arguments)))
            msgs.append(Message(role="assistant", tool_calls=[call]))
            # The tool output is not known without running it; the corpus only needs its shape (digits, newline).
            msgs.append(Message(role="tool", name=step.tool, tool_call_id=call.id,
                                content=task.verifier.answer or ""))
        msgs.append(Message(role="assistant", content=ref.final))
    return chat.to_template(msgs, template=FAMILIES[family].chat_template)


def render_conversations(conversations: list[list[dict[str, Any]]],
                         tools: list[dict[str, Any]] | None = None, *, family: str = "tiny") -> list[str]:
    """Render conversations with a tiny family's chat template (text, no tokenizer needed)."""
    if not conversations:
        return []
    rendered, _ = render_jinja_template(conversations, tools=tools, chat_template=FAMILIES[family].chat_template)
    return rendered


def task_corpus(tasks: list[Task], *, family: str = "tiny") -> list[str]:
    """Training text for the tokenizer: every task's reference episode rendered with the family's chat template and
    tools."""
    out: list[str] = []
    for t in tasks:
        out += render_conversations([reference_conversation(t, family=family)],
                                    tools=tool_schemas(t.tools, t.tool_specs),
                                    family=family)
    return out


def prompt_blocks(corpus: list[str], *, min_count: int = 2, family: str = "tiny") -> list[str]:
    """System blocks (system prompt plus tool schemas, as the template renders them) that recur in the corpus.

    Each becomes one added token: a constant prompt of ~200 BPE tokens then costs one position, which makes tiny-model
    steps several times cheaper. A prompt that differs by one character falls back to ordinary BPE tokens.
    GPT-OSS's system message is cut around the date the template writes (today's): two blocks, with the date's
    digits as ordinary tokens between them, so a prompt rendered on another day still uses both.
    """
    counts: dict[str, int] = {}
    for text in corpus:
        for match in FAMILIES[family].system_block.finditer(text):
            for block in filter(None, match.groups()):
                counts[block] = counts.get(block, 0) + 1
    return sorted(b for b, c in counts.items() if c >= min_count and len(b) > 16)


def words(text: str) -> list[str]:
    """`text` cut into words as Qwen2's pre-tokenizer cuts it (a word keeps one leading space or punctuation mark,
    `/galoza`); joined, they give `text` back."""
    return [w for w, _ in _WORD_SPLIT.pre_tokenize_str(text)]


def rare_words(docs: list[str], share: float) -> set[str]:
    """The words (`words`) that occur in fewer than `share` of `docs` (0-1): on a task corpus, one text per task,
    the names coined for one task or a few, not the wording the tasks share."""
    counts: dict[str, int] = {}
    for doc in docs:
        for w in set(words(doc)):
            counts[w] = counts.get(w, 0) + 1
    return {w for w, c in counts.items() if c < share * len(docs)}


_WORD_SPLIT = pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated")


def _train_tokenizer(corpus: list[str], vocab_size: int, blocks: list[str], fam: Family,
                     rare_word_share: float = 0.0) -> PreTrainedTokenizerFast:
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
    specials, tags = list(fam.special_tokens), list(fam.tag_tokens)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=specials + tags, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), min_frequency=2,
    )
    # Added tokens are atomic at encode time, so they must be boundaries at training time too.
    cut = re.compile("|".join(re.escape(t) for t in sorted(specials + tags + blocks, key=len, reverse=True)))
    pieces = [p for text in corpus for p in cut.split(text) if p]
    if rare_word_share:  # merges learnt from the shared wording only: a rare word spells out in common pieces
        rare = rare_words(corpus, rare_word_share)
        pieces = [kept for p in pieces if (kept := "".join(w for w in words(p) if w not in rare))]
    tok.train_from_iterator(pieces, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=None, eos_token=fam.eos_token, pad_token=specials[0],
        unk_token=None, additional_special_tokens=[t for t in specials[1:] if t != fam.eos_token],
        clean_up_tokenization_spaces=False, model_max_length=4096,
    )
    fast.add_tokens(tags + blocks, special_tokens=False)
    fast.chat_template = fam.chat_template
    # TRL's response template of the family, saved in tokenizer_config.json: `transformers serve` parses replies
    # with it (without one it parses no tool calls or reasoning for GPT-OSS, whose model type it has no fallback
    # for, and returns the text with harmony's markers stripped)
    add_response_schema(fast)
    return fast


def _config(fam: Family, tokenizer: PreTrainedTokenizerFast, *, hidden: int, layers: int, heads: int,
            kv_heads: int, intermediate: int | None, max_positions: int, experts: int, experts_per_token: int,
            sliding_window: int) -> Any:
    from transformers import GptOssConfig, Qwen2Config, Qwen3Config

    common: dict[str, Any] = {
        "vocab_size": len(tokenizer), "hidden_size": hidden, "num_hidden_layers": layers,
        "num_attention_heads": heads, "num_key_value_heads": kv_heads, "max_position_embeddings": max_positions,
        "bos_token_id": None, "eos_token_id": tokenizer.eos_token_id, "pad_token_id": tokenizer.pad_token_id,
        "use_cache": True}
    if fam.architecture == "GptOssForCausalLM":
        # every other layer attends within a sliding window, as GPT-OSS does; each attention head has a sink
        return GptOssConfig(**common, intermediate_size=intermediate or 2 * hidden, head_dim=hidden // heads,
                            num_local_experts=experts, num_experts_per_tok=experts_per_token,
                            sliding_window=sliding_window, tie_word_embeddings=True,
                            rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0,
                                             "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                                             "original_max_position_embeddings": max(1, max_positions // 32)},
                            layer_types=["sliding_attention" if i % 2 == 0 else "full_attention"
                                         for i in range(layers)])
    if fam.architecture == "Qwen3ForCausalLM":
        return Qwen3Config(**common, intermediate_size=intermediate or 4 * hidden, head_dim=hidden // heads,
                           tie_word_embeddings=True, rope_theta=10000.0)
    return Qwen2Config(**common, intermediate_size=intermediate or 4 * hidden, tie_word_embeddings=True,
                       rope_theta=10000.0)


def build_tiny_model(out_dir: str | Path, corpus: list[str], *, family: str = "tiny", hidden: int = 128,
                     layers: int = 4, heads: int = 4, kv_heads: int = 2, intermediate: int | None = None,
                     vocab_size: int = 2048, max_positions: int = 1024, seed: int = 0, compress_prompts: bool = True,
                     experts: int = 4, experts_per_token: int = 2, sliding_window: int = 128,
                     rare_word_share: float = 0.0) -> Path:
    """Train a tokenizer on `corpus`, build a randomly initialised model of `family` (FAMILIES), save both.

    `corpus` is text the model will read and write, rendered with the family's template (use
    `task_corpus(tasks, family=...)` for a suite); the chat template's own text and the tool schemas are always
    added. With `compress_prompts`, system blocks that recur in the corpus become single added tokens (see
    `prompt_blocks`). `experts`, `experts_per_token` and `sliding_window` size the GPT-OSS family (ignored by the
    others). With `rare_word_share` > 0 the tokenizer learns no merges from the words that occur in fewer than that
    share of the corpus's texts (`rare_words`; one text per task): a name coined for one task then tokenizes into
    letters and short common pieces, as an unseen one does. Returns `out_dir` as a Path. Deterministic for the same
    inputs.
    """
    fam = tiny_family(family)
    if not corpus:
        raise TinyModelError("corpus is empty: pass task texts, e.g. training.tiny.task_corpus(tasks)")
    if hidden % heads or heads % kv_heads:
        raise TinyModelError(f"hidden={hidden} must divide by heads={heads}, heads by kv_heads={kv_heads}")
    if not 1 <= experts_per_token <= experts:
        raise TinyModelError(f"experts_per_token={experts_per_token} must be between 1 and experts={experts}")
    if not 0 <= rare_word_share < 1:
        raise TinyModelError(f"rare_word_share={rare_word_share} must be in [0, 1): a share of the corpus's texts")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    skeleton = render_conversations([[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}]],
                                    tools=tool_schemas(["python"]), family=family)
    blocks = prompt_blocks(corpus, family=family) if compress_prompts else []
    tokenizer = _train_tokenizer(list(corpus) + skeleton + [json.dumps(tool_schemas(["python"]))], vocab_size,
                                 blocks, fam, rare_word_share)
    torch.manual_seed(seed)
    config = _config(fam, tokenizer, hidden=hidden, layers=layers, heads=heads, kv_heads=kv_heads,
                     intermediate=intermediate, max_positions=max_positions, experts=experts,
                     experts_per_token=experts_per_token, sliding_window=sliding_window)
    import transformers

    model = getattr(transformers, fam.architecture)(config)
    stops = [tokenizer.convert_tokens_to_ids(t) for t in fam.stop_tokens]
    model.generation_config.eos_token_id = stops if len(stops) > 1 else stops[0]
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.bos_token_id = None
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def n_parameters(model_dir: str | Path) -> int:
    """Number of parameters of a saved model folder."""
    from transformers import AutoModelForCausalLM

    return sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(model_dir).parameters())
