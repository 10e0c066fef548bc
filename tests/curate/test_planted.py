"""A planted set per rule: paraphrased held-out prompts, the held-out expression or answer tuple in a tool call
under a new prompt, near-duplicates with case/whitespace/number-format changes and a reworded final line, and
clean distinct rows (train tasks of the same templates, look-alikes with one number changed) that must be kept.
Every planted row must be dropped with the right reason, rule and held-out task; every clean one kept.
(The rates over thousands of rows are measured by benchmarks/decontam.py.)"""

from __future__ import annotations

import json

import pytest

from curate.config import DecontamConfig, DedupConfig
from curate.decontam import (
    CONTAMINATED,
    RULE_ANSWER,
    RULE_EXPRESSION,
    RULE_MINHASH,
    RULE_NGRAM,
    Decontaminator,
    decontaminate,
    find_contamination,
)
from curate.dedup import DUP_NEAR, dedup_rows
from curate.normalise import normalise, tokens
from tasks import arithmetic, mathword
from tests.curate.test_curate import row

PROMPT_RULES = {RULE_NGRAM, RULE_MINHASH}


@pytest.fixture(scope="module")
def tasks():
    train = arithmetic.generate(60, split="train", seed=0, difficulty=1)
    held = arithmetic.generate(30, split="heldout", seed=0, difficulty=1)
    return train, held


def bare(task, user, sample=9):
    """A conversation of a prompt alone: the answer without any tool call or number (only prompt rules see it)."""
    r = row(task, user=user, sample=sample)
    msgs = [r.messages[0], r.messages[1], r.messages[4].model_copy(update={"content": "I am not sure."})]
    return r.model_copy(update={"messages": msgs, "n_tool_calls": 0})


def test_normalise_folds_number_formats_case_and_space():
    assert normalise("  Answer:   178.0 ") == normalise("answer: 178") == "answer: 178"
    assert tokens("It costs $7,200.00") == tokens("it costs $7200") == ["it", "costs", "7200"]
    assert tokens("2.50 and 1,2,3") == ["2.5", "and", "1", "2", "3"]   # a list is not a thousands separator


def test_paraphrased_prompts_are_dropped_by_a_prompt_rule_against_the_right_task(tasks):
    train, held = tasks
    z = next(h for h in held if h.prompt.startswith(("Ana", "Ben", "Kim", "Raj", "Zoe", "Leo", "Mia", "Sam")))
    a, b = z.metadata["expression"].split(" ")[0::2]
    planted = {
        "verbatim": z.prompt,
        "case_space": "  " + z.prompt.upper().replace(" ", "   "),
        "number_format": z.prompt.replace(a, f"{a}.0").replace(b, f"{b}.00"),
        "word_swap": z.prompt.replace(" has ", " owns ").replace("How many", "What number of"),
        "reorder": " ".join(reversed(z.prompt.split(". "))),
        "wrapped": f"Hello! Please help with this: {z.prompt} Thanks a lot.",
    }
    rows = {k: bare(train[0], p, sample=i) for i, (k, p) in enumerate(planted.items())}
    hits = find_contamination(list(rows.values()), held, DecontamConfig())
    for kind, r in rows.items():
        assert r.trajectory_id in hits, kind
        h = hits[r.trajectory_id]
        assert (h.reason, h.heldout_id) == (CONTAMINATED, z.id) and h.rule in PROMPT_RULES, (kind, h)


def test_expression_and_answer_tuple_in_the_episode_under_a_new_prompt(tasks):
    train, held = tasks
    h0, h1 = held[0], held[1]
    expr = row(train[0], user="Run this for me please.", code=f"print({h0.metadata['expression']})", sample=11)
    a, op, b = h1.metadata["expression"].split()
    tup = row(train[1], user="Two numbers, one operation.", code=f"x = {a}\ny = {b}\nprint(x {op} y)",
              final=f"It is {h1.verifier.answer}.", sample=12)
    mw = mathword.generate(20, split="heldout", seed=0, difficulty=2)

    def ints(t):
        return [v for v in t.metadata["params"].values() if isinstance(v, int)]
    m0 = next(t for t in mw if len(ints(t)) >= 2 and len("".join(map(str, ints(t)))) + len(t.verifier.answer) >= 6)
    nums = ints(m0)
    tup_mw = row(train[2], user="A puzzle.", code="print(" + " + ".join(map(str, nums)) + ")",
                 final=f"Answer: {m0.verifier.answer}", sample=13)
    hits = find_contamination([expr, tup, tup_mw], held + mw, DecontamConfig())
    assert (hits[expr.trajectory_id].rule, hits[expr.trajectory_id].heldout_id) == (RULE_EXPRESSION, h0.id)
    assert (hits[tup.trajectory_id].rule, hits[tup.trajectory_id].heldout_id) == (RULE_ANSWER, h1.id)
    assert (hits[tup_mw.trajectory_id].rule, hits[tup_mw.trajectory_id].heldout_id) == (RULE_ANSWER, m0.id)


def test_clean_rows_and_honest_lookalikes_are_kept(tasks):
    train, held = tasks
    held_exprs = {h.metadata["expression"] for h in held}
    swapped = {" ".join(e.split()[::-1]) for e in held_exprs if "+" in e}   # a commuted held-out sum is a leak
    clean = [row(t) for t in train if t.metadata["expression"] not in swapped]
    lookalikes = []
    for i, h in enumerate(held[:10]):
        a, op, b = h.metadata["expression"].split()
        other = f"{a} {op} {int(b) + 1}"
        if other in held_exprs:
            continue
        lookalikes.append(bare(train[0], h.prompt.replace(b, str(int(b) + 1)), sample=20 + i))
    kept, dropped, _ = decontaminate(clean + lookalikes, held, DecontamConfig())
    assert dropped == {}
    assert len(kept) == len(clean) + len(lookalikes) and len(lookalikes) >= 8


def test_the_constants_gate_is_what_keeps_lookalikes(tasks):
    """Without the held-out constants in the row, a row one number away scores high on the prompt rules."""
    train, held = tasks
    h = held[0]
    b = h.metadata["expression"].split()[2]
    la = bare(train[0], h.prompt.replace(b, str(int(b) + 1)))
    dec = Decontaminator(held, DecontamConfig())
    assert dec.match(la) is None and dec.score(la)[1] != h.id


def test_near_duplicates_of_short_conversations_are_found_and_distinct_kept(tasks):
    train, _ = tasks
    clean = [row(t) for t in train]
    t0, t1, t2 = train[0], train[1], train[2]
    ans = t0.verifier.answer
    variants = [
        row(t0, sample=1, user="  " + t0.prompt.upper() + "  ", final=f"ANSWER:   {ans}"),     # case, whitespace
        row(t1, sample=1, final=f"Answer: {t1.verifier.answer}.0"),                          # number format
        row(t2, sample=1, final=f"The result is {t2.verifier.answer}."),                      # reworded final line
    ]
    kept, dropped, dup_of = dedup_rows(clean + variants, DedupConfig())
    assert dropped == {v.trajectory_id: DUP_NEAR for v in variants}
    assert [dup_of[v.trajectory_id] for v in variants] == [c.trajectory_id for c in clean[:3]]
    assert {r.trajectory_id for r in kept} == {r.trajectory_id for r in clean}
    # with the same-problem gate off, nothing else is dropped either, and the json args stay canonical
    _, dropped2, _ = dedup_rows(clean, DedupConfig(same_problem=False))
    assert json.dumps(dropped2) == "{}" or all(v == DUP_NEAR for v in dropped2.values())
