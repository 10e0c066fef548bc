"""BFCL v4 multi-turn base: the ground truth passes BFCL's own checker on every loadable task; a dropped call fails.

The wheel is fetched (pip download --no-deps) into the user's cache on first use; the tests skip with pip's error
only when the registry cannot be reached. The fetch-failure test points pip at a closed loopback port.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tasks import bfcl


@pytest.fixture(scope="module")
def wheel():
    try:
        return bfcl.wheel_path()
    except bfcl.BfclFetchFailed as e:  # the registry cannot be reached: nothing to test against
        pytest.skip(str(e))


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
    assert sum(len(turn) for turn in kept[0]["ground_truth"]) == len(t.reference.steps)
    # sort('final_report.pdf') is positional in the ground truth: named by the method's signature
    assert t.reference.steps[5].model_dump() == {"tool": "sort", "arguments": {"file_name": "final_report.pdf"}}


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
def test_the_suite_through_the_cli_show_export_validate_and_a_refused_rollout(wheel, entries, tmp_path):
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
    gen = _flywheel("generate", "--suite", "bfcl-multi-turn", "--teacher", "reference", cwd=tmp_path)
    assert gen.returncode == 2 and "cannot be rolled out yet" in gen.stderr and "Traceback" not in gen.stderr


@pytest.mark.slow
def test_the_checker_and_the_classes_run_inside_a_sandbox(wheel, entries):
    from sandbox.backend import open_backend
    from sandbox.result import SandboxConfig

    kept, _ = entries
    with open_backend(SandboxConfig(backend="local")) as backend:
        failed = [e["id"] for e in kept if not bfcl.check_in_sandbox(e, e["ground_truth"], backend, wheel)["valid"]]
        print(f"\nin the sandbox: ground truth passes on {len(kept) - len(failed)}/{len(kept)}")
        assert not failed, failed
        for e in kept[:10]:
            turns = [list(t) for t in e["ground_truth"]]
            del turns[0][0]
            got = bfcl.check_in_sandbox(e, turns, backend, wheel)
            assert got["valid"] is False and got["error_type"].startswith("multi_turn:"), (e["id"], got)
