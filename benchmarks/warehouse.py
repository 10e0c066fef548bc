"""Benchmark: the Parquet/DuckDB trajectory lake against JSONL files read with pandas, side by side.

Generates N synthetic trajectories of realistic size (system + user prompt, two python tool calls with their
results, a final answer; tool schemas; tokens, verdicts, hack flags), then measures in the same process:
  ingest   lake.write_trajectories (idempotent, atomic, zstd Parquet) vs JSONL (pydantic model_dump_json lines,
           fsync), both from the same Trajectory objects, in the same batch size
  disk     bytes on disk of each
  queries  Q1 pass rate by suite and round; Q2 the 20 tasks students fail most; Q3 tokens per accepted trajectory
           by teacher: DuckDB over the lake (query.connect, cold: includes opening views and footer checks) vs
           pandas.read_json(lines=True) over the JSONL files (only the columns the query needs kept per chunk)
and prints a table and writes JSON (--out). Generation time is excluded from both sides.

Usage: python benchmarks/warehouse.py [--n 1000000] [--batch 10000] [--dir /tmp/fw-bench] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

# Run as a script, this file's folder comes first on sys.path and its name would shadow the warehouse package.
_HERE = str(Path(__file__).resolve().parent)
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from warehouse.record import FunctionCall, Message, ToolCall, Trajectory, trajectory_id

SUITES = ["arithmetic", "code-fix", "sql-gen", "unit-convert"]
TEACHERS = ["gpt-4.1", "qwen2.5-72b-instruct", "llama-3.3-70b"]
VERDICT_WEIGHTS = [("pass", 55), ("fail", 25), ("hack", 6), ("model_error", 6), ("timeout", 5), ("infra_error", 3)]
HACKS = ["answer_without_tool", "printed_expected", "edited_tests", "hardcoded_output"]
TOOLS_JSON = json.dumps(
    [
        {
            "type": "function",
            "function": {
                "name": "python",
                "description": "Run a Python 3 program in the sandbox and return its stdout and stderr.",
                "parameters": {
                    "type": "object",
                    "properties": {"code": {"type": "string", "description": "The program to run."}},
                    "required": ["code"],
                },
            },
        }
    ]
)
SYSTEM = (
    "You are a careful assistant that solves problems by running code. Use the python tool to compute every "
    "number; never guess. When you are done, reply with a single line 'Answer: <number>'."
)


def synthetic_trajectory(i: int, run_id: str = "bench", n_rounds: int = 5, tasks_per_suite: int = 500) -> Trajectory:
    """The i-th synthetic trajectory (deterministic in i): about 2 KB of messages with two tool calls."""
    rng = random.Random(i)
    rnd = i % n_rounds
    suite = SUITES[rng.randrange(len(SUITES))]
    task_no = rng.randrange(tasks_per_suite)
    source = "teacher" if rng.random() < 0.5 else "student"
    policy = TEACHERS[rng.randrange(len(TEACHERS))] if source == "teacher" else f"student-r{rnd}"
    r = rng.randrange(100)
    acc = 0
    verdict = "pass"
    for v, w in VERDICT_WEIGHTS:
        acc += w
        if r < acc:
            verdict = v
            break
    a, b, c = rng.randrange(10, 999), rng.randrange(10, 999), rng.randrange(2, 50)
    code1 = f"apples = {a}\noranges = {b}\ntotal = apples + oranges\nprint(total)"
    code2 = f"total = {a + b}\nboxes = {c}\nper_box = total / boxes\nprint(round(per_box, 4))"
    answer = f"{(a + b) / c:.4f}"
    messages = [
        Message(role="system", content=SYSTEM),
        Message(
            role="user",
            content=f"A shop has {a} apples and {b} oranges. It packs all the fruit into {c} boxes with the same "
            f"number of fruit in each box. How many pieces of fruit go into each box? Give 4 decimals.",
        ),
        Message(
            role="assistant",
            content="First I add the fruit.",
            tool_calls=[ToolCall(id=f"call_{i}_0", function=FunctionCall(name="python", arguments=json.dumps({"code": code1})))],
        ),
        Message(role="tool", content=f"{a + b}\n", tool_call_id=f"call_{i}_0", name="python"),
        Message(
            role="assistant",
            content="Now I divide by the number of boxes.",
            tool_calls=[ToolCall(id=f"call_{i}_1", function=FunctionCall(name="python", arguments=json.dumps({"code": code2})))],
        ),
        Message(role="tool", content=f"{answer}\n", tool_call_id=f"call_{i}_1", name="python"),
        Message(role="assistant", content=f"Each box holds {answer} pieces of fruit.\nAnswer: {answer}"),
    ]
    sample = i // (len(SUITES) * tasks_per_suite * n_rounds)
    task_id = f"{suite}-{task_no:05d}"
    return Trajectory(
        trajectory_id=trajectory_id(run_id, rnd, task_id, policy, i),
        run_id=run_id,
        round=rnd,
        source=source,
        policy=policy,
        endpoint="http://127.0.0.1:8000/v1" if source == "teacher" else None,
        sampling_json='{"temperature": 0.7, "top_p": 0.95, "max_tokens": 1024}',
        sample_index=sample,
        task_id=task_id,
        suite=suite,
        split="train" if rng.random() < 0.8 else "heldout",
        task_version="1",
        difficulty=rng.randrange(1, 6),
        sandbox_backend="docker",
        sandbox_image="sha256:4f1c2b7d9e0a",
        verifier="numeric",
        verifier_version="1",
        messages=messages,
        tools_json=TOOLS_JSON,
        answer=answer,
        reward=1.0 if verdict == "pass" else 0.0,
        success=verdict == "pass",
        verdict=verdict,
        hack_flags=[HACKS[rng.randrange(len(HACKS))]] if verdict == "hack" else [],
        reward_terms_json='{"format": 1.0, "tool_use": 1.0}',
        verifier_details_json=json.dumps({"expected": answer, "got": answer if verdict == "pass" else "0"}),
        turns=3,
        n_tool_calls=2,
        prompt_tokens=rng.randrange(300, 1500),
        completion_tokens=rng.randrange(50, 400),
        cost_usd=0.0,
        latency_ms=rng.uniform(200, 5000),
        created_at=datetime(2026, 11, 1, tzinfo=UTC) + timedelta(seconds=i),
    )


# ----------------------------------------------------------------------------- the three questions
SCORED = "('pass', 'fail', 'hack', 'model_error', 'timeout')"
SQL = {
    "q1_pass_rate_by_suite_round": f"""
        SELECT suite, round, avg(CASE WHEN verdict = 'pass' THEN 1.0 ELSE 0.0 END) AS pass_rate, count(*) AS n
        FROM trajectories WHERE verdict IN {SCORED} GROUP BY suite, round ORDER BY suite, round""",
    "q2_tasks_students_fail_most": f"""
        SELECT task_id, count(*) FILTER (WHERE verdict <> 'pass') AS fails, count(*) AS n
        FROM trajectories WHERE source = 'student' AND verdict IN {SCORED}
        GROUP BY task_id ORDER BY fails DESC, task_id LIMIT 20""",
    "q3_tokens_per_accepted_by_teacher": """
        SELECT policy, avg(prompt_tokens + completion_tokens) AS tokens, count(*) AS n
        FROM trajectories WHERE source = 'teacher' AND verdict = 'pass' GROUP BY policy ORDER BY policy""",
}
PANDAS_COLUMNS = ["trajectory_id", "suite", "round", "verdict", "source", "task_id", "policy", "prompt_tokens",
                  "completion_tokens"]
SCORED_SET = ["pass", "fail", "hack", "model_error", "timeout"]


def pandas_load(jsonl_dir: str):
    """Read every JSONL file with pandas, keep the columns the questions need, drop duplicate ids."""
    import pandas as pd

    parts = []
    for name in sorted(os.listdir(jsonl_dir)):
        df = pd.read_json(os.path.join(jsonl_dir, name), lines=True, dtype=False)
        parts.append(df[PANDAS_COLUMNS])
    df = pd.concat(parts, ignore_index=True)
    return df.drop_duplicates("trajectory_id")


def pandas_answer(df, q: str):
    d = df[df.verdict.isin(SCORED_SET)]
    if q == "q1_pass_rate_by_suite_round":
        g = d.assign(p=(d.verdict == "pass").astype(float)).groupby(["suite", "round"])
        out = g.agg(pass_rate=("p", "mean"), n=("p", "size")).reset_index()
        return [(r.suite, int(r.round), round(r.pass_rate, 9), int(r.n)) for r in out.itertuples()]
    if q == "q2_tasks_students_fail_most":
        s = d[d.source == "student"]
        out = s.assign(f=(s.verdict != "pass").astype(int)).groupby("task_id").agg(fails=("f", "sum"), n=("f", "size"))
        out = out.reset_index().sort_values(["fails", "task_id"], ascending=[False, True]).head(20)
        return [(r.task_id, int(r.fails), int(r.n)) for r in out.itertuples()]
    t = df[(df.source == "teacher") & (df.verdict == "pass")]
    out = t.assign(tok=t.prompt_tokens + t.completion_tokens).groupby("policy").agg(tokens=("tok", "mean"),
                                                                                    n=("tok", "size"))
    return [(p, round(r.tokens, 6), int(r.n)) for p, r in out.sort_index().iterrows()]


def duck_answer(table, q: str):
    rows = table.to_pylist()
    if q == "q1_pass_rate_by_suite_round":
        return [(r["suite"], r["round"], round(float(r["pass_rate"]), 9), r["n"]) for r in rows]
    if q == "q2_tasks_students_fail_most":
        return [(r["task_id"], r["fails"], r["n"]) for r in rows]
    return [(r["policy"], round(float(r["tokens"]), 6), r["n"]) for r in rows]


def du(path: str) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for f in files:
            total += os.path.getsize(os.path.join(dirpath, f))
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=1_000_000, help="trajectories to generate (default 1,000,000)")
    ap.add_argument("--batch", type=int, default=10_000, help="rows per write call (default 10,000)")
    ap.add_argument("--dir", default="/tmp/fw-bench-warehouse", help="work folder (wiped first)")
    ap.add_argument("--out", default=None, help="JSON results (default DIR/warehouse.json)")
    ap.add_argument("--repeat", type=int, default=3, help="runs of each lake query (first one is cold)")
    ap.add_argument("--no-pandas-ingest", action="store_true", help="skip the DataFrame.to_json ingest baseline")
    ap.add_argument("--keep", action="store_true", help="keep the generated lake and JSONL files")
    args = ap.parse_args()

    from warehouse.lake import compact, write_trajectories
    from warehouse.query import connect, query

    work = args.dir
    shutil.rmtree(work, ignore_errors=True)
    lake_root, jsonl_dir, pdjson_dir = (os.path.join(work, d) for d in ("lake", "jsonl", "pandas-jsonl"))
    for d in (jsonl_dir, pdjson_dir):
        os.makedirs(d)
    out_path = args.out or os.path.join(work, "warehouse.json")

    t_gen = t_lake = t_jsonl = t_pandas_ingest = 0.0
    done = 0
    part = 0
    while done < args.n:
        m = min(args.batch, args.n - done)
        t = time.perf_counter()
        rows = [synthetic_trajectory(i) for i in range(done, done + m)]
        t_gen += time.perf_counter() - t

        t = time.perf_counter()
        res = write_trajectories(lake_root, rows)
        t_lake += time.perf_counter() - t
        assert res.written == m, res

        t = time.perf_counter()
        with open(os.path.join(jsonl_dir, f"part-{part:05d}.jsonl"), "w", encoding="utf-8") as f:
            f.write("\n".join(r.model_dump_json() for r in rows))
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        t_jsonl += time.perf_counter() - t

        if not args.no_pandas_ingest:
            import pandas as pd

            t = time.perf_counter()
            df = pd.DataFrame([r.model_dump(mode="json") for r in rows])
            with open(os.path.join(pdjson_dir, f"part-{part:05d}.jsonl"), "w", encoding="utf-8") as f:
                df.to_json(f, orient="records", lines=True)
                f.flush()
                os.fsync(f.fileno())
            t_pandas_ingest += time.perf_counter() - t
        if part == 0:
            first_chunk = rows
        done += m
        part += 1
        if part % 10 == 0:
            print(f"  {done:,} rows: gen {t_gen:.1f}s lake {t_lake:.1f}s jsonl {t_jsonl:.1f}s "
                  f"pandas-jsonl {t_pandas_ingest:.1f}s", flush=True)
        del rows

    # A restarted writer's first batch (the crash-and-rerun case): it must learn which ids are already stored.
    # Lake: read the trajectory_id column of the batch's partitions. JSONL: parse every line of every file.
    import warehouse.integrity as integrity_mod
    import warehouse.lake as lake_mod

    lake_mod._ID_CACHE.clear()
    integrity_mod._CHECKED.clear()
    t = time.perf_counter()
    res = write_trajectories(lake_root, first_chunk)
    t_restart_lake = time.perf_counter() - t
    assert res.written == 0 and res.skipped == len(first_chunk), res
    t = time.perf_counter()
    have: set[str] = set()
    for name in sorted(os.listdir(jsonl_dir)):
        with open(os.path.join(jsonl_dir, name), encoding="utf-8") as f:
            have.update(json.loads(line)["trajectory_id"] for line in f)
    new_rows = [r for r in first_chunk if r.trajectory_id not in have]
    t_restart_jsonl = time.perf_counter() - t
    assert not new_rows
    del first_chunk

    disk_lake, disk_jsonl = du(lake_root), du(jsonl_dir)
    shutil.rmtree(pdjson_dir, ignore_errors=True)
    n_files = sum(len(f) for _d, _s, f in os.walk(os.path.join(lake_root, "trajectories")))

    t = time.perf_counter()
    connect(lake_root).close()
    t_connect = time.perf_counter() - t

    def time_lake_queries() -> dict:
        res = {}
        for q, sql in SQL.items():
            times, table = [], None
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                table = query(lake_root, sql)
                times.append(time.perf_counter() - t0)
            res[q] = {"first_s": times[0], "median_s": sorted(times)[len(times) // 2], "answer": duck_answer(table, q)}
        return res

    lake_q = time_lake_queries()

    t = time.perf_counter()
    df = pandas_load(jsonl_dir)
    t_pd_load = time.perf_counter() - t
    pd_q = {}
    for q in SQL:
        t = time.perf_counter()
        ans = pandas_answer(df, q)
        pd_q[q] = {"compute_s": time.perf_counter() - t, "answer": ans}
    del df

    t = time.perf_counter()
    compact(lake_root)
    t_compact = time.perf_counter() - t
    n_files_compact = sum(len(f) for _d, _s, f in os.walk(os.path.join(lake_root, "trajectories")))
    lake_qc = time_lake_queries()

    def same(a, b) -> bool:
        return len(a) == len(b) and all(
            all((abs(x - y) < 1e-6) if isinstance(x, float) else x == y for x, y in zip(ra, rb, strict=True))
            for ra, rb in zip(a, b, strict=True))

    results = {
        "n": args.n, "batch": args.batch, "loadavg_at_end": os.getloadavg(), "cpus": os.cpu_count(), "lake_files": n_files, "lake_files_after_compact": n_files_compact,
        "generate_s": t_gen,
        "ingest": {"lake_s": t_lake, "jsonl_model_dump_json_s": t_jsonl,
                   "jsonl_pandas_to_json_s": None if args.no_pandas_ingest else t_pandas_ingest},
        "restart_first_batch": {"lake_s": t_restart_lake, "jsonl_s": t_restart_jsonl,
                                "speedup": t_restart_jsonl / t_restart_lake},
        "disk": {"lake_bytes": disk_lake, "jsonl_bytes": disk_jsonl},
        "lake_connect_s": t_connect, "compact_s": t_compact, "pandas_load_s": t_pd_load, "queries": {},
    }
    rows_out = []
    for q in SQL:
        pandas_total = t_pd_load + pd_q[q]["compute_s"]
        lq, lc = lake_q[q], lake_qc[q]
        ok = same(lq["answer"], pd_q[q]["answer"]) and same(lc["answer"], pd_q[q]["answer"])
        results["queries"][q] = {
            "lake_first_s": lq["first_s"], "lake_median_s": lq["median_s"],
            "lake_compacted_first_s": lc["first_s"], "lake_compacted_median_s": lc["median_s"],
            "pandas_read_plus_compute_s": pandas_total, "pandas_compute_only_s": pd_q[q]["compute_s"],
            "speedup_first": pandas_total / lq["first_s"], "speedup_compacted_first": pandas_total / lc["first_s"],
            "answers_match": ok,
        }
        rows_out.append((q, f"{lq['first_s']:.3f} / {lq['median_s']:.3f}", f"{lc['first_s']:.3f} / {lc['median_s']:.3f}",
                         f"{pandas_total:.2f}", f"{pd_q[q]['compute_s']:.3f}",
                         f"{pandas_total / lq['first_s']:.0f}x", f"{pandas_total / lc['first_s']:.0f}x",
                         "yes" if ok else "NO"))
    results["ingest_speedup_vs_model_dump_json"] = t_jsonl / t_lake
    results["ingest_speedup_vs_pandas_to_json"] = None if args.no_pandas_ingest else t_pandas_ingest / t_lake
    results["disk_ratio"] = disk_lake / disk_jsonl

    print(f"\nwarehouse benchmark: {args.n:,} trajectories, batches of {args.batch:,}, "
          f"{n_files} lake files ({n_files_compact} after compact, {t_compact:.1f}s)")
    print(f"{'ingest':<38} lake {t_lake:8.2f}s | JSONL model_dump_json {t_jsonl:8.2f}s "
          f"({t_jsonl / t_lake:.2f}x)" + ("" if args.no_pandas_ingest else
                                          f" | JSONL pandas to_json {t_pandas_ingest:8.2f}s "
                                          f"({t_pandas_ingest / t_lake:.2f}x)"))
    print(f"{'restart: 1st batch of a re-run':<38} lake {t_restart_lake:8.2f}s | JSONL (parse all ids) "
          f"{t_restart_jsonl:8.2f}s ({t_restart_jsonl / t_restart_lake:.1f}x)")
    print(f"{'disk':<38} lake {disk_lake / 1e6:8.1f} MB | JSONL {disk_jsonl / 1e6:8.1f} MB "
          f"(lake = 1/{disk_jsonl / disk_lake:.1f})")
    print(f"{'connect (list, check footers, views)':<38} {t_connect:.3f}s;  pandas read_json of all JSONL: "
          f"{t_pd_load:.2f}s\n")
    hdr = ("query", "lake 1st/median s", "compacted 1st/med s", "pandas read+q s", "pandas q only s",
           "speedup", "speedup compacted", "same answer")
    widths = [36, 18, 20, 16, 16, 8, 18, 11]
    print("  ".join(h.ljust(w) for h, w in zip(hdr, widths, strict=True)))
    for r in rows_out:
        print("  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)))
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    with open(out_path + ".tmp", "w") as f:
        json.dump(results, f, indent=2)
    os.replace(out_path + ".tmp", out_path)
    print(f"\nJSON: {out_path}")
    if not args.keep:
        shutil.rmtree(lake_root, ignore_errors=True)
        shutil.rmtree(jsonl_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
