"""Loaders for people's task files: each format loads; a malformed file fails with file, line and field named and
yields no task at all; `flywheel tasks validate|show` functions agree."""

# ruff: noqa: E501 - verbatim dataset records and trajectories

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tasks.arithmetic import generate as arithmetic
from tasks.cli import tasks_export, tasks_list, tasks_show, tasks_validate
from tasks.code import generate as code_tasks
from tasks.loaders import TaskFileError, load_tasks, validate_file, write_tasks

GSM = [{"question": "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
                    "How many clips did Natalia sell altogether in April and May?",
        "answer": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 clips.\n#### 72"},
       {"question": "What is 1,000 plus 234?", "answer": "#### 1,234"}]
MBPP = [{"task_id": 11, "text": "Write a python function to remove first and last occurrence of a given character "
                                "from the string.",
         "code": "def remove_Occ(s,ch): \r\n    for i in range(len(s)): \r\n        if (s[i] == ch): \r\n"
                 "            s = s[0 : i] + s[i + 1:] \r\n            break\r\n    for i in range(len(s) - 1,-1,-1):  \r\n"
                 "        if (s[i] == ch): \r\n            s = s[0 : i] + s[i + 1:] \r\n            break\r\n    return s ",
         "test_list": ["assert remove_Occ(\"hello\",\"l\") == \"heo\"", "assert remove_Occ(\"abcda\",\"a\") == \"bcd\"",
                       "assert remove_Occ(\"PHP\",\"P\") == \"H\""],
         "test_setup_code": "", "challenge_test_list": ["assert remove_Occ(\"hellolloll\",\"l\") == \"helollol\""]}]
HUMANEVAL = [{"task_id": "HumanEval/0", "prompt": "from typing import List\n\n\ndef has_close_elements(numbers: "
              "List[float], threshold: float) -> bool:\n    \"\"\" Check if in given list of numbers, are any two numbers "
              "closer to each other than\n    given threshold.\n    >>> has_close_elements([1.0, 2.0, 3.0], 0.5)\n    False\n"
              "    >>> has_close_elements([1.0, 2.8, 3.0, 4.0, 5.0, 2.0], 0.3)\n    True\n    \"\"\"\n",
              "canonical_solution": "    for idx, elem in enumerate(numbers):\n        for idx2, elem2 in enumerate(numbers):\n"
              "            if idx != idx2:\n                distance = abs(elem - elem2)\n"
              "                if distance < threshold:\n                    return True\n\n    return False\n",
              "test": "\n\nMETADATA = {\n    'author': 'jt',\n    'dataset': 'test'\n}\n\n\ndef check(candidate):\n"
                      "    assert candidate([1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.3) == True\n"
                      "    assert candidate([1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.05) == False\n",
              "entry_point": "has_close_elements"}]


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_gsm8k(tmp_path):
    tasks = load_tasks(write_jsonl(tmp_path / "gsm.jsonl", GSM))
    assert [t.verifier.answer for t in tasks] == ["72", "1234"]
    assert tasks[0].reference.steps[0].arguments["code"] == "print(48/2)\nprint(48+24)"
    assert tasks[0].suite == "gsm" and tasks[0].verifier.kind == "numeric"


def test_mbpp(tmp_path):
    (t,) = load_tasks(write_jsonl(tmp_path / "mbpp.jsonl", MBPP), split="heldout")
    assert t.verifier.kind == "unit_tests" and t.split == "heldout"
    assert t.visible_tests == [MBPP[0]["test_list"][0]] and len(t.hidden_tests) == 3
    assert "remove_Occ" in t.files["test_visible.py"] and t.metadata["entry_point"] == "remove_Occ"
    assert not any(h in json.dumps(t.files) for h in t.hidden_tests)


def test_humaneval(tmp_path):
    (t,) = load_tasks(write_jsonl(tmp_path / "he.jsonl", HUMANEVAL))
    assert t.id == "HumanEval/0" and t.suite == "he"  # the benchmark's own id, not rebuilt from the file name
    # Only the benchmark's check() decides the verdict; the docstring examples are for run_tests only.
    assert t.visible_tests == [] and len(t.hidden_tests) == 1
    assert t.hidden_tests[0].rstrip().endswith("check(has_close_elements)")
    vis = t.files["test_visible.py"]
    assert "assert has_close_elements([1.0, 2.0, 3.0], 0.5) == False" in vis
    assert "assert has_close_elements([1.0, 2.8, 3.0, 4.0, 5.0, 2.0], 0.3) == True" in vis
    assert "assert callable(has_close_elements)" in vis
    assert t.files["solution.py"].endswith("raise NotImplementedError\n")


def test_humaneval_without_examples_still_has_a_test_file(tmp_path):
    rec = dict(HUMANEVAL[0], prompt=HUMANEVAL[0]["prompt"].split("    >>>")[0] + '    """\n')
    (t,) = load_tasks(write_jsonl(tmp_path / "he.jsonl", [rec]))
    vis = t.files["test_visible.py"]
    assert vis.count("def test_") == 1 and "assert callable(has_close_elements)" in vis


@pytest.mark.parametrize("suffix", [".jsonl.gz", ".json.gz"])
def test_gzipped_files(tmp_path, suffix):
    body = (json.dumps(HUMANEVAL) if suffix == ".json.gz" else "".join(json.dumps(r) + "\n" for r in HUMANEVAL))
    path = tmp_path / f"HumanEval{suffix}"
    path.write_bytes(gzip.compress(body.encode()))
    (t,) = load_tasks(path)
    assert t.id == "HumanEval/0" and t.suite == "HumanEval"
    (tmp_path / "bad.jsonl.gz").write_bytes(b"not gzip")
    with pytest.raises(TaskFileError, match="not a readable gzip file"):
        load_tasks(tmp_path / "bad.jsonl.gz")


def test_bad_format_and_split_are_problems_not_crashes(tmp_path):
    path = write_jsonl(tmp_path / "he.jsonl", HUMANEVAL)
    assert "unknown task file format 'nope'" in str(validate_file(path, format="nope").problems[0])
    with pytest.raises(TaskFileError, match="split must be"):
        load_tasks(path, split="test")


def test_spec_jsonl_and_parquet_round_trip(tmp_path):
    tasks = arithmetic(5)
    rows = [t.model_dump(mode="json") for t in tasks]
    assert load_tasks(write_jsonl(tmp_path / "a.jsonl", rows)) == tasks
    assert load_tasks(write_tasks(tasks, tmp_path / "a.parquet")) == tasks
    assert load_tasks(write_tasks(code_tasks(3), tmp_path / "c.parquet")) == code_tasks(3)
    flat = [dict(r, verifier="{'kind': 'numeric'}", files="{}", metadata="{}") for r in rows]
    pq.write_table(pa.Table.from_pylist(flat), tmp_path / "bad.parquet")
    with pytest.raises(TaskFileError, match=r"bad.parquet:1: field 'verifier'"):
        load_tasks(tmp_path / "bad.parquet")


@pytest.mark.parametrize("rows,where", [
    ([GSM[0], {"question": "How many?", "answer": "about seven"}], (2, "answer")),
    ([GSM[0], "{not json"], (2, None)),
    ([MBPP[0], dict(MBPP[0], task_id=12, test_list=[])], (2, "test_list")),
    ([dict(MBPP[0], test_list=["assert remove_Occ(\"a\",\"a\") == ", MBPP[0]["test_list"][1]])], (1, "test_list[0]")),
    ([dict(MBPP[0], code="def other(s, ch):\n    return s\n")], (1, "code")),
    ([HUMANEVAL[0], dict(HUMANEVAL[0], task_id="HumanEval/1", entry_point="nope")], (2, "entry_point")),
    ([dict(HUMANEVAL[0], test="def check(candidate):\n    assert candidate(\n")], (1, "test")),
    ([dict(HUMANEVAL[0], test="assert True\n")], (1, "test")),
    ([dict(HUMANEVAL[0], canonical_solution="    return (\n")], (1, "canonical_solution")),
    ([dict(HUMANEVAL[0], prompt="def has_close_elements(numbers:\n")], (1, "prompt")),
    ([GSM[0], GSM[0]], (2, "id")),
    ([{"foo": 1}], (1, None)),
])
def test_malformed_files_name_file_line_field(tmp_path, rows, where):
    path = write_jsonl(tmp_path / "bad.jsonl", rows)
    with pytest.raises(TaskFileError) as ei:
        load_tasks(path)
    line, field = where
    assert any(p.line == line and p.field == field and p.file == str(path) for p in ei.value.problems), \
        ei.value.problems
    assert f"{path}:{line}" in str(ei.value)
    report = validate_file(path)
    assert not report.ok and report.n_tasks == 0


def test_bad_spec_rows_name_the_nested_field(tmp_path):
    row = arithmetic(1)[0].model_dump(mode="json")
    row["verifier"]["kind"] = "vibes"
    row2 = dict(arithmetic(2)[1].model_dump(mode="json"), split="test")
    path = write_jsonl(tmp_path / "spec.jsonl", [row, row2])
    report = tasks_validate(str(path))
    fields = {(p.line, p.field) for p in report.problems}
    assert (1, "verifier.kind") in fields and (2, "split") in fields


def test_missing_and_empty_files(tmp_path):
    with pytest.raises(TaskFileError, match="no such file"):
        load_tasks(tmp_path / "nope.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(TaskFileError, match="no records"):
        load_tasks(tmp_path / "empty.jsonl")


def test_cli_functions(tmp_path):
    assert [s.name for s in tasks_list()] == ["arithmetic", "code", "mathword"]
    assert len(tasks_show("code", n=2, difficulty=2)) == 2
    path = write_jsonl(tmp_path / "gsm.jsonl", GSM)
    assert [t.verifier.answer for t in tasks_show(str(path), n=1)] == ["72"]
    assert tasks_validate(str(path)).ok
    out = tasks_export("mathword", str(tmp_path / "m.parquet"), n=4, split="heldout", difficulty=3)
    assert load_tasks(out) == tasks_show("mathword", n=4, split="heldout", difficulty=3)
