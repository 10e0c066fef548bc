"""curate/frontier.py without Docker: the student's failures grouped by the family and knobs of their tasks (read
from the Harbor folders' task.toml), infra errors and successes left out, other tasks counted apart; candidates
split over the cells by their failures, each a task with its cell's knobs and new data; ledger_near fixes knobs
without moving the family's own stream."""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

import pytest

from curate.frontier import Episode, Frontier, FrontierCell, allot, failure_frontier, frontier_candidates
from tasks.factory.draft import write_folder
from tasks.factory.ledger import KNOBS, _draft, ledger_draft, ledger_near
from tasks.harbor import load_harbor
from tasks.suites import load_suite

ROOT = Path(__file__).resolve().parents[2]


def _pool(tmp: Path, indices: list[int]) -> list:
    for i in indices:
        write_folder(ledger_draft(0, i), tmp / "pool" / f"ledger-0-{i}")
    return load_harbor(tmp / "pool")


def _knobs(task) -> dict[str, str]:
    meta = task.metadata["task_metadata"]
    return {k: meta[k] for k in KNOBS}


def test_failures_are_grouped_by_family_and_knobs(tmp_path):
    pool = _pool(tmp_path, list(range(8)))
    arith = load_suite("arithmetic", n=2, split="train", seed=0)
    eps = [Episode(f"t{i}", t.id, success=(i % 4 == 0), verdict="pass" if i % 4 == 0 else "fail")
           for i, t in enumerate(pool)]
    eps += [Episode("infra", pool[1].id, success=False, verdict="infra_error"),  # not the student's failure
            Episode("hack", pool[1].id, success=False, verdict="hack"),
            Episode("a0", arith[0].id, success=False, verdict="fail"), Episode("a1", arith[1].id, True, "pass")]
    f = failure_frontier(eps, pool + arith)
    assert (f.episodes, f.failures, f.outside) == (len(eps) - 1, 6 + 1 + 1, 1)
    assert sum(len(c.failures) for c in f.cells) == 7 and "infra" not in {x for c in f.cells for x in c.failures}
    failed = {t.id: t for i, t in enumerate(pool) if i % 4 != 0}
    for c in f.cells:
        for tid in c.tasks:
            meta = failed[tid].metadata["task_metadata"]
            assert _knobs(failed[tid]) == c.knobs and meta["difficulty"] == c.difficulty
    assert [c.key for c in f.cells] == sorted(c.key for c in f.cells)
    hack_cell = next(c for c in f.cells if "hack" in c.failures)
    assert pool[1].id in hack_cell.tasks and hack_cell.failures.count("hack") == 1
    with pytest.raises(ValueError, match="not in the train pool"):
        failure_frontier([Episode("x", "nowhere/1", False, "fail")], pool)


def _frontier(*sizes: int) -> Frontier:
    cells = [FrontierCell("ledger", 1, {"aggregate": a, "group_by": "file", "format": "json"},
                          failures=[f"{a}-{i}" for i in range(n)], tasks=[f"task-{a}"])
             for a, n in zip(["count", "max", "min", "sum"], sizes)]
    return Frontier(cells=cells, episodes=sum(sizes), failures=sum(sizes), outside=0)


def test_candidates_are_split_by_failures_deterministically():
    f = _frontier(6, 3, 1)
    assert [(c.knobs["aggregate"], n) for c, n in allot(f, 10)] == [("count", 6), ("max", 3), ("min", 1)]
    assert [(c.knobs["aggregate"], n) for c, n in allot(f, 4)] == [("count", 3), ("max", 1)]  # remainders
    assert allot(f, 0) == [] and allot(_frontier(), 5) == []
    for n in (1, 2, 3, 7, 11):
        assert sum(k for _, k in allot(f, n)) == n


def test_candidates_carry_their_cells_knobs_and_are_new(tmp_path):
    pool = _pool(tmp_path, [0, 1, 2])
    f = failure_frontier([Episode(f"t{i}", t.id, False, "fail") for i, t in enumerate(pool)], pool)
    got = frontier_candidates(f, 6, seed=0, round=1)
    assert len(got) == 6 and len({c.candidate_id for c, _ in got}) == 6
    for c, cell in got:
        assert {k: c.draft.metadata[k] for k in KNOBS} == cell.knobs and c.draft.difficulty == cell.difficulty
        assert c.seed_tasks == cell.tasks and c.draft.name.startswith("ledger-s0-r1-")
        assert all(c.draft.files != ledger_draft(0, i).files for i in range(3))
    again = frontier_candidates(f, 6, seed=0, round=1)
    assert [c.draft for c, _ in again] == [c.draft for c, _ in got]
    other = frontier_candidates(f, 6, seed=0, round=2)
    assert all(a.draft.files != b.draft.files for (a, _), (b, _) in zip(got, other))


def test_fixing_knobs_does_not_move_the_familys_stream():
    """ledger_near's knobs replace drawn values without skipping draws: fixing a task's own knobs gives it back."""
    for i in range(20):
        d = ledger_draft(3, i)
        knobs = {k: d.metadata[k] for k in KNOBS}
        assert _draft(random.Random(f"ledger:3:{i}"), name=d.name, seed=3, index=i, knobs=knobs) == d
    with pytest.raises(ValueError, match="no knob"):
        ledger_near({"aggregate": "median"}, seed=0, round=1, index=0)
    with pytest.raises(ValueError, match="no knob"):
        ledger_near({"colour": "red"}, seed=0, round=1, index=0)


def test_the_familys_own_tasks_are_what_they_were():
    """ledger_draft's output, pinned: the sha256 of seeds 0 and 7, indices 0-49 (name, instruction, files, tests,
    metadata, difficulty), the same before ledger_near and the suites' vocabularies were added (re-pinned once, when
    the instruction came to name the delimiter in words); the solution is pinned apart (solve.sh became one program
    with the task's values, so that the reference call is short; re-pinned when it took the delimiter's name and a
    count's empty value column, and when it came to read each file's delimiter from its header)."""
    h, sol = hashlib.sha256(), hashlib.sha256()
    for seed in (0, 7):
        for i in range(50):
            d = ledger_draft(seed, i)
            h.update(json.dumps([d.name, d.instruction, d.files, d.tests, d.metadata, d.difficulty],
                                sort_keys=True).encode())
            sol.update(json.dumps(d.solution, sort_keys=True).encode())
    assert h.hexdigest() == "266377fa28c7ea54f9bb57dfd0abcf9ffb70b0c3a7779c025acdde0ded08dd90"
    assert sol.hexdigest() == "258f9b35eefc131a3ee7ca4636baa570140f6649c4c17aefb4fead10899273f0"


def test_hand_written_harbor_tasks_are_outside_for_the_reference_writer_and_cells_for_a_seeded_one(tmp_path):
    """The shipped Harbor suite (difficulty = "easy", no factory family): the reference writer cannot write near
    them (counted outside); a writer that works from seed folders gets a cell per kind, easy read as 1."""
    tasks = load_harbor(ROOT / "data" / "harbor")
    eps = [Episode(f"h{i}", t.id, False, "fail") for i, t in enumerate(tasks)]
    ref = failure_frontier(eps, tasks)
    assert (ref.failures, ref.outside, ref.cells) == (len(tasks), len(tasks), [])
    seeded = failure_frontier(eps, tasks, any_harbor=True)
    assert seeded.outside == 0 and sum(len(c.failures) for c in seeded.cells) == len(tasks)
    assert all(c.difficulty == 1 and c.knobs == {} for c in seeded.cells)
    # a ledger task whose knob has a value the family no longer has is outside too, not a crash
    d = ledger_draft(0, 0)
    write_folder(d.model_copy(update={"metadata": {**d.metadata, "aggregate": "median"}}), tmp_path / "odd")
    odd = load_harbor(tmp_path / "odd")
    assert failure_frontier([Episode("o", odd[0].id, False, "fail")], odd).outside == 1
