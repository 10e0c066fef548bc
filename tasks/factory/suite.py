"""The ledger family as built-in suites: `ledger` (train and held-out splits) and `ledger-combos` (held-out only).

`ledger_tasks(n, split=..., seed=..., suite=...)` writes the first n drafts of tasks/factory/ledger.py
`ledger_suite_drafts` as Harbor task folders under a cache folder (FLYWHEEL_TASK_CACHE, default
~/.cache/flywheel/tasks; one subfolder per suite, split, seed and version of the family's code, each task folder
written whole or not at all and reused when present), loads them with tasks/harbor.py (their images built, or
reused when present: SandboxUnavailable without Docker) and returns them as Tasks of that suite.
`ledger`'s held-out tasks share no name (file, folder, column, key value) with its train tasks; `ledger-combos` scores
combinations of steps (aggregate x grouping x format) never seen together in training and has no train split.
This module does not judge or admit anything: the family's oracle and check are tested (tests/tasks/test_factory.py).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from tasks.factory.draft import write_folder
from tasks.factory.ledger import GUEST, ledger_suite_drafts
from tasks.spec import Task

SUITES = ("ledger", "ledger-combos")  # the built-in suites of the family (tasks/suites.py dispatches them here)


def cache_root() -> Path:
    return Path(os.environ.get("FLYWHEEL_TASK_CACHE") or Path.home() / ".cache" / "flywheel" / "tasks")


def family_version() -> str:
    """12 hex of a sha256 over the family's code (ledger.py and its guest programs): folders of another version
    are never reused."""
    h = hashlib.sha256()
    for p in [GUEST.parent / "ledger.py", *sorted(GUEST.iterdir())]:
        if p.is_file():
            h.update(p.name.encode() + b"\0" + p.read_bytes())
    return h.hexdigest()[:12]


def _which(suite: str, split: str) -> str:
    """The ledger_suite_drafts split that serves `suite`'s `split`; ValueError naming the fix."""
    if suite not in SUITES:
        raise ValueError(f"no ledger suite {suite!r}; the ledger suites: {', '.join(SUITES)}")
    if suite == "ledger-combos":
        if split != "heldout":
            raise ValueError("ledger-combos holds held-out tasks only (combinations never trained): ask for split "
                             "heldout, or give its schedule step train_tasks = 0")
        return "combos"
    if split not in ("train", "heldout"):
        raise ValueError(f"ledger has splits train and heldout, not {split!r}")
    return split


def check_ledger(suite: str, split: str | None = None) -> None:
    """Preflight: the suite and split exist (ValueError) and Docker answers (SandboxUnavailable)."""
    from sandbox.engine import docker_client

    if split is not None:
        _which(suite, split)
    docker_client(timeout=30).close()


def ledger_tasks(n: int, *, split: str, seed: int = 0, suite: str = "ledger", build: bool = True) -> list[Task]:
    """n tasks of `suite`'s `split` (train | heldout), Harbor tasks with their images built (build=False: folders
    and Tasks only, no Docker)."""
    from tasks.harbor import build_images, load_harbor

    if n == 0:  # a schedule step with no train tasks (ledger-combos)
        return []
    which = _which(suite, split)
    folder = cache_root() / f"{suite}-{which}-s{seed}-{family_version()}"
    drafts = ledger_suite_drafts(n, split=which, seed=seed)
    tasks = []
    for d in drafts:
        if not (folder / d.name).is_dir():
            try:
                write_folder(d, folder / d.name)
            except FileExistsError:  # another process (the teacher ahead) wrote the same folder first
                pass
        tasks += [t.model_copy(update={"suite": suite}) for t in load_harbor(folder / d.name)]
    if build:
        build_images(tasks)
    return tasks
