"""Verification in real sandboxes: every built-in code reference solves its task through the real tool loop, the
public corpus is re-judged by `verify_trajectories` (hacks flagged with their codes, clean episodes pass), loaded
MBPP/HumanEval references pass, and broken solutions fail closed."""

# ruff: noqa: E501 - verbatim dataset records and trajectories

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from sandbox.backend import open_backend
from sandbox.result import SandboxConfig
from tasks.cli import verify_trajectories
from tasks.judge.verify import verify
from tasks.loaders import load_tasks
from tasks.spec import Task, conversation
from tasks.suites import load_suite
from tasks.tools import observation, parse_arguments, prepare_workspace, run_tool, workspace_snapshot
from warehouse.record import FunctionCall, Message, ToolCall

CORPUS = Path(__file__).parent / "corpus"


@pytest.fixture(scope="module", params=[pytest.param("docker", marks=pytest.mark.docker),
                                        pytest.param("local", marks=pytest.mark.slow)])
def backend(request):
    with open_backend(SandboxConfig(backend=request.param)) as be:
        yield be


@pytest.fixture(scope="module")
def docker_backend():
    with open_backend(SandboxConfig(backend="docker")) as be:
        yield be


def run_reference(task: Task, backend) -> tuple[list[Message], object, list[str]]:
    """The reference solution through the real tools in one sandbox, as the episode loop runs it."""
    sb = backend.acquire()
    observations = []
    try:
        prepare_workspace(sb, task.files)
        msgs = conversation(task)
        for i, step in enumerate(task.reference.steps):
            raw = json.dumps(step.arguments)
            msgs.append(Message(role="assistant", tool_calls=[ToolCall(id=f"c{i}", function=FunctionCall(
                name=step.tool, arguments=raw))]))
            obs = observation(run_tool(sb, step.tool, parse_arguments(step.tool, raw)))
            observations.append(obs)
            msgs.append(Message(role="tool", tool_call_id=f"c{i}", name=step.tool, content=obs))
        msgs.append(Message(role="assistant", content=task.reference.final))
        ws = workspace_snapshot(sb)
    finally:
        sb.close()
    return msgs, ws, observations


@pytest.mark.parametrize("difficulty", [1, 2, 3])
def test_code_references_pass_their_verifier(backend, difficulty):
    for split in ("train", "heldout"):
        (task,) = load_suite("code", 1, split, seed=11, difficulty=difficulty)
        msgs, ws, obs = run_reference(task, backend)
        assert obs[-1].startswith(f"{len(task.visible_tests)} passed, 0 failed"), obs
        o = verify(task, msgs, backend=backend, workspace=ws)
        assert (o.verdict, o.reward, o.hack_flags) == ("pass", 1.0, []), o.details
        assert o.details["hidden_passed"] == len(task.hidden_tests)


@pytest.mark.docker
def test_starters_fail_and_broken_solutions_fail_closed(docker_backend):
    (task,) = load_suite("code", 1, "train", seed=11, difficulty=2)
    msgs = conversation(task)
    assert verify(task, msgs, backend=docker_backend).verdict == "fail"  # the starter (stub or bug) fails
    # the hang holds every test to its limit (65.7 s of judging at the default 5 s, 30 s at 1 s, measured on Docker):
    # a 1 s limit shows the same fail-closed verdict
    hung = task.model_copy(update={"verifier": task.verifier.model_copy(update={"timeout_s": 1.0})})
    for src in ("def oops(:\n", "", "while True:\n    pass\n", "import os\nos.close(1)\nos.close(2)\n"):
        judged = hung if src.startswith("while True") else task
        ws = workspace_snapshot_of(judged, {"solution.py": src}, docker_backend)
        o = verify(judged, msgs, backend=docker_backend, workspace=ws)
        assert o.verdict == "fail" and o.reward == 0.0, (src, o.details.get("error"))


def workspace_snapshot_of(task: Task, files: dict[str, str], backend):
    sb = backend.acquire()
    try:
        prepare_workspace(sb, dict(task.files, **files))
        return workspace_snapshot(sb)
    finally:
        sb.close()


@pytest.mark.docker
def test_run_tests_tool_reports_deleted_tests(docker_backend):
    (task,) = load_suite("code", 1, "train", seed=5, difficulty=1)
    sb = docker_backend.acquire()
    try:
        prepare_workspace(sb, task.files)
        run_tool(sb, "python", {"code": "import os; os.remove('test_visible.py')"})
        assert "no tests found" in observation(run_tool(sb, "run_tests", {}))
        assert "outside the workspace" in observation(run_tool(sb, "read_file", {"path": "/etc/passwd"}))
    finally:
        sb.close()


@pytest.mark.docker
@pytest.mark.timeout(1800)  # 133 episodes; a few hacks hold today's harness to its whole budget (~1 min)
@pytest.mark.parametrize("name", ["hacks.jsonl", "clean.jsonl"])
def test_corpus_rejudged_in_sandboxes(docker_backend, name):
    """Every hack: never `pass`, reward 0, and (at least) the reason codes forensics must find; every clean episode: `pass`,
    reward 1, no flag. Prints the share of hacks per attack class judged `hack` with the right codes (pytest -s).
    Rows with relies_on='judge' (and the clean rows needing the data files or the answer regex) hold only with
    issue 16's judge: data-only results, the isolated runner, task data files copied into the test sandbox."""
    rows = {json.loads(line)["trajectory_id"]: json.loads(line) for line in (CORPUS / name).read_text().splitlines()}
    out = io.StringIO()
    results = verify_trajectories(str(CORPUS / name), backend=docker_backend, out=out)
    assert [json.loads(line) for line in out.getvalue().splitlines()] == results
    wrong, table = [], {}
    for r in results:
        row = rows[r["trajectory_id"]]
        exp, flags = row["expected_flags"], sorted(r["hack_flags"])
        if name == "clean.jsonl":
            ok = (r["verdict"], r["reward"], flags) == ("pass", 1.0, [])
        else:
            # the test run may add run-time evidence (an early exit the harness saw) to what forensics must find
            ok = r["verdict"] != "pass" and r["reward"] == 0.0 and set(exp) <= set(flags)
            table.setdefault(row["attack"], []).append(r["verdict"] == "hack" and bool(exp) and set(exp) <= set(flags))
        if not ok:
            wrong.append((r, exp, row["relies_on"]))
    if table:
        print(f"\n{'attack class':22} {'hacks':>5} {'hack, right codes':>17} {'share':>6}  (never pass, reward 0: all)")
        for cls, hits in sorted(table.items()):
            print(f"{cls:22} {len(hits):5} {sum(hits):17} {sum(hits) / len(hits):6.0%}")
    assert not wrong, wrong


MBPP = {"task_id": 2, "text": "Write a function to find the shared elements from the given two lists.",
        "code": "def similar_elements(test_tup1, test_tup2):\n  res = tuple(set(test_tup1) & set(test_tup2))\n"
                "  return (res) ",
        "test_list": ["assert set(similar_elements((3, 4, 5, 6),(5, 7, 4, 10))) == set((4, 5))",
                      "assert set(similar_elements((1, 2, 3, 4),(5, 4, 3, 7))) == set((3, 4))",
                      "assert set(similar_elements((11, 12, 14, 13),(17, 15, 14, 13))) == set((13, 14))"]}
HUMANEVAL = {"task_id": "HumanEval/2", "prompt": "\n\ndef truncate_number(number: float) -> float:\n"
             "    \"\"\" Return the decimal part of a positive number.\n    >>> truncate_number(3.5)\n    0.5\n    \"\"\"\n",
             "canonical_solution": "    return number % 1.0\n",
             "test": "\n\nMETADATA = {}\n\n\ndef check(candidate):\n    assert candidate(3.5) == 0.5\n"
                     "    assert abs(candidate(1.33) - 0.33) < 1e-6\n    assert abs(candidate(123.456) - 0.456) < 1e-6\n",
             "entry_point": "truncate_number"}


@pytest.mark.docker
def test_loaded_code_references_pass(docker_backend, tmp_path):
    for name, rec in (("mbpp", MBPP), ("humaneval", HUMANEVAL)):
        path = tmp_path / f"{name}.jsonl"
        path.write_text(json.dumps(rec) + "\n")
        (task,) = load_tasks(path)
        msgs, ws, _ = run_reference(task, docker_backend)
        o = verify(task, msgs, backend=docker_backend, workspace=ws)
        assert (o.verdict, o.hack_flags) == ("pass", []), (name, o.details)
