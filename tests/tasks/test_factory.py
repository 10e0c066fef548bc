"""The task factory's parts, without Docker: the ledger family (deterministic, varied, its oracle and check agree
and never leak into the instruction), the perturbed oracles spoil what the oracle wrote (each fails the check),
the atomic folder writer, the writers' strict schema, the leak rules, and the decontamination rules as a duplicate
and held-out-copy test (a copy is caught, the family's own variety is not); the built-in ledger suites' splits
(train and held-out tasks share no coined name; the held-back combinations only in ledger-combos)."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from agents.audit import HealthRow
from curate.admission import (
    FLAKY,
    LEAKS_ANSWER,
    LEAKS_TEST,
    NULL_PASSES,
    ORACLE_FAILS,
    DuplicateIndex,
    as_episode,
    audit_reasons,
    leak_reasons,
)
from curate.config import DecontamConfig
from tasks.factory.draft import MalformedProposal, parse_proposal, write_folder
from tasks.factory.ledger import GUEST, HELD_COMBOS, SEEN_COMBOS, ledger_draft, ledger_drafts, ledger_suite_drafts
from tasks.harbor import load_harbor

GUEST_CHECK = GUEST / "ledger_check.py"


def _on_host(draft, tmp: Path) -> tuple[Path, Path, dict]:
    """The draft's files under tmp (its /app), its solve.sh and expected output with their /app paths pointed there."""
    app = tmp / "app"
    for rel, text in draft.files.items():
        (app / rel).parent.mkdir(parents=True, exist_ok=True)
        (app / rel).write_text(text)
    expected = json.loads(draft.tests["expected.json"])
    expected["output"] = expected["output"].replace("/app", str(app), 1)
    solve = tmp / "solve.sh"
    solve.write_text(draft.solution["solve.sh"].replace('"/app/', f'"{app}/'))
    return app, solve, expected


def _guest(name: str):
    """A guest program of the family imported on the host (they are standard-library modules)."""
    spec = importlib.util.spec_from_file_location(f"fw_test_guest_{name}", GUEST / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _check(expected: dict) -> str | None:
    out = Path(expected["output"])
    return _guest("ledger_check").check(expected, out.read_text()) if out.exists() else "no output"


def test_the_family_is_deterministic_and_varied():
    assert ledger_drafts(4, seed=3) == ledger_drafts(4, seed=3)
    assert ledger_drafts(2, seed=3, start=2) == ledger_drafts(4, seed=3)[2:]
    many = ledger_drafts(1000, seed=0)
    assert len({d.instruction for d in many}) == 1000
    assert len({json.dumps(d.files, sort_keys=True) for d in many}) == 1000
    for knob in ("aggregate", "group_by", "format"):
        assert len({d.metadata[knob] for d in many}) >= 2, knob


def test_the_oracle_passes_the_check_and_every_perturbation_fails_it(tmp_path, monkeypatch):
    perturb = _guest("perturb")
    monkeypatch.setattr(perturb, "STATE", str(tmp_path / "state.json"))
    monkeypatch.setattr(perturb, "SAVED", str(tmp_path / "saved"))
    drafts = [ledger_draft(5, i) for i in range(12)]
    drafts += [d for split in ("train", "heldout", "combos") for d in ledger_suite_drafts(4, split=split, seed=5)]
    for i, d in enumerate(drafts):
        app, solve, expected = _on_host(d, tmp_path / str(i))
        assert perturb.main(["perturb.py", "snapshot", str(app)]) == 0
        assert subprocess.run(["bash", str(solve)], capture_output=True, check=False).returncode == 0
        assert _check(expected) is None, (i, d.instruction)
        assert perturb.main(["perturb.py", "save", str(app)]) == 0
        for kind in ("wrong_value", "missing_file", "partial_work"):
            assert perturb.main(["perturb.py", kind, str(app)]) == 0
            assert _check(expected) is not None, (i, kind)
    # a oracle that changed nothing leaves nothing to perturb: exit 3, so the perturbed episode is the oracle's
    assert perturb.main(["perturb.py", "snapshot", str(app)]) == 0
    shutil.rmtree(tmp_path / "saved")
    assert perturb.main(["perturb.py", "wrong_value", str(app)]) == 3


def _names(d) -> set[str]:
    """The names a draft uses: its folders, file stems (without their numbers), output path parts, and the key
    column, key value and value column its instruction names."""
    out = set(re.findall(r"`([a-z]+)`", d.instruction))
    for rel in d.files:
        *folders, file = rel.split("/")
        out |= set(folders) | {file.rsplit("-", 1)[0]}
    output = json.loads(d.tests["expected.json"])["output"].split("/")
    return out | {output[-2], output[-1].rsplit(".", 1)[0]}


def test_the_suites_split_names_and_hold_back_combinations():
    from tasks.suites import load_suite

    train = ledger_suite_drafts(300, split="train", seed=0)
    held = ledger_suite_drafts(100, split="heldout", seed=0)
    combos = ledger_suite_drafts(60, split="combos", seed=0)
    assert ledger_suite_drafts(5, split="heldout", seed=0) == held[:5]  # task i depends on (split, seed, i) only
    seen = set().union(*map(_names, train))
    assert not seen & set().union(*map(_names, held + combos)) - {"README.txt", "notes.md", "old.csv.bak",
                                                                    "manifest.json", "summary.tsv"}
    knobs = [tuple(d.metadata[k] for k in ("aggregate", "group_by", "format")) for d in train + held]
    assert set(knobs) <= set(SEEN_COMBOS) and len(set(knobs)) == len(SEEN_COMBOS)
    assert {tuple(d.metadata[k] for k in ("aggregate", "group_by", "format")) for d in combos} == set(HELD_COMBOS)
    assert {d.metadata["split"] for d in train} == {"train"} and {d.metadata["split"] for d in held + combos} == \
        {"heldout"}
    assert len({d.instruction for d in train + held + combos}) == 460
    with pytest.raises(ValueError, match="held-out tasks only"):
        load_suite("ledger-combos", 3, split="train")
    assert load_suite("ledger-combos", 0, split="train") == []  # a schedule step that is only scored
    with pytest.raises(ValueError, match="splits train and heldout"):
        load_suite("ledger", 3, split="test")


def test_the_family_never_leaks_its_answer_or_test():
    assert all(leak_reasons(d) == [] for d in ledger_drafts(300, seed=9))


def test_leak_rules_catch_a_stated_answer_and_a_copied_test():
    d = ledger_draft(0, 0)
    answer = next(iter(json.loads(d.tests["expected.json"])["groups"].values()))
    big = {**json.loads(d.tests["expected.json"]), "groups": {"x": 4711}}
    leaky = d.model_copy(update={"tests": {**d.tests, "expected.json": json.dumps(big)},
                                 "instruction": d.instruction + "\n\n(The total is 4711.)"})
    assert leak_reasons(leaky) == [LEAKS_ANSWER]
    line = "if python3 /tests/ledger_check.py; then"
    assert leak_reasons(d.model_copy(update={"instruction": d.instruction + f"\n\nThe grader runs: {line}"})) \
        == [LEAKS_TEST]
    assert isinstance(answer, int | float)


def test_folders_are_written_whole_and_load_as_harbor_tasks(tmp_path):
    out = tmp_path / "suite"
    for d in ledger_drafts(2, seed=1):
        write_folder(d, out / d.name)
    with pytest.raises(FileExistsError):
        write_folder(ledger_draft(1, 0), out / "ledger-1-0")
    assert sorted(p.name for p in out.iterdir()) == ["ledger-1-0", "ledger-1-1"]  # no temp folder left behind
    tasks = load_harbor(out)
    assert [t.id for t in tasks] == ["synth/ledger-1-0", "synth/ledger-1-1"]
    h = tasks[0].metadata["harbor"]
    assert h["workdir"] == "/app" and h["memory_mb"] == 256 and "expected.json" in h["tests"]
    assert "expected" not in tasks[0].prompt and (out / "ledger-1-0" / "solution" / "solve.sh").stat().st_mode & 0o111


def test_the_strict_schema_counts_malformed_replies():
    good = {"name": "count-errors", "instruction": "Count it.", "files": {"a.txt": "x\n"}, "test_sh": "#!/bin/sh\n",
            "solve_sh": "#!/bin/sh\n"}
    assert parse_proposal(json.dumps(good), family="openai").tests == {"test.sh": "#!/bin/sh\n"}
    assert parse_proposal("```json\n" + json.dumps(good) + "\n```", family="openai").name == "count-errors"
    for bad, why in [("sure! here is a task", "not JSON"), (json.dumps({**good, "extra": 1}), "extra"),
                     (json.dumps({k: v for k, v in good.items() if k != "solve_sh"}), "solve_sh"),
                     (json.dumps({**good, "files": {"../x": "y"}}), "'..'"),
                     (json.dumps({**good, "name": "Bad Name"}), "name")]:
        with pytest.raises(MalformedProposal, match=why):
            parse_proposal(bad, family="openai")


def test_duplicates_are_caught_and_the_familys_variety_is_not(tmp_path):
    drafts = ledger_drafts(40, seed=2)
    for d in drafts:
        write_folder(d, tmp_path / d.name)
    tasks = load_harbor(tmp_path)
    index = DuplicateIndex(tasks[:30], DecontamConfig())
    assert "synth/ledger-2-3" in {t.id for t in tasks[:30]}
    assert [index.match(t) for t in tasks[30:]] == [None] * 10
    copy = drafts[3].model_copy(update={"name": "renamed-copy"})
    write_folder(copy, tmp_path / "x" / copy.name)
    assert index.match(load_harbor(tmp_path / "x")[0]) == "synth/ledger-2-3"  # indexed: load order is by name
    ep = as_episode(tasks[0])
    assert ep.messages[0].content.startswith(tasks[0].prompt + "\n\n") and ep.messages[1].tool_calls
    assert ".csv:\n" in ep.messages[0].content[len(tasks[0].prompt):]  # then the input files, path and text


def test_audit_figures_become_reason_codes():
    base = {"task_id": "t", "suite": "s", "task_version": "1", "verifier": "harbor", "verifier_version": "2", "n_mutants": 3,
                "mutants_killed": 3, "mutant_kill_rate": 1.0, "k_regrades": 3, "flake_rate": 0.0, "wall_s": 1.0}
    assert audit_reasons(HealthRow(**base, oracle_pass=True, null_pass=False)) == []
    assert audit_reasons(HealthRow(**base, oracle_pass=False, null_pass=True)) == [ORACLE_FAILS, NULL_PASSES]
    flaky = {**base, "flake_rate": 1 / 3}
    assert audit_reasons(HealthRow(**flaky, oracle_pass=True, null_pass=False)) == [FLAKY]
    survived = {**base, "mutants_killed": 2, "mutant_survivors": ["partial_work"]}
    assert audit_reasons(HealthRow(**survived, oracle_pass=True, null_pass=False)) == ["perturbed_partial_work_passes"]
    assert audit_reasons(HealthRow(**base, oracle_pass=True, null_pass=False, error="boom")) == ["audit_error"]


def test_the_report_has_the_funnel_and_cost_per_writer(tmp_path):
    from warehouse.lake import write_rows
    from warehouse.report import build_report

    root = str(tmp_path / "lake")
    base = {"synthesis_id": "s1", "family": "ledger", "writer": "reference", "decision": "refused", "build_s": 1.0,
            "audit_s": 9.0}
    write_rows(root, "task_synthesis", [
        {**base, "candidate_id": "a", "decision": "admitted", "reason_codes": []},
        {**base, "candidate_id": "b", "reason_codes": ["oracle_fails", "flaky"]},
        {**base, "candidate_id": "c", "reason_codes": ["flaky"]},
        {**base, "candidate_id": "d", "writer": "openai", "family": "openai", "reason_codes": ["malformed_reply"],
         "prompt_tokens": 100, "completion_tokens": 50, "writer_usd": 0.25, "audit_s": 0.0}])
    md = build_report(root, "run1").markdown
    assert "## Task factory (flywheel tasks synthesize)" in md
    assert "| reference | ledger | admitted | 1 |" in md and "| reference | ledger | flaky | 2 |" in md
    assert "| reference | ledger | oracle_fails | 1 |" in md and "| openai | openai | malformed_reply | 1 |" in md
    assert "| reference | 3 | 1 | 0.3333 | 0 | 0.0 | 0.0 | 30.0 |" in md, md
    assert "| openai | 1 | 0 | 0.0 | 150 | 0.25 | None | None |" in md, md
