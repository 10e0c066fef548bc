"""The lake on an S3 API, end to end: a real S3-compatible server on loopback (moto's server mode, `moto_server`
in a process of its own on 127.0.0.1) reached through s3fs, configured as the README says (AWS_ENDPOINT_URL and
the AWS credential variables, read by botocore under s3fs; DuckDB reads through the same fsspec filesystem).

Through the console script, as a user runs it: `flywheel generate --out s3://BUCKET/lake`, `flywheel sql`,
`flywheel curate`, `flywheel export` (a local file; an s3:// output is refused), and kill-and-resume (SIGKILL of
a generate once its first batch is in the bucket, then the same command again: every row once, none lost). In
process, against the same server, the faults of the object-storage path fixed in warehouse/lakefs.py: a write
that fails part-way publishes nothing; a listing sees files another process wrote after this one had listed; a
torn object is quarantined with its reason.

Commands report to the session's Prefect server (conftest.prefect_api) instead of each starting its own, to stay
near a minute on CI's two cores; sandboxes are the local backend, the teacher the reference policy.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

from tests.conftest import FLYWHEEL, free_port, in_background

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

MOTO = str(Path(sys.executable).with_name("moto_server"))


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """moto_server on 127.0.0.1:PORT with one fresh bucket; this process's environment points s3fs at it (and
    so does every child's). Yields {"bucket", "env", "fs", "log"}; the server's process group is stopped after."""
    port = free_port()
    log_path = tmp_path_factory.mktemp("moto") / "moto.log"
    env = {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ACCESS_KEY_ID": "testing",
           "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
    saved = {k: os.environ.get(k) for k in env}
    with in_background([MOTO, "-H", "127.0.0.1", "-p", str(port)], log_path) as proc:
        deadline = time.time() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{env['AWS_ENDPOINT_URL']}/moto-api/", timeout=2):
                    break
            except OSError:
                if proc.poll() is not None or time.time() > deadline:
                    raise RuntimeError(f"moto_server did not start: {log_path.read_text()[-2000:]}") from None
                time.sleep(0.3)
        os.environ.update(env)
        try:
            import s3fs

            fs = s3fs.S3FileSystem(skip_instance_cache=True)
            bucket = f"lake-{uuid.uuid4().hex[:10]}"
            fs.mkdir(bucket)
            yield {"bucket": bucket, "env": env, "fs": fs, "log": log_path}
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


def flywheel(s3, api: str, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, **s3["env"], "PREFECT_API_URL": api}
    return subprocess.run([FLYWHEEL, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=300,
                          check=False)


def sql(s3, api: str, root: str, q: str) -> list[dict]:
    p = flywheel(s3, api, "sql", "--root", root, "--format", "json", q)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


GENERATE = ["generate", "--samples", "1", "--backend", "local", "--teacher", "reference"]


def test_generate_sql_curate_export_on_s3(s3, prefect_api, tmp_path):
    root = f"s3://{s3['bucket']}/lake"
    p = flywheel(s3, prefect_api, *GENERATE, "--n-tasks", "4", "--run-id", "s3-a", "--out", root, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "rows written 4, already present 0" in p.stdout
    assert not (tmp_path / "s3:").exists() and not (tmp_path / "runs").exists()  # nothing local
    files = s3["fs"].find(f"{s3['bucket']}/lake/trajectories/run=s3-a")
    assert files and all(f.endswith(".parquet") for f in files), files
    assert s3["fs"].exists(f"{s3['bucket']}/lake/runs/s3-a/config.toml")

    rows = sql(s3, prefect_api, root, "SELECT trajectory_id, verdict, run_id, round FROM trajectories")
    assert len(rows) == 4 and len({r["trajectory_id"] for r in rows}) == 4
    assert {(r["run_id"], r["round"]) for r in rows} == {("s3-a", 0)} and all(r["verdict"] for r in rows)

    c = flywheel(s3, prefect_api, "curate", "--run-id", "s3-a", "--round", "0", "--out", root, cwd=tmp_path)
    assert c.returncode == 0, c.stderr
    summary = json.loads(c.stdout[c.stdout.index("{"):c.stdout.index("}\n") + 1])
    snap, n_selected = summary["snapshot_id"], summary["n_selected"]
    assert n_selected >= 1
    assert s3["fs"].exists(f"{s3['bucket']}/lake/snapshots/{snap}/manifest.parquet")
    (listed,) = sql(s3, prefect_api, root, f"SELECT n_rows FROM datasets WHERE snapshot_id = '{snap}'")
    assert listed["n_rows"] == n_selected

    out = tmp_path / "snap.jsonl"
    e = flywheel(s3, prefect_api, "export", str(out), "--root", root, "--snapshot", snap, cwd=tmp_path)
    assert e.returncode == 0, e.stderr
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(lines) == n_selected and all(x["messages"] and "weight" in x for x in lines)

    # an object-store output is refused (it used to land in a local folder named "s3:")
    bad = flywheel(s3, prefect_api, "export", f"s3://{s3['bucket']}/out.jsonl", "--root", root, "--snapshot", snap,
                   cwd=tmp_path)
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines()[-1].startswith("error: output 's3://") and "local path" in bad.stderr
    assert not (tmp_path / "s3:").exists() and not s3["fs"].exists(f"{s3['bucket']}/out.jsonl")


def test_sigkill_mid_rollout_then_resume_on_s3(s3, prefect_api, tmp_path):
    """SIGKILL once the first batch is in the bucket, then the same command: every episode once, none lost.
    Concurrency limits are off here: on the shared server a killed holder's leases take ~75 s to expire, and
    that path is tests/flows/test_kill.py's subject."""
    root, n = f"s3://{s3['bucket']}/kill", 40
    argv = [FLYWHEEL, *GENERATE, "--n-tasks", str(n), "--run-id", "s3-kill", "--out", root, "--concurrency", "2",
            "--set", "rollout.batch_size=2", "--set", "limits.enabled=false"]
    env = {**os.environ, **s3["env"], "PREFECT_API_URL": prefect_api}
    with open(tmp_path / "killed.out", "w") as o, open(tmp_path / "killed.err", "w") as e:
        p = subprocess.Popen(argv, env=env, cwd=tmp_path, stdout=o, stderr=e)
    part = f"{s3['bucket']}/kill/trajectories/run=s3-kill"
    deadline = time.monotonic() + 180
    try:
        while not s3["fs"].find(part):
            assert p.poll() is None, (tmp_path / "killed.err").read_text()[-3000:]
            assert time.monotonic() < deadline, "no batch reached the bucket"
            time.sleep(0.1)
            s3["fs"].invalidate_cache()
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=30)
    assert p.returncode == -signal.SIGKILL, "generate finished before the kill: raise n"

    before = sql(s3, prefect_api, root, "SELECT count(*) AS n, count(DISTINCT trajectory_id) AS ids "
                                        "FROM trajectories_raw")[0]
    assert 0 < before["n"] < n and before["n"] == before["ids"], before
    assert not s3["fs"].exists(f"{s3['bucket']}/kill/quarantine")  # no torn object: nothing to quarantine

    again = subprocess.run(argv, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False)
    assert again.returncode == 0, again.stderr
    assert f"rows written {n - before['n']}, already present {before['n']}" in again.stdout, again.stdout
    after = sql(s3, prefect_api, root, "SELECT count(*) AS n, count(DISTINCT trajectory_id) AS ids, "
                                       "count(DISTINCT task_id) AS tasks FROM trajectories_raw")[0]
    assert after == {"n": n, "ids": n, "tasks": n}, after  # every episode once, also at the file level
    assert not s3["fs"].exists(f"{s3['bucket']}/kill/quarantine")


# ----------------------------------------------------------------------------- the object-storage path, in process

def _rows(n: int, run_id: str):
    from tests.warehouse.conftest import make_trajectory

    return [make_trajectory(i, run_id=run_id, task_id=f"t{i}") for i in range(n)]


def test_a_write_that_fails_part_way_publishes_nothing(s3, monkeypatch):
    """Fault injected with a test double (`failing_write_table`): the Parquet writer dies after writing a
    Parquet-looking head. Before the fix, closing the output stream sent that head as the object."""
    import pyarrow as pa

    from warehouse import lakefs

    lake = lakefs.Lake(f"s3://{s3['bucket']}/torn")
    path = lake.join("trajectories", "run=r", "round=0", "part-x.parquet")

    def failing_write_table(table, where, **kw):
        where.write(b"PAR1" + b"\0" * 4096)
        raise OSError("injected: writer died part-way")

    monkeypatch.setattr(lakefs.pq, "write_table", failing_write_table)
    with pytest.raises(OSError, match="injected"):
        lake.write_parquet_atomic(pa.table({"a": [1, 2, 3]}), path)
    s3["fs"].invalidate_cache()
    assert not s3["fs"].exists(path) and s3["fs"].find(f"{s3['bucket']}/torn") == []


WRITE_ONE = """
import sys
from tests.warehouse.conftest import make_trajectory
from warehouse.lake import write_trajectories
write_trajectories(sys.argv[1], [make_trajectory(9, run_id="r", task_id="late")])
"""


def test_a_listing_sees_what_another_process_wrote_after_it(s3):
    """A long-lived reader (the viewer, a flywheel run) lists, another process writes, the reader lists again.
    Before the fix s3fs answered the new file's open() from the first listing's cache: FileNotFoundError, and
    the file was skipped as vanished, so the reader silently lacked its rows."""
    from warehouse.lake import write_trajectories
    from warehouse.query import query

    root = f"s3://{s3['bucket']}/readers"
    write_trajectories(root, _rows(3, "r"))
    assert query(root, "SELECT count(*) AS n FROM trajectories").to_pylist() == [{"n": 3}]
    env = {**os.environ, **s3["env"], "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[2]),
                                                                     os.environ.get("PYTHONPATH", "")])}
    subprocess.run([sys.executable, "-c", WRITE_ONE, root], env=env, check=True, timeout=120)
    got = query(root, "SELECT task_id FROM trajectories ORDER BY task_id").to_pylist()
    assert [r["task_id"] for r in got] == ["late", "t0", "t1", "t2"]


def test_a_torn_object_is_quarantined_with_its_reason(s3, prefect_api):
    from warehouse.lake import write_trajectories

    root = f"s3://{s3['bucket']}/quar"
    write_trajectories(root, _rows(2, "r"))
    torn = f"{s3['bucket']}/quar/trajectories/run=r/round=0/part-torn.parquet"
    s3["fs"].pipe_file(torn, b"PAR1" + b"\0" * 100)  # a head, no footer
    p = flywheel(s3, prefect_api, "sql", "--root", root, "--format", "json", "SELECT count(*) AS n FROM trajectories")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) == [{"n": 2}]
    assert "quarantined corrupt lake file" in p.stderr and "part-torn.parquet" in p.stderr
    s3["fs"].invalidate_cache()
    assert not s3["fs"].exists(torn)
    moved = [f for f in s3["fs"].find(f"{s3['bucket']}/quar/quarantine") if f.endswith(".reason.txt")]
    assert len(moved) == 1 and "no Parquet magic bytes at the end" in s3["fs"].cat_file(moved[0]).decode()
