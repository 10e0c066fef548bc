"""Benchmark: the OpenAI policy's client CPU per request with each HTTP stack (aiohttp vs httpx), same process.

A rollout on a small machine is bounded by the CPU the client spends per model request once sandboxes are cheap
(benchmarks/rollout.py: "where the CPU goes"). This isolates that cost: `OpenAIPolicy.reply` at a fixed concurrency
against the latency endpoint of benchmarks/rollout.py (tests/agents/fault_server.py in its own process, one short
turn answered directly), with the two transports the OpenAI SDK offers, alternating in rounds so that both see the
same machine load. Reports this process's CPU milliseconds per request (the number that matters on 2 cores),
requests per second, and the ratio; writes JSON (--out).

    .venv/bin/python benchmarks/http_client.py [--requests 1280] [--concurrency 64] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_HERE = str(Path(__file__).resolve().parent)
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]  # benchmarks/sandbox.py shadows sandbox/
sys.path.insert(0, str(ROOT))

from agents.openai_policy import HTTP_STACKS, OpenAIPolicy
from benchmarks.rollout import EndpointProcess
from tasks import arithmetic
from warehouse.record import Message


async def measure(base_url: str, model: str, tasks: list, http: str, n: int, concurrency: int) -> dict:
    """n requests at the given concurrency after a warm-up wave; CPU ms per request and requests per second."""
    policy = OpenAIPolicy(base_url=base_url, model=model, name=http, concurrency=concurrency, max_retries=0,
                          timeout_s=30.0, temperature=0.0, http=http)
    sem = asyncio.Semaphore(concurrency)

    async def one(i: int) -> str:
        t = tasks[i % len(tasks)]
        async with sem:
            r = await policy.reply([Message(role="user", content=t.prompt)], [], task=t, sample_index=i)
        return r.message.content or ""

    async with policy.session():
        await asyncio.gather(*(one(i) for i in range(concurrency)))  # connections opened, code paths warm
        cpu0, t0 = time.process_time(), time.perf_counter()
        answers = await asyncio.gather(*(one(i) for i in range(n)))
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - t0
    wrong = sum(a != f"Answer: {tasks[i % len(tasks)].verifier.answer}" for i, a in enumerate(answers))
    return {"http": http, "requests": n, "cpu_ms_per_request": cpu * 1000 / n, "requests_per_s": n / wall,
            "wrong_answers": wrong}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="/tmp/flywheel-bench-http-client.json")
    ap.add_argument("--requests", type=int, default=1280, help="requests per measurement")
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--latency", type=float, default=0.05, help="seconds the endpoint waits per request")
    ap.add_argument("--rounds", type=int, default=3, help="measurements per stack, alternating")
    args = ap.parse_args()

    tasks = arithmetic.generate(64, split="train", seed=11)
    model = f"latency:{args.latency}:1"
    srv = EndpointProcess({"solutions": {}, "direct": {t.prompt: str(t.verifier.answer) for t in tasks},
                           "tool_turns": 0, "models": [model]})
    runs: list[dict] = []
    try:
        for r in range(args.rounds):
            for http in (HTTP_STACKS if r % 2 == 0 else HTTP_STACKS[::-1]):
                srv0 = srv.cpu_s()
                m = asyncio.run(measure(srv.base_url, model, tasks, http, args.requests, args.concurrency))
                m["round"] = r
                m["endpoint_cpu_ms_per_request"] = (srv.cpu_s() - srv0) * 1000 / args.requests
                runs.append(m)
    finally:
        srv.close()
    summary = {}
    for http in HTTP_STACKS:
        mine = [m for m in runs if m["http"] == http]
        summary[http] = {"cpu_ms_per_request_median": statistics.median(m["cpu_ms_per_request"] for m in mine),
                         "requests_per_s_median": statistics.median(m["requests_per_s"] for m in mine),
                         "wrong_answers": sum(m["wrong_answers"] for m in mine)}
    base, alt = summary["httpx"], summary["aiohttp"]
    print(f"\nOpenAI client CPU per request: concurrency {args.concurrency}, {args.requests} requests x "
          f"{args.rounds} rounds per stack, endpoint latency {args.latency * 1000:.0f} ms, {os.cpu_count()} cpus, "
          f"load {os.getloadavg()[0]:.1f}")
    print(f"{'http':<9}{'round':>6}{'cpu ms/req':>12}{'req/s':>9}{'wrong':>7}")
    for m in runs:
        print(f"{m['http']:<9}{m['round']:>6}{m['cpu_ms_per_request']:>12.3f}{m['requests_per_s']:>9.0f}"
              f"{m['wrong_answers']:>7}")
    print(f"median: aiohttp {alt['cpu_ms_per_request_median']:.3f} vs httpx {base['cpu_ms_per_request_median']:.3f} "
          f"ms/request (ratio {alt['cpu_ms_per_request_median'] / base['cpu_ms_per_request_median']:.2f}); "
          f"{alt['requests_per_s_median']:.0f} vs {base['requests_per_s_median']:.0f} requests/s")
    out = {"benchmark": "http_client", "args": vars(args), "cpus": os.cpu_count(), "runs": runs, "summary": summary}
    Path(args.out).write_text(json.dumps(out, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
