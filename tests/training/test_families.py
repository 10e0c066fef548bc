"""Students of real families, built offline: tiny GPT-OSS (MoE, attention sinks, sliding window, harmony template)
and tiny Qwen3 (`<think>` template): TRL recognises their templates, the codec reads their tool calls as TRL's own
response parsers do, SFT renders stored reasoning the family's way with assistant-only masks, one SFT step, one
in-process episode in a real sandbox lands as a row, one GRPO step runs."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from tasks.tools import tool_schemas
from training.config import GRPOConfig, SFTConfig
from training.tiny import (
    FAMILIES,
    TinyModelError,
    build_tiny_model,
    reference_conversation,
    render_conversations,
    task_corpus,
)
from warehouse import chat
from warehouse.record import FunctionCall, Message, ToolCall

FAMS = ["tiny-gptoss", "tiny-qwen3"]


@pytest.fixture(scope="module")
def fam_models(tmp_path_factory, train_tasks):
    """family -> its tiny model's folder, each built once for the module on first use."""
    built: dict[str, Path] = {}

    def get(fam: str) -> Path:
        if fam not in built:
            built[fam] = build_tiny_model(tmp_path_factory.mktemp(fam) / "base", task_corpus(train_tasks, family=fam),
                                          family=fam, hidden=32, layers=2, heads=2, kv_heads=1, vocab_size=600, seed=0)
        return built[fam]

    return get


@pytest.fixture(scope="module", params=FAMS)
def fam_model(request, fam_models):
    return request.param, fam_models(request.param)


def test_real_architectures(fam_model):
    fam, path = fam_model
    model = AutoModelForCausalLM.from_pretrained(path)
    tok = AutoTokenizer.from_pretrained(path)
    assert json.loads((path / "config.json").read_text())["architectures"] == [FAMILIES[fam].architecture]
    assert model.config.vocab_size == len(tok)
    stops = model.generation_config.eos_token_id
    stops = stops if isinstance(stops, list) else [stops]
    assert sorted(tok.convert_ids_to_tokens(stops)) == sorted(FAMILIES[fam].stop_tokens)
    # TRL's response template travels in the folder: `transformers serve` parses tool calls and reasoning with it
    assert set(tok.response_template["fields"]) == {"content", "tool_calls",
                                                    "thinking" if fam == "tiny-gptoss" else "reasoning_content"}
    if fam == "tiny-gptoss":
        c = model.config
        assert c.model_type == "gpt_oss" and c.num_local_experts == 4 and c.num_experts_per_tok == 2
        assert set(c.layer_types) == {"sliding_attention", "full_attention"} and c.sliding_window == 128
        names = {n for n, _ in model.named_parameters()}
        assert any(n.endswith("self_attn.sinks") for n in names)  # a learnt attention sink per head
        assert any("mlp.router" in n for n in names) and any("mlp.experts" in n for n in names)
        for t in ("<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|call|>", "<|return|>"):
            assert len(tok(t, add_special_tokens=False)["input_ids"]) == 1, t
    else:
        assert model.config.model_type == "qwen3"
        for t in ("<think>", "</think>", "<tool_call>"):
            assert len(tok(t, add_special_tokens=False)["input_ids"]) == 1, t


def test_gptoss_prompt_blocks_hold_on_any_day(fam_models, train_tasks):
    """Harmony's system message carries today's date: it is cut around the date into two added tokens, so a
    prompt rendered on another day still costs 16 positions (3 markers, 2 blocks, 10 date characters, <|end|>),
    and the developer message (instructions and tools) is one token."""
    tok = AutoTokenizer.from_pretrained(fam_models("tiny-gptoss"))
    task = train_tasks[0]
    text = render_conversations([reference_conversation(task, family="tiny-gptoss")], tools=tool_schemas(task.tools),
                                family="tiny-gptoss")[0]
    today = re.search(r"Current date: (\d{4}-\d{2}-\d{2})", text).group(1)
    for day in (today, "2031-02-28"):
        ids = tok.encode(text.replace(today, day), add_special_tokens=False)
        assert tok.decode(ids) == text.replace(today, day)
        pieces = tok.convert_ids_to_tokens(ids)
        starts = [i for i, p in enumerate(pieces) if p == "<|start|>"]
        assert starts[1] - starts[0] == 16, pieces[: starts[1]]
        assert starts[2] - starts[1] == 5, pieces[starts[1]: starts[2]]  # <|start|> developer <|message|> BLOCK <|end|>


def test_unknown_family_names_the_choices(tmp_path, train_tasks):
    with pytest.raises(TinyModelError, match="tiny-gptoss"):
        build_tiny_model(tmp_path / "x", task_corpus(train_tasks[:2]), family="tiny-llama")


def test_trl_recognises_the_template_and_parses_like_the_codec(fam_model, train_tasks):
    from trl.chat_template_utils import (
        add_response_schema,
        get_training_chat_template,
        is_chat_template_prefix_preserving,
        supports_tool_calling,
    )

    fam, path = fam_model
    tok = AutoTokenizer.from_pretrained(path)
    assert supports_tool_calling(tok)
    training = AutoTokenizer.from_pretrained(path)
    training.chat_template = get_training_chat_template(tok)  # what SFT masks with and GRPO's tool loop renders
    assert "generation" in training.chat_template and is_chat_template_prefix_preserving(training)
    # Qwen3's own template drops earlier turns' empty think blocks (not prefix-preserving); GPT-OSS's is
    assert is_chat_template_prefix_preserving(tok) == (fam == "tiny-gptoss")
    add_response_schema(tok)  # raises for a template TRL does not know
    conv = reference_conversation(train_tasks[0], family=fam)
    tools = tool_schemas(["python"])
    # the assistant's first turn as the template writes it: the text after the generation prompt
    prompt = tok.apply_chat_template(conv[:2], tools=tools, tokenize=False, add_generation_prompt=True)
    msg = Message(role="assistant", reasoning="I will compute it.",
                  tool_calls=[ToolCall(id="call_2_0", function=FunctionCall(name="python",
                                                                           arguments='{"code": "print(2 + 3)"}'))])
    full = tok.apply_chat_template(conv[:2] + chat.to_template([msg], template=tok.chat_template),
                                   tools=tools, tokenize=False)
    assert full.startswith(prompt)
    completion = full[len(prompt):]
    ids = tok(completion, add_special_tokens=False)["input_ids"]
    from agents.transformers_policy import completion_text

    ours = chat.parse_text(completion_text(tok, ids), turn=2, dialect=chat.dialect_of(tok.chat_template))
    assert ours.tool_calls[0].function.name == "python"
    assert json.loads(ours.tool_calls[0].function.arguments) == {"code": "print(2 + 3)"}
    assert ours.reasoning == "I will compute it." and ours.content is None
    prefix = tok.apply_chat_template(conv[:2], tools=tools, tokenize=True, add_generation_prompt=True,
                                     return_dict=True)["input_ids"]
    theirs = tok.parse_response(tok(completion, add_special_tokens=False)["input_ids"], prefix=list(prefix))
    assert theirs["tool_calls"][0]["function"]["name"] == "python"
    assert theirs["tool_calls"][0]["function"]["arguments"] == {"code": "print(2 + 3)"}
    # what `transformers serve` answers with: its own parser over the response template the folder carries
    from transformers.cli.serving.utils import parse_assistant_message

    content, reasoning, calls = parse_assistant_message(tok, AutoModelForCausalLM.from_pretrained(path), ids, prefix)
    assert (reasoning or "").strip() == "I will compute it." and not (content or "").strip()
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("python", {"code": "print(2 + 3)"})]


def test_vllm_policy_reads_the_family_dialect_and_records_template_and_version(fam_model, train_tasks):
    """vLLM is not installed here (no GPU): its policy's reply path runs on a TEST DOUBLE of vLLM's RequestOutput
    (the completion's token ids and logprobs, and `text` decoded as vLLM decodes it, special tokens skipped) over
    the family's real tokenizer. The reply is read from the ids by the transformers policy's TurnReader."""
    from types import SimpleNamespace

    from agents.transformers_policy import TurnReader, checkpoint_version
    from agents.vllm_policy import VLLMPolicy

    fam, path = fam_model
    tok = AutoTokenizer.from_pretrained(path)
    conv, tools = reference_conversation(train_tasks[0], family=fam), tool_schemas(["python"])
    prompt = tok.apply_chat_template(conv[:2], tools=tools, tokenize=False, add_generation_prompt=True)
    msg = Message(role="assistant", reasoning="I will compute it.",
                  tool_calls=[ToolCall(id="x", function=FunctionCall(name="python", arguments='{"code": "print(5)"}'))])
    full = tok.apply_chat_template(conv[:2] + chat.to_template([msg], template=tok.chat_template), tools=tools,
                                   tokenize=False)
    end = "<|call|>" if fam == "tiny-gptoss" else "<|im_end|>"
    ids = tok(full[len(prompt):].split(end)[0] + end, add_special_tokens=False)["input_ids"]
    prompt_ids = tok(prompt, add_special_tokens=False)["input_ids"]
    out = SimpleNamespace(token_ids=ids, logprobs=[{t: SimpleNamespace(logprob=-0.5)} for t in ids],
                          text=tok.decode(ids, skip_special_tokens=True), finish_reason="stop")
    policy = object.__new__(VLLMPolicy)  # no engine: only the reply path runs
    policy.logprobs, policy.reader = True, TurnReader(tok, path)
    r = policy._to_reply(SimpleNamespace(outputs=[out], prompt_token_ids=prompt_ids), turn=2)
    assert r.message.reasoning == "I will compute it." and r.finish_reason == "tool_calls"
    assert [(c.id, c.function.name, json.loads(c.function.arguments)) for c in r.message.tool_calls] == \
        [("call_2_0", "python", {"code": "print(5)"})]
    assert r.token_ids == ids and r.prompt_token_ids == prompt_ids and r.logprobs == [-0.5] * len(ids)
    assert r.chat_template_hash == chat.template_hash(tok.chat_template) and r.chat_template_hash
    assert r.model_version == checkpoint_version(path) and r.model_version.startswith("sha256:")
    if fam == "tiny-gptoss":  # vLLM's own text has lost harmony's markers: the codec could not read a call in it
        assert chat.parse_text(out.text, turn=2, dialect="harmony").tool_calls is None


def _reasoning_row(ref_row):
    """A reference row whose assistant turns carry stored reasoning (schema 3's Message.reasoning)."""
    msgs = [m.model_copy(update={"reasoning": f"step {i}: work it out"}) if m.role == "assistant" else m
            for i, m in enumerate(ref_row.messages)]
    return ref_row.model_copy(update={"messages": msgs})


def test_sft_renders_reasoning_the_family_way_with_assistant_only_loss(fam_model, ref_rows):
    from training.sft import tokenize_rows

    fam, path = fam_model
    tok = AutoTokenizer.from_pretrained(path)
    row = _reasoning_row(ref_rows[0])
    cols, stats = tokenize_rows(tok, [row], SFTConfig(max_length=4096))
    assert stats["dropped_malformed"] == 0 and stats["truncated"] == 0
    ids, labels = cols["input_ids"][0], cols["labels"][0]
    trained = tok.decode([t for t, lab in zip(ids, labels) if lab != -100])
    untrained = tok.decode([t for t, lab in zip(ids, labels) if lab == -100])
    last = len(row.messages) - 1  # the final answer's reasoning survives in every family
    if fam == "tiny-gptoss":
        assert f"<|channel|>analysis<|message|>step {last}: work it out<|end|>" in trained
        assert "to=functions.python<|channel|>commentary json<|message|>" in trained and "<|call|>" in trained
        assert trained.rstrip().endswith("<|return|>")
    else:
        for i, m in enumerate(row.messages):
            if m.role == "assistant":
                assert f"<think>\nstep {i}: work it out\n</think>" in trained
        assert "<tool_call>" in trained and trained.rstrip().endswith("<|im_end|>")
    # no user, system or tool token is trained; the tool output and the question are only context
    user = next(m.content for m in row.messages if m.role == "user")
    tool = next(m.content for m in row.messages if m.role == "tool")
    assert user in untrained and user not in trained
    assert tool.strip() in untrained and tool.strip() not in trained.replace(row.messages[-1].content or "", "")
    assert "work it out" not in untrained


def test_a_row_the_harmony_template_refuses_is_dropped_and_counted(fam_models, ref_rows):
    """A student's passing row whose answer holds harmony's headers (degenerate text ending in `Answer: N`, seen in
    a round-2 snapshot) is a malformed row SFT counts, not a crash of the round; the other rows train."""
    from training.sft import tokenize_rows

    tok = AutoTokenizer.from_pretrained(fam_models("tiny-gptoss"))
    good = ref_rows[0]
    final = good.messages[-1]
    bad = good.model_copy(update={"trajectory_id": "bad", "messages": [*good.messages[:-1], final.model_copy(
        update={"content": f"Answer: 1: to.python<|channel|>final<|message|>{final.content}"})]})
    with pytest.raises(chat.ConversationError, match="harmony's message header"):
        chat.to_template(bad.messages, template=tok.chat_template)
    cols, stats = tokenize_rows(tok, [good, bad], SFTConfig(max_length=4096))
    assert stats["dropped_malformed"] == 1 and stats["dropped_ids"] == ["bad"] and len(cols["input_ids"]) == 1


def test_one_sft_step_one_episode_one_grpo_step(fam_model, ref_rows, train_tasks, backend, tmp_path):
    from agents.rollout import rollout
    from agents.transformers_policy import TransformersPolicy, completion_text
    from training.grpo import train_grpo
    from training.sft import train_sft

    fam, path = fam_model
    res = train_sft(path, [_reasoning_row(r) for r in ref_rows[:8]], tmp_path / "sft",
                    SFTConfig(max_steps=1, batch_size=4), progress=False)
    assert res.steps == 1 and res.losses and res.n_examples == 8
    policy = TransformersPolicy(res.checkpoint_path, temperature=1.0, max_new_tokens=24, seed=1)
    rows: list = []
    asyncio.run(rollout(train_tasks[:1], policy, backend, run_id=f"fam-{fam}", concurrency=1, on_rows=rows.extend,
                        batch_size=1, progress=False))
    assert len(rows) == 1
    row = rows[0]
    assert row.verdict in {"pass", "fail", "hack", "model_error", "timeout"}, (row.verdict, row.error)
    assert row.completion_token_ids and row.completion_logprobs
    first = next(m for m in row.messages if m.role == "assistant")
    ids = row.completion_token_ids[0]
    assert len(row.completion_logprobs[0]) == len(ids)
    # the stored message is what the family's codec reads from the generated tokens
    again = chat.parse_text(completion_text(policy.tokenizer, ids), turn=2, dialect=policy.dialect)
    assert (first.content, first.reasoning, first.tool_calls) == (again.content, again.reasoning, again.tool_calls)
    assert policy.dialect == ("harmony" if fam == "tiny-gptoss" else "hermes")
    g = train_grpo(res.checkpoint_path, train_tasks[:2], tmp_path / "grpo",
                   GRPOConfig(max_steps=1, num_generations=2, prompts_per_step=2, max_completion_length=24,
                              max_tool_calling_iterations=1, update_check=False),
                   backend=backend, progress=False)
    assert g.steps == 1 and g.episodes == 4
    assert g.steps_diagnostics[0]["clip_fraction"] == 0.0  # exactly on-policy: old_logp = logp.detach()
    assert AutoModelForCausalLM.from_pretrained(g.checkpoint_path).config.architectures == [FAMILIES[fam].architecture]


def test_qwen3_thinking_on_and_off(fam_models, train_tasks, backend):
    """Qwen3's template switch (enable_thinking); GPT-OSS's template has none, so this runs on Qwen3 only."""
    from agents.loop import initial_messages
    from agents.rollout import rollout
    from agents.transformers_policy import TransformersPolicy

    path = fam_models("tiny-qwen3")
    msgs, tools = initial_messages(train_tasks[0]), tool_schemas(["python"])
    on, off = TransformersPolicy(path, max_new_tokens=8), TransformersPolicy(path, max_new_tokens=8,
                                                                             enable_thinking=False)
    assert on.tokenizer.decode(on.prompt_ids(msgs, tools)).endswith("<|im_start|>assistant\n")
    assert off.tokenizer.decode(off.prompt_ids(msgs, tools)).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert off.sampling["enable_thinking"] is False
    rows: list = []
    asyncio.run(rollout(train_tasks[:1], off, backend, run_id="think-off", concurrency=1, on_rows=rows.extend,
                        batch_size=1, progress=False))
    assert len(rows) == 1 and rows[0].completion_token_ids


@pytest.mark.slow
def test_a_briefly_trained_student_calls_tools_in_its_family_format(fam_model, ref_rows, train_tasks, backend,
                                                                    tmp_path):
    """80 SFT steps (~25-40 s): the student writes a tool call in its family's format, the in-process policy parses
    it, the sandbox runs it, and the final answer follows (measured: every episode, both families)."""
    from agents.rollout import rollout
    from agents.transformers_policy import TransformersPolicy
    from training.sft import train_sft

    fam, path = fam_model
    res = train_sft(path, [r for r in ref_rows if r.verdict == "pass"], tmp_path / "sft",
                    SFTConfig(max_steps=80, batch_size=8, learning_rate=1e-2), progress=False)
    policy = TransformersPolicy(res.checkpoint_path, max_new_tokens=48)
    rows: list = []
    asyncio.run(rollout(train_tasks[:4], policy, backend, run_id=f"warm-{fam}", concurrency=4, on_rows=rows.extend,
                        batch_size=4, progress=False))
    called = [r for r in rows if any(c.function.name == "python" for m in r.messages if m.role == "assistant"
                                     for c in m.tool_calls or [])]
    assert len(called) >= 3, [(r.verdict, [m.model_dump() for m in r.messages[2:]]) for r in rows]
    for r in called:
        assert r.messages[3].role == "tool" and r.messages[3].content  # the sandbox ran the parsed call
        assert (r.messages[-1].content or "").startswith("Answer:")


def _served_rows(path, fam, tasks, backend, thought, *, reasoning_on_calls=True):
    """Episodes of `tasks` through a FaultServer over `path`'s tokenizer answering as vLLM does."""
    from agents.openai_policy import OpenAIPolicy
    from agents.rollout import rollout
    from tests.agents.fault_server import FaultServer

    with FaultServer(solutions={t.prompt: t.reference.steps[0].arguments["code"] for t in tasks},
                     tokenizer_dir=str(path), reasoning=thought, reasoning_on_calls=reasoning_on_calls) as srv:
        # the default template has no reasoning of its own: reasoning goes back inline, as SFT renders it
        pol = OpenAIPolicy(base_url=srv.base_url, model="ok", name=f"served-{fam}", token_ids=True, logprobs=True,
                           reasoning_history="inline" if fam == "tiny" else "field", max_retries=0)
        rows: list = []
        asyncio.run(rollout(tasks, pol, backend, run_id=f"served-{fam}-{reasoning_on_calls}", concurrency=2,
                            on_rows=rows.extend, batch_size=len(tasks), progress=False))
    assert [r.verdict for r in rows] == ["pass"] * len(tasks), [(r.verdict, r.error_message) for r in rows]
    for r in rows:
        assistants = [m for m in r.messages if m.role == "assistant"]
        assert [m.reasoning for m in assistants] == [thought if reasoning_on_calls else None, thought]
        assert assistants[0].tool_calls and assistants[0].tool_calls[0].function.name == "python"
        assert len(r.prompt_token_ids) == len(r.completion_token_ids) == 2 and all(r.completion_token_ids)
    return rows


@pytest.mark.e2e
@pytest.mark.parametrize("fam", ["tiny", "tiny-qwen3", "tiny-gptoss"])
def test_an_episode_through_a_loopback_server_has_no_drift_and_keeps_reasoning(fam, train_tasks, backend, tmp_path):
    """Per family, episodes through a real HTTP server on 127.0.0.1 that answers as vLLM does (reasoning and tool
    calls parsed into fields, prompt and completion token ids): the rows' stored ids re-render exactly (drift 0)
    and their reasoning is in SFT's loss-carrying tokens. tests/agents/fault_server.py, not `transformers serve`:
    serve returns no token ids or logprobs (it refuses `logprobs` with HTTP 422) and hands no reasoning of earlier
    turns to the template (test_transformers_serve_parses_harmony_tool_calls covers serve itself).

    GPT-OSS: its template drops the analysis of a tool-call turn once a final answer follows, so a row that
    reasoned before its tool call cannot re-render from the whole conversation: the preflight
    names it (turn 0's completion, message 2: the render lacks its analysis); reasoning on the final answer
    alone re-renders exactly."""
    from training.preflight import preflight_rows
    from training.sft import tokenize_rows

    path = build_tiny_model(tmp_path / fam, task_corpus(train_tasks, family=fam), family=fam, hidden=32, layers=2,
                            heads=2, kv_heads=1, vocab_size=600, seed=0)
    tok = AutoTokenizer.from_pretrained(path)
    tasks, thought = train_tasks[:2], "I add the two numbers with the tool."
    rows = _served_rows(path, fam, tasks, backend, thought, reasoning_on_calls=fam != "tiny-gptoss")
    report = preflight_rows(tok, rows)
    assert report.with_ids == 2 and report.drifted == [], report.drifted
    assert report.mask_problems == [] and report.unrenderable == []
    cols, stats = tokenize_rows(tok, rows, SFTConfig(max_length=4096))
    assert stats["dropped_malformed"] == stats["dropped_truncated"] == 0
    for labels in cols["labels"]:
        trained = tok.decode([t for t in labels if t != -100])
        if fam == "tiny-gptoss":
            assert trained.count(f"<|channel|>analysis<|message|>{thought}<|end|>") == 1, trained
        else:
            assert trained.count(f"<think>\n{thought}\n</think>") == 2, trained
    if fam == "tiny-gptoss":
        drifted = preflight_rows(tok, _served_rows(path, fam, tasks, backend, thought))
        assert [(d.turn, d.part, d.message, d.role) for d in drifted.drifted] == [(0, "completion", 2, "assistant")] * 2


@pytest.mark.slow
@pytest.mark.e2e
def test_transformers_serve_parses_harmony_tool_calls(ref_rows, train_tasks, backend, tmp_path):
    """`transformers serve` over a tiny-gptoss student (60 SFT steps on 4 episodes, ~20 s; serve starts in ~20 s):
    the OpenAI-compatible policy gets the harmony tool call as a structured `tool_calls` entry, parsed by serve
    with TRL's response template that the model folder carries (without it serve parses nothing for GPT-OSS and
    strips harmony's markers from the text). That serve's parser reads the analysis channel as reasoning is
    checked on the template's own text in test_trl_recognises_the_template_and_parses_like_the_codec (this
    briefly trained student does not write a clean analysis message)."""
    from agents.openai_policy import OpenAIPolicy
    from agents.rollout import rollout
    from tests.agents.test_serve import transformers_serve
    from training.sft import train_sft

    tasks = train_tasks[:4]
    base = build_tiny_model(tmp_path / "base", task_corpus(tasks, family="tiny-gptoss"), family="tiny-gptoss",
                            hidden=32, layers=2, heads=2, kv_heads=1, vocab_size=600, seed=0)
    student = train_sft(base, ref_rows[:4], tmp_path / "sft", SFTConfig(max_steps=60, batch_size=4, learning_rate=1e-2,
                                                                warmup_ratio=0.0), progress=False).checkpoint_path
    with transformers_serve(Path(student)) as url:
        pol = OpenAIPolicy(base_url=url, model=str(student), name="serve-gptoss", source="student",
                           temperature=0.0, max_tokens=64, seed=0, max_retries=0, timeout_s=120)
        served: list = []
        asyncio.run(rollout(tasks, pol, backend, run_id="serve-gptoss", concurrency=2, on_rows=served.extend,
                            batch_size=4, progress=False, max_turns=2))
    called = [r for r in served if r.n_tool_calls]
    assert len(called) >= 3, [(r.verdict, r.error_message, [m.model_dump() for m in r.messages[2:]]) for r in served]
    for r in called:
        call = r.messages[2].tool_calls[0]
        assert call.id.endswith("_tool_call_0")  # serve's id: serve parsed the call, not our text fallback
        assert call.function.name == "python" and "code" in json.loads(call.function.arguments)
        assert r.messages[3].role == "tool" and r.messages[3].content  # the sandbox ran it
    for r in served:
        for m in r.messages:
            assert "<|channel|>" not in (m.content or "") and "commentary json" not in (m.content or "")
