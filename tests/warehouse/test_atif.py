"""ATIF out and in: `flywheel export --format atif` writes one file per episode that satisfies the ATIF v1.8 field set
read from the `harbor` package's own models (fetched with pip download --no-deps, never installed), and reading the
files back gives the rows exactly, on a corpus of real episodes of every built-in suite, of the benchmark suites
(BFCL multi-turn, HumanEval) and of the shipped Harbor suite (Docker)."""

from __future__ import annotations

import ast
import asyncio
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from warehouse.atif import ATIF_VERSION, REQUIRED, atif_to_row, row_to_atif
from warehouse.record import Trajectory

FLYWHEEL = str(Path(sys.executable).with_name("flywheel"))
SPEC_FILES = {"Trajectory": "trajectory.py", "Agent": "agent.py", "Step": "step.py", "ToolCall": "tool_call.py",
              "Observation": "observation.py", "ObservationResult": "observation_result.py",
              "Metrics": "metrics.py", "FinalMetrics": "final_metrics.py"}


@pytest.fixture(scope="session")
def atif_spec() -> dict[str, dict[str, bool]]:
    """class -> {field: required} from harbor/models/trajectories in the harbor wheel that setup caches
    (scripts/setup.sh, FLYWHEEL_SPEC_CACHE); never fetched here: without it the tests skip (a failure in CI)."""
    cache = Path(os.environ.get("FLYWHEEL_SPEC_CACHE", Path.home() / ".cache" / "flywheel-spec"))
    wheels = sorted(cache.glob("harbor-*.whl"))
    if not wheels:
        pytest.skip(f"the harbor wheel (the ATIF spec) is not in {cache}; make setup caches it")
    spec: dict[str, dict[str, bool]] = {}
    with zipfile.ZipFile(wheels[-1]) as z:
        for cls, fname in SPEC_FILES.items():
            tree = ast.parse(z.read(f"harbor/models/trajectories/{fname}"))
            node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
            fields = {}
            for st in node.body:
                if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name):
                    v = st.value
                    required = v is None or (isinstance(v, ast.Call) and any(
                        isinstance(a, ast.Constant) and a.value is Ellipsis
                        for a in [*v.args[:1], *(k.value for k in v.keywords if k.arg == "default")]))
                    fields[st.target.id] = required
            spec[cls] = fields
            if cls == "Trajectory":
                versions = [c.value for c in ast.walk(node) if isinstance(c, ast.Constant)
                            and isinstance(c.value, str) and c.value.startswith("ATIF-v")]
                spec["_versions"] = {v: True for v in versions}
    return spec


def _check(obj: dict, cls: str, spec: dict) -> None:
    fields = spec[cls]
    assert set(obj) <= set(fields), (cls, set(obj) - set(fields))  # the spec forbids extra keys
    missing = {f for f, req in fields.items() if req} - set(obj)
    assert not missing, (cls, missing)


def validate(doc: dict, spec: dict) -> None:
    """The document against the spec's field sets and its validators' rules (step ids, call references, agent-only
    fields)."""
    _check(doc, "Trajectory", spec)
    assert doc["schema_version"] in spec["_versions"]
    _check(doc["agent"], "Agent", spec)
    if "final_metrics" in doc:
        _check(doc["final_metrics"], "FinalMetrics", spec)
    assert doc["steps"], "ATIF needs at least one step"
    for i, step in enumerate(doc["steps"], 1):
        _check(step, "Step", spec)
        assert step["step_id"] == i and step["source"] in ("system", "user", "agent")
        if step["source"] != "agent":
            assert not {"tool_calls", "metrics", "reasoning_content", "model_name"} & set(step)
        ids = set()
        for c in step.get("tool_calls") or []:
            _check(c, "ToolCall", spec)
            assert isinstance(c["arguments"], dict)
            ids.add(c["tool_call_id"])
        if "metrics" in step:
            _check(step["metrics"], "Metrics", spec)
        if "observation" in step:
            _check(step["observation"], "Observation", spec)
            for r in step["observation"]["results"]:
                _check(r, "ObservationResult", spec)
                assert r.get("source_call_id") is None or r["source_call_id"] in ids


def test_writer_fills_every_field_the_spec_requires(atif_spec):
    assert ATIF_VERSION in atif_spec["_versions"]
    # what the spec says today (read from its models, not from our writer): a change shows up here
    assert {f for f, req in atif_spec["Step"].items() if req} == {"step_id", "source", "message"}
    for cls, ours in REQUIRED.items():
        theirs = {f for f, req in atif_spec[cls].items() if req}
        assert theirs <= ours, (cls, theirs - ours)


def _corpus() -> list[Trajectory]:
    """Real episodes of every built-in suite (reference teacher with noise: passes, fails, malformed calls,
    no-tool answers) in bubblewrap sandboxes, plus one row carrying prompt and completion token ids, logprobs and
    reasoning (ATIF's reasoning_content and metrics.prompt_token_ids)."""
    from agents.loop import run_episode
    from agents.reference import ReferenceNoise, ReferencePolicy
    from sandbox.backend import open_backend
    from sandbox.result import SandboxConfig
    from tasks.suites import load_suite

    be = open_backend(SandboxConfig(backend="local"), pool_size=0)
    pol = ReferencePolicy(noise=ReferenceNoise(malformed_call=0.25, no_tool=0.25, wrong_answer=0.2))
    rows = []
    try:
        for suite in ("arithmetic", "code", "mathword"):
            for t in load_suite(suite, 4, split="train"):
                rows.append(asyncio.run(run_episode(t, pol, be, run_id="atif", sample_index=len(rows))))
    finally:
        be.shutdown()
    r = rows[0]
    n = sum(m.role == "assistant" for m in r.messages)
    thought = [m.model_copy(update={"reasoning": f"step {i}"}) if m.role == "assistant" else m
               for i, m in enumerate(r.messages)]
    rows.append(r.model_copy(update={"trajectory_id": "with-logprobs", "completion_token_ids": [[1, 2, 3]] * n,
                                     "completion_logprobs": [[-0.5, -0.25, -1.0]] * n,
                                     "prompt_token_ids": [[7, 8, 9, 10]] * n, "messages": thought}))
    return rows


def _round_trip(rows: list[Trajectory], tmp_path: Path, atif_spec: dict) -> tuple[list[Path], dict[str, Trajectory]]:
    """The rows into a lake, out through `flywheel export --format atif`, each file validated against the spec and
    read back into exactly its stored row; the files and the stored rows by id."""
    from warehouse.lake import write_trajectories
    from warehouse.query import read_trajectories

    lake = tmp_path / "lake"
    write_trajectories(str(lake), rows)
    stored = {r.trajectory_id: r for r in read_trajectories(str(lake))}
    out = tmp_path / "atif"
    p = subprocess.run([FLYWHEEL, "export", str(out), "--root", str(lake), "--format", "atif"], capture_output=True,
                       text=True, timeout=300, check=False)
    assert p.returncode == 0, p.stderr
    files = sorted(out.glob("*.json"))
    assert len(files) == len(rows)
    for f in files:
        doc = json.loads(f.read_text())
        validate(doc, atif_spec)
        row, _, missing = atif_to_row(doc)
        want = stored[doc["trajectory_id"]]
        assert row is not None and row.model_dump() == want.model_dump(), doc["trajectory_id"]
        assert doc["extra"]["flywheel"]["task_id"] == want.task_id
        assert ("token_ids" in missing) == (want.completion_token_ids is None)
        if want.trajectory_id == "with-logprobs":
            agent = [s for s in doc["steps"] if s["source"] == "agent"]
            assert [s["reasoning_content"] for s in agent] == [m.reasoning for m in want.messages if m.reasoning]
            assert all(s["metrics"]["prompt_token_ids"] == [7, 8, 9, 10] for s in agent)
        assert "tool_timings" in missing
    return files, stored


def test_export_atif_validates_and_round_trips_through_the_console_script(tmp_path, atif_spec):
    from warehouse.query import read_trajectories

    rows = _corpus()
    assert {r.suite for r in rows} == {"arithmetic", "code", "mathword"}
    assert {"pass", "model_error"} <= {r.verdict for r in rows}
    files, stored = _round_trip(rows, tmp_path, atif_spec)
    out = tmp_path / "atif"
    # the files as demonstrations: `flywheel demos import --format atif` (folder), each row saying what it lacks
    lake2 = tmp_path / "lake2"
    d = subprocess.run([FLYWHEEL, "demos", "import", str(out), "--format", "atif", "--root", str(lake2),
                        "--allow-partial"], capture_output=True, text=True, timeout=300, check=False)
    assert d.returncode == 0, d.stderr
    assert "missing evidence (rows): " in d.stdout and "tool_timings" in d.stdout
    demos = read_trajectories(str(lake2))
    passing = [r for r in rows if r.verdict == "pass"]
    assert len(demos) >= len(passing)  # malformed calls may be refused as demos (listed as skipped)
    def plain(r):  # dedup (curate.dedup.normalised) ignores reasoning: a conversation with it is the same demo
        return json.dumps([m.model_dump(exclude={"reasoning"}) for m in r.messages])

    by_msgs = {plain(r): r for r in demos}
    for r in passing:
        got = by_msgs[plain(r)]
        assert got.source == "human" and got.task_id == r.task_id and json.loads(got.tools_json) == json.loads(
            r.tools_json)
        assert "tool_timings" in json.loads(got.verifier_details_json)["missing_evidence"]
    # another producer's ATIF (no flywheel provenance): the messages, and what evidence is missing
    foreign = json.loads(files[0].read_text())
    del foreign["extra"]
    row, msgs, missing = atif_to_row(foreign)
    assert row is None and [m.role for m in msgs] == [m.role for m in stored[foreign["trajectory_id"]].messages]
    assert {"tool_timings"} <= set(missing)


def test_malformed_arguments_and_null_content_survive():
    from warehouse.record import FunctionCall, Message, ToolCall

    row = Trajectory(trajectory_id="t", run_id="r", source="teacher", policy="p", task_id="x", suite="s",
                     split="train", task_version="1", verifier="numeric", verifier_version="2", verdict="model_error",
                     messages=[Message(role="system", content="sys"), Message(role="user", content="q"),
                               Message(role="assistant", content=None, tool_calls=[ToolCall(
                                   id="c1", function=FunctionCall(name="python", arguments='{"code": "pri'))]),
                               Message(role="tool", tool_call_id="c1", name="python", content="error: bad JSON"),
                               Message(role="tool", tool_call_id="zz", name="python", content="stray")])
    doc = row_to_atif(row)
    back, _, _ = atif_to_row(json.loads(json.dumps(doc)))
    assert back is not None and back.model_dump() == row.model_dump()
    call = doc["steps"][2]["tool_calls"][0]
    assert call["arguments"] == {} and call["extra"]["arguments_json"] == '{"code": "pri'


def _episodes(tasks, backend, policies) -> list[Trajectory]:
    from agents.loop import run_episode

    return [asyncio.run(run_episode(t, pol, backend, run_id="atif", sample_index=i))
            for t in tasks for i, pol in enumerate(policies)]


@pytest.mark.slow
def test_benchmark_suites_round_trip_bfcl_multi_turn_and_humaneval(tmp_path, atif_spec):
    """BFCL multi-turn episodes (later user turns between the agent's steps, the task's own tool schemas) and
    HumanEval episodes, each passed and failed, round-trip exactly."""
    from agents.reference import ReferenceNoise, ReferencePolicy
    from sandbox.backend import open_backend
    from sandbox.result import SandboxConfig
    from tasks import bfcl
    from tasks.suites import load_suite

    try:
        bfcl.wheel_path(fetch=False)
    except bfcl.BfclMissing as e:  # setup did not cache it (a failure in CI)
        pytest.skip(f"{e} (make setup caches it)")
    policies = [ReferencePolicy(), ReferencePolicy(noise=ReferenceNoise(no_tool=1.0))]
    with open_backend(SandboxConfig(backend="local")) as be:
        rows = (_episodes(load_suite("bfcl-multi-turn", 2, split="heldout"), be, policies)
                + _episodes(load_suite("humaneval", 2), be, [ReferencePolicy(), ReferencePolicy(
                    noise=ReferenceNoise(exit_hack=1.0))]))
    assert {(r.suite, r.verdict) for r in rows} == {("bfcl-multi-turn", "pass"), ("bfcl-multi-turn", "fail"),
                                                    ("humaneval", "pass"), ("humaneval", "hack")}
    files, stored = _round_trip(rows, tmp_path, atif_spec)
    multi = [json.loads(f.read_text()) for f in files if stored[json.loads(f.read_text())["trajectory_id"]].suite
             == "bfcl-multi-turn"]
    for doc in multi:
        row = stored[doc["trajectory_id"]]
        assert sum(st["source"] == "user" for st in doc["steps"]) == sum(m.role == "user" for m in row.messages) > 2
        assert [t["function"]["name"] for t in doc["agent"]["tool_definitions"]] == [
            t["function"]["name"] for t in json.loads(row.tools_json)]


@pytest.mark.docker
@pytest.mark.slow
def test_harbor_rows_round_trip(tmp_path, atif_spec):
    """Episodes of the shipped Harbor suite in Docker (the oracle passes; an agent that answers without running
    anything fails its tests) round-trip exactly."""
    from agents.reference import ReferenceNoise, ReferencePolicy
    from sandbox.backend import open_backend
    from sandbox.result import SandboxConfig
    from tasks.harbor import shutdown
    from tasks.suites import load_suite

    root = Path(__file__).resolve().parents[2]
    try:
        with open_backend(SandboxConfig(backend="docker")) as be:
            rows = _episodes(load_suite(str(root / "data" / "harbor"), 2), be,
                             [ReferencePolicy(), ReferencePolicy(noise=ReferenceNoise(no_tool=1.0))])
    finally:
        shutdown()
    assert {(r.verifier, r.verdict) for r in rows} == {("harbor", "pass"), ("harbor", "fail")}, [
        (r.task_id, r.verdict, r.error_message) for r in rows]
    _round_trip(rows, tmp_path, atif_spec)
