"""Benchmark: client CPU per model request, the OpenAI policy's own aiohttp client vs the openai SDK, same process.

A rollout on a small machine is bounded by the CPU the client spends per model request once sandboxes are cheap
(benchmarks/rollout.py: "where the CPU goes"). This isolates that cost: the same chat-completions requests at a fixed
concurrency against the latency endpoint of benchmarks/rollout.py (tests/agents/fault_server.py in its own process,
one short turn answered directly), sent by
- `flywheel`: `OpenAIPolicy.reply` (plain aiohttp, JSON in and out: what rollouts use),
- `sdk-httpx`: the `openai` SDK's `AsyncOpenAI.chat.completions.create` with its default HTTP stack (the baseline:
  the SDK as commonly used, and what OpenAIPolicy sent through until now), and `sdk-aiohttp`: the same with the
  SDK's aiohttp transport,
alternating in rounds so all see the same machine load. Reports this process's CPU milliseconds per request (the
number that matters on 2 cores), requests per second and the ratios; writes JSON (--out).

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

from agents.openai_policy import OpenAIPolicy
from benchmarks.rollout import EndpointProcess
from tasks import arithmetic
from warehouse.record import Message

CLIENTS = ("flywheel", "sdk-httpx", "sdk-aiohttp")


async def measure(base_url: str, model: str, tasks: list, client: str, n: int, concurrency: int) -> dict:
    """n requests at the given concurrency after a warm-up wave; CPU ms per request and requests per second."""
    sem = asyncio.Semaphore(concurrency)
    if client == "flywheel":
        policy = OpenAIPolicy(base_url=base_url, model=model, name=client, concurrency=concurrency, max_retries=0,
                              timeout_s=30.0, temperature=0.0)

        async def ask(i: int) -> str:
            t = tasks[i % len(tasks)]
            r = await policy.reply([Message(role="user", content=t.prompt)], [], task=t, sample_index=i)
            return r.message.content or ""

        scope = policy.session()
    else:
        from openai import AsyncOpenAI, DefaultAioHttpClient, DefaultAsyncHttpxClient

        http = DefaultAioHttpClient() if client == "sdk-aiohttp" else DefaultAsyncHttpxClient()
        sdk = AsyncOpenAI(base_url=base_url, api_key="EMPTY", max_retries=0, timeout=30.0, http_client=http)

        async def ask(i: int) -> str:
            t = tasks[i % len(tasks)]
            r = await sdk.chat.completions.create(model=model, messages=[{"role": "user", "content": t.prompt}],
                                                  temperature=0.0, max_tokens=512)
            return r.choices[0].message.content or ""

        scope = sdk

    async def one(i: int) -> str:
        async with sem:
            return await ask(i)

    async with scope:
        await asyncio.gather(*(one(i) for i in range(concurrency)))  # connections opened, code paths warm
        cpu0, t0 = time.process_time(), time.perf_counter()
        answers = await asyncio.gather(*(one(i) for i in range(n)))
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - t0
    wrong = sum(a != f"Answer: {tasks[i % len(tasks)].verifier.answer}" for i, a in enumerate(answers))
    return {"client": client, "requests": n, "cpu_ms_per_request": cpu * 1000 / n, "requests_per_s": n / wall,
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
            for client in (CLIENTS if r % 2 == 0 else CLIENTS[::-1]):
                srv0 = srv.cpu_s()
                m = asyncio.run(measure(srv.base_url, model, tasks, client, args.requests, args.concurrency))
                m["round"] = r
                m["endpoint_cpu_ms_per_request"] = (srv.cpu_s() - srv0) * 1000 / args.requests
                runs.append(m)
    finally:
        srv.close()
    summary = {}
    for client in CLIENTS:
        mine = [m for m in runs if m["client"] == client]
        summary[client] = {"cpu_ms_per_request_median": statistics.median(m["cpu_ms_per_request"] for m in mine),
                         "requests_per_s_median": statistics.median(m["requests_per_s"] for m in mine),
                         "wrong_answers": sum(m["wrong_answers"] for m in mine)}
    print(f"\nclient CPU per chat-completions request: concurrency {args.concurrency}, {args.requests} requests x "
          f"{args.rounds} rounds per client, endpoint latency {args.latency * 1000:.0f} ms, {os.cpu_count()} cpus, "
          f"load {os.getloadavg()[0]:.1f}")
    print(f"{'client':<13}{'round':>6}{'cpu ms/req':>12}{'req/s':>9}{'endpoint ms':>13}{'wrong':>7}")
    for m in runs:
        print(f"{m['client']:<13}{m['round']:>6}{m['cpu_ms_per_request']:>12.3f}{m['requests_per_s']:>9.0f}"
              f"{m['endpoint_cpu_ms_per_request']:>13.3f}{m['wrong_answers']:>7}")
    base = summary["sdk-httpx"]["cpu_ms_per_request_median"]
    print("median cpu ms/request: " + ", ".join(
        f"{c} {summary[c]['cpu_ms_per_request_median']:.3f} (x{summary[c]['cpu_ms_per_request_median'] / base:.2f})"
        for c in CLIENTS) + " (ratios to sdk-httpx, the baseline)")
    out = {"benchmark": "http_client", "args": vars(args), "cpus": os.cpu_count(), "runs": runs, "summary": summary}
    Path(args.out).write_text(json.dumps(out, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
