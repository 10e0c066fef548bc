"""The student's failure frontier, and the candidate tasks it asks the task factory for (`flywheel.synthesize`).

`failure_frontier(episodes, tasks)` groups a round's failed train episodes of the student by the factory family
and the knobs of their task (ledger: the aggregate, the grouping and the output format, which set its difficulty;
read from the task's task.toml [metadata]). A failure of a task no family of the factory makes (arithmetic, a
hand-written Harbor task) is counted apart, never guessed at. Held-out episodes never enter: the caller passes
train episodes only, and the admission refuses a copy of a held-out task anyway.

`allot(frontier, n)` splits n candidates over the cells in proportion to their failures (largest remainders, ties by
the cell's key); `frontier_candidates(frontier, n, seed=..., round=...)` writes each as a task of the cell's family
with the cell's knobs fixed and everything else new (data, names, wording): the reference writer. With
`any_harbor`, a failed Harbor task of no family gets a cell of its own kind too, for a writer that works from seed
folders (the openai writer, in flows/synthesize.py). Each candidate carries its cell, so the stage
can record its lineage (the run, the round, the cell, the failed trajectory ids). Deterministic in its inputs.

Pure functions over typed inputs: this module reads no lake, builds nothing and admits nothing (curate/synthesis.py
admits; flows/synthesize.py wires the stage and writes the rows).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from tasks.factory.draft import Candidate
from tasks.factory.ledger import FAMILY as LEDGER
from tasks.factory.ledger import KNOBS as LEDGER_KNOBS
from tasks.factory.ledger import ledger_near
from tasks.spec import Task

FAMILIES = {LEDGER: LEDGER_KNOBS}  # family the factory writes -> the knobs a cell fixes -> their values
WORDS = {"easy": 1, "medium": 2, "hard": 3}  # Harbor's difficulty words


@dataclass(frozen=True)
class Episode:
    """What the frontier reads of one episode row."""

    trajectory_id: str
    task_id: str
    success: bool
    verdict: str


@dataclass
class FrontierCell:
    """Tasks of one family with the same knobs, and the student's failed episodes on them."""

    family: str
    difficulty: int
    knobs: dict[str, str]
    failures: list[str] = field(default_factory=list)  # trajectory ids, in row order
    tasks: list[str] = field(default_factory=list)  # the failed tasks' ids, each once

    @property
    def key(self) -> str:
        """e.g. ledger/d2/aggregate=max,format=lines,group_by=file"""
        return f"{self.family}/d{self.difficulty}/" + ",".join(f"{k}={v}" for k, v in sorted(self.knobs.items()))


@dataclass
class Frontier:
    """The cells of failures the factory can write near, and what it cannot."""

    cells: list[FrontierCell]
    episodes: int  # scored episodes read (infra errors left out)
    failures: int  # of them failed
    outside: int  # failures on tasks of no factory family


def _difficulty(meta: dict, task: Task) -> int:
    """task.toml's [metadata] difficulty: a number, or Harbor's easy/medium/hard; else the task's own."""
    d = meta.get("difficulty")
    if isinstance(d, int) or (isinstance(d, str) and d.isdigit()):
        return int(d)
    return WORDS.get(str(d).lower(), task.difficulty)


def _cell_of(task: Task, any_harbor: bool) -> tuple[str, int, dict[str, str]] | None:
    meta = (task.metadata or {}).get("task_metadata") or {}
    family = meta.get("family")
    knobs = FAMILIES.get(family)
    if knobs is not None and all(str(meta.get(k)) in values for k, values in knobs.items()):
        return family, _difficulty(meta, task), {k: str(meta[k]) for k in sorted(knobs)}
    if any_harbor and (task.metadata or {}).get("source_format") == "harbor":
        return str(family or task.suite), _difficulty(meta, task), {}
    return None


def failure_frontier(episodes: Iterable[Episode], tasks: Iterable[Task], *, any_harbor: bool = False) -> Frontier:
    """The frontier of `episodes` (a round's student train episodes) over `tasks` (the train pool they ran on).
    An infra_error is not the student's failure and is left out; an episode of a task not in `tasks` is an error.
    `any_harbor` (a writer that works from seed folders: openai): a failed Harbor task of no factory family gets a
    cell too, keyed by its [metadata] family (else its suite) and difficulty, with no knobs."""
    by_id = {t.id: t for t in tasks}
    cells: dict[str, FrontierCell] = {}
    n = failed = outside = 0
    for e in episodes:
        if e.verdict == "infra_error":
            continue
        if e.task_id not in by_id:
            raise ValueError(f"episode {e.trajectory_id} is of task {e.task_id!r}, which is not in the train pool")
        n += 1
        if e.success:
            continue
        failed += 1
        where = _cell_of(by_id[e.task_id], any_harbor)
        if where is None:
            outside += 1
            continue
        cell = FrontierCell(*where)
        cell = cells.setdefault(cell.key, cell)
        cell.failures.append(e.trajectory_id)
        if e.task_id not in cell.tasks:
            cell.tasks.append(e.task_id)
    return Frontier(cells=[cells[k] for k in sorted(cells)], episodes=n, failures=failed, outside=outside)


def allot(frontier: Frontier, n: int) -> list[tuple[FrontierCell, int]]:
    """n candidates split over the cells in proportion to their failures (largest remainders; ties by key)."""
    total = sum(len(c.failures) for c in frontier.cells)
    if n <= 0 or total == 0:
        return []
    shares = {c.key: divmod(n * len(c.failures), total) for c in frontier.cells}  # exact: whole part, remainder
    counts = {k: q for k, (q, _) in shares.items()}
    for k in sorted(shares, key=lambda k: (-shares[k][1], k))[: n - sum(counts.values())]:
        counts[k] += 1
    return [(c, counts[c.key]) for c in frontier.cells if counts[c.key] > 0]


def frontier_candidates(frontier: Frontier, n: int, *, seed: int, round: int) -> list[tuple[Candidate, FrontierCell]]:
    """The reference writer's n candidates near the frontier's cells (see allot), each with the cell that asked for
    it. (The openai writer's are flows/synthesize.py's: they need an endpoint and the seed folders.)"""
    out: list[tuple[Candidate, FrontierCell]] = []
    for cell, count in allot(frontier, n):
        for _ in range(count):
            d = ledger_near(cell.knobs, seed=seed, round=round, index=len(out))
            out.append((Candidate(candidate_id=d.name, writer="reference", family=cell.family, draft=d,
                                  seed_tasks=list(cell.tasks)), cell))
    return out
