"""`flywheel export --snapshot S`: exactly the curated rows with their weights, tool-call arguments as objects,
rendered by a real tokenizer's chat template and taken by TRL's SFTTrainer for one step on the tiny student.
The raw-lake export warns that it bypasses curation. Run through the installed console script."""

from __future__ import annotations

import json
import subprocess

import pyarrow.parquet as pq
import pytest

from curate.config import CurateConfig
from curate.stage import curate
from tasks import arithmetic
from tests.conftest import FLYWHEEL
from tests.curate.test_curate import row
from warehouse.lake import write_trajectories


def fw(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([FLYWHEEL, *args], capture_output=True, text=True, timeout=300, check=False)


@pytest.fixture(scope="module")
def snap(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("lake"))
    train = arithmetic.generate(12, split="train", seed=0, difficulty=1)
    held = arithmetic.generate(10, split="heldout", seed=0, difficulty=1)
    clean = [row(t) for t in train[:10]]
    leak = row(train[10], sample=1, code=f"print({held[0].metadata['expression']})")   # held-out expression
    hack = row(train[11], sample=1, hack_flags=["answer_without_tool"])
    human = row(train[0], sample=2, source="human", policy="human",
                final=f"That makes {train[0].verifier.answer}. Answer: {train[0].verifier.answer}")
    write_trajectories(root, clean + [leak, hack, human])
    res = curate(root, CurateConfig(), run_id="run1", round=0, heldout_tasks=held)
    assert res.outcomes[leak.trajectory_id] == "contaminated"
    assert res.contamination[leak.trajectory_id] == f"expression:{held[0].id}"
    return root, res, leak, hack


def test_snapshot_export_is_the_manifest_with_weights_and_object_arguments(snap, tmp_path):
    root, res, _, _ = snap
    out = tmp_path / "snap.jsonl"
    p = fw("export", str(out), "--root", root, "--snapshot", res.snapshot_id, "--metadata")
    assert p.returncode == 0, p.stderr
    assert "bypasses curation" not in p.stderr
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    manifest = pq.read_table(res.manifest_path).to_pylist()
    assert [(x["trajectory_id"], x["weight"]) for x in lines] == [(m["trajectory_id"], m["weight"]) for m in manifest]
    assert {x["source"] for x in lines} == {"teacher", "human"} and {x["weight"] for x in lines} == {1.0, 2.0}
    call = lines[0]["messages"][2]["tool_calls"][0]["function"]
    assert isinstance(call["arguments"], dict) and call["arguments"]["code"].startswith("print(")
    assert isinstance(lines[0]["tools"], list) and lines[0]["tools"][0]["type"] == "function"
    # the wire form on request
    wire = tmp_path / "wire.jsonl"
    assert fw("export", str(wire), "--root", root, "--snapshot", res.snapshot_id, "--arguments", "string"
              ).returncode == 0
    first = json.loads(wire.read_text().splitlines()[0])
    assert isinstance(first["messages"][2]["tool_calls"][0]["function"]["arguments"], str)


def test_raw_lake_export_warns_and_holds_what_curation_dropped(snap, tmp_path):
    root, _, leak, hack = snap
    out = tmp_path / "raw.jsonl"
    p = fw("export", str(out), "--root", root, "--verdict", "pass", "--metadata")
    assert p.returncode == 0, p.stderr
    assert "warning: exporting from the raw lake bypasses curation" in p.stderr
    ids = {json.loads(x)["trajectory_id"] for x in out.read_text().splitlines()}
    assert {leak.trajectory_id, hack.trajectory_id} <= ids


def test_bad_snapshot_export_input_is_one_error_line(snap, tmp_path):
    root, res, _, _ = snap
    p = fw("export", str(tmp_path / "a.jsonl"), "--root", root, "--snapshot", "nope")
    assert p.returncode == 2 and p.stderr.strip().startswith("error: snapshot 'nope' is not in the datasets table")
    p = fw("export", str(tmp_path / "b.jsonl"), "--root", root, "--snapshot", res.snapshot_id, "--verdict", "pass")
    assert p.returncode == 2 and "drop --verdict" in p.stderr
    p = fw("export", str(tmp_path / "c"), "--root", root, "--snapshot", res.snapshot_id, "--format", "datasets",
           "--arguments", "object")
    assert p.returncode == 2 and "JSON strings" in p.stderr
    assert not (tmp_path / "a.jsonl").exists() and not (tmp_path / "b.jsonl").exists()


@pytest.mark.slow
def test_exported_snapshot_renders_and_trains_one_sft_step(snap, tmp_path):
    datasets = pytest.importorskip("datasets")
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    from training.tiny import build_tiny_model, task_corpus

    root, res, _, _ = snap
    out = tmp_path / "snap.jsonl"
    assert fw("export", str(out), "--root", root, "--snapshot", res.snapshot_id).returncode == 0
    model_dir = build_tiny_model(tmp_path / "tiny", task_corpus(arithmetic.generate(12, split="train", seed=0)),
                                 hidden=32, layers=2, heads=2, kv_heads=1, vocab_size=600, seed=0)
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    ex = json.loads(out.read_text().splitlines()[0])
    text = tok.apply_chat_template(ex["messages"], tools=ex["tools"], tokenize=False)
    code = ex["messages"][2]["tool_calls"][0]["function"]["arguments"]["code"]
    assert json.dumps({"code": code}) in text          # the arguments object, encoded once
    assert '\\"code\\"' not in text                     # not a JSON string inside the template text
    wire = json.loads(json.dumps(ex))
    wire["messages"][2]["tool_calls"][0]["function"]["arguments"] = json.dumps({"code": code})
    assert '\\"code\\"' in tok.apply_chat_template(wire["messages"], tools=ex["tools"], tokenize=False)  # what
    # the old export gave: double encoded
    ds = datasets.load_dataset("json", data_files=str(out), split="train").remove_columns(["weight"])
    args = SFTConfig(output_dir=str(tmp_path / "sft"), max_steps=1, per_device_train_batch_size=2, max_length=512,
                     report_to="none", save_strategy="no", use_cpu=True, dataloader_num_workers=0,
                     disable_tqdm=True)
    trainer = SFTTrainer(model=AutoModelForCausalLM.from_pretrained(str(model_dir)), args=args, train_dataset=ds,
                         processing_class=tok)
    trainer.train()
    assert trainer.state.global_step == 1


@pytest.mark.slow
def test_curate_command_prints_counts_contamination_rules_and_invalid_demos(tmp_path, prefect_api):
    """`flywheel curate` through the console script: the table by source, verdict and outcome, the rule and
    held-out task of each contaminated row, and every invalid demo named."""
    root = str(tmp_path / "lake")
    train = arithmetic.generate(6, split="train", seed=0, difficulty=1)
    held = arithmetic.generate(50, split="heldout", seed=0, difficulty=1)   # the default schedule's held-out split
    leak = row(train[5], sample=1, user="Compute it.", code=f"print({held[3].metadata['expression']})")
    write_trajectories(root, [row(t) for t in train[:5]] + [leak])
    bad = tmp_path / "bad_demos.jsonl"
    bad.write_text(json.dumps({"messages": [{"role": "wizard", "content": "hi"}]}) + "\n")
    p = fw("curate", "--run-id", "run1", "--round", "0", "--out", root, "--demos", str(bad),
           "--set", "curate.demo_tools=[\"python\"]")
    assert p.returncode == 0, p.stderr[-2000:]
    assert "teacher   pass         selected                           5" in p.stdout
    assert "teacher   pass         contaminated                       1" in p.stdout
    assert f"contaminated {leak.trajectory_id}: rule expression against held-out task {held[3].id}" in p.stdout
    assert "invalid demo: " in p.stdout and "wizard" in p.stdout
