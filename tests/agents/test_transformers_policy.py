"""The in-process transformers policy: tool calls parsed from text, typed errors, batched generation, greedy
determinism, and episodes through the real loop."""

from __future__ import annotations

import asyncio

import pytest

from agents.policy import ContextLengthError
from agents.transformers_policy import TransformersPolicy
from tasks import arithmetic
from warehouse.record import Message


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    from training.tiny import build_tiny_model, task_corpus

    tasks = arithmetic.generate(16, split="train", seed=1)
    return build_tiny_model(tmp_path_factory.mktemp("tp") / "m", task_corpus(tasks), hidden=32, layers=1, heads=2,
                            kv_heads=1, vocab_size=500, max_positions=256)


def _msgs(task):
    from agents.loop import initial_messages

    return initial_messages(task)


def test_concurrent_replies_share_one_generate_call_and_greedy_is_deterministic(tiny_dir):
    tasks = arithmetic.generate(6, split="train", seed=2)
    pol = TransformersPolicy(tiny_dir, temperature=0.0, max_new_tokens=12, batch_size=8, device="cpu")

    async def all_replies():
        async def one(t):  # an untrained model writes garbage: a message all the same, the loop judges it
            r = await pol.reply(_msgs(t), [], task=t, sample_index=0)
            return (r.message.model_dump_json(), r.completion_tokens, len(r.logprobs or []))
        return await asyncio.gather(*(one(t) for t in tasks))

    first = asyncio.run(all_replies())
    assert pol._batches == 1  # six concurrent requests, one generate call
    second = asyncio.run(all_replies())
    assert first == second  # greedy decoding repeats itself
    for _, n_tok, n_lp in first:
        assert 0 < n_tok <= 12 and n_lp == n_tok
    # batched and one-at-a-time greedy generation agree
    solo = TransformersPolicy(tiny_dir, temperature=0.0, max_new_tokens=12, batch_size=1, device="cpu")
    ids = [solo.prompt_ids(_msgs(t), []) for t in tasks[:3]]
    assert [solo.generate_batch([i])[0][0] for i in ids] == [x[0] for x in pol.generate_batch(ids)]


def test_a_reply_gets_the_room_left_in_the_context_and_a_full_context_is_a_context_length_error(tiny_dir):
    """max_new_tokens is a ceiling: a late turn near the end of the context (256 positions here) is generated up to
    the room left, in the same batch as a turn with all its room; a prompt that fills the context is an error."""
    pol = TransformersPolicy(tiny_dir, max_new_tokens=64, batch_size=8, device="cpu")
    t = arithmetic.generate(1, split="train", seed=2)[0]
    words = 1
    while len(pol.prompt_ids(near := [*_msgs(t), Message(role="user", content="many " * words)], [])) < 256 - 10:
        words += 1
    room = 256 - len(pol.prompt_ids(near, []))
    assert 0 < room <= 10 and pol.budget(256 - room) == room and pol.budget(10) == 64

    async def both():
        return await asyncio.gather(pol.reply(_msgs(t), [], task=t, sample_index=0),
                                    pol.reply(near, [], task=t, sample_index=0))
    batches = pol._batches
    short, late = asyncio.run(both())
    assert pol._batches == batches + 1  # one batch, cut into one generate call per budget
    assert late.completion_tokens <= room and late.prompt_tokens + late.completion_tokens <= 256
    # a reply that did not stop ran to its bound: the ceiling for the full turn, the room left for the late one
    assert short.completion_tokens == 64 or short.finish_reason == "stop"
    assert late.completion_tokens == room or late.finish_reason == "stop"
    solo = TransformersPolicy(tiny_dir, max_new_tokens=64, batch_size=1, device="cpu")
    assert solo.generate_batch([pol.prompt_ids(_msgs(t), [])])[0][0] == short.token_ids
    full = [*_msgs(t), Message(role="user", content="many words " * 300)]
    with pytest.raises(ContextLengthError, match="fills the context"):
        asyncio.run(pol.reply(full, [], task=t, sample_index=0))


def test_sampling_is_seeded_per_request_not_per_batch(tiny_dir):
    """A sampled reply depends on (seed, task, sample index, turn) only: the same in a batch of six or alone, the
    same on a second run; other sample indices draw other replies."""
    tasks = arithmetic.generate(6, split="train", seed=3)
    batched = TransformersPolicy(tiny_dir, temperature=1.0, max_new_tokens=16, batch_size=8, device="cpu", seed=7)
    solo = TransformersPolicy(tiny_dir, temperature=1.0, max_new_tokens=16, batch_size=1, device="cpu", seed=7)

    def ids(pol, sample_index):
        async def go():
            return await asyncio.gather(*(pol.reply(_msgs(t), [], task=t, sample_index=sample_index)
                                          for t in tasks), return_exceptions=True)
        return [r.token_ids if not isinstance(r, Exception) else type(r).__name__ for r in asyncio.run(go())]

    first = ids(batched, 0)
    assert batched._batches == 1
    assert ids(batched, 0) == first == ids(solo, 0)
    assert ids(batched, 1) != first


def test_row_gumbel_samples_the_tempered_softmax():
    """Greedy over the processor's output is an exact sample of softmax(logits / T), top-p cut applied."""
    import torch

    from agents.transformers_policy import _RowGumbel

    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    n = 4000
    proc = _RowGumbel(list(range(n)), temperature=2.0, top_p=1.0)
    picks = proc(None, logits.expand(n, 4)).argmax(-1)
    freq = torch.bincount(picks, minlength=4).float() / n
    assert torch.allclose(freq, torch.softmax(logits[0] / 2.0, -1), atol=0.03)
    cut = _RowGumbel(list(range(n)), temperature=1.0, top_p=0.7)(None, logits.expand(n, 4)).argmax(-1)
    assert set(cut.tolist()) == {0, 1}  # softmax mass 0.64 then 0.24: the first two reach 0.7


def test_a_rollout_holds_the_policy_in_lockstep_so_batches_do_not_depend_on_timing(tiny_dir, monkeypatch):
    """agents.rollout holds a batching policy in lockstep: a batch is cut only when every worker waits for a reply,
    its requests ordered by key. With random latency around every episode (a TEST DOUBLE wrapping the real
    run_episode, for timing only), two rollouts of one plan cut the same batches, the same requests in the same
    order; so their rows are equal too."""
    import random

    import agents.rollout as ro
    from sandbox.backend import open_backend
    from sandbox.result import SandboxConfig

    real = ro.run_episode
    jitter = random.Random()

    async def jittered(*args, **kwargs):
        await asyncio.sleep(jitter.uniform(0, 0.04))
        row = await real(*args, **kwargs)
        await asyncio.sleep(jitter.uniform(0, 0.04))
        return row

    monkeypatch.setattr(ro, "run_episode", jittered)
    tasks = arithmetic.generate(9, split="train", seed=4)

    def batches(timing_seed: int) -> tuple[list[tuple[int, ...]], list[str]]:
        jitter.seed(timing_seed)
        pol = TransformersPolicy(tiny_dir, temperature=1.0, max_new_tokens=8, batch_size=8, device="cpu", seed=1)
        seen: list[tuple[int, ...]] = []
        generate = pol._generate

        def recorded(prompts, keys, budgets):
            seen.append(tuple(keys))
            return generate(prompts, keys, budgets)

        pol._generate = recorded
        rows: list = []
        with open_backend(SandboxConfig(backend="local", timeout_s=5.0), pool_size=3) as backend:
            asyncio.run(ro.rollout(tasks, pol, backend, run_id="ls", concurrency=3, samples=2, max_turns=2,
                                   on_rows=rows.extend, progress=False))
        return seen, sorted(f"{r.trajectory_id}:{r.messages[-1].content}" for r in rows)

    first, again = batches(1), batches(2)
    assert first == again
    assert len(first[0]) >= 6 and max(len(b) for b in first[0]) == 3  # three workers, each batch all of them
