"""Benchmark: latency and throughput of a trivial python tool call through every sandbox path, side by side.

In one process, one run, the same call (`x = x + 1` then print it; a one-liner for process-per-call paths):
  interpreter     DockerSandbox.run_python on a warm persistent interpreter (container from the warm pool)
  exec            DockerSandbox.exec(["python3", "-c", ...]) in a warm container (a new process per call)
  docker run      `docker run --rm --network none IMAGE python3 -c ...` per call (the baseline)
  docker reused   the same two in a reused container (its interpreter forked and relayed by the keeper)
  local interp    LocalBackend sandbox run_python (bubblewrap, persistent interpreter)
  local exec      LocalBackend sandbox exec (a new process per call)
plus: acquire (a clean container handed out by the pool, p50/p95, with a short pause between episodes as in a
rollout; and acquire + the episode's first call, which the pool's pre-started interpreter keeps fast), and pool throughput (C threads, each holding its own sandbox from the pool, calling run_python for a
fixed time: total calls/s on this machine's cores), and fresh-sandbox episodes/s (acquire + one call + close in C
threads: the ceiling the pool's refill puts on rollouts that need a clean sandbox per episode), measured twice side by
side: fresh containers (sandbox.reuse=false) and reused ones (reset and checked between episodes, Docker's default;
issue 22's goal: >= 50 clean episodes/s). The load average before and after is printed and written.
Goals (issue 3): interpreter p50 <= 10 ms; >= 50x faster than docker run per call; >= 100 calls/s with a pool;
acquire p50 <= 50 ms. Prints a table, writes JSON (--out).

Usage: python benchmarks/sandbox.py [--n 200] [--runs 10] [--threads 4] [--seconds 5] [--out FILE] [--no-local]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sandbox.docker import DockerBackend
from sandbox.image import build_image
from sandbox.result import SandboxConfig

CODE = "x = globals().get('x', 0) + 1\nprint(x)"
ONE_LINER = "print(1 + 1)"


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def summary(name: str, ms: list[float], wall_s: float) -> dict:
    return {"path": name, "n": len(ms), "p50_ms": statistics.median(ms), "p95_ms": pct(ms, 0.95),
            "mean_ms": statistics.fmean(ms), "calls_per_s": len(ms) / wall_s if wall_s > 0 else 0.0}


def timed(fn, n: int, check) -> tuple[list[float], float]:
    ms = []
    t_all = time.perf_counter()
    for _ in range(n):
        t = time.perf_counter()
        r = fn()
        ms.append((time.perf_counter() - t) * 1000)
        check(r)
    return ms, time.perf_counter() - t_all


def ok(r) -> None:
    if r.verdict != "ok":
        raise RuntimeError(f"benchmark call failed: {r}")


def bench_sandbox(backend, n: int, n_exec: int, label: str) -> list[dict]:
    sb = backend.acquire()
    try:
        ok(sb.run_python(CODE))  # start the interpreter (not timed: once per episode)
        ms, wall = timed(lambda: sb.run_python(CODE), n, ok)
        rows = [summary(f"{label} interpreter", ms, wall)]
        ok(sb.exec(["python3", "-c", ONE_LINER]))
        ms, wall = timed(lambda: sb.exec(["python3", "-c", ONE_LINER]), n_exec, ok)
        rows.append(summary(f"{label} exec", ms, wall))
        return rows
    finally:
        sb.close()


def bench_docker_run(image: str, runs: int) -> dict:
    cmd = ["docker", "run", "--rm", "--network", "none", "--memory", "512m", "--label", "flywheel.bench=1", image,
           "python3", "-c", ONE_LINER]

    def once():
        p = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if p.returncode != 0 or p.stdout.strip() != "2":
            raise RuntimeError(f"docker run failed: {p.stderr[-500:]}")
        return p

    once()
    ms, wall = timed(once, runs, lambda p: None)
    return summary("docker run --rm", ms, wall)


def bench_acquire(backend, n: int, pause_s: float) -> list[dict]:
    ms, first = [], []
    for _ in range(n):
        time.sleep(pause_s)
        t = time.perf_counter()
        sb = backend.acquire()
        ms.append((time.perf_counter() - t) * 1000)
        ok(sb.run_python(CODE))
        first.append((time.perf_counter() - t) * 1000)
        sb.close()
    return [{"path": f"acquire (pool, {pause_s:g}s between episodes)", "n": n, "p50_ms": statistics.median(ms),
             "p95_ms": pct(ms, 0.95), "mean_ms": statistics.fmean(ms), "calls_per_s": None},
            {"path": "acquire + first call of an episode", "n": n, "p50_ms": statistics.median(first),
             "p95_ms": pct(first, 0.95), "mean_ms": statistics.fmean(first), "calls_per_s": None}]


def bench_pool_throughput(backend, threads: int, seconds: float) -> dict:
    sbs = [backend.acquire() for _ in range(threads)]
    for sb in sbs:
        ok(sb.run_python(CODE))
    counts = [0] * threads
    lat: list[list[float]] = [[] for _ in range(threads)]
    stop = time.perf_counter() + seconds

    def worker(i: int) -> None:
        while time.perf_counter() < stop:
            t = time.perf_counter()
            r = sbs[i].run_python(CODE)
            lat[i].append((time.perf_counter() - t) * 1000)
            ok(r)
            counts[i] += 1

    t0 = time.perf_counter()
    ts = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    wall = time.perf_counter() - t0
    for sb in sbs:
        sb.close()
    all_ms = [x for xs in lat for x in xs]
    return {"path": f"pool throughput ({threads} sandboxes x run_python)", "n": sum(counts),
            "p50_ms": statistics.median(all_ms), "p95_ms": pct(all_ms, 0.95), "mean_ms": statistics.fmean(all_ms),
            "calls_per_s": sum(counts) / wall}


ENGINE = ("dockerd", "containerd", "containerd-shim", "containerd-shim-runc-v2", "runc", "docker-init")


def cpu_now() -> dict[str, float]:
    """CPU seconds so far of this process, of the live engine processes, and of all Docker containers (the docker
    cgroup's cpuacct: containers of other users of this machine count too; 0 where it is not readable)."""
    t = os.times()
    engine = 0
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                st = (d / "stat").read_text()
                if st[st.index("(") + 1 : st.rindex(")")] in ENGINE:
                    f = st[st.rindex(")") + 2 :].split()
                    engine += int(f[11]) + int(f[12])
            except (OSError, ValueError):
                continue
    try:
        containers = int(Path("/sys/fs/cgroup/cpuacct/docker/cpuacct.usage").read_text()) / 1e9
    except (OSError, ValueError):
        containers = 0.0
    return {"process": t.user + t.system, "engine": engine / os.sysconf("SC_CLK_TCK"), "containers": containers}


def bench_episodes(backend, threads: int, seconds: float, label: str = "") -> dict:
    """Clean sandbox per episode: acquire + one run_python + close, in `threads` threads (the backend's ceiling)."""
    ms: list[float] = []
    lock = threading.Lock()
    stop = time.perf_counter() + seconds

    def worker() -> None:
        while time.perf_counter() < stop:
            t = time.perf_counter()
            sb = backend.acquire()
            try:
                ok(sb.run_python(CODE))
            finally:
                sb.close()
            with lock:
                ms.append((time.perf_counter() - t) * 1000)

    t0 = time.perf_counter()
    c0 = cpu_now()
    ts = [threading.Thread(target=worker) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    wall = time.perf_counter() - t0
    c1 = cpu_now()
    cpu_ms = {k: (c1[k] - c0[k]) * 1000 / max(1, len(ms)) for k in c0}
    return {"path": f"episodes{label}: acquire + 1 call + close ({threads} threads)", "n": len(ms),
            "p50_ms": statistics.median(ms), "p95_ms": pct(ms, 0.95), "mean_ms": statistics.fmean(ms),
            "calls_per_s": len(ms) / wall, "cpu_ms_per_episode": cpu_ms,
            "episodes_per_s_if_idle": (os.cpu_count() or 1) * 1000 / max(1e-9, sum(cpu_ms.values()))}


def bench_spawn_as_nobody(n: int, ballast_mb: int) -> list[dict]:
    """Spawning a process as the sandbox user from a parent holding `ballast_mb` of memory (a flow process holds
    torch and a model: ~700 MB): Popen(user=, group=, extra_groups=) -- how the local backend did it, which makes
    CPython fork the parent -- next to the `setpriv` prefix it uses now (CPython can vfork). Root only."""
    ballast = bytearray(ballast_mb * 1024 * 1024)
    for i in range(0, len(ballast), 4096):
        ballast[i] = 1  # touch every page: page tables are what a fork copies
    setpriv = shutil.which("setpriv")
    ways = {f"spawn as nobody, Popen(user=) ({ballast_mb} MB parent)":
            lambda: subprocess.run(["/bin/true"], user=65534, group=65534, extra_groups=[], start_new_session=True,
                                   check=True),
            f"spawn as nobody, setpriv ({ballast_mb} MB parent)":
            lambda: subprocess.run([setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", "--", "/bin/true"],
                                   start_new_session=True, check=True)}
    rows = []
    for name, fn in ways.items():
        fn()
        ms, wall = timed(fn, n, lambda p: None)
        rows.append(summary(name, ms, wall))
    del ballast
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=200, help="calls per warm-interpreter path")
    ap.add_argument("--n-exec", type=int, default=40, help="calls per exec path")
    ap.add_argument("--runs", type=int, default=10, help="docker run --rm calls (the slow baseline)")
    ap.add_argument("--acquires", type=int, default=20)
    ap.add_argument("--pause", type=float, default=0.3, help="seconds between acquires (time an episode lasts)")
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--no-local", action="store_true", help="skip the bubblewrap backend")
    ap.add_argument("--ballast-mb", type=int, default=700, help="memory the parent holds in the spawn comparison")
    ap.add_argument("--out", default="/tmp/flywheel-bench/sandbox.json")
    a = ap.parse_args()

    cfg = SandboxConfig(reuse=False)
    image = cfg.image
    build_image(image)  # reuses the image when present
    rows: list[dict] = []
    load_before = os.getloadavg()
    backend = DockerBackend(cfg, pool_size=max(2, a.threads))
    try:
        time.sleep(2.0)  # let the pool fill
        rows += bench_sandbox(backend, a.n, a.n_exec, "docker")
        rows.append(bench_docker_run(image, a.runs))
        rows += bench_acquire(backend, a.acquires, a.pause)
        time.sleep(2.0)
        rows.append(bench_pool_throughput(backend, a.threads, a.seconds))
        time.sleep(2.0)
        rows.append(bench_episodes(backend, a.threads, a.seconds, ", fresh"))
    finally:
        backend.shutdown()
    reuse_stats = {}
    reusing = DockerBackend(cfg.model_copy(update={"reuse": True}), pool_size=max(2, a.threads))
    try:
        time.sleep(2.0)  # let the pool fill
        bench_episodes(reusing, a.threads, 2.0)  # warm-up, not counted: every container has served an episode
        rows += bench_sandbox(reusing, a.n, a.n_exec, "docker reused")  # calls relayed by the container's keeper
        rows.append(bench_episodes(reusing, a.threads, a.seconds, ", reused"))
        reuse_stats = dict(reusing.stats)
    finally:
        reusing.shutdown()
    load_after = os.getloadavg()
    if not a.no_local:
        try:
            from sandbox.local import LocalBackend

            lb = LocalBackend(cfg.model_copy(update={"backend": "local"}))
            try:
                rows += bench_sandbox(lb, a.n, a.n_exec, "local")
            finally:
                lb.shutdown()
            if os.geteuid() == 0:
                rows += bench_spawn_as_nobody(a.n_exec, a.ballast_mb)
        except Exception as e:  # noqa: BLE001 - a missing bwrap is reported, not fatal to the docker numbers
            print(f"local backend skipped: {type(e).__name__}: {e}", file=sys.stderr)

    by = {r["path"]: r for r in rows}
    interp, run = by["docker interpreter"]["p50_ms"], by["docker run --rm"]["p50_ms"]
    acquire = next(r for r in rows if r["path"].startswith("acquire"))
    pool = next(r for r in rows if r["path"].startswith("pool"))
    episodes = next(r for r in rows if r["path"].startswith("episodes, fresh"))
    reused = next(r for r in rows if r["path"].startswith("episodes, reused"))
    goals = {
        "interpreter_p50_ms": interp, "interpreter_p50_goal_ms": 10, "interpreter_p50_met": interp <= 10,
        "speedup_vs_docker_run": run / interp, "speedup_goal": 50, "speedup_met": run / interp >= 50,
        "speedup_exec_vs_docker_run": run / by["docker exec"]["p50_ms"],
        "pool_calls_per_s": pool["calls_per_s"], "pool_goal_calls_per_s": 100, "pool_met": pool["calls_per_s"] >= 100,
        "fresh_episodes_per_s": episodes["calls_per_s"],
        "reused_episodes_per_s": reused["calls_per_s"], "reused_goal_episodes_per_s": 50,
        "reused_met": reused["calls_per_s"] >= 50, "reused_vs_fresh": reused["calls_per_s"] / episodes["calls_per_s"],
        "reuse_stats": reuse_stats, "load_average_before": load_before, "load_average_after": load_after,
        "acquire_p50_ms": acquire["p50_ms"], "acquire_goal_ms": 50, "acquire_met": acquire["p50_ms"] <= 50,
    }
    result = {"benchmark": "sandbox", "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
              "config": cfg.model_dump(), "rows": rows, "goals": goals,
              "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))

    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"Sandbox call latency, one trivial python tool call ({os.cpu_count()} cores)")
    for col in ("path", "n", "p50 ms", "p95 ms", "calls/s", "x faster than docker run (p50)"):
        t.add_column(col, justify="left" if col == "path" else "right")
    for r in rows:
        cps = f"{r['calls_per_s']:.0f}" if r["calls_per_s"] else "-"
        per_call = r["calls_per_s"] and not r["path"].startswith(("pool", "episodes", "spawn"))
        ratio = f"{run / r['p50_ms']:.0f}x" if per_call else "-"
        t.add_row(r["path"], str(r["n"]), f"{r['p50_ms']:.2f}", f"{r['p95_ms']:.2f}", cps, ratio)
    con = Console()
    con.print(t)
    for k, goal, met in (("interpreter p50", "<= 10 ms", goals["interpreter_p50_met"]),
                         ("speedup vs docker run", ">= 50x", goals["speedup_met"]),
                         ("pool throughput", ">= 100 calls/s", goals["pool_met"]),
                         ("acquire p50", "<= 50 ms", goals["acquire_met"]),
                         ("reused episodes/s", ">= 50", goals["reused_met"])):
        con.print(f"{k:24s} goal {goal:16s} {'met' if met else 'NOT met'}")
    for r in (episodes, reused):
        c = r["cpu_ms_per_episode"]
        con.print(f"{r['path'].split(':')[0]}: CPU per episode {sum(c.values()):.1f} ms (this process "
                  f"{c['process']:.1f}, engine {c['engine']:.1f}, containers {c['containers']:.1f}, an upper bound: "
                  f"every container on the machine counts) -> {r['episodes_per_s_if_idle']:.0f} episodes/s on "
                  f"{os.cpu_count()} idle cores")
    con.print(f"clean episodes/s: reused {reused['calls_per_s']:.1f} vs fresh {episodes['calls_per_s']:.1f} "
              f"({goals['reused_vs_fresh']:.1f}x); reuse stats {reuse_stats}; load average "
              f"{' '.join(f'{x:.2f}' for x in load_before)} before, {' '.join(f'{x:.2f}' for x in load_after)} after")
    con.print(f"JSON: {out}")


if __name__ == "__main__":
    main()
