"""Built-in suites: deterministic, disjoint splits, difficulty levels, learnable arithmetic prompts, and every
numeric reference solution passes its own verifier (code references run in tests/tasks/test_sandboxed.py)."""

from __future__ import annotations

import json

import pytest

from tasks.judge.verify import verify
from tasks.spec import Task, conversation
from tasks.suites import UnknownSuiteError, list_suites, load_suite
from warehouse.record import FunctionCall, Message, ToolCall

SUITES = ["arithmetic", "code", "mathword"]


def reference_messages(task: Task) -> list[Message]:
    msgs = conversation(task)
    for i, s in enumerate(task.reference.steps):
        msgs.append(Message(role="assistant", tool_calls=[
            ToolCall(id=f"c{i}", function=FunctionCall(name=s.tool, arguments=json.dumps(s.arguments)))]))
        # what the reference's call prints: the answer for numeric tasks (the verifier traces it to the tool)
        msgs.append(Message(role="tool", tool_call_id=f"c{i}", name=s.tool, content=task.verifier.answer or "ok"))
    msgs.append(Message(role="assistant", content=task.reference.final))
    return msgs


@pytest.mark.parametrize("suite", SUITES)
@pytest.mark.parametrize("difficulty", [1, 2, 3])
def test_deterministic_and_splits_disjoint(suite, difficulty):
    a = load_suite(suite, 15, "train", seed=7, difficulty=difficulty)
    b = load_suite(suite, 15, "train", seed=7, difficulty=difficulty)
    h = load_suite(suite, 15, "heldout", seed=7, difficulty=difficulty)
    assert [t.model_dump() for t in a] == [t.model_dump() for t in b]
    assert len({t.id for t in a}) == 15 and len({t.id for t in h}) == 15
    assert not {t.prompt for t in a} & {t.prompt for t in h}
    assert {t.split for t in a} == {"train"} and {t.split for t in h} == {"heldout"}
    assert all(t.difficulty == difficulty and t.suite == suite for t in a + h)
    other = load_suite(suite, 15, "train", seed=8, difficulty=difficulty)
    assert [t.id for t in other] != [t.id for t in a]


@pytest.mark.parametrize("suite", ["arithmetic", "mathword"])
@pytest.mark.parametrize("difficulty", [1, 2, 3])
def test_numeric_references_pass_their_verifier(suite, difficulty):
    for split in ("train", "heldout"):
        for t in load_suite(suite, 20, split, seed=1, difficulty=difficulty):
            o = verify(t, reference_messages(t))
            assert (o.verdict, o.reward, o.hack_flags) == ("pass", 1.0, []), (t.id, o)


def test_code_task_id_changes_with_its_tests():
    from tasks.code import task_id

    t = load_suite("code", 1, "train", seed=3, difficulty=1)[0]
    key = t.prompt + "\n" + t.files["solution.py"]
    assert task_id(1, key, t.visible_tests, t.hidden_tests) == t.id
    assert task_id(1, key, t.visible_tests, t.hidden_tests[:-1]) != t.id
    assert task_id(1, key, t.visible_tests[1:], t.hidden_tests) != t.id
    assert task_id(1, key, t.hidden_tests, t.visible_tests) != t.id  # which tests are hidden matters too


def test_code_tasks_keep_hidden_tests_out_of_the_workspace():
    for d in (1, 2, 3):
        for t in load_suite("code", 10, "train", seed=3, difficulty=d):
            assert t.verifier.kind == "unit_tests" and t.hidden_tests and t.visible_tests
            blob = json.dumps(t.files)
            assert not any(h in blob for h in t.hidden_tests)
            assert set(t.files) == {"solution.py", "test_visible.py"}
            if t.metadata["mode"] == "fix":
                assert "NotImplementedError" not in t.files["solution.py"]


def test_arithmetic_stays_learnable():
    for t in load_suite("arithmetic", 50, "train", seed=0, difficulty=1):
        assert len(t.prompt) < 90 and t.tools == ["python"]
        assert t.reference.final == f"Answer: {t.verifier.answer}"


def test_unknown_suite_names_the_known_ones():
    with pytest.raises(UnknownSuiteError, match="arithmetic, code, mathword"):
        load_suite("gsm9k", 1)
    assert [s.name for s in list_suites()] == SUITES


@pytest.mark.parametrize("suite", SUITES)
def test_bad_arguments_are_refused(suite):
    with pytest.raises(ValueError, match="split"):
        load_suite(suite, 1, "test")
    with pytest.raises(ValueError, match="difficulty"):
        load_suite(suite, 1, difficulty=4)


def test_task_files_as_suites(tmp_path):
    from tasks.loaders import TaskFileError, write_tasks
    from tasks.suites import check_suite

    tasks = load_suite("mathword", 3, "train") + load_suite("mathword", 2, "heldout")
    path = str(write_tasks(tasks, tmp_path / "mine.jsonl"))
    check_suite(path)
    check_suite("code")
    assert load_suite(path, 2, "heldout") == tasks[3:]
    with pytest.raises(ValueError, match="holds 2 heldout"):
        load_suite(path, 3, "heldout")
    (tmp_path / "bad.jsonl").write_text("{}\n")
    with pytest.raises(TaskFileError):
        check_suite(str(tmp_path / "bad.jsonl"))
    with pytest.raises(UnknownSuiteError, match="task file"):
        check_suite("missing.jsonl")
