"""Benchmark: what GRPO's generation costs per episode on the arithmetic suite and on Harbor tasks, in Docker.

For each suite a tiny student is built from the tasks' corpus and fine-tuned on their reference episodes (played
through the real loop), then GRPO runs `--steps` steps of `--prompts` tasks x `--generations` generations. Rows:
arithmetic in the run's Docker sandboxes with container reuse (reset between episodes, the Docker default) and
without it (a fresh container per episode); Harbor tasks, each generation in a container of the task's own image and
graded by test.sh in a fresh one, with the agent containers reused (reset between generations, grpo.harbor_reuse,
sandbox/taskenv.py) and without (a fresh one per generation). The tasks recur: with as many tasks as prompts per
step every step plays all of them, so from the second step on a reusing run finds reset containers of each image.
Episodes per second is scored generations over GRPO's wall time (generation, tool calls, grading and the updates;
the updates of a tiny model are a small share). Prints a table, writes JSON (`--json`).

    .venv/bin/python benchmarks/grpo_cost.py [--steps 4] [--prompts 2] [--generations 4] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sandbox.backend import open_backend
from sandbox.result import SandboxConfig
from tasks import arithmetic
from tasks.harbor import load_harbor
from tasks.spec import ReferenceSolution, ToolCallStep
from training.config import GRPOConfig, SFTConfig
from training.grpo import train_grpo
from training.sft import train_sft
from training.tiny import build_tiny_model, task_corpus

# one-line references for shipped Harbor tasks (their oracles copy solution/ in base64: long for a tiny model)
HARBOR_REFERENCES = {
    "hello-file": "printf 'Hello, world!\\n' > /app/hello.txt",
    "sort-numbers": "sort -n /app/numbers.txt > /app/sorted.txt",
    "set-port": "sed -i '0,/^port = 80$/s//port = 8080/' /app/server.ini",
}


def reference_rows(tasks, backend):
    import asyncio

    from agents.reference import ReferencePolicy
    from agents.rollout import rollout

    rows: list = []
    asyncio.run(rollout(tasks, ReferencePolicy(), backend, run_id="bench-ref", concurrency=2, on_rows=rows.extend,
                        batch_size=len(tasks), progress=False))
    return rows


def harbor_tasks(n: int):
    out = []
    for name, command in list(HARBOR_REFERENCES.items())[:n]:
        t = load_harbor(ROOT / "data" / "harbor" / name, build=True)[0]
        ref = ReferenceSolution(steps=[ToolCallStep(tool="shell", arguments={"command": command})], final="Done.")
        out.append(t.model_copy(update={"reference": ref}))
    return out


def student(tasks, backend, folder: Path) -> str:
    rows = reference_rows(tasks, backend)
    bad = [r.verdict for r in rows if r.verdict != "pass"]
    if bad:
        raise SystemExit(f"reference episodes did not pass: {bad}")
    base = build_tiny_model(folder / "base", task_corpus(tasks) * 2, hidden=64, layers=2, heads=2, kv_heads=1,
                            vocab_size=600, seed=0)
    return train_sft(base, rows, folder / "sft", SFTConfig(max_steps=150, batch_size=2, learning_rate=1e-2,
                                                           max_length=2048), progress=False).checkpoint_path


def measure(name: str, tasks, reuse: bool | None, harbor_reuse: bool, a, folder: Path) -> dict:
    from tasks import harbor as harbor_tasks_module

    cfg = GRPOConfig(max_steps=a.steps, num_generations=a.generations, prompts_per_step=a.prompts,
                     max_completion_length=64, max_tool_calling_iterations=2, learning_rate=1e-4, seed=3,
                     update_check=False, harbor_reuse=harbor_reuse)
    with open_backend(SandboxConfig(backend="docker", timeout_s=30.0, reuse=reuse), pool_size=2) as backend:
        model = student(tasks, backend, folder / name)
        harbor_tasks_module.shutdown()  # the reference episodes' containers: not the measured run's
        t0 = time.perf_counter()
        res = train_grpo(model, tasks, folder / name / "grpo", cfg, backend=backend, progress=False)
        wall = time.perf_counter() - t0
    return {"condition": name, "tasks": len(tasks), "episodes": res.episodes, "grpo_wall_s": round(res.wall_s, 2),
            "total_s": round(wall, 2), "episodes_per_s": round(res.episodes / res.wall_s, 3),
            "verdicts": {k: v for k, v in res.verdicts.items() if v}, "task_containers": res.task_containers}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--prompts", type=int, default=2, help="Tasks per step (at most 3 Harbor tasks).")
    ap.add_argument("--generations", type=int, default=4)
    ap.add_argument("--json", default=str(ROOT / "benchmarks" / "grpo_cost.json"))
    a = ap.parse_args()
    arith = arithmetic.generate(a.prompts, split="train", seed=3, difficulty=1)
    harbor = harbor_tasks(a.prompts)
    rows = []
    with tempfile.TemporaryDirectory(prefix="flywheel-bench-grpo-") as tmp:
        for name, tasks, reuse, harbor_reuse in (
                ("arithmetic, containers reused", arith, True, False),
                ("arithmetic, fresh containers", arith, False, False),
                ("harbor, task containers reused", harbor, None, True),
                ("harbor, fresh container of the task image", harbor, None, False)):
            rows.append(measure(name, tasks, reuse, harbor_reuse, a, Path(tmp)))
            r = rows[-1]
            print(f"{r['condition']:<44} {r['episodes']:>4} episodes  {r['grpo_wall_s']:>7.1f} s  "
                  f"{r['episodes_per_s']:>6.2f} episodes/s  {r['verdicts']} {r['task_containers']}", flush=True)
    base = rows[0]["episodes_per_s"]
    print("\n| condition | episodes | GRPO wall s | episodes/s | vs arithmetic reused | verdicts | task containers |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['condition']} | {r['episodes']} | {r['grpo_wall_s']} | {r['episodes_per_s']} | "
              f"{r['episodes_per_s'] / base:.2f}x | {r['verdicts']} | {r['task_containers'] or ''} |")
    Path(a.json).write_text(json.dumps({"args": vars(a), "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
