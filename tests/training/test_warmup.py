"""Copy warm-up of a fresh tiny base: it learns to echo texts it never saw, repeats itself, and refuses bad input."""

from __future__ import annotations

import random
import shutil

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tasks import arithmetic
from training.tiny import build_tiny_model, task_corpus
from training.warmup import WarmupError, recoin, warm_up_copying


@pytest.fixture(scope="module")
def base(tmp_path_factory, train_tasks):
    return build_tiny_model(tmp_path_factory.mktemp("warm") / "base", task_corpus(train_tasks), hidden=128, layers=2,
                            heads=4, kv_heads=1, vocab_size=600, seed=0)


def _copy(base, tmp_path, name):
    return shutil.copytree(base, tmp_path / name)


def _echoes(model_dir, texts: list[str]) -> list[str]:
    """The model's greedy continuation of <|im_start|>TEXT<|im_end|> for each text (loaded once)."""
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    start, end = tok.convert_tokens_to_ids("<|im_start|>"), tok.convert_tokens_to_ids("<|im_end|>")
    out = []
    for text in texts:
        ids = [start, *tok.encode(text, add_special_tokens=False), end]
        with torch.no_grad():
            gen = model.generate(torch.tensor([ids]), max_new_tokens=len(ids), do_sample=False, eos_token_id=end)
        out.append(tok.decode(gen[0, len(ids):], skip_special_tokens=True))
    return out


@pytest.mark.slow  # trains the copy warm-up: not the fast core (make test-fast)
def test_warm_up_teaches_copying_of_unseen_prompts(base, tmp_path):
    """Trained on 200 train prompts (500 steps), the model echoes held-out prompts (other numbers, other sums) digit
    for digit;
    the random base echoes none of them."""
    train = [t.prompt for t in arithmetic.generate(200, split="train", seed=5, difficulty=1)]
    held = [t.prompt for t in arithmetic.generate(10, split="heldout", seed=5, difficulty=1)]
    assert sum(e == p for e, p in zip(_echoes(base, held), held)) == 0
    model = _copy(base, tmp_path, "warm")
    # 500 steps: at 300 (the rate 1e-3) the count depends on the CPU's arithmetic (9 of 10 on one machine, 7 on an
    # AMD EPYC); at 500 it is 10 of 10 there
    res = warm_up_copying(model, train, steps=500, batch_size=16)
    assert res.steps == 500 and len(res.losses) == 500
    assert res.final_loss < 0.2 * sum(res.losses[:20]) / 20, (res.losses[:5], res.final_loss)
    echoes = _echoes(model, held)
    assert sum(e == p for e, p in zip(echoes, held)) >= 8, list(zip(echoes, held))


def test_warm_up_is_seeded(base, tmp_path):
    texts = [t.prompt for t in arithmetic.generate(20, split="train", seed=1, difficulty=1)]
    a = warm_up_copying(_copy(base, tmp_path, "a"), texts, steps=5, batch_size=4)
    b = warm_up_copying(_copy(base, tmp_path, "b"), texts, steps=5, batch_size=4)
    c = warm_up_copying(_copy(base, tmp_path, "c"), texts, steps=5, batch_size=4, seed=1)
    assert a.losses == b.losses
    assert a.losses != c.losses


def test_zero_steps_leave_the_weights_alone(base, tmp_path):
    model = _copy(base, tmp_path, "zero")
    before = (model / "model.safetensors").read_bytes()
    res = warm_up_copying(model, ["What is 1 + 2?"], steps=0)
    assert res.steps == 0 and res.losses == []
    assert (model / "model.safetensors").read_bytes() == before


def test_bad_input_is_refused_before_any_write(base, tmp_path):
    model = _copy(base, tmp_path, "bad")
    before = (model / "model.safetensors").read_bytes()
    with pytest.raises(WarmupError, match="no texts"):
        warm_up_copying(model, ["", "  "], steps=3)
    with pytest.raises(WarmupError, match="steps"):
        warm_up_copying(model, ["x"], steps=-1)
    assert (model / "model.safetensors").read_bytes() == before


def test_recoin_replaces_the_letters_of_rare_words_only():
    text = "Sum `tilo` under `/app/galoza` for 2024, then Sum again."
    out = recoin(text, {"tilo", "/galoza", "Sum"}, random.Random(0))
    assert len(out) == len(text)
    assert out[5:9] != "tilo" and out[5:9].islower() and out[:5] != "Sum `"[:5] and out[0].isupper()
    assert out[17:23] == "`/app/" and out[23:29] != "galoza" and out[29:] == "` for 2024, then Sum again."
    assert recoin(text, set(), random.Random(0)) == text


def test_rare_word_share_echoes_recoined_prompts(base, tmp_path):
    """With rare_word_share, every other echo carries words no prompt holds: its losses differ from plain echoes of
    the same draw; without it the draw is the plain one (the flywheel's default is unchanged)."""
    texts = [f"Add up `{w}` in `/app/{w}x` then stop." for w in ("alpha", "beta", "gamma", "delta", "omega")] * 4
    plain = warm_up_copying(_copy(base, tmp_path, "p"), texts, steps=3, batch_size=4)
    again = warm_up_copying(_copy(base, tmp_path, "q"), texts, steps=3, batch_size=4, rare_word_share=0.0)
    fresh = warm_up_copying(_copy(base, tmp_path, "r"), texts, steps=3, batch_size=4, rare_word_share=0.3)
    assert plain.losses == again.losses
    assert fresh.losses != plain.losses
