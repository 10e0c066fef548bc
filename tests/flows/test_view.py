"""`flywheel view` for real: the console script serves a small real lake on a free loopback port; plain HTTP
requests check every page type, filters, sorting, paging and the error pages (status and message, never a stack
trace), and headless Chromium opens an episode with a tool call and a forensics finding, checks what a person
sees and keeps screenshots in $FLYWHEEL_TEST_OUTPUT (default /tmp/flywheel-test-output)/view/.

The lake: real episodes of the built-in arithmetic and code suites in bubblewrap sandboxes (reference teacher with
injected wrong answers and reward hacks in round 0; a reference policy as "student" in round 1), judged by the
real verifiers and forensics, written by the lake's writer, and a snapshot curated from round 0.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e]

FLYWHEEL = str(Path(sys.executable).with_name("flywheel"))
RUN_ID = "view-run"
OUT = Path(os.environ.get("FLYWHEEL_TEST_OUTPUT", "/tmp/flywheel-test-output")) / "view"


def build_lake(root: str, n_tasks: int = 3) -> dict:
    """Write the small lake under root (see the module docstring); returns the snapshot id and a hacked episode
    that has tool calls and forensics findings."""
    from agents.config import PolicyConfig, ReferenceNoise, build_policy
    from agents.rollout import rollout
    from curate.config import CurateConfig
    from curate.stage import curate
    from sandbox.backend import open_backend
    from sandbox.result import SandboxConfig
    from tasks.suites import load_suite
    from warehouse.lake import write_trajectories
    from warehouse.query import query

    tasks = load_suite("arithmetic", n_tasks, seed=3) + load_suite("code", n_tasks, seed=3)
    teacher = build_policy(PolicyConfig(kind="reference", name="ref-teacher", seed=1, noise=ReferenceNoise(
        wrong_answer=0.15, no_tool=0.15, exit_hack=0.3)))
    student = build_policy(PolicyConfig(kind="reference", name="ref-student", source="student", seed=2,
                                        noise=ReferenceNoise(wrong_answer=0.3)))
    with open_backend(SandboxConfig(backend="local"), pool_size=2) as backend:
        for rnd, policy, samples in ((0, teacher, 3), (1, student, 2)):
            asyncio.run(rollout(tasks, [policy], backend, samples=samples, concurrency=2, run_id=RUN_ID, round=rnd,
                                on_rows=lambda rows: write_trajectories(root, rows), max_turns=6))
    snap = curate(root, CurateConfig(), run_id=RUN_ID, round=0,
                  heldout_tasks=load_suite("arithmetic", 2, split="heldout", seed=3))
    hacked = query(root, """SELECT trajectory_id, task_id, hack_flags FROM trajectories
                            WHERE verdict = 'hack' AND suite = 'code' AND n_tool_calls > 0
                            ORDER BY trajectory_id LIMIT 1""").to_pylist()
    assert hacked, "the lake has no hacked code episode with a tool call: raise exit_hack"
    return {"root": root, "snapshot_id": snap.snapshot_id, "hacked": hacked[0], "n_dropped": sum(
        snap.dropped_by_reason.values())}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`flywheel view` in its own process group; `url` once it answers."""

    def __init__(self, root: str, log: Path):
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log
        self.log = open(log, "w")  # noqa: SIM115 - closed by stop()
        self.proc = subprocess.Popen([FLYWHEEL, "view", "--root", root, "--port", str(self.port)],
                                     stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.time() + 60
        while True:
            try:
                with urllib.request.urlopen(self.url + "/", timeout=5):
                    return
            except urllib.error.HTTPError:
                return
            except OSError:
                if self.proc.poll() is not None or time.time() > deadline:
                    self.stop()
                    raise RuntimeError(f"flywheel view did not start: {log.read_text()[-3000:]}") from None
                time.sleep(0.3)

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(self.url + path, timeout=30) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def stop(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=20)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        self.log.close()


@pytest.fixture(scope="module")
def lake(tmp_path_factory):
    root = tmp_path_factory.mktemp("view") / "lake"
    return build_lake(str(root))


@pytest.fixture(scope="module")
def server(lake, tmp_path_factory):
    s = Server(lake["root"], tmp_path_factory.mktemp("view-log") / "view.log")
    yield s
    s.stop()


def q(path: str, **params) -> str:
    return path + "?" + urllib.parse.urlencode(params)


def _no_trace(body: str) -> None:
    assert "Traceback (most recent call last)" not in body and 'File "/' not in body, body[:2000]


def test_runs_run_and_snapshot_pages(server, lake):
    code, body = server.get("/")
    assert code == 200 and RUN_ID in body and "30 episodes" in body
    code, body = server.get(f"/runs/{RUN_ID}")
    assert code == 200
    assert "Episodes per round" in body and "teacher" in body and "student" in body
    assert lake["snapshot_id"] in body
    code, body = server.get(f"/snapshots/{lake['snapshot_id']}")
    assert code == 200 and "Mix by source" in body and "Drops by reason" in body
    assert "hack_flags" in body or "verdict" in body  # the filters' drop reasons of the hacked rows
    left_out = body.split('id="left-out" href="', 1)[1].split('"', 1)[0].replace("&amp;", "&")
    code, body = server.get(left_out)
    assert code == 200, body[:2000]
    assert f"<strong>{lake['n_dropped']}</strong> episodes" in body
    code, body = server.get(f"/snapshots/{lake['snapshot_id']}")
    hack_link = body.split("verdict=hack", 1)[0].rsplit('href="', 1)[1] + "verdict=hack" + \
        body.split("verdict=hack", 1)[1].split('"', 1)[0]
    code, body = server.get(hack_link.replace("&amp;", "&"))
    n_hack = body.split("<strong>", 1)[1].split("</strong>", 1)[0]
    assert code == 200 and 'class="badge pass"' not in body and int(n_hack) > 0


def test_episode_list_filters_sort_and_pages(server, lake):
    code, body = server.get(q("/episodes", verdict="hack"))
    assert code == 200 and 'class="badge pass"' not in body.split('id="episodes"', 1)[1]
    n_hack = int(body.split("<strong>", 1)[1].split("</strong>", 1)[0])
    flag = lake["hacked"]["hack_flags"][0]
    code, body = server.get(q("/episodes", verdict="hack", hack=flag))
    assert code == 200 and flag in body
    n_flag = int(body.split("<strong>", 1)[1].split("</strong>", 1)[0])
    assert 0 < n_flag <= n_hack
    code, body = server.get(q("/episodes", where="n_tool_calls = 0 AND verdict = 'hack'", sort="reward", desc=0))
    assert code == 200 and "no_tool_use" in body
    code, p1 = server.get(q("/episodes", per_page=25, sort="trajectory_id", desc=0))
    code2, p2 = server.get(q("/episodes", per_page=25, sort="trajectory_id", desc=0, page=2))
    assert code == code2 == 200 and "page 1 of 2" in p1 and "page 2 of 2" in p2
    ids1 = {s.split('"')[0] for s in p1.split('href="/episodes/')[1:]}
    ids2 = {s.split('"')[0] for s in p2.split('href="/episodes/')[1:]}
    assert len(ids1) == 25 and len(ids2) == 5 and not ids1 & ids2


def test_episode_and_task_pages(server, lake):
    tid, task = lake["hacked"]["trajectory_id"], lake["hacked"]["task_id"]
    code, body = server.get(f"/episodes/{tid}")
    assert code == 200
    for needle in ("Forensics findings", "Conversation", "Provenance", "ref-teacher", "tests passed",
                   'class="code"', lake["hacked"]["hack_flags"][0]):
        assert needle in body, needle
    code, body = server.get(f"/tasks/{task}")
    assert code == 200 and "Teacher vs student" in body and "ref-teacher" in body and "ref-student" in body
    assert "pass@k" in body


@pytest.mark.parametrize("path,status,message", [
    ("/episodes/0123456789abcdef", 404, "is not in this lake"),
    ("/tasks/no-such-task", 404, "has no episodes in this lake"),
    ("/snapshots/nope", 404, "is not in this lake"),
    ("/runs/nope", 404, "is not in this lake"),
    ("/nope", 404, "there is no page at /nope"),
    ("/episodes?sort=evil", 400, "cannot sort by"),
    ("/episodes?page=x", 400, "bad query parameter"),
    ("/episodes?per_page=7", 400, "per_page must be one of"),
    ("/episodes?round=one", 400, "round must be a whole number"),
    ("/episodes?" + urllib.parse.urlencode({"where": "verdict = "}), 400, "does not parse"),
    ("/episodes?" + urllib.parse.urlencode({"where": "no_such_column = 1"}), 400, "failed"),
    ("/episodes?" + urllib.parse.urlencode({"where": "1=1) UNION SELECT 'x' WHERE (1=1"}), 400,
     "must be one condition"),
    ("/episodes?" + urllib.parse.urlencode({"where": "1=1); DROP VIEW trajectories; SELECT (1"}), 400,
     "must be one condition"),
    ("/episodes?" + urllib.parse.urlencode({"where": "1=1) --"}), 400, "does not parse"),
    ("/episodes?" + urllib.parse.urlencode({"where": "trajectory_id IN (SELECT content FROM read_text('/etc/passwd'))"}),
     400, "Permission"),
])
def test_bad_input_answers_a_clear_page_with_its_status(server, path, status, message):
    code, body = server.get(path)
    assert code == status, (path, code, body[:1500])
    assert message in body.replace("&#39;", "'"), body[:3000]
    _no_trace(body)


def test_empty_lake_and_unknown_root(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    s = Server(str(empty), tmp_path / "empty.log")
    try:
        code, body = s.get("/")
        assert code == 200 and "This lake is empty" in body
        code, body = s.get("/episodes")
        assert code == 200 and "No episode matches" in body
    finally:
        s.stop()
    r = subprocess.run([FLYWHEEL, "view", "--root", str(tmp_path / "missing"), "--port", str(_free_port())],
                       capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 2 and "error: lake root" in r.stderr and "does not exist" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_port_in_use_is_one_error_line(tmp_path):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        r = subprocess.run([FLYWHEEL, "view", "--root", str(tmp_path), "--port", str(port)],
                           capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 2 and f"cannot listen on 127.0.0.1:{port}" in r.stderr, r.stderr


def test_the_view_writes_nothing_into_the_lake(server, lake):
    def listing() -> dict[str, float]:
        return {str(p): p.stat().st_mtime for p in Path(lake["root"]).rglob("*")}

    before = listing()
    for path in ("/", f"/runs/{RUN_ID}", "/episodes", f"/episodes/{lake['hacked']['trajectory_id']}",
                 f"/snapshots/{lake['snapshot_id']}"):
        assert server.get(path)[0] == 200
    assert listing() == before


@pytest.mark.slow
def test_episode_page_in_a_real_browser(server, lake, browser, tmp_path):
    tid, flag = lake["hacked"]["trajectory_id"], lake["hacked"]["hack_flags"][0]
    shots: list[Path] = []
    try:
        browser.goto(q(server.url + "/episodes", verdict="hack", hack=flag))
        browser.wait_for_text("Episodes", flag, "hack code", timeout_s=30)
        shots.append(browser.screenshot(tmp_path / "1-episodes-hack-filter.png"))
        rows = browser.eval("[...document.querySelectorAll('#episodes tr')].slice(1).map(r => r.innerText)")
        assert rows and all(flag in r and "hack" in r for r in rows), rows

        browser.goto(f"{server.url}/episodes/{tid}")
        body = browser.wait_for_text("Forensics findings", "Conversation", timeout_s=30)
        for needle in ("Outcome", "Cost", "Provenance", "verdict", "reward", "tests passed", flag, "python",
                       "ref-teacher", "turn"):
            assert needle in body, needle
        # a tool call's code is highlighted (pygments spans inside the call), a tool output is shown
        assert browser.eval("document.querySelectorAll('.call pre.code span').length") > 0
        assert browser.eval("document.querySelectorAll('.msg.tool').length") > 0
        # the finding links to the turn it names, and that turn is marked
        assert browser.eval("document.querySelectorAll('.finding a[href^=\"#m\"]').length") > 0
        assert browser.eval("document.querySelectorAll('.msg.flagged').length") > 0
        shots.append(browser.screenshot(tmp_path / "2-episode.png", full_page=True))

        for name, path, needles in (("3-task", f"/tasks/{lake['hacked']['task_id']}", ("Teacher vs student",
                                                                                       "ref-student")),
                                    ("4-snapshot", f"/snapshots/{lake['snapshot_id']}", ("Mix by source",
                                                                                         "Drops by reason")),
                                    ("5-run", f"/runs/{RUN_ID}", ("Episodes per round", "Snapshots"))):
            browser.goto(server.url + path)
            browser.wait_for_text(*needles, timeout_s=30)
            shots.append(browser.screenshot(tmp_path / f"{name}.png"))
    finally:
        OUT.mkdir(parents=True, exist_ok=True)
        kept = [shutil.copy(s, OUT / s.name) for s in shots]
        print(f"screenshots: {', '.join(map(str, kept))}")
    for s in shots:
        assert s.stat().st_size > 10_000, f"{s} looks blank"


def test_artifact_links_open_viewer_pages(server, lake):
    import re

    from flows.artifacts import viewer_links

    assert viewer_links(None, RUN_ID) == ""
    md = viewer_links(server.url + "/", RUN_ID, [lake["snapshot_id"]])
    urls = re.findall(r"\]\((http[^)]+)\)", md)
    assert len(urls) == 5
    for url in urls:
        code, body = server.get(url[len(server.url):])
        assert code == 200, (url, body[:1000])


def test_a_corrupt_file_is_skipped_and_left_in_place(lake, tmp_path):
    root = tmp_path / "lake"
    shutil.copytree(lake["root"], root)
    bad = root / "trajectories" / f"run={RUN_ID}" / "round=0" / "part-zzzz-torn.parquet"
    bad.write_bytes(b"PAR1" + b"\0" * 64)  # a torn write: no footer
    s = Server(str(root), tmp_path / "corrupt.log")
    try:
        code, body = s.get("/")
        assert code == 200 and "30 episodes" in body, body[:2000]
    finally:
        s.stop()
    assert bad.exists() and not (root / "quarantine").exists()
    assert "skipping corrupt lake file" in s.log_path.read_text()


def _same_pages(root: str, combos: list[dict]) -> int:
    """Compare episode_list's rows (page_rows: bounded in two steps) with the straightforward one-statement page
    of list_sql for every combination; returns how many non-empty pages were compared."""
    from warehouse.viewer import EpisodeQuery, episode_list, list_sql, open_view

    con = open_view(root)
    compared = 0
    try:
        for c in combos:
            q = EpisodeQuery(**c)
            page_sql, count_sql, params = list_sql(con, q)
            cur = con.execute(page_sql, params)
            cols = [d[0] for d in cur.description]
            want = [dict(zip(cols, r, strict=True)) for r in cur.fetchall()]
            got = episode_list(con, q)
            assert got["rows"] == want, c
            assert got["total"] == con.execute(count_sql, params).fetchall()[0][0], c
            compared += bool(want)
    finally:
        con.close()
    return compared


def test_the_bounded_page_query_answers_exactly_the_straightforward_rows(lake, tmp_path):
    """On the run's lake and on a 400-row lake (benchmarks/warehouse.py's rows, the lake's writer): every sort
    column both ways, ties (verdict, suite, reward, round), filters, hack code, a free WHERE, the first, middle,
    last and past-the-end pages, and one past BOUND_MAX_ROWS."""
    from benchmarks.warehouse import synthetic_trajectory
    from warehouse.lake import write_trajectories
    from warehouse.viewer import SORTABLE

    big = str(tmp_path / "lake")
    for start in (0, 200):
        write_trajectories(big, [synthetic_trajectory(i, tasks_per_suite=20) for i in range(start, start + 200)])
    flag = lake["hacked"]["hack_flags"][0]
    narrows = [{}, {"filters": {"verdict": "fail"}}, {"filters": {"source": "student", "round": "2"}},
               {"where": "prompt_tokens > 600 OR verdict = 'pass'"}]
    combos = [{**n, "sort": s, "desc": d, "page": p, "per_page": 25}
              for n in narrows for s in sorted(SORTABLE) for d, pages in ((True, (1, 16)), (False, (5, 17)))
              for p in pages]
    combos.append({"page": 501, "per_page": 200})  # past BOUND_MAX_ROWS: the plain page
    assert _same_pages(big, combos) > len(combos) // 3
    small = [{**n, "sort": s, "desc": d, "page": p, "per_page": 25}
             for n in ({}, {"filters": {"verdict": "hack"}, "hack": flag}, {"where": "n_tool_calls > 0"})
             for s in ("reward", "verdict", "created_at", "task_id") for d in (True, False) for p in (1, 2)]
    assert _same_pages(lake["root"], small) > len(small) // 2
