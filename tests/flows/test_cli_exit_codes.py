"""Exit codes and error lines of every command, through the installed `flywheel` console script in a subprocess:
bad input and usage errors end with exactly one `error:` line, exit code 2 and no traceback; success exits 0.
None of these cases starts a Prefect server or a sandbox."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import FLYWHEEL


def flywheel(*args: str, cwd=None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    return subprocess.run([FLYWHEEL, *args], capture_output=True, text=True, timeout=120, cwd=cwd, env=env)


def one_error_line(p: subprocess.CompletedProcess) -> str:
    assert "Traceback" not in p.stderr, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.startswith("error: ")]
    assert len(lines) == 1, p.stderr
    return lines[0]


# (argv with {d} for a scratch folder, text the error line must hold): one bad-input case per command
CASES = [
    (["generate", "--suite", "nope"], "unknown suite 'nope'"),
    (["generate", "--n-tasks", "abc"], "Invalid value for '--n-tasks'"),
    (["generate", "--format", "x"], "No such option: --format"),
    (["run", "--rounds", "abc"], "Invalid value for '--rounds'"),
    (["run", "--resume", "nope", "--out", "{d}"], "run nope has no saved config"),
    (["run", "--out", "{d}", "--set", 'student.base="tiny-gpt"'], "is no tiny family (tiny, tiny-gptoss, tiny-qwen3)"),
    (["run", "--out", "{d}", "--set", "flywheel.synthesize.enabled=true", "--set", "flywheel.student_train_samples=0"],
     "flywheel.synthesize.enabled needs the student's train rollouts"),
    (["run", "--out", "s3://bucket/lake", "--set", "flywheel.synthesize.enabled=true"],
     "set flywheel.synthesize.folder to a local folder"),
    (["curate", "--run-id", "r", "--out", "{d}/none"], "lake root {d}/none does not exist"),
    (["curate"], "Missing option '--run-id'"),
    (["train", "sft", "--model", "m", "--snapshot", "s", "--run-id", "r", "--out", "{d}/none"],
     "lake root {d}/none does not exist"),
    (["train", "grpo", "--model", "m", "--run-id", "r", "--set", "grpo.nope=1"], "unknown config key 'grpo.nope'"),
    (["train", "nope"], "No such command 'nope'"),
    (["evaluate", "--model", "m", "--set", "x.y=1"], "unknown config section [x]"),
    (["sql", "select nope", "--root", "{d}"], 'column "nope" was not found'),
    (["sql"], "Missing argument 'query'"),
    (["sql", "SELECT 1", "--root", "file://x/y"], "a file:// URL needs three slashes"),
    (["export", "{d}/o.jsonl", "--root", "{d}/none"], "lake root {d}/none does not exist"),
    (["stats", "--root", "{d}", "--by", "nope"], "unknown stats dimension"),
    (["verify", "--trajectories", "{d}/none.jsonl"], "trajectory file {d}/none.jsonl does not exist"),
    (["tasks", "list", "--bogus"], "No such option: --bogus"),
    (["tasks", "show", "nope"], "unknown suite 'nope'"),
    (["tasks", "show", "arithmetic", "--bogus", "x"], "No such option: --bogus"),
    (["tasks", "validate", "{d}/bad.jsonl"], "1 problem(s) in {d}/bad.jsonl"),
    (["tasks", "export", "nope", "{d}/o.jsonl"], "unknown suite 'nope'"),
    (["demos", "import", "{d}/none.jsonl", "--root", "{d}"], "{d}/none.jsonl: no such file or folder"),
    (["sandbox", "exec", "--backend", "local"], "no command given"),
    (["sandbox", "exec", "--timeout", "0", "--", "true"], "bad sandbox option: timeout_s"),
    (["sandbox", "exec", "--backend", "nope", "--", "true"], "bad sandbox option: backend"),
    (["sandbox", "build-image", "--bogus"], "No such option: --bogus"),
    (["serve", "--set", "x.y=1"], "unknown config section [x]"),
    (["deploy"], "Missing option '--work-pool'"),
    (["server", "start", "--port", "abc"], "Invalid value for '--port'"),
    (["server", "nope"], "No such command 'nope'"),
    (["nope"], "No such command 'nope'"),
]


@pytest.mark.parametrize("argv,expect", CASES, ids=[" ".join(a) for a, _ in CASES])
def test_bad_input_exits_2_with_one_error_line(tmp_path, argv, expect):
    (tmp_path / "bad.jsonl").write_text('{"x": 1}\n')
    before = sorted(p.name for p in tmp_path.iterdir())
    p = flywheel(*(a.format(d=tmp_path) for a in argv), cwd=tmp_path)
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert expect.format(d=tmp_path) in one_error_line(p)
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing half-written


def test_usage_error_shows_usage_then_one_error_line():
    p = flywheel("tasks", "show", "arithmetic", "--bogus", "x")
    lines = p.stderr.strip().splitlines()
    assert lines[0].startswith("Usage: flywheel tasks show")
    assert lines[-1] == "error: No such option: --bogus"


def test_success_and_help_exit_0(tmp_path):
    good = tmp_path / "good.jsonl"
    assert flywheel("tasks", "export", "arithmetic", str(good), "--n", "2").returncode == 0
    p = flywheel("tasks", "validate", str(good))
    assert (p.returncode, p.stdout.strip()) == (0, f"ok: {good}")
    assert flywheel("--help").returncode == 0
    assert flywheel("tasks", "--help").returncode == 0


def test_bare_group_prints_help_exit_2():
    p = flywheel("tasks")
    assert p.returncode == 2 and "Usage" in p.stderr + p.stdout and "Traceback" not in p.stderr


def test_the_console_script_starts_without_its_heavy_imports():
    """Every command imports flows.cli and the config before it does anything: that path leaves pyarrow (the
    record's Arrow schema is built on first use, warehouse/record.py), httpx (the LLM judge's client, imported
    when it judges) and prefect to the commands that use them."""
    code = "import sys, flows.cli; print(sorted(m for m in ('pyarrow', 'httpx', 'numpy', 'prefect') if m in sys.modules))"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert p.stdout.strip() == "[]", p.stdout


def test_read_commands_never_import_prefect(tmp_path):
    """sql, stats, export and tasks need no Prefect server: they do not even import prefect."""
    (tmp_path / "lake").mkdir()
    lake = str(tmp_path / "lake")
    code = ("import sys; from flows.cli import main; sys.argv = ['flywheel'] + sys.argv[1:]\n"
            "try:\n    main()\nexcept SystemExit as e:\n    print('exit', e.code, 'prefect' in sys.modules)")
    for argv in (["tasks", "list"], ["tasks", "show", "arithmetic", "--n", "1"], ["stats", "--root", lake],
                 ["sql", "SELECT 1 AS x", "--root", lake], ["export", str(tmp_path / "o.jsonl"), "--root", lake]):
        p = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=120,
                           env={k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"})
        assert p.stdout.strip().splitlines()[-1].endswith("False"), (argv, p.stdout, p.stderr)
