"""A `process` work pool end to end, as the README's scale-out steps have a user do it, through a real Prefect
server (the session's, conftest.prefect_api, loopback) and the real console scripts:
`prefect work-pool create NAME --type process`, `flywheel deploy --work-pool NAME --config FILE --flow generate`
(which sets the concurrency limits to the config and exits), `prefect worker start --pool NAME --type process`
in the background from another working directory, `prefect deployment run generate/NAME --param n_tasks=3`: the
worker picks the run up and runs it in a subprocess of its own, the run completes, and `flywheel sql` finds its
rows in the deployed lake with the deployed config's other values. Bad input to `flywheel deploy` (no server, an
unknown pool) is one `error:` line and exit 2. The worker runs in its own process group with a marker in its
environment; at the end (pass or fail) the group is stopped and the test checks that no process carrying the
marker is left.

Sandboxes are the local (bubblewrap) backend and the teacher is the offline reference policy, to stay well
under two minutes on CI's two cores.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.conftest import FLYWHEEL, in_background
from tests.flows.test_kill import processes_with

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

PREFECT = str(Path(sys.executable).with_name("prefect"))
POOL = "flywheel-e2e-pool"
NAME = "pool-e2e"  # [serve] name: its own deployment names, apart from test_serve_e2e's generate/flywheel
DEPLOYMENT = f"generate/{NAME}"


def write_config(path: Path, lake: Path) -> Path:
    path.write_text(f'[run]\nout = "{lake}"\nmax_workers = 2\n\n'
                    '[generate]\nn_tasks = 2\nsamples = 1\n\n[rollout]\nconcurrency = 2\nbatch_size = 2\n\n'
                    '[teacher]\nkind = "reference"\nseed = 3\n\n[sandbox]\nbackend = "local"\n\n'
                    f'[serve]\nname = "{NAME}"\nflows = ["generate"]\n\n'
                    '[limits]\nsandbox_slots = 9\n')  # above every test's concurrency: harmless to the session
    return path


def cli(*argv: str, env: dict, cwd: Path | None = None, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          check=False)


@contextmanager
def worker(env: dict, cwd: Path):
    """`prefect worker start --pool POOL --type process` in its own process group; yields (process, log path).
    Stopped by its group at the end, SIGTERM then SIGKILL."""
    log_path = cwd / "worker.log"
    argv = [PREFECT, "worker", "start", "--pool", POOL, "--type", "process", "--limit", "1"]
    with in_background(argv, log_path, cwd=cwd, env=env) as proc:
        yield proc, log_path


def wait_for_final_state(client, flow_run_id: str, proc, log_path: Path, timeout_s: float = 240):
    deadline = time.time() + timeout_s
    while True:
        run = client.read_flow_run(flow_run_id)
        if run.state and run.state.is_final():
            return run
        if proc.poll() is not None or time.time() > deadline:
            raise AssertionError(f"flow run {flow_run_id} still {run.state_name} after {timeout_s}s (worker exit "
                                 f"code {proc.poll()}); worker log:\n{log_path.read_text()[-4000:]}")
        time.sleep(1)


def test_deploy_needs_a_server_and_an_existing_pool(prefect_api, tmp_path):
    config = write_config(tmp_path / "flywheel.toml", tmp_path / "lake")
    no_server = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    p = cli(FLYWHEEL, "deploy", "--work-pool", POOL, "--config", str(config), env=no_server)
    assert p.returncode == 2, p.stderr
    assert p.stderr.strip().splitlines()[-1].startswith("error: no Prefect server: run `flywheel server start`")
    p = cli(FLYWHEEL, "deploy", "--work-pool", "no-such-pool", "--config", str(config),
            env={**os.environ, "PREFECT_API_URL": prefect_api})
    assert p.returncode == 2, p.stderr
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith("error: work pool 'no-such-pool' does not exist") and "prefect work-pool create" in last


def test_a_process_worker_picks_up_a_deployment_run_and_writes_rows(prefect_api, tmp_path):
    from prefect.client.orchestration import get_client

    marker = uuid.uuid4().hex
    env = {**os.environ, "PREFECT_API_URL": prefect_api, "PYTHONUNBUFFERED": "1", "FW_KILL_TEST": marker,
           "PREFECT_WORKER_QUERY_SECONDS": "2"}  # poll every 2 s (default 10) to keep the test short
    lake = tmp_path / "lake"
    config = write_config(tmp_path / "flywheel.toml", lake)
    elsewhere = tmp_path / "worker-cwd"  # entrypoints are module paths: no checkout or cwd needed
    elsewhere.mkdir()

    t0 = time.perf_counter()
    p = cli(PREFECT, "work-pool", "create", POOL, "--type", "process", "--overwrite", env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    p = cli(FLYWHEEL, "deploy", "--work-pool", POOL, "--config", str(config), "--flow", "generate", env=env)
    assert p.returncode == 0, p.stderr
    assert f"registered generate/{NAME} on work pool {POOL} (process)" in p.stdout
    assert "concurrency limits: flywheel-gpu=1, flywheel-sandbox=9" in p.stdout  # set to the config, as serve does
    t_deployed = time.perf_counter() - t0
    try:
        with worker(env, elsewhere) as (proc, log_path), get_client(sync_client=True) as client:
            dep = client.read_deployment_by_name(DEPLOYMENT)
            assert dep.work_pool_name == POOL
            assert client.read_global_concurrency_limit_by_name("flywheel-sandbox").limit == 9
            done = cli(PREFECT, "deployment", "run", DEPLOYMENT, "--param", "n_tasks=3",
                       "--param", 'overrides=["run.run_id=pool-run-1"]', env=env)
            assert done.returncode == 0, done.stdout + done.stderr
            run_id = re.search(r"UUID: ([0-9a-f-]{36})", done.stdout).group(1)
            run = wait_for_final_state(client, run_id, proc, log_path)
            t_done = time.perf_counter() - t0
            log = log_path.read_text()
            assert run.state.is_completed(), f"{run.state_name}: {run.state.message}\n{log[-4000:]}"
            assert run.work_pool_name == POOL and run.deployment_id == dep.id
            # the worker ran it in a process of its own ("hostname:pid" of that process)
            assert run.infrastructure_pid and run.infrastructure_pid.split(":")[-1] != str(proc.pid)
            assert run_id in log, log[-4000:]
    finally:
        deadline = time.monotonic() + 20
        while processes_with(marker) and time.monotonic() < deadline:
            time.sleep(0.2)
        leftover = processes_with(marker)
        for line in leftover:  # do not leave them to the rest of the session, then fail below
            try:
                os.kill(int(line.split()[0]), signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert leftover == [], leftover
    print(f"deployed after {t_deployed:.1f}s, run completed by the worker after {t_done:.1f}s")

    # rows in the deployed lake, seen as a user sees them; the deployed samples=1, the run's n_tasks=3
    q = cli(FLYWHEEL, "sql", "--root", str(lake), "--format", "json",
            "SELECT trajectory_id, sample_index, verdict FROM trajectories WHERE run_id = 'pool-run-1'", env=env)
    assert q.returncode == 0, q.stderr
    rows = json.loads(q.stdout)
    assert len(rows) == 3 and len({r["trajectory_id"] for r in rows}) == 3
    assert {r["sample_index"] for r in rows} == {0} and all(r["verdict"] for r in rows)
    assert not (elsewhere / "runs").exists()  # not under the worker's working directory
    saved = (lake / "runs" / "pool-run-1" / "config.toml").read_text()
    assert "n_tasks = 3" in saved and "seed = 3" in saved and 'backend = "local"' in saved
