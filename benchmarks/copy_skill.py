"""Can the tiny shell student copy what it reads? Echo accuracy of its base on train and held-out ledger prompts.

The shell flywheel's student (configs/shell.toml) must copy names it has never seen (a folder, a key column, a key
value, a value column, an output path: coined per task, tasks/factory/ledger.py) from the instruction into its one
shell call. A base that memorised its train prompts instead writes train names held-out, and its round scores 0%
(README, "The shell flywheel"). Copying is what the base's copy warm-up (training/warmup.py) and the tokenizer's
rare-word rule (student.tiny.rare_word_share) are for, so this measures it directly, without Docker, SFT or a
flywheel run (minutes instead of 25): the base is built as the flywheel's base stage builds it (the config's
student.tiny settings, the tokenizer trained on the first --n train tasks' reference episodes, the warm-up on their
prompts), once per rare_word_share in --shares (0, the plain tokenizer and echo, is the baseline) and warm-up step
count in --steps, and each is scored by teacher-forced echo, `<|im_start|>P<|im_end|>P<|im_end|>` (the family's turn
markers) with the argmax of every token of the second P compared: per prompt, all tokens right (exact), the share of
tokens right, and the share of its backticked spans (the names, `.csv` and the format's) with every token right, on
40 train prompts (echoed in the warm-up) and on the 40 held-out prompts of the suite (names never seen). A base that
copies scores the same on both; one that memorised its prompts scores far lower held-out. Table printed, JSON to
--out. Trains nothing it keeps (--work).

    .venv/bin/python benchmarks/copy_skill.py --config configs/shell.toml --shares 0 0.05 --steps 0 400
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import re
import shutil
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

_HERE = str(Path(__file__).resolve().parent)  # benchmarks/sandbox.py would shadow the package
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

N_SCORED = 40


def echo_scores(model_dir: Path, prompts: list[str]) -> dict[str, float]:
    """Teacher-forced echo of each prompt: exact (every token), token share, span share (backticked spans)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from training.warmup import echo_markers

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir)).eval()
    start, end = echo_markers(tok)
    exact = tokens = spans_ok = spans = 0.0
    for p in prompts:
        enc = tok(p, add_special_tokens=False, return_offsets_mapping=True)
        ids, offsets = enc["input_ids"], enc["offset_mapping"]
        seq = torch.tensor([[start, *ids, end, *ids, end]])
        with torch.no_grad():
            pred = model(input_ids=seq).logits[0].argmax(-1)
        right = (seq[0, len(ids) + 2:-1] == pred[len(ids) + 1:-2]).tolist()
        exact += all(right)
        tokens += sum(right) / len(right)
        for m in re.finditer(r"`([^`]+)`", p):
            inside = [k for k, (a, b) in enumerate(offsets) if a < m.end(1) and b > m.start(1)]
            spans_ok += all(right[k] for k in inside)
            spans += 1
    n = len(prompts)
    return {"exact": round(exact / n, 3), "tokens": round(tokens / n, 4), "spans": round(spans_ok / max(spans, 1), 3)}


def measure(config: str, n: int, share: float, steps: int, work: str) -> dict:
    """One base of the config built with rare_word_share=`share` and warmed up for `steps`, echo-scored."""
    from flows.config import load_config
    from tasks.factory.suite import ledger_tasks
    from training.tiny import build_tiny_model, task_corpus
    from training.warmup import warm_up_copying

    cfg = load_config(config)
    t = cfg.student.tiny
    # the suite's own task folders (its cache, as a run loads them), without their images
    train = ledger_tasks(n, split="train", seed=cfg.run.seed, build=False)
    held = ledger_tasks(N_SCORED, split="heldout", seed=cfg.run.seed, build=False)
    base = Path(work) / f"base-{share}-{steps}"
    shutil.rmtree(base, ignore_errors=True)
    build_tiny_model(base, task_corpus(train, family=cfg.student.base), family=cfg.student.base, hidden=t.hidden,
                     layers=t.layers, heads=t.heads, kv_heads=t.kv_heads, vocab_size=t.vocab_size, seed=t.seed,
                     experts=t.experts, experts_per_token=t.experts_per_token, rare_word_share=share)
    t0 = time.perf_counter()
    warm = warm_up_copying(base, [x.prompt for x in train], steps=steps, learning_rate=t.copy_warmup_learning_rate,
                           batch_size=t.copy_warmup_batch_size, seed=t.seed, threads=1, rare_word_share=share)
    return {"rare_word_share": share, "warmup_steps": steps, "batch_size": t.copy_warmup_batch_size,
            "echo_loss": round(warm.final_loss, 4) if steps else None,
            "wall_s": round(time.perf_counter() - t0, 1),
            "train": echo_scores(base, [x.prompt for x in train[:N_SCORED]]),
            "heldout": echo_scores(base, [x.prompt for x in held])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/shell.toml", help="the run config whose student.tiny is measured")
    ap.add_argument("--n", type=int, default=300, help="train tasks: the tokenizer's corpus and the echoed prompts")
    ap.add_argument("--steps", type=int, nargs="+", default=[0, 400], help="copy warm-up steps, the baseline first")
    ap.add_argument("--shares", type=float, nargs="+", default=[0.0, 0.05],
                    help="student.tiny.rare_word_share values, each with every --steps (0: the plain tokenizer and "
                         "echo, the baseline)")
    ap.add_argument("--jobs", type=int, default=2, help="bases measured at once (one CPU thread each)")
    ap.add_argument("--work", default="/tmp/flywheel-copy-skill", help="folder for the bases")
    ap.add_argument("--out", default="/tmp/flywheel-copy-skill.json")
    args = ap.parse_args()

    from tasks.factory.suite import ledger_tasks

    ledger_tasks(args.n, split="train", build=False)  # the task folders written once, before the workers read them
    ledger_tasks(N_SCORED, split="heldout", build=False)
    shutil.rmtree(args.work, ignore_errors=True)
    pairs = [(share, steps) for share in args.shares for steps in args.steps]
    with ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = [pool.submit(measure, args.config, args.n, share, steps, args.work) for share, steps in pairs]
        results = []
        for f in futures:
            results.append(f.result())
            print(json.dumps(results[-1]), flush=True)
    print(f"\nteacher-forced echo, {args.n} train tasks, {min(args.n, N_SCORED)} train and {N_SCORED} held-out "
          f"prompts ({args.config}):")
    print(f"{'rare share':>10} {'warm-up steps':>13} {'echo loss':>9} {'wall s':>7} | {'train exact':>11} {'tokens':>6} "
          f"{'spans':>5} | {'held-out exact':>14} {'tokens':>6} {'spans':>5}")
    for r in results:
        loss = "-" if r["echo_loss"] is None else f"{r['echo_loss']:.3f}"
        a, b = r["train"], r["heldout"]
        print(f"{r['rare_word_share']:>10} {r['warmup_steps']:>13} {loss:>9} {r['wall_s']:>7} | {a['exact']:>11} "
              f"{a['tokens']:>6} {a['spans']:>5} | {b['exact']:>14} {b['tokens']:>6} {b['spans']:>5}")
    Path(args.out).write_text(json.dumps({"config": args.config, "n_train": args.n, "results": results}, indent=1)
                              + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
