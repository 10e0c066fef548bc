"""`flywheel export --format dpo|kto` on a real lake of real episodes: passes paired with hacks and failures of the
same task, round and policy, reason codes as columns; the file opens with `datasets` and goes through TRL's DPO
dataset preparation and one DPO step on the tiny student (KTO likewise through its trainer's preparation)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess

import datasets
import pytest

from tasks import arithmetic
from tests.conftest import FLYWHEEL


def _renders(row):
    """Whether a chat template can show the row (a malformed call cannot: such episodes are left out)."""
    from warehouse import chat

    try:
        chat.to_template(row.messages)
    except chat.ConversationError:
        return False
    return True


def _flywheel(*args):
    return subprocess.run([FLYWHEEL, *args], capture_output=True, text=True, env=os.environ, timeout=300, check=False)


@pytest.fixture(scope="module")
def noisy_lake(backend, tmp_path_factory):
    """Reference-teacher episodes with injected wrong answers, malformed calls and tool-skipping hacks: every
    task has passes and failures in the same round under the same policy."""
    from agents.reference import ReferenceNoise, ReferencePolicy
    from agents.rollout import rollout
    from warehouse.lake import write_trajectories

    root = tmp_path_factory.mktemp("pref") / "lake"
    tasks = arithmetic.generate(4, split="train", seed=21, difficulty=1)
    policy = ReferencePolicy(noise=ReferenceNoise(wrong_answer=0.25, malformed_call=0.15, no_tool=0.3), seed=3)
    rows = []
    asyncio.run(rollout(tasks, policy, backend, run_id="pref", round=1, samples=6, concurrency=4,
                        on_rows=rows.extend, batch_size=24, progress=False))
    write_trajectories(str(root), rows)
    return root, rows


def test_dpo_export_pairs_passes_with_hacks_and_failures(noisy_lake, tmp_path):
    root, rows = noisy_lake
    verdicts = {r.verdict for r in rows}
    assert {"pass", "hack", "fail", "model_error"} <= verdicts, verdicts
    assert not all(_renders(r) for r in rows if r.verdict == "model_error")  # malformed calls: left out
    out = tmp_path / "dpo.jsonl"
    p = _flywheel("export", str(out), "--root", str(root), "--format", "dpo", "--run-id", "pref")
    assert p.returncode == 0, p.stderr
    assert "rows to" in p.stdout and "without a partner left out" in p.stdout
    ds = datasets.load_dataset("json", data_files=str(out), split="train")
    by_id = {r.trajectory_id: r for r in rows}
    n_pass = {}
    n_neg = {}
    for r in rows:
        if r.verdict == "pass":
            n_pass[r.task_id] = n_pass.get(r.task_id, 0) + 1
        elif r.verdict in ("hack", "fail", "model_error", "timeout") and _renders(r):
            n_neg[r.task_id] = n_neg.get(r.task_id, 0) + 1
    assert ds.num_rows > 0
    assert {"prompt", "chosen", "rejected", "tools", "reason", "rejected_verdict", "rejected_hack_flags",
            "chosen_id", "rejected_id"} <= set(ds.column_names)
    seen = set()
    for ex in ds:
        c, j = by_id[ex["chosen_id"]], by_id[ex["rejected_id"]]
        assert c.verdict == "pass" and j.verdict in ("hack", "fail", "model_error", "timeout")
        assert (c.task_id, c.round, c.policy) == (j.task_id, j.round, j.policy) == (ex["task_id"], 1, "reference")
        assert ex["rejected_verdict"] == j.verdict and ex["rejected_hack_flags"] == j.hack_flags
        assert ex["reason"] == (f"hack:{','.join(sorted(j.hack_flags))}" if j.verdict == "hack" else j.verdict)
        assert ex["prompt"][0]["role"] == "system" and ex["prompt"][-1]["role"] == "user"
        assert ex["chosen"][0]["role"] == ex["rejected"][0]["role"] == "assistant"
        assert ex["chosen"][-1]["content"] == c.messages[-1].content
        assert not ({ex["chosen_id"], ex["rejected_id"]} & seen)  # each episode in one pair at most
        seen |= {ex["chosen_id"], ex["rejected_id"]}
    # hacks are taken first as the rejected partner
    hacks = {r.task_id for r in rows if r.verdict == "hack"}
    assert any(ex["reason"].startswith("hack:no_tool_use") for ex in ds) and hacks
    per_task = {}
    for ex in ds:
        per_task[ex["task_id"]] = per_task.get(ex["task_id"], 0) + 1
    assert per_task == {t: min(n_pass.get(t, 0), n_neg.get(t, 0)) for t in per_task}

    again = _flywheel("export", str(out), "--root", str(root), "--format", "dpo")
    assert again.returncode == 2 and "already exists" in again.stderr
    none = _flywheel("export", str(tmp_path / "none.jsonl"), "--root", str(root), "--format", "dpo",
                     "--verdict", "pass")
    assert none.returncode == 2 and "no preference pairs" in none.stderr and not (tmp_path / "none.jsonl").exists()
    snap = _flywheel("export", str(tmp_path / "s.jsonl"), "--root", str(root), "--format", "kto", "--snapshot", "x")
    assert snap.returncode == 2 and "drop --snapshot" in snap.stderr


@pytest.mark.slow
def test_dpo_export_passes_trl_dataset_preparation_and_a_step(noisy_lake, tiny_model, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import DPOConfig, DPOTrainer

    root, _ = noisy_lake
    out = tmp_path / "dpo.jsonl"
    assert _flywheel("export", str(out), "--root", str(root), "--format", "dpo").returncode == 0
    ds = datasets.load_dataset("json", data_files=str(out), split="train")
    tok = AutoTokenizer.from_pretrained(str(tiny_model))
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model))
    args = DPOConfig(output_dir=str(tmp_path / "dpo"), max_steps=1, per_device_train_batch_size=2, report_to="none",
                     use_cpu=True, save_strategy="no", logging_steps=1, max_length=1024)
    trainer = DPOTrainer(model=model, args=args, train_dataset=ds, processing_class=tok)
    prepared = trainer.train_dataset
    assert prepared.num_rows == ds.num_rows  # nothing dropped as fully truncated
    first = prepared[0]
    assert first["chosen_ids"] and first["rejected_ids"] and first["chosen_ids"] != first["rejected_ids"]
    # the prompt rendered with the task's tools: the tool schema is in the prompt the model is trained on
    assert json.loads(ds[0]["tools"])[0]["function"]["name"] in tok.decode(first["prompt_ids"])
    trainer.train()
    assert trainer.state.global_step == 1 and any("loss" in h for h in trainer.state.log_history)


@pytest.mark.slow
def test_kto_export_labels_each_side_and_passes_trl_preparation(noisy_lake, tiny_model, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import KTOConfig, KTOTrainer

    root, _ = noisy_lake
    out = tmp_path / "kto.jsonl"
    p = _flywheel("export", str(out), "--root", str(root), "--format", "kto")
    assert p.returncode == 0, p.stderr
    ds = datasets.load_dataset("json", data_files=str(out), split="train")
    assert {"prompt", "completion", "label", "reason", "verdict", "hack_flags"} <= set(ds.column_names)
    labels = ds["label"]
    assert labels.count(True) == labels.count(False) > 0
    assert all((ex["verdict"] == "pass") == ex["label"] for ex in ds)
    tok = AutoTokenizer.from_pretrained(str(tiny_model))
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model))
    args = KTOConfig(output_dir=str(tmp_path / "kto"), max_steps=1, per_device_train_batch_size=2, report_to="none",
                     use_cpu=True, save_strategy="no", max_length=1024)
    trainer = KTOTrainer(model=model, args=args, train_dataset=ds, processing_class=tok)
    assert trainer.train_dataset.num_rows == ds.num_rows
