"""Benchmark: `flywheel view` page latency on a large lake, next to the same query through `flywheel sql`'s path.

Builds (or reuses, with --reuse) a lake of N synthetic trajectories with benchmarks/warehouse.py's generator and
the lake's own writer (lake.write_trajectories, then compact), starts the real app (`flows.view.create_app`)
under uvicorn on a free loopback port, and times over HTTP, --repeat times each (the first request is warm-up,
not counted):
  list       /episodes (first page, newest first), /episodes?verdict=fail&suite=...&sort=reward (a filtered,
             sorted page), and page 200 of a filtered list
  episode    /episodes/ID for ids spread over the lake
(the first request of each case, which also fills the list's drop-down cache, is printed apart)
next to the same SQL through warehouse.query.query (what `flywheel sql` runs: connect + views + query). For the
list cases it also times, in-process and interleaved, the viewer's two-step page (warehouse.viewer.episode_list:
count, the page's last sort value, the bounded page) against the one-statement page of list_sql (count + page)
on the viewer's own connection: the same rows, before and after that change, under the same load.
Prints a table (median and p95 in ms) and writes JSON (--out).

Usage: python benchmarks/view.py [--n 1000000] [--dir /tmp/fw-bench-view] [--reuse] [--repeat 15] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import sys
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

_HERE = str(Path(__file__).resolve().parent)
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def build(root: str, n: int, batch: int) -> float:
    from benchmarks.warehouse import synthetic_trajectory
    from warehouse.lake import compact, write_trajectories

    t0 = time.perf_counter()
    for start in range(0, n, batch):
        rows = [synthetic_trajectory(i) for i in range(start, min(n, start + batch))]
        write_trajectories(root, rows)
        if (start // batch) % 10 == 9:
            print(f"  {start + len(rows):,} rows written ({time.perf_counter() - t0:.0f} s)", flush=True)
    compact(root)
    return time.perf_counter() - t0


def pctl(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(p * (len(xs) - 1)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--batch", type=int, default=20_000)
    ap.add_argument("--dir", default="/tmp/fw-bench-view")
    ap.add_argument("--reuse", action="store_true", help="reuse DIR/lake if it holds N rows")
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    import uvicorn

    from flows.view import create_app
    from warehouse.query import query
    from warehouse.viewer import EpisodeQuery, episode_list, list_sql, open_view

    root = os.path.join(args.dir, "lake")
    have = 0
    if args.reuse and os.path.isdir(root):
        have = query(root, "SELECT count(*) AS n FROM trajectories").to_pylist()[0]["n"]
    build_s = None
    if have != args.n:
        shutil.rmtree(args.dir, ignore_errors=True)
        os.makedirs(args.dir)
        build_s = build(root, args.n, args.batch)
    n_files = sum(len(f) for _d, _s, f in os.walk(os.path.join(root, "trajectories")))

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(root), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    base = f"http://127.0.0.1:{port}"

    ids = [r["trajectory_id"] for r in query(root, "SELECT trajectory_id FROM trajectories USING SAMPLE 50 ROWS "
                                                   "(reservoir, 7)").to_pylist()]

    def fetch(path: str) -> float:
        t = time.perf_counter()
        with urllib.request.urlopen(base + path, timeout=120) as r:
            body = r.read()
            assert r.status == 200 and b'id="error"' not in body, path
        return time.perf_counter() - t

    first: dict[str, float] = {}

    def timed(fn, k: int, name: str | None = None) -> list[float]:
        t = fn(0)
        if name:
            first[name] = t * 1e3
        return [fn(i + 1) for i in range(k)]

    def sql_of(q: EpisodeQuery) -> tuple[str, list]:
        con = open_view(root)
        try:
            page, count, params = list_sql(con, q)
        finally:
            con.close()
        return page, count, params

    def duck(sql: str, params: list) -> float:
        t = time.perf_counter()
        query(root, sql, params)
        return time.perf_counter() - t

    cases = {
        "list: first page": {"verdict": ""},
        "list: verdict+suite, sort reward": {"verdict": "fail", "suite": "code-fix", "sort": "reward"},
        "list: page 200 of a filter": {"source": "student", "page": 200},
        "list: hack code + WHERE": {"hack": "edited_tests", "where": "prompt_tokens > 800"},
    }
    def one_statement(q: EpisodeQuery) -> float:
        t = time.perf_counter()
        con = open_view(root)
        try:
            page, count, params = list_sql(con, q)
            con.execute(count, params).fetchall()
            con.execute(page, params).fetchall()
        finally:
            con.close()
        return time.perf_counter() - t

    def two_step(q: EpisodeQuery) -> float:
        t = time.perf_counter()
        con = open_view(root)
        try:
            episode_list(con, q)
        finally:
            con.close()
        return time.perf_counter() - t

    results = []
    for name, params in cases.items():
        params = {k: v for k, v in params.items() if v != ""}
        path = "/episodes?" + urllib.parse.urlencode(params)
        page_t = timed(lambda _i, path=path: fetch(path), args.repeat, name)
        filters = {k: v for k, v in params.items() if k not in ("sort", "page", "hack", "where")}
        q = EpisodeQuery(filters=filters, hack=params.get("hack"), where=params.get("where"),
                         sort=params.get("sort", "created_at"), page=int(params.get("page", 1)))
        page_sql, count_sql, sql_params = sql_of(q)
        sql_t = timed(lambda _i, a=page_sql, b=count_sql, p=sql_params: duck(a, p) + duck(b, p), args.repeat)
        pair = timed(lambda _i, q=q: (one_statement(q), two_step(q)), args.repeat)
        results.append({"case": name, "path": path, "page_ms": [x * 1e3 for x in page_t],
                        "sql_ms": [x * 1e3 for x in sql_t], "one_statement_ms": [a * 1e3 for a, _b in pair],
                        "two_step_ms": [b * 1e3 for _a, b in pair]})
    ep_t = timed(lambda i: fetch(f"/episodes/{ids[i % len(ids)]}"), args.repeat, "episode page")
    sql_ep = timed(lambda i: duck("SELECT * FROM trajectories WHERE trajectory_id = ?", [ids[i % len(ids)]]),
                   args.repeat)
    results.append({"case": "episode page", "path": "/episodes/ID", "page_ms": [x * 1e3 for x in ep_t],
                    "sql_ms": [x * 1e3 for x in sql_ep]})
    server.should_exit = True
    thread.join(timeout=10)

    print(f"\nflywheel view on {args.n:,} trajectories ({n_files} files), {args.repeat} requests each after one "
          f"warm-up; baseline: the same SQL through warehouse.query.query (`flywheel sql`)")
    head = f"{'case':36} {'page med':>9} {'page p95':>9} {'sql med':>9} {'sql p95':>9} {'page/sql':>9}"
    print(head + "\n" + "-" * len(head))
    for r in results:
        pm, pp = statistics.median(r["page_ms"]), pctl(r["page_ms"], 0.95)
        sm, sp = statistics.median(r["sql_ms"]), pctl(r["sql_ms"], 0.95)
        r.update(page_median_ms=pm, page_p95_ms=pp, sql_median_ms=sm, sql_p95_ms=sp, ratio=pm / sm,
                 first_ms=first.get(r["case"]))
        print(f"{r['case']:36} {pm:9.0f} {pp:9.0f} {sm:9.0f} {sp:9.0f} {pm / sm:9.2f}")
    head = f"{'list query (in-process)':36} {'1-stmt med':>10} {'1-stmt p95':>10} {'2-step med':>10} " \
           f"{'2-step p95':>10} {'2/1':>6}"
    print("\n" + head + "\n" + "-" * len(head))
    for r in results:
        if "two_step_ms" in r:
            om, op = statistics.median(r["one_statement_ms"]), pctl(r["one_statement_ms"], 0.95)
            tm, tp = statistics.median(r["two_step_ms"]), pctl(r["two_step_ms"], 0.95)
            r.update(one_statement_median_ms=om, two_step_median_ms=tm, two_step_ratio=tm / om)
            print(f"{r['case']:36} {om:10.0f} {op:10.0f} {tm:10.0f} {tp:10.0f} {tm / om:6.2f}")
    out = args.out or os.path.join(args.dir, "view.json")
    with open(out, "w") as f:
        json.dump({"n": args.n, "files": n_files, "build_s": build_s, "repeat": args.repeat, "results": results}, f,
                  indent=2)
    print("first (warm-up) requests, ms: " + ", ".join(f"{k} {v:.0f}" for k, v in first.items()))
    print(f"\nms; page = HTTP request to the viewer (connect, views, count + page queries, render); JSON: {out}")


if __name__ == "__main__":
    main()
