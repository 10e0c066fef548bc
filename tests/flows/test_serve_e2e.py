"""End to end through a real Prefect server: `flywheel serve` in the background, runs of the generate deployment
created as a user does (`prefect deployment run generate/flywheel --param n_tasks=3`): Completed with the served
config's other values, artifacts, rows in the served lake; bad overrides and a partial `cfg` fail naming the key.

The server is the session's (conftest.prefect_api, loopback). `flywheel serve` runs in its own process group from
another working directory (the deployments' module entrypoints must not depend on it) and is killed by that group
at the end. Sandboxes are real Docker containers; the teacher is the offline reference policy.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.conftest import in_background

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.docker]

FLYWHEEL = str(Path(sys.executable).with_name("flywheel"))
DEPLOYMENT = "generate/flywheel"  # ServeConfig's default deployment name


def write_config(path: Path, lake: Path) -> Path:
    """The served config: its values become the deployment's default parameters (the UI form's defaults)."""
    from flows.config import FlywheelConfig

    text = (f'[run]\nout = "{lake}"\nmax_workers = 2\n\n'
            '[generate]\nn_tasks = 2\nsamples = 1\n\n[rollout]\nconcurrency = 2\nbatch_size = 2\n\n'
            '[teacher]\nkind = "reference"\nseed = 1\n\n[sandbox]\nbackend = "docker"\n')
    if "serve" in FlywheelConfig.model_fields:  # the [serve] section, once flows/config.py composes it
        text += ('\n[serve]\nflows = ["generate"]\n\n'
                 '[serve.generate]\ninterval_s = 86400\nactive = false\n')
    path.write_text(text)
    return path


@contextmanager
def serving(config: Path, cwd: Path, api_url: str):
    """`flywheel serve` in the background, in its own process group; yields (process, log path)."""
    log_path = cwd / "serve.log"
    env = {**os.environ, "PREFECT_API_URL": api_url, "PYTHONUNBUFFERED": "1"}
    argv = [FLYWHEEL, "serve", "--config", str(config), "--flow", "generate"]
    with in_background(argv, log_path, cwd=cwd, env=env) as proc:
        yield proc, log_path


def wait_for_deployment(client, name: str, proc, log_path: Path, timeout_s: float = 120):
    from prefect.exceptions import ObjectNotFound

    deadline = time.time() + timeout_s
    while True:
        try:
            return client.read_deployment_by_name(name)
        except ObjectNotFound:
            pass
        if proc.poll() is not None or time.time() > deadline:
            raise AssertionError(f"deployment {name} did not appear (serve exit code {proc.poll()}); serve log:\n"
                                 f"{log_path.read_text()[-4000:]}")
        time.sleep(1)


def wait_for_final_state(client, flow_run_id, log_path: Path, timeout_s: float = 400):
    deadline = time.time() + timeout_s
    while True:
        run = client.read_flow_run(flow_run_id)
        if run.state and run.state.is_final():
            return run
        if time.time() > deadline:
            raise AssertionError(f"flow run {flow_run_id} still {run.state_name} after {timeout_s}s; serve log:\n"
                                 f"{log_path.read_text()[-4000:]}")
        time.sleep(1)


PREFECT = str(Path(sys.executable).with_name("prefect"))


def deployment_run(api_url: str, *params: str) -> str:
    """`prefect deployment run generate/flywheel --param K=V ...` as a user types it; returns the flow run id."""
    argv = [PREFECT, "deployment", "run", DEPLOYMENT, *(a for p in params for a in ("--param", p))]
    done = subprocess.run(argv, env={**os.environ, "PREFECT_API_URL": api_url}, capture_output=True, text=True,
                          check=False, timeout=120)
    assert done.returncode == 0, f"{argv} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    m = re.search(r"UUID: ([0-9a-f-]{36})", done.stdout)
    assert m, done.stdout
    return m.group(1)


@pytest.fixture(scope="module")
def served_run(prefect_api, tmp_path_factory):
    """Serve generate, trigger one run with `prefect deployment run --param n_tasks=3`, wait for it."""
    from prefect.client.orchestration import get_client

    work = tmp_path_factory.mktemp("serve-e2e")
    lake = work / "lake"
    config = write_config(work / "flywheel.toml", lake)
    with serving(config, work, prefect_api) as (proc, log_path), get_client(sync_client=True) as client:
        t0 = time.perf_counter()
        dep = wait_for_deployment(client, DEPLOYMENT, proc, log_path)
        t_registered = time.perf_counter() - t0
        run_id = deployment_run(prefect_api, "n_tasks=3", 'overrides=["run.run_id=ui-custom-1"]')
        run = wait_for_final_state(client, run_id, log_path)
        t_done = time.perf_counter() - t0
        from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

        artifacts = client.read_artifacts(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run.id])))
        print(f"deployment registered after {t_registered:.1f}s, run final after {t_done:.1f}s")
        yield {"deployment": dep, "run": run, "artifacts": artifacts, "lake": lake, "log": log_path,
               "proc": proc, "cwd": work}
    assert proc.poll() is not None, "serve did not stop on SIGTERM/SIGKILL of its process group"


def test_deployment_has_a_small_typed_form_and_the_schedule(served_run):
    dep = served_run["deployment"]
    schema = dep.parameter_openapi_schema
    assert list(schema["properties"]) == ["suite", "split", "n_tasks", "samples", "teacher_kind", "teacher_model",
                                          "teacher_endpoint", "backend", "overrides"]
    n = schema["properties"]["n_tasks"]
    assert n["type"] == "integer" and n["description"] and n["default"] == 2  # the served value
    assert "cfg" not in schema["properties"] and not schema.get("definitions")
    assert dep.enforce_parameter_schema
    assert dep.parameters["cfg"]["generate"]["n_tasks"] == 2  # the served config rides along, out of the form
    assert dep.parameters["cfg"]["run"]["out"] == str(served_run["lake"])
    (sched,) = dep.schedules
    assert sched.schedule.interval.total_seconds() == 86400 and sched.active is False


def test_param_n_tasks_completes_with_served_values_artifacts_and_rows(served_run):
    from warehouse.query import query

    run = served_run["run"]
    assert run.state.is_completed(), f"{run.state_name}: {run.state.message}\n{served_run['log'].read_text()[-4000:]}"
    assert run.parameters["n_tasks"] == 3 and run.deployment_id == served_run["deployment"].id

    keys = {a.key for a in served_run["artifacts"]}
    assert "generate-summary" in keys, keys
    summary = next(a for a in served_run["artifacts"] if a.key == "generate-summary")
    table = json.loads(summary.data) if isinstance(summary.data, str) else summary.data
    assert sum(r["episodes"] for r in table) == 3  # 3 tasks x the served samples = 1

    # in the served lake (not runs/default under serve's working directory), with the served samples
    assert not (served_run["cwd"] / "runs").exists()
    rows = query(str(served_run["lake"]), "SELECT trajectory_id, verdict, sample_index FROM trajectories "
                                          "WHERE run_id = 'ui-custom-1'").to_pylist()
    assert len(rows) == 3 and len({r["trajectory_id"] for r in rows}) == 3
    assert all(r["verdict"] for r in rows) and {r["sample_index"] for r in rows} == {0}
    saved = (served_run["lake"] / "runs" / "ui-custom-1" / "config.toml").read_text()
    assert "n_tasks = 3" in saved and "samples = 1" in saved and "seed = 1" in saved


def test_a_second_run_of_the_same_run_id_writes_no_duplicates(served_run, prefect_api):
    """Resume semantics through the deployment: the same parameters again add no rows."""
    from prefect.client.orchestration import get_client

    from warehouse.query import query

    if served_run["proc"].poll() is not None:
        pytest.fail("serve exited before the second run")
    run_id = deployment_run(prefect_api, "n_tasks=3", 'overrides=["run.run_id=ui-custom-1"]')
    with get_client(sync_client=True) as client:
        run = wait_for_final_state(client, run_id, served_run["log"])
    assert run.state.is_completed()
    n = query(str(served_run["lake"]), "SELECT count(*) AS n FROM trajectories WHERE run_id = 'ui-custom-1'")
    assert n.to_pylist()[0]["n"] == 3


@pytest.mark.parametrize("bad_id,param,said", [
    ("ui-bad-1", 'overrides=["generate.ntasks=5", "run.run_id=ui-bad-1"]', "unknown config key 'generate.ntasks'"),
    ("ui-bad-2", 'overrides=["serve.limit=4", "run.run_id=ui-bad-2"]', "override of [serve]"),
])
def test_a_bad_override_or_a_partial_cfg_fails_the_run_naming_it(served_run, prefect_api, bad_id, param, said):
    from prefect.client.orchestration import get_client

    if served_run["proc"].poll() is not None:
        pytest.fail("serve exited before the run")
    run_id = deployment_run(prefect_api, param)
    with get_client(sync_client=True) as client:
        run = wait_for_final_state(client, run_id, served_run["log"], timeout_s=120)
        assert run.state.is_failed(), run.state_name
        message = str(run.state.result(raise_on_failure=False))
    assert said in message, message
    assert not (served_run["lake"] / "runs" / bad_id).exists()  # refused before anything was written


def test_a_partial_cfg_is_refused_by_the_cli_and_fails_a_run_made_through_the_api(served_run, prefect_api):
    """`--param cfg=...` (the issue's run that silently dropped the served config) is refused at creation: cfg is
    not a parameter of the form. Through the API, where nothing checks names, the run fails before writing."""
    from prefect.client.orchestration import get_client

    argv = [PREFECT, "deployment", "run", DEPLOYMENT, "--param", 'cfg={"generate": {"n_tasks": 12}}']
    done = subprocess.run(argv, env={**os.environ, "PREFECT_API_URL": prefect_api}, capture_output=True,
                          text=True, check=False, timeout=120)
    assert done.returncode != 0 and "not found on the deployment: 'cfg'" in done.stdout + done.stderr
    with get_client(sync_client=True) as client:
        fr = client.create_flow_run_from_deployment(
            served_run["deployment"].id, parameters={"cfg": {"generate": {"n_tasks": 12},
                                                             "run": {"run_id": "ui-bad-3"}}})
        run = wait_for_final_state(client, fr.id, served_run["log"], timeout_s=120)
        assert run.state.is_failed(), run.state_name
        message = str(run.state.result(raise_on_failure=False))
    assert "holds the served config" in message and "--param n_tasks=12" in message, message
    assert not (served_run["lake"] / "runs" / "ui-bad-3").exists()
