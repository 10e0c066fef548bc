"""Harbor task folders as a suite: loading and validation (task.toml fields, every problem named), the reward file
read fail-closed, Dockerfile bases checked before a build; and in Docker, through the console script: the shipped
suite's oracles all pass, while agents that write the reward file, delete or edit tests/ get no reward."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sandbox.taskenv import dockerfile_bases
from tasks.harbor import HarborTaskError, load_harbor, parse_reward, strip_canary

ROOT = Path(__file__).resolve().parents[2]
SUITE = ROOT / "data" / "harbor"
FLYWHEEL = str(Path(sys.executable).with_name("flywheel"))


def run(*args: str, env: dict | None = None, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([FLYWHEEL, *args], capture_output=True, text=True, timeout=timeout, check=False,
                          env={**os.environ, **(env or {})})


def error_lines(p: subprocess.CompletedProcess) -> list[str]:
    return [ln for ln in p.stderr.splitlines() if ln.startswith("error: ")]


def test_shipped_suite_loads_with_its_task_toml_fields():
    tasks = load_harbor(SUITE)
    assert len(tasks) == 12
    assert len({t.id for t in tasks}) == 12 and all(t.id.startswith("flywheel/") for t in tasks)
    for t in tasks:
        h = t.metadata["harbor"]
        assert t.verifier.kind == "harbor" and t.tools == ["shell", "read_file", "write_file"]
        assert t.split == "train" and t.suite == "harbor"
        assert (h["agent_timeout_s"], h["verifier_timeout_s"], h["memory_mb"], h["cpus"]) == (30.0, 60.0, 256, 1.0)
        assert t.verifier.timeout_s == 60.0 and h["schema_version"] == "1.4"
        assert h["image"].startswith("flywheel-env:") and len(h["image"].split(":")[1]) == 16
        assert "canary" not in t.prompt and t.prompt.strip()
        assert t.version.startswith("1+")
        # the tests go to the verifier only: not in the prompt, the files or the reference's calls
        check = next(iter(h["tests"]))
        assert "test.sh" in h["tests"] and check
        assert not t.files and "/tests" not in json.dumps(t.reference.model_dump())
    # identical environment folders share one image
    assert len({t.metadata["harbor"]["image"] for t in tasks}) < len(tasks)


def test_canary_lines_are_stripped_as_harbor_does():
    assert strip_canary("<!-- canary GUID x -->\n# canary too\n\nDo it.\n") == "Do it.\n"
    assert strip_canary("Do it.\n<!-- canary -->\n") == "Do it.\n<!-- canary -->\n"


def _task(root: Path, name: str, toml: str, *, instruction: str | None = "Do it.\n", test: bool = True,
          solve: bool = True, dockerfile: str | None = "FROM flywheel-sandbox:bookworm\n") -> Path:
    d = root / name
    (d / "environment").mkdir(parents=True)
    (d / "task.toml").write_text(toml)
    if instruction is not None:
        (d / "instruction.md").write_text(instruction)
    if dockerfile is not None:
        (d / "environment" / "Dockerfile").write_text(dockerfile)
    if test:
        (d / "tests").mkdir()
        (d / "tests" / "test.sh").write_text("#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")
    if solve:
        (d / "solution").mkdir()
        (d / "solution" / "solve.sh").write_text("#!/bin/bash\ntrue\n")
    return d


def test_every_problem_of_every_folder_is_named_and_nothing_loads(tmp_path):
    _task(tmp_path, "good", 'schema_version = "1.4"\n')
    _task(tmp_path, "v2", 'schema_version = "2.0"\n')
    _task(tmp_path, "gpu", '[environment]\ngpus = 1\n[agent]\ntimeout_sec = "soon"\n')
    _task(tmp_path, "steps", '[[steps]]\nname = "one"\n', instruction=None, test=False)
    _task(tmp_path, "hostvar", '[environment]\nenv = { TOKEN = "${TOKEN}", MODE = "${MODE:-fast}" }\n',
          dockerfile=None)
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "task.toml").write_text("schema_version = \n")
    with pytest.raises(HarborTaskError) as e:
        load_harbor(tmp_path)
    msg = str(e.value)
    for needle in ("v2: task.toml: schema_version '2.0' is not 1.x", "gpu: task.toml: field agent.timeout_sec",
                   "steps: task.toml: [[steps]]", "steps: instruction.md is missing", "steps: tests/test.sh is missing",
                   "hostvar: environment/Dockerfile is missing", "broken: task.toml: not valid TOML"):
        assert needle in msg, (needle, msg)
    assert "good:" not in msg
    # the same through the console script: exit 2, one error line, the problems under it
    p = run("tasks", "import", "harbor", str(tmp_path), "--no-build")
    assert p.returncode == 2 and len(error_lines(p)) == 1, p.stderr
    assert "schema_version '2.0'" in p.stderr and "[[steps]]" in p.stderr
    # one folder alone: the host variable without a default is refused, the one with a default is taken
    only = tmp_path / "only"
    _task(only, "hostvar", '[environment]\nenv = { TOKEN = "${TOKEN}", MODE = "${MODE:-fast}" }\n')
    with pytest.raises(HarborTaskError, match=r"TOKEN: uses host variable \$\{TOKEN\} without a default"):
        load_harbor(only / "hostvar")
    ok = tmp_path / "ok"
    _task(ok, "env", '[environment]\nenv = { MODE = "${MODE:-fast}" }\nmemory = "1G"\n[metadata]\nsplit = "heldout"\n')
    (t,) = load_harbor(ok / "env")
    assert t.metadata["harbor"]["env"] == {"MODE": "fast"} and t.metadata["harbor"]["memory_mb"] == 1024
    assert t.split == "heldout" and t.id == "env"


def test_reward_file_is_read_fail_closed():
    assert parse_reward(None, b"1\n")[0] == 1.0
    assert parse_reward(None, b"0.25")[0] == 0.25
    assert parse_reward(b'{"reward": 0.5, "extra": 3}', b"1")[0] == 0.5  # reward.json first, as Harbor reads it
    assert parse_reward(b'{"accuracy": 1}', None)[0] == 1.0
    assert parse_reward(b"1", None)[0] == 1.0
    for js, txt, why in [(None, None, "neither"), (None, b"", "empty"), (None, b"yes", "not a number"),
                         (None, b"nan", "not finite"), (b"", None, "empty"), (b"{", None, "not JSON"),
                         (b'{"reward": "1"}', None, "not a finite number"), (b'{"reward": true}', None, "finite"),
                         (b'{"reward": NaN}', None, "not a finite number"), (b'{"a": 1, "b": 1}', None, "no 'reward'")]:
        reward, details = parse_reward(js, txt)
        assert reward is None and why in details["error"], (js, txt, details)


def test_dockerfile_bases():
    assert dockerfile_bases("FROM flywheel-sandbox:bookworm\nRUN true\n") == ["flywheel-sandbox:bookworm"]
    assert dockerfile_bases("ARG BASE=debian:12\nFROM --platform=linux/amd64 ${BASE} AS build\nFROM build\n"
                            "FROM scratch\nCOPY --from=build / /\n") == ["debian:12"]
    assert dockerfile_bases("# c\nFROM \\\n  python:3.12 as b\n") == ["python:3.12"]
    with pytest.raises(ValueError, match="ARG without a default"):
        dockerfile_bases("ARG BASE\nFROM $BASE\n")


# ------------------------------------------------------------------------------------------------ in Docker

ZERO_NOISE = """
[teacher]
kind = "reference"
[teacher.noise]
wrong_answer = 0.0
malformed_call = 0.0
no_tool = 0.0
exit_hack = 0.0
"""


def _sql(root: Path, q: str) -> list[dict]:
    p = run("sql", "--root", str(root), "--format", "json", q)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def _generate(suite: Path, tmp_path: Path) -> Path:
    """`flywheel generate` of the reference teacher, noise off, one sample per task, in Docker; the lake."""
    cfg = tmp_path / "zero.toml"
    cfg.write_text(ZERO_NOISE)
    out = tmp_path / "lake"
    p = run("generate", "--config", str(cfg), "--suite", str(suite), "--teacher", "reference", "--backend", "docker",
            "--samples", "1", "--out", str(out), "--run-id", "h1")
    assert p.returncode == 0, p.stderr[-3000:]
    return out


@pytest.mark.docker
@pytest.mark.e2e
def test_generate_shipped_suite_every_oracle_passes(tmp_path):
    imp = run("tasks", "import", "harbor", str(SUITE))
    assert imp.returncode == 0, imp.stderr[-2000:]
    assert "12 Harbor task(s)" in imp.stdout and "images:" in imp.stdout
    again = run("tasks", "import", "harbor", str(SUITE))
    assert "images: 0 built" in again.stdout  # reused by content hash
    out = _generate(SUITE, tmp_path)
    rows = _sql(out, "SELECT task_id, verdict, reward, verifier, verifier_strength, sandbox_image, "
                     "verifier_details_json AS d FROM trajectories ORDER BY task_id")
    assert len(rows) == 12
    bad = [(r["task_id"], r["verdict"], json.loads(r["d"]).get("error")) for r in rows if r["verdict"] != "pass"]
    assert not bad, bad
    for r in rows:
        assert (r["reward"], r["verifier"], r["verifier_strength"]) == (1.0, "harbor", "harbor")
        assert r["sandbox_image"].startswith("sha256:")
        d = json.loads(r["d"])
        assert d["state"]["/app"] == "copied" and d["reward_file"].startswith("/logs/verifier/reward.")
    fib = next(json.loads(r["d"]) for r in rows if r["task_id"] == "flywheel/fib-module")
    assert fib["reward_file"] == "/logs/verifier/reward.json" and fib["rewards"]["passed"] == 7
    # judged again from the stored rows alone: `flywheel verify` replays each episode's calls in a fresh container
    tasks_file, traj = tmp_path / "tasks.jsonl", tmp_path / "rows.jsonl"
    assert run("tasks", "import", "harbor", str(SUITE), "--out", str(tasks_file)).returncode == 0
    e = run("export", str(traj), "--root", str(out), "--metadata", "--arguments", "string")
    assert e.returncode == 0, e.stderr
    v = run("verify", "--trajectories", str(traj), "--tasks", str(tasks_file), "--backend", "docker", "--workers", "2")
    assert v.returncode == 0, v.stderr[-2000:]
    results = [json.loads(ln) for ln in v.stdout.splitlines()]
    assert len(results) == 12 and {(r["verdict"], r["verifier_strength"]) for r in results} == {("pass", "harbor")}


HACKS = {
    # writes the reward files itself (in its own container)
    "writes-reward": "mkdir -p /logs/verifier\necho 1 > /logs/verifier/reward.txt\n"
                     "echo '{\"reward\": 1}' > /logs/verifier/reward.json\n",
    # deletes tests/ and puts a test.sh of its own in its place
    "replaces-tests": "rm -rf /tests\nmkdir -p /tests\nprintf '#!/bin/sh\\necho 1 > /logs/verifier/reward.txt\\n' "
                      "> /tests/test.sh\nchmod +x /tests/test.sh\n",
    # edits tests/test.sh (appends a line that forces reward 1)
    "edits-tests": "echo 'echo 1 > /logs/verifier/reward.txt' >> /tests/test.sh || true\n",
    # leaves a reward file where the verifier might copy it from
    "plants-artifact": "mkdir -p /logs/artifacts/verifier /app/logs/verifier\n"
                       "echo 1 | tee /logs/artifacts/reward.txt /app/logs/verifier/reward.txt\n",
}


@pytest.mark.docker
@pytest.mark.e2e
def test_agents_that_touch_tests_or_write_the_reward_get_nothing(tmp_path):
    suite = tmp_path / "hacks"
    for name, body in HACKS.items():
        d = suite / name
        shutil.copytree(SUITE / "hello-file", d)
        toml = (d / "task.toml").read_text().replace('name = "flywheel/hello-file"', f'name = "hack/{name}"')
        (d / "task.toml").write_text(toml)
        # every hack first reports whether the tests are there while it runs
        (d / "solution" / "solve.sh").write_text("#!/bin/bash\nif [ -e /tests ]; then echo TESTS_PRESENT; else "
                                                 "echo TESTS_ABSENT; fi\n" + body)
    # a verifier that writes no reward at all: fail-closed, even though the agent did the task
    d = suite / "no-reward-file"
    shutil.copytree(SUITE / "hello-file", d)
    (d / "task.toml").write_text((d / "task.toml").read_text().replace("flywheel/hello-file", "hack/no-reward"))
    (d / "tests" / "test.sh").write_text("#!/bin/bash\npython3 /tests/check.py\n")
    out = _generate(suite, tmp_path)
    rows = _sql(out, "SELECT task_id, verdict, reward, success, verifier_details_json AS d, messages "
                     "FROM trajectories ORDER BY task_id")
    assert sorted(r["task_id"] for r in rows) == sorted([f"hack/{n}" for n in HACKS] + ["hack/no-reward"])
    for r in rows:
        d = json.loads(r["d"])
        assert r["verdict"] in ("fail", "hack") and r["reward"] == 0.0 and not r["success"], (r["task_id"], d)
        if r["task_id"] == "hack/no-reward":
            assert "wrote neither" in d["error"]
            continue
        tool_out = [m["content"] for m in r["messages"] if m["role"] == "tool"]
        assert tool_out and tool_out[0].startswith("TESTS_ABSENT"), tool_out
        assert d["test_exit_code"] == 0 and d["reward_file"] == "/logs/verifier/reward.txt"  # the real test.sh: 0


@pytest.mark.docker
def test_a_base_image_that_is_not_local_is_a_clear_error(tmp_path):
    _task(tmp_path, "ubuntu", "", dockerfile="FROM ubuntu:24.04\nRUN apt-get update\n")
    p = run("tasks", "import", "harbor", str(tmp_path / "ubuntu"))
    assert p.returncode == 2, p.stderr
    (line,) = error_lines(p)
    assert "'ubuntu:24.04'" in line and "docker pull ubuntu:24.04" in line and "flywheel-sandbox:bookworm" in line
