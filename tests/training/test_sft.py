"""SFT: multi-turn tool conversations tokenized with assistant-only labels, drops counted, seeded runs repeat."""

from __future__ import annotations

import time

import pytest
from transformers import AutoTokenizer

from training.config import SFTConfig
from training.sft import TrainingError, tokenize_rows, train_sft, trajectory_conversation


def test_conversation_has_tool_calls_as_objects(ref_rows):
    msgs, tools = trajectory_conversation(ref_rows[0])
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "tool", "assistant"]
    assert isinstance(msgs[2]["tool_calls"][0]["function"]["arguments"], dict)
    assert tools[0]["function"]["name"] == "python"


def test_labels_cover_assistant_turns_only(tiny_model, ref_rows):
    tok = AutoTokenizer.from_pretrained(tiny_model)
    cols, stats = tokenize_rows(tok, ref_rows[:4], SFTConfig())
    ids, labels = cols["input_ids"][0], cols["labels"][0]
    trained = tok.decode([t for t, lab in zip(ids, labels) if lab != -100])
    assert '<tool_call>' in trained and '"print(' in trained and "Answer:" in trained
    assert trained.count("<|im_end|>") == 2  # both assistant turns learn to stop
    masked = tok.decode([t for t, lab in zip(ids, labels) if lab == -100])
    assert "careful agent" in masked and ref_rows[0].messages[1].content in masked  # system, user: no loss
    assert stats["dropped_truncated"] == 0 and stats["loss_tokens"] > 0


def test_truncation_drops_are_counted_not_silent(tiny_model, ref_rows):
    tok = AutoTokenizer.from_pretrained(tiny_model)
    full, _ = tokenize_rows(tok, ref_rows[:3], SFTConfig())
    n = len(full["input_ids"][0])
    # a budget that ends before the first assistant token of every row (prompts differ in length)
    first_loss = min(next(i for i, lab in enumerate(labels) if lab != -100) for labels in full["labels"])
    cols, stats = tokenize_rows(tok, ref_rows[:3], SFTConfig(max_length=first_loss))
    assert stats["dropped_truncated"] == 3 and cols["input_ids"] == []
    assert stats["dropped_ids"] == [r.trajectory_id for r in ref_rows[:3]]
    cols, stats = tokenize_rows(tok, ref_rows[:1], SFTConfig(max_length=n - 2))
    assert stats["truncated"] == 1 and stats["dropped_truncated"] == 0 and len(cols["input_ids"][0]) == n - 2


def test_malformed_rows_are_counted(tiny_model, ref_rows):
    tok = AutoTokenizer.from_pretrained(tiny_model)
    bad = ref_rows[0].model_copy(deep=True)
    bad.messages[2].tool_calls[0].function.arguments = '{"code": "print(1'
    cols, stats = tokenize_rows(tok, [bad, ref_rows[1]], SFTConfig())
    assert stats["dropped_malformed"] == 1 and len(cols["input_ids"]) == 1


def test_all_dropped_is_an_error_naming_the_fix(tiny_model, ref_rows, tmp_path):
    with pytest.raises(TrainingError, match="max_length"):
        train_sft(tiny_model, ref_rows[:2], tmp_path / "out", SFTConfig(max_length=4, max_steps=1), progress=False)


@pytest.mark.slow
def test_seeded_sft_repeats_its_loss_sequence(tiny_model, ref_rows, tmp_path):
    cfg = SFTConfig(max_steps=6, batch_size=8, learning_rate=3e-3, seed=11)
    t0 = time.perf_counter()
    a = train_sft(tiny_model, ref_rows, tmp_path / "a", cfg, progress=False)
    b = train_sft(tiny_model, ref_rows, tmp_path / "b", cfg, progress=False)
    print(f"two seeded SFT runs of {cfg.max_steps} steps: {time.perf_counter() - t0:.1f}s; losses {a.losses}")
    assert len(a.losses) == 6 and a.losses == b.losses
    assert a.losses[-1] < a.losses[0]
    c = train_sft(tiny_model, ref_rows, tmp_path / "c", cfg.model_copy(update={"seed": 12}), progress=False)
    assert c.losses != a.losses  # the seed matters: the test can fail
    assert (tmp_path / "a" / "model.safetensors").exists() and (tmp_path / "a" / "tokenizer.json").exists()
    assert a.n_examples == len(ref_rows) and a.n_dropped_truncated == 0


def test_load_snapshot_takes_ids_as_values(tmp_path):
    from tests.warehouse.conftest import make_trajectory
    from training.sft import load_snapshot
    from warehouse.lake import write_manifest, write_trajectories

    root = str(tmp_path / "lake")
    rows = [make_trajectory(i, task_id=tid) for i, tid in enumerate(["it's", "o''neil", "plain"])]
    write_trajectories(root, rows)
    write_manifest(root, "snap-1", [{"trajectory_id": r.trajectory_id, "source": r.source, "run_id": r.run_id,
                                     "round": r.round, "task_id": r.task_id, "suite": r.suite, "policy": r.policy,
                                     "weight": 1.0} for r in rows[:2]])
    assert sorted(r.task_id for r in load_snapshot(root, "snap-1")) == ["it's", "o''neil"]
    with pytest.raises(TrainingError, match="has no trajectories"):
        load_snapshot(root, "snap-1' OR '1'='1")


def test_late_sources_train_in_a_last_phase_over_the_whole_mix():
    from training.sft import sft_phases

    cols = {"input_ids": [[1], [2], [3], [4]], "labels": [[1], [2], [3], [4]]}
    sources = ["teacher", "human", "teacher", "student"]
    cfg = SFTConfig(max_steps=100, learning_rate=5e-3, late_sources=["human"], late_steps=30, late_learning_rate=2e-3,
                    late_max_share=0.5)
    (early, n1, lr1), (late, n2, lr2) = sft_phases(cols, sources, cfg)
    assert early["input_ids"] == [[1], [3], [4]] and early["labels"] == [[1], [3], [4]]
    assert (n1, lr1, n2, lr2) == (70, 5e-3, 30, 2e-3) and late == cols
    # more late rows than late_max_share allows: a seeded sample of them, the others all kept, order kept
    many = {"input_ids": [[i] for i in range(10)], "labels": [[i] for i in range(10)]}
    src = ["teacher"] * 3 + ["human"] * 7
    (_, _, _), (late, _, _) = sft_phases(many, src, cfg)
    assert late["input_ids"][:3] == [[0], [1], [2]] and len(late["input_ids"]) == 6  # 3 teacher + 3 human = 50%
    assert late["input_ids"] == sorted(late["input_ids"]) and late == sft_phases(many, src, cfg)[1][0]
    assert sft_phases(many, src, cfg.model_copy(update={"seed": 1}))[1][0] != late  # the seed picks the sample
    # one phase without late sources, or when the snapshot holds only one kind
    assert sft_phases(cols, sources, cfg.model_copy(update={"late_sources": []})) == [(cols, 100, 5e-3)]
    assert sft_phases(cols, ["human"] * 4, cfg) == [(cols, 100, 5e-3)]
    assert sft_phases(cols, ["teacher"] * 4, cfg) == [(cols, 100, 5e-3)]
    with pytest.raises(TrainingError, match=r"sft.max_steps \(30\) above sft.late_steps \(30\)"):
        sft_phases(cols, sources, cfg.model_copy(update={"max_steps": 30}))


def test_late_phase_that_cannot_fit_is_a_config_error():
    from flows.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=r"flywheel.later_sft_steps \(100\) above sft.late_steps \(150\)"):
        load_config(None, ['sft.late_sources=["human"]', "flywheel.later_sft_steps=100"])
    cfg = load_config(None, ['sft.late_sources=["human"]'])
    assert cfg.sft.late_sources == ["human"] and cfg.sft.max_steps == 2000


@pytest.mark.slow
def test_two_phase_sft_counts_both_phases(tiny_model, ref_rows, tmp_path):
    rows = [r.model_copy(update={"source": "human"}) if i % 4 == 0 else r for i, r in enumerate(ref_rows)]
    cfg = SFTConfig(max_steps=5, batch_size=4, late_sources=["human"], late_steps=2, seed=3)
    res = train_sft(tiny_model, rows, tmp_path / "out", cfg, progress=False)
    assert res.steps == 5 and len(res.losses) == 5 and res.n_examples == len(rows)
    assert (tmp_path / "out" / "model.safetensors").exists()
