"""Token-exact capture and the drift preflight, for the default tiny student (TRL's qwen2_5 template).

Episodes run through the real loop in real sandboxes, from the in-process transformers policy and through a
loopback OpenAI-compatible server that answers as vLLM does (tests/agents/fault_server.py over the same tokenizer),
land in a real lake as rows, are put in a snapshot, and `flywheel train preflight` (the installed console script)
re-renders them with the training template: clean episodes give drift 0 and their reasoning reaches SFT's loss
tokens; a planted template change and a planted retokenization are caught, naming the rows.

The in-process episodes use a scripted model (TEST DOUBLE): the tiny model's own generate, with a logits processor
that forces the reply a trained student would write (reasoning in `<think>`, then the tool call or the answer).
The token ids, logprobs, prompt rendering and parsing are the policy's real ones; only the choice of tokens is
scripted, because an untrained model writes garbage that retokenizes differently (drift the preflight reports).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess

import pytest

from agents.loop import run_episode
from agents.openai_policy import OpenAIPolicy
from agents.transformers_policy import TransformersPolicy
from curate.mixing import write_snapshot
from tasks import arithmetic
from tests.agents.fault_server import FaultServer
from tests.conftest import FLYWHEEL
from training.config import SFTConfig
from training.preflight import preflight_rows
from training.sft import tokenize_rows
from warehouse import chat
from warehouse.lake import write_trajectories

pytestmark = pytest.mark.slow  # real episodes and several console-script runs: minutes on 2 cores

REASONING = "I add the two numbers with python."


def fw(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([FLYWHEEL, *args], capture_output=True, text=True, timeout=300, check=False)


@pytest.fixture(scope="module")
def tasks():
    return arithmetic.generate(3, split="train", seed=11, difficulty=1)


def scripted_reply(prompt_text: str, tasks) -> str:
    """What a trained student writes after this prompt: reasoning, then the reference call or the answer."""
    task = next(t for t in tasks if t.prompt in prompt_text)
    if "<tool_response>" not in prompt_text:
        block = json.dumps({"name": "python", "arguments": task.reference.steps[0].arguments})
        return f"<think>\n{REASONING}\n</think>\n<tool_call>\n{block}\n</tool_call><|im_end|>"
    return f"<think>\nThe tool printed it.\n</think>\n\nAnswer: {task.verifier.answer}<|im_end|>"


def scripted(policy: TransformersPolicy, tasks) -> TransformersPolicy:
    """TEST DOUBLE: force the policy's model to write `scripted_reply` (see the module docstring)."""
    import torch
    from transformers import LogitsProcessorList

    tok, generate = policy.tokenizer, policy.model.generate

    def forced(input_ids, attention_mask, **kw):
        width = input_ids.shape[1]
        targets = [tok(scripted_reply(tok.decode(row[m.bool()].tolist()), tasks), add_special_tokens=False)
                   ["input_ids"] for row, m in zip(input_ids.cpu(), attention_mask.cpu())]

        def force(ids, scores):
            step = ids.shape[1] - width
            out = torch.full_like(scores, float("-inf"))
            for i, t in enumerate(targets):
                out[i, t[step] if step < len(t) else tok.eos_token_id] = 0.0
            return out

        return generate(input_ids=input_ids, attention_mask=attention_mask,
                        logits_processor=LogitsProcessorList([force]), **kw)

    policy.model.generate = forced
    return policy


def episodes(tasks, policy, backend, run_id):
    async def go():
        return [await run_episode(t, policy, backend, run_id=run_id) for t in tasks]

    async def in_session():
        async with policy.session():
            return await go()
    return asyncio.run(in_session() if hasattr(policy, "session") else go())


def in_process_rows(model_dir, tasks, backend, run_id="inproc"):
    pol = scripted(TransformersPolicy(model_dir, max_new_tokens=96, device="cpu"), tasks)
    return episodes(tasks, pol, backend, run_id)


def snapshot(root, rows, run_id):
    write_trajectories(root, rows)
    sid, _ = write_snapshot(root, run_id=run_id, round=0, selected=[(r, 1.0) for r in rows], cfg_hash="test",
                            config_json="{}", counts={}, parent_snapshot_id=None)
    return sid


def preflight(root, sid, model_dir, *extra):
    return fw("train", "preflight", "--snapshot", sid, "--model", str(model_dir), "--out", root, *extra)


@pytest.fixture(scope="module")
def clean_rows(tiny_model, tasks, backend):
    rows = in_process_rows(tiny_model, tasks, backend)
    assert [r.verdict for r in rows] == ["pass"] * len(rows), [(r.verdict, r.error_message) for r in rows]
    return rows


def test_in_process_rows_keep_what_the_model_saw_and_wrote(clean_rows, tiny_model):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    r = clean_rows[0]
    assistants = [m for m in r.messages if m.role == "assistant"]
    assert [m.reasoning for m in assistants] == [REASONING, "The tool printed it."]
    assert assistants[0].content is None and assistants[0].tool_calls[0].function.name == "python"
    assert len(r.prompt_token_ids) == len(r.completion_token_ids) == len(r.completion_logprobs) == 2
    assert all(len(c) == len(lp) > 0 for c, lp in zip(r.completion_token_ids, r.completion_logprobs))
    assert all(lp <= 0 for lp in r.completion_logprobs[0])  # the random model's own logprobs of forced tokens
    assert r.completion_token_ids[0][-1] == tok.convert_tokens_to_ids("<|im_end|>")
    assert r.chat_template_hash == chat.template_hash(tok.chat_template) and len(r.chat_template_hash) == 16
    assert r.model_version.startswith("sha256:")
    # the second prompt is the first prompt, the first completion and the tool turn
    assert r.prompt_token_ids[1][: len(r.prompt_token_ids[0]) + len(r.completion_token_ids[0])] == \
        r.prompt_token_ids[0] + r.completion_token_ids[0]


def test_clean_in_process_and_server_episodes_have_no_drift_and_reasoning_is_trained(
        clean_rows, tiny_model, tasks, backend, tmp_path):
    solutions = {t.prompt: t.reference.steps[0].arguments["code"] for t in tasks}
    with FaultServer(solutions=solutions, tokenizer_dir=str(tiny_model), reasoning=REASONING) as srv:
        pol = OpenAIPolicy(base_url=srv.base_url, model="ok", name="served", token_ids=True, logprobs=True,
                           reasoning_history="inline", max_retries=0)
        served = episodes(tasks, pol, backend, "served")
    assert [r.verdict for r in served] == ["pass"] * len(tasks), [(r.verdict, r.error_message) for r in served]
    s = served[0]
    assert [m.reasoning for m in s.messages if m.role == "assistant"] == [REASONING, REASONING]
    assert s.prompt_token_ids and all(s.prompt_token_ids) and all(s.completion_token_ids)
    assert s.model_version == "ok" and s.chat_template_hash is None  # a server does not tell its template

    root = str(tmp_path / "lake")
    sid = snapshot(root, clean_rows + served, "clean")
    p = preflight(root, sid, tiny_model, "--strict", "--json", str(tmp_path / "r.json"))
    assert p.returncode == 0, p.stdout + p.stderr
    assert f"drift: 0 of {2 * len(tasks)} rows with token ids (0.0%); refused for RL: 0" in p.stdout
    assert "loss mask: 0 problem(s)" in p.stdout
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["drifted"] == 0 and report["with_ids"] == 2 * len(tasks) and report["template_mismatch"] == 0

    # reasoning survives SFT rendering: the <think> block is in the loss-carrying tokens of every assistant turn
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    cols, stats = tokenize_rows(tok, clean_rows + served, SFTConfig(max_length=1024))
    assert stats["dropped_malformed"] == stats["dropped_truncated"] == 0
    for labels in cols["labels"]:
        trained = tok.decode([t for t in labels if t != -100])
        assert trained.count(f"<think>\n{REASONING}\n</think>") >= 1, trained


def test_reasoning_sent_as_a_field_to_a_template_that_drops_it_is_drift(tiny_model, tasks, backend, tmp_path):
    """The qwen2_5 template ignores `reasoning_content`: the server's second prompt lacks the first turn's
    reasoning that SFT's render holds. The preflight names each row at its second turn's prompt."""
    solutions = {t.prompt: t.reference.steps[0].arguments["code"] for t in tasks}
    with FaultServer(solutions=solutions, tokenizer_dir=str(tiny_model), reasoning=REASONING) as srv:
        pol = OpenAIPolicy(base_url=srv.base_url, model="ok", name="field", token_ids=True, max_retries=0)
        rows = episodes(tasks, pol, backend, "field")
    root = str(tmp_path / "lake")
    sid = snapshot(root, rows, "field")
    p = preflight(root, sid, tiny_model)
    assert p.returncode == 0, p.stderr  # without --strict: a report, exit 0
    for r in rows:
        assert f"drift {r.trajectory_id}: turn 1 prompt, message 2 (assistant)" in p.stdout, p.stdout
    assert f"drift: {len(rows)} of {len(rows)} rows with token ids (100.0%); refused for RL: {len(rows)}" in p.stdout


def test_planted_template_change_is_caught_naming_the_rows(clean_rows, tiny_model, tasks, backend, tmp_path):
    """Rows rolled out by a model whose template says the tool header differently, checked against the model
    training uses: drift in the system message of every row, template hash differs, --strict exits 1."""
    from transformers import AutoTokenizer

    other = tmp_path / "other-template"
    shutil.copytree(tiny_model, other)
    tok = AutoTokenizer.from_pretrained(other)
    assert "You may call one or more functions" in tok.chat_template
    tok.chat_template = tok.chat_template.replace("You may call one or more functions",
                                                  "You can call one or more functions")
    tok.save_pretrained(other)
    planted = in_process_rows(other, tasks, backend, run_id="other")
    root = str(tmp_path / "lake")
    sid = snapshot(root, clean_rows + planted, "mixed")
    p = preflight(root, sid, tiny_model, "--strict")
    assert p.returncode == 1, p.stdout + p.stderr
    assert "error: snapshot" in p.stderr and "not token-exact" in p.stderr
    for r in planted:
        assert f"drift {r.trajectory_id}: turn 0 prompt, message 0 (system)" in p.stdout, p.stdout
    for r in clean_rows:
        assert r.trajectory_id not in p.stdout
    n = len(clean_rows) + len(planted)
    assert f"drift: {len(planted)} of {n} rows with token ids (50.0%)" in p.stdout
    assert f"template hash differs: {len(planted)}" in p.stdout


def test_planted_retokenization_is_caught_at_the_token(clean_rows, tiny_model, tmp_path):
    """The same text, other ids: one multi-character token of a completion replaced by its characters' tokens (a
    sampler can emit that; decoding gives the same text, re-encoding does not give the same ids)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    row = clean_rows[1]
    ids = row.completion_token_ids[1]
    j = next(j for j, t in enumerate(ids) if len(tok.convert_ids_to_tokens(t)) >= 3
             and t not in tok.all_special_ids)
    piece = tok.convert_ids_to_tokens(ids[j])
    split = [tok.convert_tokens_to_ids(ch) for ch in piece]
    assert tok.decode(ids[:j] + split + ids[j + 1:]) == tok.decode(ids)  # same text
    planted = row.model_copy(update={"completion_token_ids": [row.completion_token_ids[0],
                                                              ids[:j] + split + ids[j + 1:]]})
    report = preflight_rows(tok, [clean_rows[0], planted])
    assert [d.trajectory_id for d in report.drifted] == [row.trajectory_id] and report.rl_refused == [row.trajectory_id]
    d = report.drifted[0]
    assert (d.turn, d.part, d.role, d.message) == (1, "completion", "assistant", 4)
    assert d.position == len(row.prompt_token_ids[1]) + j and d.stored == split[0] and d.rendered == ids[j]
    assert report.drift_share == 0.5 and not report.mask_problems
    # the same through the console script, from a lake
    root = str(tmp_path / "lake")
    sid = snapshot(root, [clean_rows[0], planted], "retok")
    p = preflight(root, sid, tiny_model, "--strict")
    assert p.returncode == 1, p.stdout + p.stderr
    assert (f"drift {row.trajectory_id}: turn 1 completion, message 4 (assistant), first differing token at "
            f"position {d.position}: stored {split[0]}") in p.stdout
    assert clean_rows[0].trajectory_id not in p.stdout
    assert "drift: 1 of 2 rows with token ids (50.0%); refused for RL: 1 (fine for SFT)" in p.stdout
    # bad input: one error line naming it, exit 2
    bad = preflight(root, "no-such-snapshot", tiny_model)
    assert bad.returncode == 2 and "error: snapshot 'no-such-snapshot'" in bad.stderr, bad.stderr
    (tmp_path / "empty").mkdir()
    bad = preflight(root, sid, tmp_path / "empty")
    assert bad.returncode == 2 and "error: cannot load a tokenizer" in bad.stderr, bad.stderr


def test_a_mask_that_trains_user_tokens_or_skips_generated_ones_is_reported(clean_rows, tiny_model):
    """Planted training templates: generation markers that also cover user messages, and markers that cover only the
    tool-call turn's end token: each problem is named per message; the drift check is unaffected."""
    from transformers import AutoTokenizer
    from trl.chat_template_utils import qwen2_5_training_chat_template as trained

    tok = AutoTokenizer.from_pretrained(tiny_model)
    user = "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
    assert trained.count(user) == 1
    tok.chat_template = trained.replace(user, "{%- generation %}" + user + "{%- endgeneration %}")
    report = preflight_rows(tok, clean_rows[:1])
    assert [(p.message, p.role) for p in report.mask_problems] == [(1, "user")] and not report.drifted
    assert "token(s) of a user message carry loss" in report.mask_problems[0].line()

    end = "{%- endfor %}\n            {{- '<|im_end|>\\n' }}"
    assert trained.count(end) == 1
    unmarked = trained.replace("{%- generation %}", "").replace("{%- endgeneration %}", "")
    tok.chat_template = unmarked.replace(end, "{%- endfor %}{%- generation %}{{- '<|im_end|>\\n' }}"
                                              "{%- endgeneration %}")
    report = preflight_rows(tok, clean_rows[:1])
    assert [(p.message, p.role) for p in report.mask_problems] == [(2, "assistant"), (4, "assistant")]
    assert all("generated token(s) carry no loss" in p.problem for p in report.mask_problems)
    assert not report.drifted
