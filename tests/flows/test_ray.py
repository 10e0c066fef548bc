"""Scale-out: the generate flow's rollouts on a real Ray cluster (on this machine) give the same rows as threads.

A head node is started with `ray start --head --block` in its own process group (killed at the end, by that group
only), the flow runs twice with the reference teacher (seeded noise, so verdicts vary) and real Docker sandboxes:
once on the capped thread runner, once with `run.ray_address` pointing at the cluster. Same run id, two lake
roots: the rows must match id for id, verdict for verdict. Each chunk reports the process that ran it: the thread
run's chunks ran in this process, the Ray run's in other processes (Ray's workers), so a run that silently fell
back to threads fails. Not Ray's timeline: its task events reach the GCS from the workers in batches and are not
kept for good (CI once saw 1 of 2 rollout tasks; loops under load saw one never appear in 60 s of polling, and one
seen earlier gone a minute later).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.docker]

RAY = str(Path(sys.executable).with_name("ray"))
CHUNKS = 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ray_cluster():
    """A one-node Ray cluster with 2 CPUs; yields its GCS address (127.0.0.1:PORT)."""
    try:
        import prefect_ray  # noqa: F401
    except ImportError:
        pytest.fail("the ray extra is not installed: pip install -e '.[ray]' (prefect-ray and ray)")
    # Ray's unix sockets live under the temp dir and their paths must stay short: not under pytest's tmp_path
    tmp = tempfile.mkdtemp(prefix="ray-", dir="/tmp")
    port, client_port = _free_port(), _free_port()
    log = open(os.path.join(tmp, "head.log"), "w")  # noqa: SIM115 - closed in the finally below
    proc = subprocess.Popen(
        [RAY, "start", "--head", "--block", "--node-ip-address", "127.0.0.1", "--port", str(port),
         "--ray-client-server-port", str(client_port), "--num-cpus", "2", "--include-dashboard=false",
         "--disable-usage-stats", "--temp-dir", tmp],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"})
    deadline = time.time() + 120
    try:
        while "Ray runtime started" not in Path(tmp, "head.log").read_text():
            if proc.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"ray head did not start: {Path(tmp, 'head.log').read_text()[-3000:]}")
            time.sleep(0.5)
        yield f"127.0.0.1:{port}"
    finally:
        for sig, wait_s in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(timeout=wait_s)
                time.sleep(1)  # the group's other members (gcs_server, raylet, workers) exit with the head
            except subprocess.TimeoutExpired:
                continue
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # whatever of OUR group is still there
        except ProcessLookupError:
            pass
        log.close()
        shutil.rmtree(tmp, ignore_errors=True)


def _cfg(root: Path, ray_address: str | None):
    from flows.config import FlywheelConfig

    return FlywheelConfig.model_validate({
        "run": {"run_id": "ray-vs-threads", "out": str(root), "ray_address": ray_address, "max_workers": 2},
        "generate": {"n_tasks": 4, "samples": 1, "chunks": CHUNKS},
        "rollout": {"concurrency": 2, "batch_size": 2},
        "teacher": {"kind": "reference", "seed": 3, "noise": {"wrong_answer": 0.3, "no_tool": 0.2}},
        "sandbox": {"backend": "docker"},
    })


def _rows(root: Path) -> list[dict]:
    from warehouse.query import query

    return query(str(root), "SELECT trajectory_id, task_id, policy, verdict, success, reward FROM trajectories "
                            "ORDER BY trajectory_id").to_pylist()


def test_generate_rollouts_on_ray_equal_threads(prefect_api, ray_cluster, tmp_path):
    from flows.generate import generate_flow
    from flows.runners import make_task_runner

    t0 = time.perf_counter()
    threads_cfg = _cfg(tmp_path / "threads", None)
    s_threads = generate_flow.with_options(task_runner=make_task_runner(None, 2))(threads_cfg)
    t1 = time.perf_counter()
    ray_cfg = _cfg(tmp_path / "ray", ray_cluster)
    s_ray = generate_flow.with_options(task_runner=make_task_runner(ray_cluster))(ray_cfg)
    t2 = time.perf_counter()
    print(f"threads {t1 - t0:.1f}s, ray {t2 - t1:.1f}s (cluster already up)")

    rows_threads, rows_ray = _rows(tmp_path / "threads"), _rows(tmp_path / "ray")
    assert len(rows_threads) == 4 and s_threads.episodes == s_ray.episodes == 4
    assert rows_ray == rows_threads
    assert len({r["verdict"] for r in rows_threads}) > 1, "noise should give more than one verdict"
    me = f"{socket.gethostname()}:{os.getpid()}"
    assert s_threads.ran_on == [me] * CHUNKS
    assert len(s_ray.ran_on) == CHUNKS and me not in s_ray.ran_on, f"the chunks did not run on Ray: {s_ray.ran_on}"
