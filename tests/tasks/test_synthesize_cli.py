"""`flywheel tasks synthesize` through the installed console script, in Docker (the Harbor tasks' backend).

- reference writer: one ledger candidate admitted as a Harbor folder (oracle passes, null agent and the three
  perturbed oracles fail), its task_synthesis row read back with `flywheel sql`; the same seed again is refused as a
  duplicate (same name: the family is deterministic) without any audit;
- openai writer: a loopback test double (tests/tasks/planted_writer.py) answers seven planted proposals, each
  admitted or refused with its reason code (sound; oracle fails; null agent passes; a coin-flip test; the answer in
  the instruction; a copy of a held-out task; malformed JSON), tokens recorded per candidate;
- bad input (no endpoint, an endpoint that is not there, an unknown held-out suite) is one line and exit 2, nothing written.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import FLYWHEEL, ROOT, free_port
from tests.tasks.planted_writer import PlantedWriter, proposals

ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def flywheel(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([FLYWHEEL, *args], capture_output=True, text=True, env=ENV, timeout=timeout, check=False)


def sql(root: Path, query: str) -> list[dict]:
    r = flywheel("sql", query, "--root", str(root), "--format", "json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.mark.docker
@pytest.mark.e2e
def test_reference_candidate_admitted_then_refused_as_duplicate(tmp_path):
    out, lake = tmp_path / "synth", tmp_path / "lake"
    args = ("tasks", "synthesize", "--n", "1", "--seed", "7", "--k", "1", "--heldout", "arithmetic", "--out",
            str(out), "--root", str(lake))
    r = flywheel(*args)
    assert r.returncode == 0, r.stderr[-3000:] + r.stdout[-3000:]
    assert "admitted 1 of 1" in r.stdout and "funnel: admitted 1" in r.stdout
    assert [p.name for p in out.iterdir()] == ["ledger-7-0"]  # no staging folder left
    assert {p.name for p in (out / "ledger-7-0").iterdir()} == {"task.toml", "instruction.md", "environment",
                                                              "tests", "solution"}
    r = flywheel(*args)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "refused ledger-7-0: duplicate (a task named ledger-7-0 exists already)" in r.stdout
    rows = sql(lake, "SELECT candidate_id, writer, family, decision, reason_codes, oracle_pass, null_pass, "
                     "n_perturbed, perturbed_killed, k_regrades, flake_rate, audit_s FROM task_synthesis "
                     "ORDER BY created_at")
    assert [(x["decision"], x["reason_codes"]) for x in rows] == [("admitted", []), ("refused", ["duplicate"])]
    first = rows[0]
    assert (first["writer"], first["family"], first["oracle_pass"], first["null_pass"], first["n_perturbed"],
            first["perturbed_killed"], first["k_regrades"], first["flake_rate"]) == \
        ("reference", "ledger", True, False, 3, 3, 1, 0.0)
    assert first["audit_s"] > 0 and rows[1]["oracle_pass"] is None  # the duplicate was never audited


@pytest.mark.docker
@pytest.mark.e2e
def test_openai_writer_planted_proposals_each_get_their_reason(tmp_path):
    held = tmp_path / "held" / "csv-sum"
    shutil.copytree(ROOT / "data" / "harbor" / "csv-sum", held)
    toml = held / "task.toml"
    toml.write_text(toml.read_text().replace("[metadata]\n", "[metadata]\nsplit = \"heldout\"\n"))
    out, lake = tmp_path / "synth", tmp_path / "lake"
    with PlantedWriter(proposals(held)) as server:
        r = flywheel("tasks", "synthesize", "--writer", "openai", "--base-url", server.url, "--model", "planted",
                     "--n", "7", "--k", "2", "--workers", "4", "--prompt-price", "2", "--completion-price", "8", "--heldout", str(held.parent), "--out", str(out), "--root", str(lake))
    assert r.returncode == 0, r.stderr[-3000:] + r.stdout[-3000:]
    assert len(server.requests) == 7 and all(b["model"] == "planted" for b in server.requests)
    rows = {x["candidate_id"]: x for x in sql(lake, "SELECT * FROM task_synthesis")}
    got = {cid: (x["decision"], x["reason_codes"]) for cid, x in rows.items()}
    assert got["openai-0"] == ("admitted", []), got
    assert got["openai-1"] == ("refused", ["oracle_fails"]), got
    assert got["openai-2"][0] == "refused" and got["openai-2"][1][0] == "null_passes", got
    assert "perturbed_wrong_value_passes" in got["openai-2"][1]  # a test that always passes lets them all through
    # a test that passes 1 time in 32: refused as flaky, or as failing the oracle when every grading failed (it is
    # admitted only when the oracle and both re-grades all pass: 1 in 32,768)
    assert got["openai-3"][0] == "refused" and set(got["openai-3"][1]) <= {"oracle_fails", "flaky"}, got
    assert got["openai-3"][1], got
    assert got["openai-4"] == ("refused", ["leaks_answer"]), got
    assert got["openai-5"] == ("refused", ["heldout_copy"]), got
    assert "flywheel/csv-sum" in rows["openai-5"]["detail"]
    assert got["openai-6"] == ("refused", ["malformed_reply"]), got
    assert "not JSON" in rows["openai-6"]["detail"]
    assert [p.name for p in out.iterdir()] == ["count-error-lines"]
    for i in range(7):  # every reply's tokens and price (USD per 1M tokens: 2 prompt, 8 completion), parsed or not
        x = rows[f"openai-{i}"]
        assert (x["prompt_tokens"], x["completion_tokens"]) == (100 + i, 50)
        assert x["writer_usd"] == pytest.approx(((100 + i) * 2 + 50 * 8) / 1e6)
    assert rows["openai-0"]["seed_tasks"] == ["ledger-0-0", "ledger-0-1"] and rows["openai-0"]["writer"] == "openai"
    assert "funnel: admitted 1" in r.stdout and "malformed_reply 1" in r.stdout


def test_bad_input_is_one_line_and_exit_2(tmp_path):
    out, lake = tmp_path / "synth", tmp_path / "lake"
    for args, words in [(("--writer", "openai"), "--base-url"), (("--heldout", "no-such-suite"), "no-such-suite"),
                        (("--writer", "openai", "--base-url", f"http://127.0.0.1:{free_port()}/v1", "--model", "m"),
                         "cannot reach")]:
        r = flywheel("tasks", "synthesize", *args, "--out", str(out), "--root", str(lake), timeout=120)
        assert r.returncode == 2 and words in r.stderr and "Traceback" not in r.stderr, (args, r.stderr)
    assert not out.exists() and not lake.exists()
