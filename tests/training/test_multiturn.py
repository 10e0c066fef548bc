"""SFT and GRPO on multi-turn episodes of the Harbor and BFCL formats: tiny models, the rows checked.

Harbor (Docker): the reference episode of a shipped task (a shell call, then a closing message) through the real
loop, in a container of the task's own image, graded by its test.sh in a fresh one; SFT on it; then two GRPO steps
whose generations play the task in containers of its image (the second step's in the first's, reset:
grpo.harbor_reuse), are graded the same way and land as rows.
BFCL: reference episodes of BFCL multi-turn entries (every user turn) as SFT examples: every assistant turn
carries loss, the later user turns and the tool outputs do not, and what max_length cuts is counted; then a GRPO
step whose rollouts get each later user turn after a reply without a call, their calls run against the task's API
state in its sandbox, BFCL's checker the reward.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sandbox.result import SandboxConfig
from tasks.spec import ReferenceSolution, ToolCallStep
from tests.training.conftest import reference_rows
from training.config import GRPOConfig, SFTConfig
from training.sft import loss_spans, tokenize_rows, train_sft

SUITE = Path(__file__).resolve().parents[2] / "data" / "harbor"


def _lake_rows(lake: Path) -> list:
    from warehouse.query import read_trajectories

    return read_trajectories(str(lake), "stage = 'grpo'", [])


@pytest.mark.docker
@pytest.mark.slow
def test_harbor_sft_then_a_grpo_step_plays_the_task_in_its_image_and_every_generation_is_a_row(tmp_path):
    from sandbox.backend import open_backend
    from tasks.harbor import load_harbor
    from training.grpo import EpisodeLog, train_grpo
    from training.tiny import build_tiny_model, task_corpus

    task = load_harbor(SUITE / "hello-file", build=True)[0]
    # a short reference (the shipped oracle copies solution/ in base64: long for a tiny model to learn in a test)
    task = task.model_copy(update={"reference": ReferenceSolution(
        steps=[ToolCallStep(tool="shell", arguments={"command": "printf 'Hello, world!\\n' > /app/hello.txt"})],
        final="Done.")})
    with open_backend(SandboxConfig(backend="docker", timeout_s=30.0), pool_size=1) as docker:
        rows = reference_rows([task], docker, run_id="harbor-ref")
        assert [(r.verdict, r.verifier, r.n_tool_calls) for r in rows] == [("pass", "harbor", 1)]
        assert rows[0].sandbox_image.startswith("sha256:")  # the task's own image, not the run's sandbox image

        # the corpus twice: its system block (prompt and tool schemas) recurs, so it becomes one token
        base = build_tiny_model(tmp_path / "base", task_corpus([task]) * 2, hidden=64, layers=2, heads=2,
                                kv_heads=1, vocab_size=400, seed=0)
        sft = train_sft(base, rows, tmp_path / "sft", SFTConfig(max_steps=100, batch_size=1, learning_rate=1e-2,
                                                                max_length=2048), progress=False)
        # both assistant turns (the call, the closing message) carry loss; the tool's output does not
        assert sft.per_suite["harbor"]["examples"] == 1
        assert sft.per_suite["harbor"]["assistant_turns"] == sft.per_suite["harbor"]["trained_turns"] == 2
        assert sft.losses[-1] < 0.05, sft.losses

        lake = tmp_path / "lake"
        cfg = GRPOConfig(max_steps=2, num_generations=2, prompts_per_step=1, max_completion_length=64,
                         max_tool_calling_iterations=2, learning_rate=1e-4, temperature=0.7, seed=3)
        res = train_grpo(sft.checkpoint_path, [task], tmp_path / "grpo", cfg, backend=docker, progress=False,
                         episode_log=EpisodeLog(str(lake), "harbor-grpo", 1, policy="grpo-r1"))
    assert res.steps == 2 and res.episodes == 4 and res.rows_written == 4
    got = _lake_rows(lake)
    assert len(got) == 4 and {r.task_id for r in got} == {task.id} and len({r.group_id for r in got}) == 2
    # every generation that called a tool had a container: a new one, or (grpo.harbor_reuse) one of the first
    # step's, reset; none failed its reset (the tool calls change /app alone)
    played = {g: sum(1 for r in got if r.group_id == g and r.n_tool_calls) for g in {r.group_id for r in got}}
    c = res.task_containers
    assert c["started"] + c["reused"] == sum(played.values()) and c["reset_failed"] == 0, (c, played)
    assert c["reused"] >= (1 if all(played.values()) else 0), (c, played)
    # the student learnt the call SFT showed it, which it reproduces only if GRPO's prompt lists the tools in the
    # order SFT's did (TRL lists them alphabetically: training.environment.show_task_schemas)
    assert sum(r.verdict == "pass" for r in got) == res.verdicts["pass"] >= 2, [r.verdict for r in got]
    for r in got:
        assert r.source == "student" and r.stage == "grpo"
        if r.n_tool_calls:  # played in a container of the task's image, graded by test.sh in a fresh one
            assert r.sandbox_image.startswith("sha256:") and r.verifier == "harbor", r
            assert json.loads(r.verifier_details_json)["state"]["/app"] == "copied"
        if r.verdict == "pass":
            assert r.reward == 1.0 and r.verifier_strength == "harbor"
    assert res.hacks_with_positive_reward == 0


@pytest.mark.slow
def test_bfcl_sft_trains_every_assistant_turn_and_grpo_plays_every_user_turn(backend, tmp_path, monkeypatch):
    from transformers import AutoTokenizer

    from tasks.bfcl import BfclMissing, load_bfcl
    from training.grpo import EpisodeLog, train_grpo
    from training.tiny import build_tiny_model, task_corpus

    try:
        tasks = load_bfcl(2, split="heldout")
    except BfclMissing as e:
        pytest.skip(f"bfcl-eval wheel not cached: {e}")
    rows = reference_rows(tasks, backend, run_id="bfcl-ref")
    assert all(r.verdict == "pass" for r in rows), [(r.verdict, r.error_message) for r in rows]
    users = [sum(m.role == "user" for m in r.messages) for r in rows]
    assert all(n == len(t.later_turns) + 1 > 1 for n, t in zip(users, tasks)), users

    base = build_tiny_model(tmp_path / "base", task_corpus(tasks) * 2, hidden=64, layers=2, heads=2, kv_heads=1,
                            vocab_size=800, seed=0)
    tok = AutoTokenizer.from_pretrained(str(base))
    cols, stats = tokenize_rows(tok, rows, SFTConfig(max_length=8192))
    assistant = [sum(m.role == "assistant" for m in r.messages) for r in rows]
    # one loss span per assistant turn, in every user turn; nothing of the user or tool messages carries loss
    assert [loss_spans(lab) for lab in cols["labels"]] == assistant
    for ids, labels, row in zip(cols["input_ids"], cols["labels"], rows):
        trained = tok.decode([t for t, lab in zip(ids, labels) if lab != -100])
        for m in row.messages:
            if m.role in ("user", "tool") and m.content and len(m.content) > 20:
                assert m.content not in trained
    counts = stats["per_suite"]["bfcl-multi-turn"]
    assert counts["examples"] == 2 and counts["trained_turns"] == counts["assistant_turns"] == sum(assistant)
    # cut at max_length where the episode's last assistant turn starts: kept as truncated, that one turn lost
    labels = cols["labels"][0]
    last_start = max(i for i, lab in enumerate(labels) if lab != -100 and labels[i - 1] == -100)
    _, cut = tokenize_rows(tok, rows[:1], SFTConfig(max_length=last_start))
    c = cut["per_suite"]["bfcl-multi-turn"]
    assert (c["examples"], c["truncated"], c["dropped_truncated"]) == (1, 1, 0)
    assert (c["assistant_turns"], c["trained_turns"]) == (assistant[0], assistant[0] - 1)

    sft = train_sft(base, rows, tmp_path / "sft", SFTConfig(max_steps=150, batch_size=2, learning_rate=1e-2,
                                                            max_length=8192), progress=False)
    assert sft.per_suite["bfcl-multi-turn"]["trained_turns"] == sum(assistant)
    # GRPO: every user turn delivered after a reply without a call, the calls run against the task's API state in
    # its sandbox, BFCL's checker as the reward
    longest = max(len(ids) for ids in cols["input_ids"])
    lake = tmp_path / "lake"
    cfg = GRPOConfig(max_steps=1, num_generations=2, prompts_per_step=2, max_completion_length=longest,
                     max_tool_calling_iterations=4, learning_rate=1e-4, temperature=0.5, seed=3,
                     update_check=False)
    import training.grpo as grpo_module

    seen: list = []  # what the trainer's multi-turn tool loop returned: (loss mask, completion ids) per rollout
    trainer_class = grpo_module._trainer_class

    def recording_trainer_class():
        class Recording(trainer_class()):
            def _tool_call_loop(self, *args):
                out = super()._tool_call_loop(*args)
                seen.extend(zip(out[0], out[2], strict=True))
                return out
        return Recording

    monkeypatch.setattr(grpo_module, "_trainer_class", recording_trainer_class)
    res = train_grpo(sft.checkpoint_path, tasks, tmp_path / "grpo", cfg, backend=backend, progress=False,
                     episode_log=EpisodeLog(str(lake), "bfcl-grpo", 1, policy="grpo-r1"))
    got = _lake_rows(lake)
    assert res.episodes == len(got) == 4 and {r.task_id for r in got} == {t.id for t in tasks}
    by_id = {t.id: t for t in tasks}
    # rollouts reach later user turns, in the task's order, each after a reply without a call
    reached = [r for r in got if sum(m.role == "user" for m in r.messages) > 1]
    assert reached, [[m.role for m in r.messages] for r in got]
    for r in reached:
        later = [m.content for m in r.messages if m.role == "user"][1:]
        assert later == by_id[r.task_id].later_turns[: len(later)]
        for k, m in enumerate(r.messages):
            if m.role == "user" and k > 1:
                assert r.messages[k - 1].role == "assistant" and not r.messages[k - 1].tool_calls
    # the later user turns' tokens are out of GRPO's loss, as tool results are; the model's own tokens are in it
    assert len(seen) == 4
    later_texts = [t for task in tasks for t in task.later_turns]
    delivered = sum(sum(m.role == "user" for m in r.messages) - 1 for r in got)
    found = 0
    for mask, ids in seen:
        assert len(mask) == len(ids)
        trained = tok.decode([t for t, m in zip(ids, mask) if m])
        masked = tok.decode([t for t, m in zip(ids, mask) if not m])
        assert not any(text in trained for text in later_texts)
        found += sum(text in masked for text in later_texts)
    assert found >= delivered > 0
    from warehouse.report import episode_turns

    shape = episode_turns(str(lake), "bfcl-grpo")  # the report's table of the episodes' turns
    assert [(r["stage"], r["source"], r["suite"], r["episodes"]) for r in shape] == [
        ("grpo", "student", "bfcl-multi-turn", 4)]
    assert shape[0]["user_turns"] == sum(sum(m.role == "user" for m in r.messages) for r in got) / 4 > 1
    assert shape[0]["not_passed"] == sum(r.verdict != "pass" for r in got)
    judged = [r for r in got if r.verdict in ("pass", "fail")]
    assert judged and all(r.verifier == "bfcl" and r.verifier_strength == "bfcl" for r in judged)
    assert res.verdicts["pass"] == sum(r.verdict == "pass" for r in got)
