"""Benchmark: TRL's GRPOTrainer through OpenEnv's own client against `flywheel env serve SUITE` on loopback.

Starts the server (the installed console script, local sandboxes, its own lake), then runs a TRL user's script:
GRPOTrainer(environment_factory=openenv_environment_class(url, tools), reward_funcs=[OpenEnvReward()]) on the
student for --steps steps. Prints one table per step (the reward TRL logged, the gradient norm, the verdicts of the
step's episodes as the server's rows record them, the step's wall time) and the episodes per second, and writes JSON
(--out). With a trained student (e.g. a run's round-1 SFT checkpoint) the groups' rewards differ, so the steps move
the weights; a fresh tiny student answers without tools (the judge: hack, reward 0) and its gradient is 0.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

_HERE = os.path.dirname(os.path.abspath(__file__))  # benchmarks/sandbox.py would shadow the sandbox package
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(url: str, proc: subprocess.Popen, deadline_s: float = 180) -> None:
    end = time.time() + deadline_s
    while time.time() < end and proc.poll() is None:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2):
                return
        except OSError:
            time.sleep(0.3)
    raise SystemExit(f"error: the environment server at {url} did not start")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--student", required=True, help="Model folder of the student (a checkpoint of a run).")
    ap.add_argument("--suite", default="arithmetic")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--prompts", type=int, default=4, help="Prompts per step.")
    ap.add_argument("--generations", type=int, default=4, help="Generations per prompt (GRPO's group).")
    ap.add_argument("--out", default=None, help="JSON output path.")
    a = ap.parse_args()
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from training.environment import OpenEnvReward, openenv_environment_class, openenv_task_rows, use_codec_parser
    from warehouse.query import query

    tmp = Path(tempfile.mkdtemp(prefix="openenv-grpo-"))
    lake, port = tmp / "lake", _free_port()
    url = f"http://127.0.0.1:{port}"
    flywheel = str(Path(sys.executable).with_name("flywheel"))
    log = open(tmp / "serve.log", "w")  # noqa: SIM115 - the server's log, open while it runs
    proc = subprocess.Popen([flywheel, "env", "serve", a.suite, "--port", str(port), "--root", str(lake), "--n",
                             str(a.steps * a.prompts), "--backend", "local"], stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        _wait(url, proc)
        cols, tools = openenv_task_rows(url, a.steps * a.prompts)
        tok = use_codec_parser(AutoTokenizer.from_pretrained(a.student))
        tok.padding_side = "left"
        args = GRPOConfig(output_dir=str(tmp / "out"), max_steps=a.steps, num_generations=a.generations,
                          per_device_train_batch_size=a.prompts * a.generations, learning_rate=1e-5,
                          max_completion_length=96, max_tool_calling_iterations=2, temperature=1.0, seed=0,
                          use_cpu=True, report_to="none", save_strategy="no", logging_steps=1, disable_tqdm=True,
                          dataloader_num_workers=0, shuffle_dataset=False)
        trainer = GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(a.student), reward_funcs=[OpenEnvReward()],
                              args=args, train_dataset=Dataset.from_dict(cols), processing_class=tok,
                              environment_factory=openenv_environment_class(url, tools, policy="trl-bench"))
        t0 = time.perf_counter()
        trainer.train()
        wall = time.perf_counter() - t0
        for envs in trainer._environment_pool.values():
            for env in envs:
                env._close()
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        log.close()
    logs = [h for h in trainer.state.log_history if "reward" in h]
    rows = query(str(lake), "SELECT verdict, count(*) AS n FROM trajectories GROUP BY verdict ORDER BY verdict"
                 ).to_pylist()
    n = sum(r["n"] for r in rows)
    steps = [{"step": i + 1, "reward": h["reward"], "reward_std": h.get("reward_std"), "grad_norm": h.get("grad_norm"),
              "step_time_s": h.get("step_time")} for i, h in enumerate(logs)]
    print(f"student {a.student}; suite {a.suite}; {a.steps} steps x {a.prompts} prompts x {a.generations} generations")
    print(f"{'step':>4} {'reward':>8} {'std':>7} {'grad norm':>10} {'step s':>7}")
    for s in steps:
        print(f"{s['step']:>4} {s['reward']:>8.3f} {s['reward_std'] or 0:>7.3f} {s['grad_norm'] or 0:>10.4f} "
              f"{s['step_time_s'] or 0:>7.1f}")
    verdicts = ", ".join(f"{r['verdict']} {r['n']}" for r in rows)
    print(f"episodes written by the server: {n} ({verdicts}); "
          f"{n / wall:.2f} episodes/s over {wall:.1f} s of training")
    if a.out:
        Path(a.out).write_text(json.dumps({"student": a.student, "suite": a.suite, "steps": steps, "verdicts": rows,
                                           "episodes": n, "train_wall_s": wall}, indent=1) + "\n")


if __name__ == "__main__":
    main()
