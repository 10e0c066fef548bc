"""Benchmark: rollout throughput (episodes/s) against a latency-simulating OpenAI-compatible endpoint.

The endpoint is the fault-injecting test double of tests/agents/fault_server.py (a real HTTP server on 127.0.0.1)
run with behaviour `latency:SECONDS:TURNS[:JITTER]` only: every request sleeps SECONDS (default 0.2; with --jitter
varied around that mean), and an episode takes TURNS assistant turns (default 3: two python tool calls that really
run in sandboxes, then the answer). Episodes run through the real loop, the real OpenAI policy and real sandboxes
(Docker with a warm pool by default; `--backend local`, with `--reuse` sandboxes reset and reused between episodes).

In the same process, side by side:
- `sequential`: a plain `for` loop awaiting `run_episode` one after another (the baseline); its mean episode time
  T1 defines the ideal throughput at concurrency c as c / T1;
- `rollout c=1, 8, 32, 64`: `agents.rollout.rollout` at that concurrency, waves x c episodes (at least 8; 8 waves
  by default: the first wave starts in lockstep, later ones measure the steady state).
efficiency = achieved episodes/s / ideal. The same is measured for model-only episodes (one 200 ms turn answered
directly, no tool call, so no sandbox is ever acquired: the loop acquires lazily) to separate the runner's own
scaling (asyncio, HTTP client, loop) from the sandbox backend's. Also measured: the backend's own ceiling (sandboxes acquired, used for one
python call and closed per second at concurrency 8), which bounds every rollout that needs a fresh sandbox per
episode. Where the CPU goes: for every level, the whole machine's CPU time (/proc/stat) per episode, split into this
process (client, loop, host side of the sandbox calls), the endpoint's process, and the rest (sandbox processes,
the container engine, anything else running), next to the budget: the CPU per episode the machine can spend when
the level runs at 90% efficiency (cpus / (0.9 x ideal episodes/s)). Prints tables, writes JSON (--out).
Usage: python benchmarks/rollout.py [--quick] [--backend local [--reuse]] [--jitter 0.25] [--waves N].
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agents.loop import run_episode
from agents.openai_policy import OpenAIPolicy
from agents.rollout import rollout
from sandbox.result import SandboxConfig
from tasks import arithmetic

FAULT_SERVER = ROOT / "tests" / "agents" / "fault_server.py"


class EndpointProcess:
    """The fault-injecting server (latency only) in a process of its own, so its threads do not compete with the
    rollout for this interpreter; stops when its stdin closes."""

    def __init__(self, spec: dict) -> None:
        self.spec_file = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)  # noqa: SIM115
        json.dump(spec, self.spec_file)
        self.spec_file.close()
        self.proc = subprocess.Popen([sys.executable, str(FAULT_SERVER), self.spec_file.name], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline().split()
        if not line or line[0] != "URL":
            raise RuntimeError(f"fault server did not start: {line}")
        self.base_url = line[1]

    def cpu_s(self) -> float:
        """CPU seconds the endpoint's process (all its threads) has used so far."""
        return proc_cpu_s(self.proc.pid)

    def count(self, model: str) -> int:
        with urllib.request.urlopen(self.base_url + "/stats", timeout=10) as r:
            return json.load(r)["by_model"].get(model, 0)

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        os.unlink(self.spec_file.name)


def proc_cpu_s(pid: int) -> float:
    """utime + stime of a process (all threads), in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_cpu_s() -> float:
    """CPU seconds all cores of this machine have spent busy (not idle or waiting for I/O) since boot."""
    with open("/proc/stat") as f:
        vals = [int(x) for x in f.readline().split()[1:]]
    return (sum(vals[:8]) - vals[3] - vals[4]) / os.sysconf("SC_CLK_TCK")


def open_bench_backend(kind: str, pool: int, max_sandboxes: int, reuse: bool = False):
    if kind == "docker":
        from sandbox.docker import DockerBackend

        return DockerBackend(SandboxConfig(backend="docker"), pool_size=pool, max_sandboxes=max_sandboxes)
    from sandbox.backend import open_backend

    backend = open_backend(SandboxConfig(backend=kind, reuse=reuse))
    if reuse:  # warm: `pool` sandboxes used once and reset, as the Docker backend's warm pool holds fresh ones
        boxes = [backend.acquire() for _ in range(pool)]
        for sb in boxes:
            sb.run_python("0")
            sb.close()
        end = time.monotonic() + 60
        while backend.ready() < pool and time.monotonic() < end:
            time.sleep(0.05)
    return backend


def wait_warm(backend, want: int, timeout_s: float) -> int:
    """Wait until the Docker backend's warm pool holds `want` containers (or timeout); returns the pool size seen."""
    pool = getattr(backend, "_pool", None)
    if pool is None:
        return 0
    deadline = time.monotonic() + timeout_s
    while pool.qsize() < want and time.monotonic() < deadline:
        time.sleep(0.2)
    return pool.qsize()


def sandbox_ceiling(backend, n: int, workers: int = 8) -> float:
    """Sandboxes per second the backend sustains: acquire, one python call, close; `workers` threads."""
    def one(_):
        sb = backend.acquire()
        try:
            sb.run_python("print(1)")
        finally:
            sb.close()

    t0 = time.perf_counter()
    with ThreadPoolExecutor(workers) as ex:
        list(ex.map(one, range(n)))
    return n / (time.perf_counter() - t0)


async def sequential(tasks, policy, backend, n: int) -> list[float]:
    times = []
    async with policy.session():
        for i in range(n):
            t0 = time.perf_counter()
            row = await run_episode(tasks[i % len(tasks)], policy, backend, run_id=f"bench-seq-{policy.name}",
                                    sample_index=i)
            assert row.verdict == "pass", (row.verdict, row.error_message)
            times.append(time.perf_counter() - t0)
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="/tmp/flywheel-bench-rollout.json")
    ap.add_argument("--backend", default="docker", choices=["docker", "local"])
    ap.add_argument("--latency", type=float, default=0.2, help="seconds per model turn (the mean, with --jitter)")
    ap.add_argument("--jitter", type=float, default=0.0,
                    help="vary each turn's latency by up to this fraction (uniform, mean unchanged, fixed per "
                         "conversation and turn). 0: every turn takes exactly --latency, so concurrent episodes "
                         "move in lockstep and their replies reach the client at the same moment (the worst case)")
    ap.add_argument("--turns", type=int, default=3, help="assistant turns per episode")
    ap.add_argument("--levels", default="1,8,32,64", help="concurrency levels")
    ap.add_argument("--pool-max", type=int, default=64, help="largest warm pool (Docker)")
    ap.add_argument("--seq", type=int, default=6, help="episodes of the sequential baseline")
    ap.add_argument("--quick", action="store_true", help="levels 1,8 only")
    ap.add_argument("--waves", type=int, default=8,
                    help="episodes per level = waves x concurrency (at least 8). With a fixed model latency the first "
                         "wave's episodes run in lockstep (their replies arrive together and queue for the client); "
                         "later waves spread out, so more waves measure the steady state")
    ap.add_argument("--reuse", action="store_true",
                    help="local backend: reuse sandboxes across episodes after a verified reset (SandboxConfig.reuse)")
    args = ap.parse_args()
    if args.reuse and args.backend != "local":
        ap.error("--reuse needs --backend local (only the local backend resets and reuses sandboxes)")
    levels = [1, 8] if args.quick else [int(x) for x in args.levels.split(",")]

    tasks = arithmetic.generate(64, split="train", seed=11)
    solutions = {t.prompt: t.reference.steps[0].arguments["code"] for t in tasks}
    jitter = f":{args.jitter}" if args.jitter else ""
    model = f"latency:{args.latency}:{args.turns}{jitter}"
    m1 = f"latency:{args.latency}:1{jitter}"
    # model-only episodes: one turn answered directly (no tool call, so no sandbox is acquired)
    direct = [t.model_copy(update={"prompt": t.prompt + " (answer directly)",
                                   "verifier": t.verifier.model_copy(update={"requires_tool": None})})
              for t in tasks]
    result: dict = {"benchmark": "rollout", "backend": args.backend, "reuse": args.reuse, "latency_s": args.latency,
                    "jitter": args.jitter, "waves": args.waves,
                    "turns": args.turns,
                    "cpus": os.cpu_count(), "loadavg_start": os.getloadavg(), "python": platform.python_version(),
                    "endpoint": "tests/agents/fault_server.py in its own process", "levels": []}
    srv = EndpointProcess({"solutions": solutions, "direct": {t.prompt: str(t.verifier.answer) for t in direct},
                           "tool_turns": args.turns - 1, "models": [model, m1]})
    try:
        policy = OpenAIPolicy(base_url=srv.base_url, model=model, name="latency", concurrency=256, max_retries=2,
                              timeout_s=30.0, temperature=0.0)
        with open_bench_backend(args.backend, pool=min(8, args.pool_max), max_sandboxes=max(levels) + 8,
                                reuse=args.reuse) as backend:
            wait_warm(backend, min(8, args.pool_max), 60)
            result["sandbox_ceiling_per_s"] = sandbox_ceiling(backend, 16)
            wait_warm(backend, min(8, args.pool_max), 60)
            seq = asyncio.run(sequential(tasks, policy, backend, args.seq))
        t1 = sum(seq) / len(seq)
        result["sequential"] = {"episodes": len(seq), "mean_episode_s": t1, "episodes_per_s": 1 / t1,
                                "model_time_s": args.latency * args.turns}
        for c in levels:
            n = max(8, args.waves * c)
            pool = min(c, args.pool_max)
            with open_bench_backend(args.backend, pool=pool, max_sandboxes=max(levels) + 8,
                                    reuse=args.reuse) as backend:
                t_warm = time.perf_counter()
                warm = wait_warm(backend, pool, 300)
                warm_s = time.perf_counter() - t_warm
                before = srv.count(model)
                cpu0, srv0, all0 = time.process_time(), srv.cpu_s(), machine_cpu_s()
                reused0 = getattr(backend, "stats", {}).get("reused", 0)
                s = asyncio.run(rollout(tasks[:n] if n <= len(tasks) else tasks, policy, backend,
                                        run_id=f"bench-c{c}", samples=max(1, -(-n // len(tasks))),
                                        concurrency=c, progress=False, max_turns=args.turns + 1))
                reused = getattr(backend, "stats", {}).get("reused", 0) - reused0
            ideal = c / t1
            per_ep = 1000 / max(1, s.episodes)
            client_ms = (time.process_time() - cpu0) * per_ep
            endpoint_ms = (srv.cpu_s() - srv0) * per_ep
            machine_ms = (machine_cpu_s() - all0) * per_ep
            lvl = {"concurrency": c, "episodes": s.episodes, "wall_s": s.wall_s, "episodes_per_s": s.episodes_per_s,
                   "ideal_per_s": ideal, "efficiency": s.episodes_per_s / ideal, "verdicts": s.verdicts,
                   "client_cpu_ms_per_episode": client_ms, "endpoint_cpu_ms_per_episode": endpoint_ms,
                   "machine_cpu_ms_per_episode": machine_ms,
                   "rest_cpu_ms_per_episode": machine_ms - client_ms - endpoint_ms,
                   "budget_cpu_ms_per_episode_at_90pct": (os.cpu_count() or 1) * 1000 / (0.9 * ideal),
                   "warm_pool": warm, "warm_pool_fill_s": warm_s, "episodes_on_reused_sandbox": reused, "requests": srv.count(model) - before,
                   "mean_latency_ms": s.by_policy["latency"].mean_latency_ms if "latency" in s.by_policy else None}
            result["levels"].append(lvl)
        p1 = OpenAIPolicy(base_url=srv.base_url, model=m1, name="model-only", concurrency=256, max_retries=2,
                          timeout_s=30.0, temperature=0.0)
        with open_bench_backend(args.backend, pool=0, max_sandboxes=8) as backend:
            seq1 = asyncio.run(sequential(direct, p1, backend, max(args.seq, 10)))
            t1m = sum(seq1) / len(seq1)
            result["model_only"] = {"sequential_mean_episode_s": t1m, "levels": []}
            for c in levels:
                n = max(16, 2 * args.waves * c)  # one-turn episodes: twice the waves for a similar duration
                cpu0, srv0, all0 = time.process_time(), srv.cpu_s(), machine_cpu_s()
                s = asyncio.run(rollout(direct, p1, backend, run_id=f"bench-m-c{c}", samples=-(-n // len(direct)),
                                        concurrency=c, progress=False, max_turns=2))
                result["model_only"]["levels"].append({
                    "concurrency": c, "episodes": s.episodes, "wall_s": s.wall_s, "episodes_per_s": s.episodes_per_s,
                    "ideal_per_s": c / t1m, "efficiency": s.episodes_per_s / (c / t1m), "verdicts": s.verdicts,
                    "client_cpu_ms_per_episode": (time.process_time() - cpu0) * 1000 / max(1, s.episodes),
                    "endpoint_cpu_ms_per_episode": (srv.cpu_s() - srv0) * 1000 / max(1, s.episodes),
                    "machine_cpu_ms_per_episode": (machine_cpu_s() - all0) * 1000 / max(1, s.episodes)})
    finally:
        srv.close()
    result["loadavg_end"] = os.getloadavg()

    print(f"\nrollout benchmark: {args.backend} sandboxes{' (reused after a reset)' if args.reuse else ''}, "
          f"{args.turns} turns x {args.latency * 1000:.0f} ms model latency"
          f"{f' (+-{args.jitter:.0%})' if args.jitter else ' (fixed: lockstep)'}, {args.waves} waves, "
          f"{result['cpus']} cpus, load {result['loadavg_start'][0]:.1f}")
    print(f"sandbox churn: {result['sandbox_ceiling_per_s']:.2f} sandboxes/s (acquire + 1 call + close, 8 threads, "
          "warm pool of 8)")
    print(f"{'run':<16}{'episodes':>9}{'wall s':>9}{'ep/s':>9}{'ideal':>9}{'effic.':>9}{'ep ms':>9}"
          f"{'cpu ms':>8}  verdicts")
    sq = result["sequential"]
    print(f"{'sequential':<16}{sq['episodes']:>9}{sum(seq):>9.2f}{sq['episodes_per_s']:>9.2f}{sq['episodes_per_s']:>9.2f}"
          f"{1.0:>9.0%}{t1 * 1000:>9.0f}{'':>8}  pass={sq['episodes']}")
    for lv in result["levels"]:
        print(f"{'rollout c=' + str(lv['concurrency']):<16}{lv['episodes']:>9}{lv['wall_s']:>9.2f}"
              f"{lv['episodes_per_s']:>9.2f}{lv['ideal_per_s']:>9.2f}{lv['efficiency']:>9.0%}"
              f"{(lv['mean_latency_ms'] or 0):>9.0f}"
              f"{lv['client_cpu_ms_per_episode']:>8.1f}  {lv['verdicts']}")
    print(f"\nwhere the CPU goes (ms of CPU per episode; budget = what {result['cpus']} cpus can spend per episode "
          "at 90% efficiency)")
    print(f"{'run':<16}{'machine':>9}{'client':>9}{'endpoint':>9}{'rest':>9}{'budget':>9}  rest = sandboxes, engine, other")
    for lv in result["levels"]:
        print(f"{'rollout c=' + str(lv['concurrency']):<16}{lv['machine_cpu_ms_per_episode']:>9.1f}"
              f"{lv['client_cpu_ms_per_episode']:>9.1f}{lv['endpoint_cpu_ms_per_episode']:>9.1f}"
              f"{lv['rest_cpu_ms_per_episode']:>9.1f}{lv['budget_cpu_ms_per_episode_at_90pct']:>9.1f}")
    mo = result["model_only"]
    print("ep ms = mean episode latency; cpu ms = this process's CPU time per episode (client, loop, sandbox calls)")
    print(f"model-only episodes (1 turn, no sandbox): sequential {mo['sequential_mean_episode_s'] * 1000:.0f} ms/episode")
    for lv in mo["levels"]:
        print(f"{'model-only c=' + str(lv['concurrency']):<16}{lv['episodes']:>9}{lv['wall_s']:>9.2f}"
              f"{lv['episodes_per_s']:>9.2f}{lv['ideal_per_s']:>9.2f}{lv['efficiency']:>9.0%}{'':>9}"
              f"{lv['client_cpu_ms_per_episode']:>8.1f}  {lv['verdicts']}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
