"""The `flywheel` command line as a user meets it: the main path on real Docker sandboxes, and bad input that ends
in one clear line, exit code 2 and no files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

FLYWHEEL = str(Path(sys.executable).with_name("flywheel"))


def run(*args: str, env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([FLYWHEEL, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def error_line(p: subprocess.CompletedProcess) -> str:
    lines = [ln for ln in p.stderr.splitlines() if ln.startswith("error: ")]
    assert len(lines) == 1, p.stderr
    return lines[0]


def test_help_on_every_command():
    import typer.main

    from flows.cli import app

    group = typer.main.get_command(app)
    paths = []
    for name, cmd in group.commands.items():
        sub = getattr(cmd, "commands", None)
        paths += [[name, s] for s in sub] if sub else [[name]]
    assert len(paths) >= 10
    from typer.testing import CliRunner

    runner = CliRunner()
    for path in paths:
        res = runner.invoke(app, [*path, "--help"])
        assert res.exit_code == 0 and "Usage" in res.output, (path, res.output)


@pytest.mark.parametrize("args,expect", [
    (["generate", "--suite", "nope"], "unknown suite 'nope'"),
    (["generate", "--set", "generate.n_taks=3"], "unknown config key 'generate.n_taks'"),
    (["generate", "--teacher", "openai", "--base-url", "http://127.0.0.1:9/v1", "--model", "m"],
     "cannot reach the OpenAI-compatible endpoint http://127.0.0.1:9/v1"),
    (["generate", "--n-tasks", "0"], "generate.n_tasks"),
    (["run", "--resume", "no-such-run"], "run no-such-run has no saved config"),
])
def test_bad_input_is_one_line_exit_2_no_files(tmp_path, args, expect):
    out = tmp_path / "lake"
    p = run(*args, "--out", str(out))
    assert p.returncode == 2, p.stderr
    assert expect in error_line(p)
    assert "Traceback" not in p.stderr
    assert not out.exists(), "nothing may be written on bad input"


def test_wrong_key_in_config_file_names_the_file(tmp_path):
    cfg = tmp_path / "bad.toml"
    cfg.write_text("[generate]\nn_taks = 3\n")
    p = run("generate", "--config", str(cfg), "--out", str(tmp_path / "lake"))
    assert p.returncode == 2
    line = error_line(p)
    assert "generate.n_taks" in line and str(cfg) in line and "n_tasks" in line


def test_no_docker_engine_names_the_fix(tmp_path):
    p = run("generate", "--backend", "docker", "--out", str(tmp_path / "lake"),
            env={"DOCKER_HOST": "unix:///nonexistent/docker.sock"})
    assert p.returncode == 2
    line = error_line(p)
    assert "no Docker engine answers" in line and "dockerd" in line and "--backend local" in line
    assert not (tmp_path / "lake").exists()


def test_sandbox_exec_contract_local():
    p = run("sandbox", "exec", "--backend", "local", "--timeout", "5", "--", "python3", "-c", "print(6*7)")
    assert p.returncode == 0, p.stderr
    res = json.loads(p.stdout)
    for key in ("exit_code", "stdout", "stderr", "timed_out", "oom_killed", "truncated", "duration_ms", "verdict"):
        assert key in res
    assert res["verdict"] == "ok" and res["stdout"] == "42\n"


@pytest.mark.docker
def test_sandbox_exec_contract_docker_timeout():
    p = run("sandbox", "exec", "--backend", "docker", "--timeout", "1", "--", "sleep", "30")
    res = json.loads(p.stdout)
    assert res["verdict"] == "timeout" and res["timed_out"] is True


@pytest.mark.docker
@pytest.mark.e2e
def test_generate_50x2_in_docker_then_sql(tmp_path, prefect_api):
    out = tmp_path / "lake"
    p = run("generate", "--suite", "arithmetic", "--split", "train", "--n-tasks", "50", "--samples", "2",
            "--teacher", "reference", "--backend", "docker", "--out", str(out), "--run-id", "g1",
            env={"PREFECT_API_URL": prefect_api})
    assert p.returncode == 0, p.stderr[-3000:]
    assert (out / "runs" / "g1" / "config.toml").is_file()
    q = run("sql", "--root", str(out), "--format", "json",
            "SELECT suite, split, count(*) AS n, count(verdict) AS verified, avg(success::INT) AS pass_rate, "
            "count(DISTINCT trajectory_id) AS ids, min(sandbox_backend) AS backend FROM trajectories GROUP BY ALL")
    assert q.returncode == 0, q.stderr
    rows = json.loads(q.stdout)
    assert len(rows) == 1
    r = rows[0]
    assert (r["suite"], r["split"], r["n"], r["verified"], r["ids"], r["backend"]) == \
        ("arithmetic", "train", 100, 100, 100, "docker")
    assert r["pass_rate"] > 0.5
    # the same command again adds nothing (deterministic ids)
    p2 = run("generate", "--suite", "arithmetic", "--n-tasks", "50", "--samples", "2", "--backend", "docker",
             "--out", str(out), "--run-id", "g1", env={"PREFECT_API_URL": prefect_api})
    assert p2.returncode == 0, p2.stderr[-3000:]
    q2 = run("sql", "--root", str(out), "-f", "json", "SELECT count(*) AS n FROM trajectories")
    assert json.loads(q2.stdout) == [{"n": 100}]
