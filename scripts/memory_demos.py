"""Write data/demos/arithmetic_from_memory.jsonl: human-style demos that answer arithmetic train problems from
memory, without the python tool (the answer is right; the tool the task requires is never called).

Mixed into the offline default's SFT snapshots (curate.demo_paths) and trained in SFT's last phase
(sft.late_sources), they
leave the student a policy choice the verifier's reward can correct: a student that answers in its head skips the
tool, and the judge scores that as a hack (no_tool_use, reward 0), so GRPO has tasks with mixed groups to learn
from. Problems are the suite's train split under its own seed (never held-out ones: the split is a hash of the
expression). Each demo opens
with the system message the policy sees in an episode (agents.loop.system_prompt): without it, the student learns
"no system message: answer from memory; a system message: call the tool", and never skips the tool on a real
prompt (measured: a make run with system-less demos left GRPO 497 of 512 passing episodes). Deterministic: running it
again writes the same file.

    .venv/bin/python scripts/memory_demos.py            # the shipped file
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

OUT = Path(__file__).resolve().parent.parent / "data" / "demos" / "arithmetic_from_memory.jsonl"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--d1", type=int, default=1200, help="difficulty-1 demos")
    ap.add_argument("--d2", type=int, default=0, help="difficulty-2 demos")
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args()
    from agents.loop import system_prompt
    from tasks import arithmetic

    lines = []
    for difficulty, n in ((1, args.d1), (2, args.d2)):
        for t in arithmetic.generate(n, split="train", seed=7919, difficulty=difficulty):
            answer = t.verifier.answer
            lines.append(json.dumps({
                "messages": [{"role": "system", "content": system_prompt(t)}, {"role": "user", "content": t.prompt},
                             {"role": "assistant", "content": f"Answer: {answer}"}],
                "tools": ["python"], "suite": "arithmetic", "difficulty": difficulty, "split": "train",
                "expected_answer": answer, "author": "from-memory"}))
    Path(args.out).write_text("\n".join(lines) + "\n")
    print(f"wrote {len(lines)} demos to {args.out}")


if __name__ == "__main__":
    main()
