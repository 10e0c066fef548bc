"""Inference and training see the same messages for the same model output (the one conversation codec).

For each model output (well-formed, several calls, malformed JSON, text around calls, an unknown tool, empty,
a final answer), the same token ids go down every path:
- inference: the real TransformersPolicy (prompt rendering, decoding, parsing) in the real episode loop with real
  sandboxes; the row stores the assistant message and the verdict;
- GRPO: TRL's own `parse_response` (what GRPOTrainer calls on each generation) with `use_codec_parser`, rebuilt by
  the environment's `completion_messages`, judged by `EpisodeReward`;
- SFT: the row rendered by the tiny model's chat template (`trajectory_conversation`), its assistant turn read back;
- export: the row through a real lake and `flywheel export`'s JSONL, read back.
The model is the only double: `ScriptedModel` is the real policy whose generate step returns scripted token ids.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from transformers import AutoTokenizer
from trl.chat_template_utils import parse_response

from agents.loop import initial_messages, run_episode
from agents.transformers_policy import TransformersPolicy
from tasks import arithmetic
from tasks.tools import tool_schemas
from training.config import SFTConfig
from training.environment import EpisodeReward, completion_messages, environment_class, use_codec_parser
from training.grpo import task_rows
from training.sft import tokenize_rows, trajectory_conversation
from warehouse import chat
from warehouse.export import ExportError, export_jsonl, to_trl_example
from warehouse.lake import write_trajectories

CALL = '<tool_call>\n{{"name": "{name}", "arguments": {args}}}\n</tool_call>'
OUTPUTS = {
    "well_formed": "Let me compute.\n" + CALL.format(name="python", args='{"code": "print({expr})"}'),
    "several_calls": CALL.format(name="python", args='{"code": "x = {expr}"}') + "\n"
                     + CALL.format(name="python", args='"{\\"code\\": \\"print(x)\\"}"'),  # double-encoded
    "malformed_json": "Computing.\n<tool_call>\n{\"name\": \"python\", \"arguments\": {\"code\": \"print(1)\"\n"
                      "</tool_call>",
    "good_then_malformed": CALL.format(name="python", args='{"code": "print({expr})"}') + "\n<tool_call>{oops"
                           "</tool_call>",
    "text_around_calls": "First I run it. " + CALL.format(name="python", args='{"code": "print({expr})"}')
                         + " Then I answer.",
    "unknown_tool": CALL.format(name="rm_rf", args='{"path": "/"}'),
    "empty": "",
    "final_answer": "Answer: {answer}",
}
# the verdict of the loop's row, which GRPO's reward must match when the episode ends at this turn
VERDICTS = {"well_formed": "pass", "several_calls": "pass", "text_around_calls": "pass",
            "malformed_json": "model_error", "good_then_malformed": "model_error", "unknown_tool": "model_error",
            "empty": "model_error", "final_answer": "hack"}
ERROR_CLASSES = {"malformed_json": "MalformedToolCall", "good_then_malformed": "MalformedToolCall",
                 "unknown_tool": "ToolArgumentError", "empty": "EmptyReply"}
ENDS_AT_FIRST_TURN = ("malformed_json", "good_then_malformed", "unknown_tool", "empty", "final_answer")


class ScriptedModel(TransformersPolicy):
    """Test double for the model only: the real TransformersPolicy whose generate step returns the token ids of
    scripted texts (then the task's answer) instead of sampling them."""

    def __init__(self, path, texts: list[str]) -> None:
        super().__init__(path, device="cpu", max_new_tokens=8)
        self.texts = texts
        self.turn = 0

    def ids(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"] + [self.tokenizer.eos_token_id]

    def _generate(self, prompts, keys, budgets):
        out = []
        for _ in prompts:
            ids = self.ids(self.texts[min(self.turn, len(self.texts) - 1)])
            self.turn += 1
            out.append((ids, [0.0] * len(ids), "stop"))
        return out


@pytest.fixture(scope="module")
def task():
    t = arithmetic.generate(1, split="train", seed=11, difficulty=1)[0]
    assert not t.messages and t.tools == ["python"]
    return t


def _text(case: str, task) -> str:
    expr = task.reference.steps[0].arguments["code"].removeprefix("print(").removesuffix(")")
    return OUTPUTS[case].replace("{expr}", expr).replace("{answer}", task.verifier.answer)


@pytest.fixture(scope="module")
def episodes(tiny_model, backend, task):
    """case -> (scripted policy, the loop's row)."""
    out = {}
    for case in OUTPUTS:
        pol = ScriptedModel(tiny_model, [_text(case, task), task.reference.final])
        out[case] = (pol, asyncio.run(run_episode(task, pol, backend, run_id=f"parity-{case}", max_turns=4)))
    return out


def test_outputs_are_what_the_cases_say(episodes):
    assert {c: r.verdict for c, (_, r) in episodes.items()} == VERDICTS
    assert {c: r.error_class for c, (_, r) in episodes.items() if r.error_class} == ERROR_CLASSES
    msgs = {c: r.messages[2] for c, (_, r) in episodes.items()}
    assert [c.function.name for c in msgs["good_then_malformed"].tool_calls] == ["python", chat.MALFORMED]
    assert msgs["malformed_json"].content == "Computing." and chat.is_malformed(msgs["malformed_json"].tool_calls[0])
    assert msgs["text_around_calls"].content == "First I run it.  Then I answer."
    assert len(msgs["several_calls"].tool_calls) == 2 and chat.is_empty(msgs["empty"])
    row = episodes["malformed_json"][1]  # the malformed turn is kept, answered by the error the verdict names
    assert row.messages[-1].role == "tool" and row.messages[-1].content.startswith("error: the tool call is not valid")


def test_grpo_parses_and_scores_the_generation_as_the_loop_did(episodes, tiny_model, backend, task):
    tok = use_codec_parser(AutoTokenizer.from_pretrained(tiny_model))
    assert tok.response_template is not None  # GRPOTrainer calls parse_response only when this is set
    schemas = tool_schemas(task.tools)
    prompt = task_rows([task])["prompt"][0]
    prompt_ids = tok.apply_chat_template(prompt, tools=schemas, add_generation_prompt=True, tokenize=True,
                                         return_dict=True)["input_ids"]
    env_cls = environment_class(task.tools, backend)
    for case, (pol, row) in episodes.items():
        assert list(prompt_ids) == pol.prompt_ids(initial_messages(task), schemas), case  # the same prompt
        turn = parse_response(tok, pol.ids(_text(case, task)), prefix=list(prompt_ids), tools=schemas)
        assert completion_messages([turn], start=len(prompt)) == [row.messages[2]], case
        if case in ENDS_AT_FIRST_TURN:
            env = env_cls()
            env.reset(task_json=task.model_dump_json())
            reward = EpisodeReward(backend=backend)
            assert reward([prompt], [[turn]], environments=[env]) == [0.0], case
            assert reward.last_verdicts == [row.verdict], case


def test_sft_renders_the_row_and_reads_back_the_same_turn(episodes, tiny_model):
    tok = AutoTokenizer.from_pretrained(tiny_model)
    for case, (_, row) in episodes.items():
        if case in ("malformed_json", "good_then_malformed", "empty"):
            with pytest.raises(chat.ConversationError):
                trajectory_conversation(row)
            _, stats = tokenize_rows(tok, [row], SFTConfig())
            assert stats["dropped_malformed"] == 1 and stats["dropped_ids"] == [row.trajectory_id], case
            continue
        msgs, tools = trajectory_conversation(row)
        text = tok.apply_chat_template(msgs, tools=tools, tokenize=False)
        first_turn = text.split("<|im_start|>assistant", 1)[1].split("<|im_end|>", 1)[0]
        assert chat.parse_text(first_turn, turn=2) == row.messages[2], case


def test_export_gives_the_same_messages_again(episodes, tmp_path):
    rows = [r for _, r in episodes.values()]
    root = str(tmp_path / "lake")
    write_trajectories(root, rows)
    out = tmp_path / "all.jsonl"
    assert export_jsonl(root, str(out), metadata=True).n_rows == len(rows)
    by_id = {r.trajectory_id: r for r in rows}
    for line in out.read_text().splitlines():
        ex = json.loads(line)
        row = by_id[ex["trajectory_id"]]
        assert [chat.from_chat(m, turn=i) for i, m in enumerate(ex["messages"])] == row.messages
    for case, (_, row) in episodes.items():
        if case in ("malformed_json", "good_then_malformed"):
            with pytest.raises(ExportError, match="not valid JSON"):
                to_trl_example(row.model_dump(), "object")
        elif case != "empty":
            assert to_trl_example(row.model_dump(), "object")["messages"] == trajectory_conversation(row)[0], case
