"""Copy warm-up of a fresh tiny base: a few hundred steps of echoing texts, so that the model can copy from context.

Every real student is a pretrained language model, and one thing every pretrained model can do is copy a span it has
just read (induction heads). A tiny model built from random weights cannot, and measured on 2 cores that is what
slows and derails its SFT: the loss sits on a plateau (~0.4) until a copy mechanism forms, which took 600 to 1,500
of 2,000 steps depending on the data order, and in some orders the model settled instead for adding the numbers in
its head (issue 9: 54-74% held-out instead of 100%). `warm_up_copying` trains the model on
`<|im_start|>TEXT<|im_end|>TEXT<|im_end|>` (harmony's `<|start|>`/`<|end|>` for GPT-OSS) with the loss on the
second copy only: ~400 steps (~50 s on one core)
take the echo loss from ~0.8 to ~0.15, and SFT then learns at once (its loss at step 400: 0.01-0.15 after the
warm-up, 0.36-0.42 without). Held-out arithmetic after 2,000 SFT steps (lr 5e-3, weight decay 0.3), per data
order: with the warm-up 100% in 3 of 3 orders, among them the one where 2,000 steps without it stalled at 74%
(5 of 6 orders reached >= 98% without it); 1,400 steps after it were not enough (3 of 4, the fourth 88%). The
offline default (TinyModelConfig.copy_warmup_steps) is 400.

Its rate matters as much (TinyModelConfig.copy_warmup_learning_rate, 1e-3): at 3e-3, the rate until stop 55, 400
steps left the echo loss at 0.13 for the default student (47% of held-out prompts echoed) and 0.48 for tiny-gptoss
(none echoed: its router did not settle), and 2,000 steps of round-1 SFT on the same snapshot then scored 78% and
68% on held-out arithmetic-d1, the round-1 figures of the flywheel's runs then; at 1e-3 the echo loss ends at 0.011
and 0.012 (100% and 97% echoed) and the same SFT scores 100% for both (50 of 50; README, issue 35's note).

Echoing a task's prompts can be learnt by memorising them, and a tiny base does that with names coined per task:
on the shell config's ledger prompts, 1,200 steps echoed every train prompt and no held-out one (benchmarks/
copy_skill.py). With `rare_word_share` (TinyModelConfig.rare_word_share) every other echoed prompt has its rare
words, the ones in fewer than that share of the prompts (the coined names), re-coined in random letters each time,
which only copying can echo; the tokenizer then also spells those words out in common pieces (training/tiny.py).

What it does not do: it never shows the model a chat turn, a tool call or an answer, so the base still scores 0%
(the flywheel measures it); pass it train-split texts only (the flywheel passes its train tasks' prompts). It
trains nothing else (SFT and GRPO: sft.py, grpo.py).
"""

from __future__ import annotations

import random
import re
import string
import time
from pathlib import Path

from pydantic import BaseModel

from training.config import COPY_WARMUP_LEARNING_RATE


class WarmupError(ValueError):
    """The warm-up cannot run on these inputs (no texts, bad sizes)."""


class WarmupResult(BaseModel):
    steps: int
    losses: list[float]
    wall_s: float

    @property
    def final_loss(self) -> float:
        tail = self.losses[-20:]
        return sum(tail) / len(tail) if tail else float("nan")


def warm_up_copying(model_dir: str | Path, texts: list[str], *, steps: int,
                    learning_rate: float = COPY_WARMUP_LEARNING_RATE,
                    batch_size: int = 32, weight_decay: float = 0.1, seed: int = 0, threads: int | None = 1,
                    rare_word_share: float = 0.0, progress: bool = False) -> WarmupResult:
    """Train the model in `model_dir` to echo `texts` for `steps` steps and save it back in place.

    AdamW with a 30-step linear warm-up then a constant rate, gradient norm clipped to 1. Seeded: the same inputs give
    the same losses on the same machine. `steps=0` leaves the folder untouched. With `rare_word_share` > 0, every
    other text of a batch is echoed with its rare words (training.tiny.rare_words: in fewer than that share of
    `texts`) re-coined at random (`recoin`): a fresh name each time, which memorising cannot echo and copying can.
    """
    import torch
    from tqdm import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from training.tiny import rare_words

    if steps < 0 or batch_size < 1:
        raise WarmupError(f"steps must be >= 0 and batch_size >= 1, not steps={steps}, batch_size={batch_size}")
    if steps == 0:
        return WarmupResult(steps=0, losses=[], wall_s=0.0)
    texts = [t for t in texts if t.strip()]
    if not texts:
        raise WarmupError("no texts to echo: pass the train tasks' prompts (e.g. [t.prompt for t in tasks])")
    t0 = time.perf_counter()
    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(seed)
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir))
    start, end = echo_markers(tok)
    rng = random.Random(seed)
    rare = rare_words(texts, rare_word_share) if rare_word_share else set()
    encoded = [tok.encode(t, add_special_tokens=False) for t in texts]
    opt = torch.optim.AdamW(model.parameters(), lr=learning_rate, weight_decay=weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 30))
    model.train()
    losses: list[float] = []
    bar = tqdm(range(steps), desc="copy warm-up", unit="step", disable=not progress)
    for _ in bar:
        picks = [rng.randrange(len(texts)) for _ in range(batch_size)]
        batch = [tok.encode(recoin(texts[i], rare, rng), add_special_tokens=False) if rare and k % 2 else encoded[i]
                 for k, i in enumerate(picks)]
        seqs = [[start, *e, end, *e, end] for e in batch]
        labels = [[-100] * (len(e) + 2) + [*e, end] for e in batch]
        loss = model(input_ids=_padded(seqs, tok.pad_token_id), attention_mask=_padded([[1] * len(s) for s in seqs], 0),
                     labels=_padded(labels, -100)).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad()
        losses.append(loss.item())
        bar.set_postfix(loss=f"{losses[-1]:.3f}", refresh=False)
    model.save_pretrained(str(model_dir))
    return WarmupResult(steps=steps, losses=losses, wall_s=time.perf_counter() - t0)


def recoin(text: str, rare: set[str], rng: random.Random) -> str:
    """`text` with the letters of each word in `rare` replaced by random ones (case and length kept; the word's
    leading mark, digits and punctuation kept): the same sentence about names never seen."""
    from training.tiny import words

    return "".join(_LETTER.sub(lambda m: rng.choice(_UPPER if m[0].isupper() else _LOWER), w) if w in rare else w
                   for w in words(text))


_LETTER = re.compile("[A-Za-z]")
_LOWER, _UPPER = string.ascii_lowercase, string.ascii_uppercase


def echo_markers(tok) -> tuple[int, int]:
    """The token ids that open and close an echoed text: the family's turn markers, Qwen's, else harmony's
    (GPT-OSS)."""
    vocab = tok.get_vocab()
    return (vocab["<|im_start|>"], vocab["<|im_end|>"]) if "<|im_start|>" in vocab else (vocab["<|start|>"],
                                                                                           vocab["<|end|>"])


def _padded(rows: list[list[int]], value: int):
    import torch

    width = max(map(len, rows))
    return torch.tensor([r + [value] * (width - len(r)) for r in rows])
