"""Decontamination and near-dedup measured on a planted set: recall on paraphrases, false drops on train splits.

For every built-in suite and difficulty it draws held-out and train tasks and builds reference-teacher episodes
(the task's reference tool calls and final answer). Planted contamination: light paraphrases of held-out prompts
(case and whitespace, number formats, word swaps, sentence reordering, a wrapper sentence, all of these at once),
each as a full episode and as a prompt alone (no tool call: only the prompt rules can see it), plus the held-out
reference tool calls under an unrelated prompt. Clean: every train episode drawn ("the full train split" up to
--train per suite and difficulty) and honest look-alikes (a held-out prompt with one defining number changed).
Near-dedup: copies of train episodes with case/whitespace changes, number formats (`109.0`), a reworded final
line or an added remark, against each episode's most similar other train episode (hard negatives).

Prints the tables and writes JSON (--out). The chosen defaults are curate/config.py's DecontamConfig and
DedupConfig; the sweeps show why. Run:
    python benchmarks/decontam.py --train 2000 --heldout 100 --code-train 150 --out benchmarks/decontam.json
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from curate.config import DecontamConfig, DedupConfig
from curate.decontam import Decontaminator
from curate.dedup import dedup_rows, problem_key, row_text, shingles
from curate.normalise import constants_in_context, grams, held_in_context, tokens
from tasks.spec import Task
from tasks.suites import load_suite
from warehouse.record import FunctionCall, Message, ToolCall, Trajectory, trajectory_id

SWAPS = [("has", "owns"), ("gets", "receives"), ("gives away", "hands out"), ("how many", "what number of"),
         ("what is", "compute"), ("buys", "purchases"), ("more", "extra"), ("are left", "remain"),
         ("returns", "gives back"), ("write", "implement"), ("the list", "the given list"), ("people", "persons"),
         ("different", "distinct"), ("integers", "whole numbers"), ("every", "each"), ("number", "count"),
         ("picks", "chooses"), ("should be fixed", "needs a fix"), ("leaves", "departs"), ("is", "equals")]


def episode(task: Task, *, user: str | None = None, with_calls: bool = True, final: str | None = None,
            tag: str = "ref", sample: int = 0) -> Trajectory:
    """A reference-teacher episode of task (or its prompt alone when with_calls is off)."""
    msgs = [Message(role="user", content=user if user is not None else task.prompt)]
    if with_calls:
        for i, step in enumerate(task.reference.steps):
            cid = f"c{i}"
            msgs.append(Message(role="assistant", content=None, tool_calls=[
                ToolCall(id=cid, function=FunctionCall(name=step.tool, arguments=json.dumps(step.arguments)))]))
            msgs.append(Message(role="tool", content=task.verifier.answer or "ok", tool_call_id=cid, name=step.tool))
    msgs.append(Message(role="assistant", content=final if final is not None else
                        (task.reference.final if with_calls else "I would need to work this out.")))
    return Trajectory(
        trajectory_id=trajectory_id("bench", 0, task.id, tag, sample), run_id="bench", round=0, source="teacher",
        policy=tag, sample_index=sample, task_id=f"{task.id}-{tag}-{sample}", suite=task.suite, split="train",
        task_version=task.version, difficulty=task.difficulty, verifier="numeric", verifier_version="1",
        messages=msgs, tools_json="[]", answer=task.verifier.answer, reward=1.0, success=True, verdict="pass",
        hack_flags=[], turns=len(task.reference.steps) + 1, n_tool_calls=len(task.reference.steps))


def _fmt_numbers(text: str) -> str:
    def one(m: re.Match[str]) -> str:
        n = int(m.group(0))
        return f"{n:,}" if n >= 1000 else f"{n}.0"
    return re.sub(r"(?<![\w.])\d+(?![\w.])", one, text)


def _swap(text: str, k: int) -> str:
    done = 0
    for a, b in SWAPS:
        pat = re.compile(rf"\b{re.escape(a)}\b", re.IGNORECASE)
        if done < k and pat.search(text):
            text, done = pat.sub(b, text, count=1), done + 1
    return text


def _reorder(text: str) -> str:
    parts = [p for p in re.split(r"(?<=[.?!;])\s+", text.strip()) if p]
    if len(parts) >= 2:
        return " ".join(parts[-1:] + parts[:-1])
    words = text.rstrip("?.!").split()
    return f"{' '.join(words[2:])}: {' '.join(words[:2]).lower()}?" if len(words) > 3 else text


def paraphrases(prompt: str) -> dict[str, str]:
    """Light paraphrases of one prompt, by kind."""
    return {
        "case_space": re.sub(r" ", "  ", prompt.upper()),
        "number_format": _fmt_numbers(prompt),
        "word_swap": _swap(prompt, 2),
        "reorder": _reorder(prompt),
        "wrapped": f"Hi! Could you help me with this one: {prompt} Thank you so much.",
        "all": _reorder(_fmt_numbers(_swap(prompt, 3))).replace(" ", "  "),
    }


def lookalike(prompt: str) -> str | None:
    """The prompt with its last number changed by one: another problem of the same template."""
    nums = list(re.finditer(r"(?<![\w.])\d+(?![\w.])", prompt))
    if not nums:
        return None
    m = nums[-1]
    return prompt[: m.start()] + str(int(m.group(0)) + 1) + prompt[m.end():]


def dup_variants(r: Trajectory) -> dict[str, Trajectory]:
    """Near-duplicate copies of an episode, by kind."""
    def edit(fn) -> Trajectory:
        msgs = [m.model_copy(update={"content": fn(m) if m.content else m.content}) for m in r.messages]
        return r.model_copy(update={"messages": msgs, "trajectory_id": r.trajectory_id + "-dup"})
    last = max(i for i, m in enumerate(r.messages) if m.role == "assistant")
    ans = r.answer or ""
    return {
        "case_space": edit(lambda m: "  " + m.content.upper().replace(" ", "   ") + " "),
        "number_format": edit(lambda m: _fmt_numbers(m.content)),
        "reworded_final": edit(lambda m: f"The result is {ans}." if m is r.messages[last] else m.content),
        "remark": edit(lambda m: f"So that gives {ans}. {m.content}" if m is r.messages[last] else m.content),
        "all": edit(lambda m: _fmt_numbers(f"The result is {ans}." if m is r.messages[last] else m.content).upper()),
    }


def draw(suite: str, n: int, split: str, d: int) -> list[Task]:
    """Up to n tasks: the code suite's small families run out of distinct problems at some difficulties."""
    while True:
        try:
            return load_suite(suite, n, split, 0, d)
        except ValueError:
            if n <= 1:
                raise
            n = n * 3 // 4


NAMES = {"ana", "ben", "kim", "raj", "zoe", "leo", "mia", "sam"}


def _key(prompt: str) -> tuple[str, ...]:
    """A prompt's tokens without the person's name: equal keys pose the same problem."""
    return tuple(t for t in tokens(prompt) if t not in NAMES)


def same_problem(a: Task, b: Task) -> bool:
    """Two tasks pose one problem: the same reference solution, the same expression up to commuting + or *
    (arithmetic), or the same family with the same parameters up to the person's name or the order of symmetric ones (same answer)."""
    ea, eb = a.metadata.get("expression"), b.metadata.get("expression")
    if [st.arguments for st in a.reference.steps] == [st.arguments for st in b.reference.steps]:
        return True   # the held-out task's reference solution is the train task's, verbatim
    if isinstance(ea, str) and isinstance(eb, str):
        pa, pb = ea.split(), eb.split()
        return pa == pb or (len(pa) == len(pb) == 3 and pa[1] == pb[1] in "+*" and pa[::-1] == pb)
    if a.metadata.get("family") is None or a.metadata.get("family") != b.metadata.get("family"):
        return False
    qa = {k: v for k, v in a.metadata.get("params", {}).items() if k != "name"}
    qb = {k: v for k, v in b.metadata.get("params", {}).items() if k != "name"}
    if qa == qb:
        return True
    return sorted(map(str, qa.values())) == sorted(map(str, qb.values())) and a.verifier.answer == b.verifier.answer


def jacc(a: set, b: set) -> float:
    return len(a & b) / len(a | b) if a or b else 1.0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--train", type=int, default=2000, help="train tasks per procedural suite and difficulty")
    ap.add_argument("--code-train", type=int, default=150, help="train tasks per code difficulty (slow to draw)")
    ap.add_argument("--heldout", type=int, default=100, help="held-out tasks per suite and difficulty")
    ap.add_argument("--dedup-sample", type=int, default=150, help="train episodes per suite/difficulty copied")
    ap.add_argument("--out", default="benchmarks/decontam.json")
    args = ap.parse_args(argv)
    t0 = time.time()
    cfg = DecontamConfig()
    out: dict[str, object] = {"args": vars(args), "config": cfg.model_dump()}

    pos_full: dict[str, list[tuple[str, str | None]]] = defaultdict(list)    # kind -> (expected id, hit id)
    pos_prompt: dict[str, list[tuple[str, str | None]]] = defaultdict(list)
    rule_counts: Counter[str] = Counter()
    fp_train: Counter[str] = Counter()
    fp_examples: list[dict[str, str]] = []
    leaks: Counter[str] = Counter()
    leak_ids: set[str] = set()
    look_examples: list[dict[str, str]] = []
    leak_examples: list[dict[str, str]] = []
    n_train = 0
    look_total, look_fp = 0, Counter()
    sweep_rows: list[tuple[str, Trajectory, str | None, Task]] = []   # (label, row, expected id, held) for sweeps
    dedup_pairs: list[tuple[str, Trajectory, Trajectory]] = []        # (label, a, b)

    for suite in ("arithmetic", "mathword", "code"):
        for d in (1, 2, 3):
            n_tr = args.code_train if suite == "code" else args.train
            n_ho = min(args.heldout, 40) if suite == "code" else args.heldout
            train = draw(suite, n_tr, "train", d)
            held = draw(suite, n_ho, "heldout", d)
            train_rows = [episode(t) for t in train]
            dec = Decontaminator(held, cfg, [t.prompt for t in train])
            held_keys = {_key(h.prompt) for h in held}
            for h in held:
                for kind, p in paraphrases(h.prompt).items():
                    full, bare = episode(h, user=p, tag=kind), episode(h, user=p, with_calls=False, tag=kind + "-bare")
                    hit = dec.match(full)
                    pos_full[kind].append((h.id, hit.heldout_id if hit else None))
                    rule_counts[hit.rule if hit else "missed"] += 1
                    hb = dec.match(bare)
                    pos_prompt[kind].append((h.id, hb.heldout_id if hb else None))
                    sweep_rows.append(("pos", bare, h.id, h))
                if h.reference.steps:
                    new = episode(h, user="Here is some code; run it and tell me what it prints.", tag="calls")
                    hit = dec.match(new)
                    pos_full["calls_new_prompt"].append((h.id, hit.heldout_id if hit else None))
                la = lookalike(h.prompt)
                if la is not None and _key(la) not in held_keys:   # else the change made another held-out task
                    look_total += 1
                    hit = dec.match(episode(h, user=la, with_calls=False, tag="look"))
                    if hit:
                        look_fp[hit.rule] += 1
                        if len(look_examples) < 6:
                            look_examples.append({"rule": hit.rule, "lookalike": la, "heldout": h.prompt})
                    sweep_rows.append(("neg", episode(h, user=la, with_calls=False, tag="look"), None, h))
            for t, r in zip(train, train_rows):
                n_train += 1
                hit = dec.match(r)
                if hit:
                    h = next(x for x in held if x.id == hit.heldout_id)
                    if same_problem(t, h):   # the suite's split let a held-out problem into train: a true leak
                        leak_ids.add(r.trajectory_id)
                        leaks[f"{suite}/d{d}/{hit.rule}"] += 1
                        if len(leak_examples) < 6:
                            leak_examples.append({"rule": hit.rule, "train": t.prompt, "heldout": h.prompt})
                        continue
                    fp_train[f"{suite}/d{d}/{hit.rule}"] += 1
                    if len(fp_examples) < 12:
                        fp_examples.append({"rule": hit.rule, "train": t.prompt, "heldout": h.prompt})
                if r.trajectory_id not in leak_ids:
                    sweep_rows.append(("neg", episode(t, with_calls=False, tag="bare"), None, t))
            # near-dedup pairs: copies vs the most similar other train episode
            rng = random.Random(f"{suite}{d}")
            sample = rng.sample(train_rows, min(args.dedup_sample, len(train_rows)))
            by_task = {t.id: t for t in train}
            for r in sample:
                for kind, v in dup_variants(r).items():
                    dedup_pairs.append((f"pos:{kind}", r, v))
                t = by_task[r.task_id.split("-ref-")[0]]
                if isinstance(t.metadata.get("expression"), str):   # the same problem solved another way
                    a, op, b = t.metadata["expression"].split()
                    other = t.model_copy(deep=True)
                    other.reference.steps[0].arguments = {"code": f"first = {a}\nsecond = {b}\n"
                                                                  f"result = first {op} second\nprint(result)"}
                    other.reference.final = (f"I stored both numbers and combined them with {op}; the result "
                                             f"is {t.verifier.answer}.")
                    dedup_pairs.append(("neg:same_problem_other_solution", r, episode(other, tag="alt")))
            texts = {r.trajectory_id: shingles(row_text(r), 3) for r in train_rows}
            for r in sample:
                best = max((x for x in train_rows if x.trajectory_id != r.trajectory_id
                            and problem_key(x) != problem_key(r)),
                           key=lambda x: jacc(texts[r.trajectory_id], texts[x.trajectory_id]))
                dedup_pairs.append(("neg:nearest_other_problem", r, best))
            print(f"  {suite} d{d}: {len(train)} train, {len(held)} held-out ({time.time() - t0:.0f} s)",
                  file=sys.stderr)

    def recall(pairs: list[tuple[str, str | None]]) -> tuple[int, int, int]:
        found = sum(1 for want, got in pairs if got is not None)
        right = sum(1 for want, got in pairs if got == want)
        return len(pairs), found, right

    print("\nDecontamination recall on planted contamination (default DecontamConfig)")
    print(f"{'kind':<18}{'full episode':>22}{'prompt alone':>22}")
    table = {}
    for kind in list(pos_full):
        n, f, r = recall(pos_full[kind])
        line = f"{kind:<18}{f'{f}/{n} = {f / n:.3f}':>22}"
        row = {"full_n": n, "full_found": f, "full_right_task": r}
        if kind in pos_prompt:
            n2, f2, r2 = recall(pos_prompt[kind])
            line += f"{f'{f2}/{n2} = {f2 / n2:.3f}':>22}"
            row.update(prompt_n=n2, prompt_found=f2, prompt_right_task=r2)
        print(line)
        table[kind] = row
    allp = [x for k in pos_full for x in pos_full[k]]
    n, f, r = recall(allp)
    n2, f2, _ = recall([x for k in pos_prompt for x in pos_prompt[k]])
    print(f"{'all paraphrases':<18}{f'{f}/{n} = {f / n:.3f}':>22}{f'{f2}/{n2} = {f2 / n2:.3f}':>22}")
    print(f"  matched to the right held-out task: {r}/{f}; rules that fired first: {dict(rule_counts)}")
    print(f"False drops: {sum(fp_train.values())} of {n_train} train episodes of every built-in suite "
          f"{dict(fp_train) or ''}; look-alikes (a number changed): {sum(look_fp.values())} of {look_total}")
    for ex in fp_examples:
        print(f"  {ex['rule']}: train {ex['train']!r}\n      ~ held-out {ex['heldout']!r}")
    for ex in look_examples:
        print(f"  look-alike {ex['rule']}: {ex['lookalike']!r}\n      ~ held-out {ex['heldout']!r}")
    print(f"Train tasks that pose a held-out problem (commuted operands, another name), dropped as leaks: "
          f"{sum(leaks.values())} {dict(leaks) or ''}")
    for ex in leak_examples:
        print(f"  {ex['rule']}: train {ex['train'][:90]!r} ~ held-out {ex['heldout'][:90]!r}")
    out.update(recall=table, recall_all={"n": n, "found": f, "right_task": r, "prompt_n": n2, "prompt_found": f2},
               false_drops={"train_rows": n_train, "dropped": dict(fp_train), "examples": fp_examples,
                            "same_problem_leaks": dict(leaks), "leak_examples": leak_examples,
                            "lookalikes": look_total, "lookalikes_dropped": dict(look_fp),
                            "lookalike_examples": look_examples})

    # sweep of the prompt rules on prompt-alone rows: n-gram size / threshold, MinHash shingle / threshold
    print("\nPrompt rules alone, swept (positives: paraphrased held-out prompts; negatives: train prompts and "
          "look-alikes; gate = held-out constants present, each beside a neighbour word)")
    by_suite: dict[str, list[Task]] = defaultdict(list)
    for lab, r, want, t in sweep_rows:
        if lab == "pos":
            by_suite[f"{t.suite}/{t.difficulty}"].append(t)
    held_by = {k: list({t.id: t for t in v}.values()) for k, v in by_suite.items()}
    sweep = []
    print(f"{'rule':<10}{'size':>5}{'thr':>6}{'gate':>6}{'recall':>8}{'false+':>8}")
    for size in (1, 2, 3, 4):
        hs = {k: [(h, grams(tokens(h.prompt), size), constants_in_context(tokens(h.prompt))) for h in v]
              for k, v in held_by.items()}
        scores = []
        for lab, r, want, t in sweep_rows:
            toks = tokens(r.messages[0].content or "")
            sh, have = grams(toks, size), constants_in_context(toks)
            cands = hs[f"{t.suite}/{t.difficulty}"]
            g = max((jacc(sh, s) for h, s, c in cands if held_in_context(have, c)), default=0.0)
            u = max((jacc(sh, s) for h, s, c in cands), default=0.0)
            scores.append((lab, g, u))
        for thr in (0.3, 0.4, 0.5, 0.6, 0.7, 0.8):
            for gate in (True, False):
                tp = sum(1 for lab, g, u in scores if lab == "pos" and (g if gate else u) >= thr)
                fp = sum(1 for lab, g, u in scores if lab == "neg" and (g if gate else u) >= thr)
                npos = sum(1 for s in scores if s[0] == "pos")
                sweep.append({"rule": "minhash", "shingle": size, "threshold": thr, "gate": gate,
                              "recall": tp / npos, "false_pos": fp})
                if thr in (0.4, 0.5, 0.6):
                    print(f"{'jaccard':<10}{size:>5}{thr:>6}{gate!s:>6}{tp / npos:>8.3f}{fp:>8}")
    for n_gram in (2, 3, 4, 8):
        c = DecontamConfig(ngram=n_gram)
        decs = {k: Decontaminator(v, c) for k, v in held_by.items()}
        sc = [(lab, decs[f"{t.suite}/{t.difficulty}"].score(r)[0]) for lab, r, want, t in sweep_rows]
        npos = sum(1 for s in sc if s[0] == "pos")
        for thr in (0.6, 0.7, 0.8, 0.9):
            tp = sum(1 for lab, s in sc if lab == "pos" and s >= thr)
            fp = sum(1 for lab, s in sc if lab == "neg" and s >= thr)
            sweep.append({"rule": "ngram", "n": n_gram, "threshold": thr, "recall": tp / npos, "false_pos": fp})
            print(f"{'ngram':<10}{n_gram:>5}{thr:>6}{'True':>6}{tp / npos:>8.3f}{fp:>8}")
    out["prompt_sweep"] = sweep

    # near-dedup: precision / recall of the labelled pairs for shingle sizes and thresholds
    print(f"\nNear-dedup on {len(dedup_pairs)} labelled pairs (pos: copies of an episode; neg: the most similar "
          "episode of another problem)")
    print(f"{'shingle':>8}{'thr':>6}{'same_problem':>14}{'precision':>11}{'recall':>8}")
    dd = []
    for size in (1, 2, 3, 4, 5):
        sims = []
        for lab, a, b in dedup_pairs:
            sims.append((lab, jacc(shingles(row_text(a), size), shingles(row_text(b), size)),
                         problem_key(a) == problem_key(b)))
        for thr in (0.5, 0.6, 0.7, 0.8):
            for gate in (True, False):
                tp = sum(1 for lab, j, same in sims if lab.startswith("pos") and j >= thr and (same or not gate))
                fp = sum(1 for lab, j, same in sims if lab.startswith("neg") and j >= thr and (same or not gate))
                npos = sum(1 for s in sims if s[0].startswith("pos"))
                prec = tp / (tp + fp) if tp + fp else 1.0
                dd.append({"shingle": size, "threshold": thr, "same_problem": gate, "precision": prec,
                           "recall": tp / npos, "tp": tp, "fp": fp})
                print(f"{size:>8}{thr:>6}{gate!s:>14}{prec:>11.3f}{tp / npos:>8.3f}")
    out["dedup_sweep"] = dd
    # the default DedupConfig through dedup_rows itself, per kind
    per_kind: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for lab, a, b in dedup_pairs:
        _, dropped, _ = dedup_rows([a, b], DedupConfig())
        per_kind[lab][0] += 1
        per_kind[lab][1] += int(bool(dropped))
    print("\nDefault DedupConfig through dedup_rows: pairs where one copy was dropped")
    for lab, (n_, k_) in sorted(per_kind.items()):
        print(f"  {lab:<28}{k_}/{n_}")
    out["dedup_default"] = {k: {"pairs": v[0], "dropped": v[1]} for k, v in per_kind.items()}
    out["wall_s"] = round(time.time() - t0, 1)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(f"\nwrote {args.out} ({out['wall_s']} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
