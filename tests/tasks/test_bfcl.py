"""BFCL v4 multi-turn base: the ground truth passes BFCL's own checker on every loadable task; a dropped call fails.

The tests read the wheel from the cache that setup fills (scripts/setup.sh; `pip download --no-deps`), never from
the network: without it they skip, which CI (CI=true) counts as a failure (tests/conftest.py). The fetch-failure test
points pip at a closed loopback port.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from tasks import bfcl
from tests.conftest import FLYWHEEL as FLYWHEEL_


@pytest.fixture(scope="module")
def wheel():
    try:
        return bfcl.wheel_path(fetch=False)
    except bfcl.BfclMissing as e:  # setup did not cache it: nothing to test against (a failure in CI)
        pytest.skip(f"{e} (make setup caches it)")


@pytest.fixture(scope="module")
def entries(wheel):
    return bfcl.load_entries(wheel)


@pytest.mark.slow
def test_ground_truth_replay_passes_on_every_loadable_base_task(wheel, entries):
    kept, left_out = entries
    failed = {e["id"]: r for e in kept if not (r := bfcl.replay(e, wheel=wheel))["valid"]}
    print(f"\nbfcl-multi-turn base: {len(kept)} loaded, ground truth passes on {len(kept) - len(failed)}; "
          f"left out {sum(left_out.values())} ({left_out})")
    assert len(kept) >= 150  # the wheel holds 200 base entries; only classes beyond the stdlib are left out
    assert not failed, f"ground-truth replay failed BFCL's checker: {dict(list(failed.items())[:3])}"
    needs = bfcl.api_imports(wheel)
    assert all(needs[c] for c in left_out), left_out  # only classes that need more than the stdlib left out
    assert len(kept) + sum(left_out.values()) == 200
    math_task = {"id": "x_0", "involved_classes": ["MathAPI"], "initial_config": {}, "ground_truth": [["mean([1])"]]}
    with pytest.raises(bfcl.BfclMissing, match="mpmath"):
        bfcl.replay(math_task, wheel=wheel)


@pytest.mark.slow
def test_a_replay_with_one_call_dropped_fails(wheel, entries):
    kept, _ = entries
    passed = [e["id"] for e in kept if bfcl.replay(e, drop=(0, 0), wheel=wheel)["valid"]]
    print(f"\nfirst call of turn 0 dropped: {len(kept) - len(passed)}/{len(kept)} fail BFCL's checker")
    assert not passed, passed
    # every single call dropped in turn: all fail but one, a get_watchlist() whose result the turn before's
    # add_to_watchlist already returned (BFCL's response check looks in all the model's results so far)
    drops = [(e["id"], t, i) for e in kept for t, turn in enumerate(e["ground_truth"]) for i in range(len(turn))]
    by_id = {e["id"]: e for e in kept}
    survived = [d for d in drops if bfcl.replay(by_id[d[0]], drop=d[1:], wheel=wheel)["valid"]]
    print(f"every single call dropped: {len(drops) - len(survived)}/{len(drops)} fail; pass: {survived}")
    assert survived == [("multi_turn_base_113", 1, 0)]
    # each check seen on its own: a state change left out, a read-only call's result left out, a turn left empty
    e0 = next(e for e in kept if e["id"] == "multi_turn_base_0")
    assert bfcl.replay(e0, drop=(0, 1))["error_type"] == "multi_turn:instance_state_mismatch"  # mkdir temp
    assert bfcl.replay(e0, drop=(1, 1))["error_type"] == "multi_turn:execution_response_mismatch"  # grep(...)
    e1 = next(e for e in kept if e["id"] == "multi_turn_base_1")
    assert bfcl.replay(e1, drop=(0, 0))["error_type"] == "multi_turn:empty_turn_model_response"  # its only call


@pytest.mark.slow
def test_tasks_carry_turns_tools_state_and_the_reference_calls(wheel, entries):
    kept, _ = entries
    tasks = bfcl.load_bfcl(wheel=wheel)
    assert [t.id for t in tasks] == [e["id"] for e in kept]
    t = tasks[0]
    assert t.suite == "bfcl-multi-turn" and t.verifier.kind == "bfcl"
    assert t.prompt == kept[0]["question"][0][0]["content"] and len(t.metadata["turns"]) == 4
    assert {"mkdir", "mv", "grep", "post_tweet"} <= set(t.tools)
    assert t.metadata["initial_config"] == kept[0]["initial_config"]
    later = [q[0]["content"] for q in kept[0]["question"][1:]]
    assert t.later_turns == ["\n".join(x) for x in t.metadata["turns"][1:]] == later
    refs = [t.reference, *t.reference.later_turns]
    assert [len(r.steps) for r in refs] == [len(turn) for turn in kept[0]["ground_truth"]]
    # sort('final_report.pdf') is positional in the ground truth: named by the method's signature
    steps = [st for r in refs for st in r.steps]
    assert steps[5].model_dump() == {"tool": "sort", "arguments": {"file_name": "final_report.pdf"}}


def test_a_missing_wheel_names_the_command_that_fixes_it(tmp_path, monkeypatch):
    monkeypatch.setenv("FLYWHEEL_BFCL_CACHE", str(tmp_path / "empty"))
    with pytest.raises(bfcl.BfclMissing, match=r"pip download --no-deps bfcl-eval==\S+ -d .*empty"):
        bfcl.wheel_path(fetch=False)


def test_a_broken_cached_wheel_is_named_with_the_fix(tmp_path, monkeypatch):
    monkeypatch.setenv("FLYWHEEL_BFCL_CACHE", str(tmp_path))
    (tmp_path / f"bfcl_eval-{bfcl.BFCL_VERSION}-py3-none-any.whl").write_text("<html>proxy error</html>")
    with pytest.raises(bfcl.BfclMissing, match="is not a wheel .* delete it and fetch it again: rm "):
        bfcl.wheel_path()


def test_an_unreachable_registry_is_a_fetch_error_naming_the_command(tmp_path):
    # fault injection: pip pointed at a closed loopback port, in a child so no env leaks into this process
    env = {**os.environ, "FLYWHEEL_BFCL_CACHE": str(tmp_path / "c"), "PIP_INDEX_URL": "http://127.0.0.1:9/simple",
           "PIP_RETRIES": "0", "PIP_TIMEOUT": "2", "PIP_NO_CACHE_DIR": "1", "PIP_FIND_LINKS": ""}
    code = ("from tasks import bfcl\ntry:\n    bfcl.wheel_path()\nexcept bfcl.BfclFetchFailed as e:\n"
            "    print(e)\n    raise SystemExit(3)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 3, proc.stderr
    assert "could not fetch the bfcl-eval" in proc.stdout and "pip download --no-deps bfcl-eval==" in proc.stdout
    assert not list((tmp_path / "c").glob("*.whl"))


def _flywheel(*args: str, cwd) -> subprocess.CompletedProcess:
    from tests.conftest import FLYWHEEL

    return subprocess.run([FLYWHEEL, *args], capture_output=True, text=True, cwd=cwd, timeout=300)


@pytest.mark.slow
def test_the_suite_through_the_cli_show_export_validate(wheel, entries, tmp_path):
    kept, _ = entries
    shown = _flywheel("tasks", "show", "bfcl-multi-turn", "--n", "2", "--split", "heldout", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    rows = [json.loads(line) for line in shown.stdout.splitlines()]
    assert [r["id"] for r in rows] == [e["id"] for e in kept[:2]] and rows[0]["verifier"]["kind"] == "bfcl"
    train = _flywheel("tasks", "show", "bfcl-multi-turn", cwd=tmp_path)
    assert train.returncode == 2 and "every task is heldout" in train.stderr and "Traceback" not in train.stderr
    out = tmp_path / "bfcl.jsonl"
    exported = _flywheel("tasks", "export", "bfcl-multi-turn", str(out), "--n", str(len(kept)), "--split", "heldout",
                         cwd=tmp_path)
    assert exported.returncode == 0, exported.stderr
    assert len(out.read_text().splitlines()) == len(kept)
    valid = _flywheel("tasks", "validate", str(out), cwd=tmp_path)
    assert valid.returncode == 0 and valid.stdout.startswith("ok:"), valid.stderr
    many = _flywheel("tasks", "show", "bfcl-multi-turn", "--n", "500", "--split", "heldout", cwd=tmp_path)
    assert many.returncode == 2 and f"holds {len(kept)} loadable tasks" in many.stderr, many.stderr


@pytest.mark.slow
def test_the_checker_and_the_classes_run_inside_a_sandbox(wheel, entries):
    """The sandboxed checker on every combination of BFCL classes the loadable tasks use and on every fourth task
    (the ground truth of every task passes BFCL's checker in test_ground_truth_replay_passes_on_every_loadable_base_task;
    in the sandbox it runs the same checker and classes)."""
    from sandbox.backend import open_backend
    from sandbox.result import SandboxConfig

    kept, _ = entries
    firsts = {tuple(sorted(e["involved_classes"])): e["id"] for e in reversed(kept)}
    sample = [e for i, e in enumerate(kept) if i % 4 == 0 or e["id"] in firsts.values()]
    assert {tuple(sorted(e["involved_classes"])) for e in sample} == firsts.keys()
    dropped = [[list(t) for t in e["ground_truth"]] for e in sample[:10]]
    for turns in dropped:
        del turns[0][0]
    jobs = [(e, e["ground_truth"]) for e in sample] + list(zip(sample[:10], dropped))
    with open_backend(SandboxConfig(backend="local"), pool_size=4) as backend, ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda job: bfcl.check_in_sandbox(*job, backend, wheel), jobs))
    failed = [e["id"] for e, r in zip(sample, got) if not r["valid"]]
    print(f"\nin the sandbox: ground truth passes on {len(sample) - len(failed)}/{len(sample)} "
          f"({len(firsts)} class combinations)")
    assert not failed, failed
    for e, r in zip(sample[:10], got[len(sample):]):
        assert r["valid"] is False and r["error_type"].startswith("multi_turn:"), (e["id"], r)


# ------------------------------------------------------------------------------------------------ rollouts


def _episode(task, backend, policy=None, **kw):
    import asyncio

    from agents.loop import run_episode
    from agents.reference import ReferencePolicy

    return asyncio.run(run_episode(task, policy or ReferencePolicy(), backend, run_id="t", **kw))


@pytest.fixture(scope="module")
def local():
    from sandbox.backend import open_backend
    from sandbox.result import SandboxConfig

    with open_backend(SandboxConfig(backend="local")) as be:
        yield be


def test_the_tools_are_bfcls_openai_schemas_of_the_tasks_functions(wheel):
    from tasks.tools import parse_arguments, tool_schemas

    t = bfcl.load_bfcl(1, wheel=wheel)[0]
    schemas = tool_schemas(t.tools, t.tool_specs)
    assert [s["function"]["name"] for s in schemas] == t.tools == [d["name"] for d in t.metadata["function_docs"]]
    types = {"string", "integer", "number", "boolean", "array", "object"}
    for s in schemas:
        params = s["function"]["parameters"]
        assert params["type"] == "object" and all(p["type"] in types for p in params["properties"].values()), s
    for step in [st for r in [t.reference, *t.reference.later_turns] for st in r.steps]:
        parse_arguments(step.tool, json.dumps(step.arguments), t.tool_specs)  # every reference call decodes
    # a float parameter reads as BFCL offers it: number, format float, the note in its description
    every = bfcl.openai_tools(wheel, bfcl.function_docs(wheel, [c for c, m in bfcl.api_imports(wheel).items()
                                                                if not m]))
    floats = [p for s in every for p in s["function"]["parameters"]["properties"].values()
              if p.get("format") == "float"]
    assert floats and all(p["type"] == "number" and p["description"].endswith("This is a float type value.")
                          for p in floats)


@pytest.mark.slow
def test_reference_episodes_pass_and_see_bfcls_own_results(wheel, entries, local):
    """The reference replays the ground truth through the real loop: each user turn arrives after the model ended
    the one before, each call runs in the sandbox, and what the model sees is what BFCL's own execution returns."""
    from tasks.tools import OBSERVATION_LIMIT

    kept, _ = entries
    utils = bfcl._import_from_wheel(wheel, "bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils")
    for task in bfcl.load_bfcl(6, wheel=wheel):
        row = _episode(task, local)
        assert row.verdict == "pass" and row.verifier == "bfcl" and row.verifier_strength == "bfcl", row.error_message
        users = [m.content for m in row.messages if m.role == "user"]
        assert users == [task.prompt, *task.later_turns]
        before_user = [row.messages[i - 1] for i, m in enumerate(row.messages) if m.role == "user" and i > 1]
        assert all(m.role == "assistant" and not m.tool_calls for m in before_user)
        calls = [bfcl.call_string(tc.function.name, json.loads(tc.function.arguments))
                 for m in row.messages if m.role == "assistant" for tc in m.tool_calls or []]
        entry = next(e for e in kept if e["id"] == task.id)
        want, _ = utils.execute_multi_turn_func_call(calls, entry["initial_config"], entry["involved_classes"],
                                                     f"ref_{task.id}", task.id)
        seen = [m.content for m in row.messages if m.role == "tool"]
        assert seen == [w.strip()[:OBSERVATION_LIMIT] for w in want], task.id
        details = json.loads(row.verifier_details_json)
        assert details["checker"]["valid"] and sum(details["model_calls"], []) == calls
        assert len(details["model_calls"]) == len(entry["ground_truth"])


@pytest.mark.slow
def test_a_policy_that_leaves_out_a_call_fails_on_bfcls_state_check(wheel, local):
    """The real reference teacher, given a reference with one call left out (`mkdir temp` of task 0): the episode
    runs to the end, and BFCL's checker, against the untouched ground truth, fails it on the state."""
    task = bfcl.load_bfcl(1, wheel=wheel)[0]
    ref = task.reference
    assert ref.steps[1].model_dump() == {"tool": "mkdir", "arguments": {"dir_name": "temp"}}
    broken = task.model_copy(update={"reference": ref.model_copy(update={"steps": [ref.steps[0], *ref.steps[2:]]})})
    row = _episode(broken, local)
    assert row.verdict == "fail" and row.reward == 0.0 and not row.success, row.error_message
    checker = json.loads(row.verifier_details_json)["checker"]
    assert checker["valid"] is False and checker["error_type"] == "multi_turn:instance_state_mismatch", checker
    # a model that answers every turn without a call: BFCL's empty-turn failure
    from agents.reference import ReferenceNoise, ReferencePolicy

    silent = _episode(task, local, ReferencePolicy(noise=ReferenceNoise(no_tool=1.0)))
    assert silent.verdict == "fail" and silent.n_tool_calls == 0 and silent.turns == 1 + len(task.later_turns)
    assert json.loads(silent.verifier_details_json)["checker"]["error_type"] == "multi_turn:empty_turn_model_response"


@pytest.mark.slow
def test_max_turns_holds_per_user_turn(wheel, local):
    """The reference answers each user turn with one message of that turn's calls and one final message: two
    assistant turns a user turn pass max_turns=2 although the episode has more; max_turns=1 stops in turn 1."""
    task = bfcl.load_bfcl(1, wheel=wheel)[0]
    refs = [task.reference, *task.reference.later_turns]
    assert all(r.steps for r in refs)
    row = _episode(task, local, max_turns=2)
    assert row.verdict == "pass" and row.turns == 2 * len(refs) > 2
    assert [len(m.tool_calls) for m in row.messages if m.role == "assistant" and m.tool_calls] == [
        len(r.steps) for r in refs]
    short = _episode(task, local, max_turns=1)
    assert short.verdict == "timeout" and short.error_class == "MaxTurns"
    assert f"in user turn 1 of {len(refs)}" in short.error_message


@pytest.mark.slow
def test_generate_through_the_cli_gives_pass_rows_and_fail_rows(wheel, tmp_path):
    from tests.conftest import ROOT

    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    def gen(out, *extra):
        return subprocess.run([FLYWHEEL_, "generate", "--suite", "bfcl-multi-turn", "--split", "heldout",
                               "--n-tasks", "3", "--samples", "1", "--teacher", "reference", "--backend", "local",
                               "--out", str(out), *extra], capture_output=True, text=True, cwd=tmp_path, env=env,
                              timeout=600)

    def verdicts(out):
        q = subprocess.run([FLYWHEEL_, "sql", "--root", str(out), "--format", "json",
                            "SELECT task_id, verdict, verifier_strength FROM trajectories ORDER BY task_id"],
                           capture_output=True, text=True, env=env, timeout=120)
        assert q.returncode == 0, q.stderr
        return json.loads(q.stdout)

    quiet = "wrong_answer=0.0,malformed_call=0.0,exit_hack=0.0"
    ok = gen(tmp_path / "ok", "--set", f"teacher.noise={{{quiet},no_tool=0.0}}")
    assert ok.returncode == 0, ok.stderr[-2000:]
    rows = verdicts(tmp_path / "ok")
    assert [r["task_id"] for r in rows] == [f"multi_turn_base_{i}" for i in range(3)]
    assert all(r["verdict"] == "pass" and r["verifier_strength"] == "bfcl" for r in rows), rows
    # judged again from the stored rows alone: `flywheel verify` with the exported tasks
    tasks_file, traj = tmp_path / "tasks.jsonl", tmp_path / "rows.jsonl"
    for args in (["tasks", "export", "bfcl-multi-turn", str(tasks_file), "--n", "3", "--split", "heldout"],
                 ["export", str(traj), "--root", str(tmp_path / "ok"), "--metadata", "--arguments", "string"]):
        done = subprocess.run([FLYWHEEL_, *args], capture_output=True, text=True, env=env, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
    v = subprocess.run([FLYWHEEL_, "verify", "--trajectories", str(traj), "--tasks", str(tasks_file), "--backend",
                        "local"], capture_output=True, text=True, env=env, timeout=300)
    assert v.returncode == 0, v.stderr[-2000:]
    assert [(r["verdict"], r["verifier_strength"]) for r in map(json.loads, v.stdout.splitlines())] == [
        ("pass", "bfcl")] * 3
    bad = gen(tmp_path / "bad", "--set", f"teacher.noise={{{quiet},no_tool=1.0}}")
    assert bad.returncode == 0, bad.stderr[-2000:]
    assert [r["verdict"] for r in verdicts(tmp_path / "bad")] == ["fail"] * 3
    train = subprocess.run([FLYWHEEL_, "generate", "--suite", "bfcl-multi-turn", "--out", str(tmp_path / "train")],
                           capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    assert train.returncode == 2 and "every task is heldout" in train.stderr and "Traceback" not in train.stderr
    assert not (tmp_path / "train").exists()


@pytest.mark.docker
@pytest.mark.slow
def test_a_reference_episode_in_docker(wheel):
    from sandbox.backend import open_backend
    from sandbox.result import SandboxConfig

    task = bfcl.load_bfcl(2, wheel=wheel)[1]
    with open_backend(SandboxConfig(backend="docker")) as be:
        row = _episode(task, be)
    assert row.verdict == "pass" and row.sandbox_backend == "docker", row.error_message


@pytest.mark.slow
def test_tasks_audit_on_bfcl(wheel, tmp_path):
    """`flywheel tasks audit bfcl-multi-turn`: the oracle passes, the null agent fails, and every mutant (the
    oracle's episode with one call left out) fails; the rows land in the lake's verifier_health table."""
    from tests.conftest import ROOT

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    a = subprocess.run([FLYWHEEL_, "tasks", "audit", "bfcl-multi-turn", "--split", "heldout", "--n", "2", "--k", "1",
                        "--backend", "local", "--workers", "2", "--root", str(tmp_path)], capture_output=True,
                       text=True, env=env, timeout=600)
    assert a.returncode == 0, a.stderr[-2000:]
    assert "oracle passes 2/2; null agent passes 0/2; mutant kill rate 16/16 = 1.000" in a.stdout, a.stdout
    q = subprocess.run([FLYWHEEL_, "sql", "--root", str(tmp_path), "--format", "json", "SELECT task_id, verifier, "
                        "oracle_pass, null_pass, n_mutants FROM verifier_health ORDER BY task_id"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert json.loads(q.stdout) == [
        {"task_id": "multi_turn_base_0", "verifier": "bfcl", "oracle_pass": True, "null_pass": False, "n_mutants": 10},
        {"task_id": "multi_turn_base_1", "verifier": "bfcl", "oracle_pass": True, "null_pass": False, "n_mutants": 6}]
