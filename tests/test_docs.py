"""The README is a promise: its file tree names every tracked file by full path (and only existing ones), every
CLI command has a section, every error class is known to the CLI or deliberately not,
and every `make X` it names exists."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

README = (ROOT / "README.md").read_text()


def tracked_files() -> list[str]:
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout.split()
    return [f for f in out if (ROOT / f).exists()]


def tree_paths() -> list[str]:
    """The first word of each line of the README's Files tree (continuation lines start with a space)."""
    tree = README.split("## Files", 1)[1].split("\n## ", 1)[0]
    block = tree.split("```", 2)[1]
    return [line.split()[0] for line in block.splitlines()[1:] if line.strip() and not line[0].isspace()]


def test_tree_names_every_tracked_file_by_full_path():
    """Both ways: every tracked file is a line of the tree (tests/ is one line: it mirrors the packages; the
    packages' __init__.py files are empty, as the tree says), and every line names a file or folder that exists."""
    listed = tree_paths()
    folders = [p for p in listed if p.endswith("/")]
    files = [f for f in tracked_files() if not any(f.startswith(d) for d in folders)]
    inits = [f for f in files if f.endswith("/__init__.py")]
    assert not [f for f in inits if (ROOT / f).read_text().strip()], "an __init__.py is not empty: list it"
    missing = sorted(set(files) - set(inits) - set(listed))
    assert not missing, f"README's Files tree lacks these paths (one line each, full path): {missing}"
    gone = [p for p in listed if not (ROOT / p).exists()]
    assert not gone, f"README's Files tree lists paths that do not exist: {gone}"
    twice = sorted({p for p in listed if listed.count(p) > 1})
    assert not twice, f"README's Files tree lists these twice: {twice}"


def test_every_cli_command_has_a_section():
    import typer.main

    from flows.cli import app

    group = typer.main.get_command(app)
    names = []
    for name, cmd in group.commands.items():
        sub = getattr(cmd, "commands", None)
        names += [f"{name} {s}" for s in sub] if sub else [name]
    missing = [n for n in names if f"### `flywheel {n}" not in README]
    assert not missing, f"README has no section for: {missing}"


def test_make_targets_exist():
    makefile = (ROOT / "Makefile").read_text()
    for target in set(re.findall(r"(?:`|^)make ([a-z][a-z0-9_-]*)", README, re.M)):
        assert re.search(rf"^{target}:", makefile, re.M), f"README names 'make {target}' but Makefile lacks it"


PACKAGES = ("agents", "curate", "flows", "sandbox", "tasks", "training", "warehouse")

# Exception classes deliberately NOT in flows/cli.py's KNOWN_ERRORS (a known error prints one line and exits 2;
# anything else reaching the CLI is a bug and shows its traceback). Each one says why.
NOT_KNOWN_ERRORS = {
    # Caught where raised and turned into something else, never reaching the CLI:
    ("training.attention", "AttentionError"): "student.train_attention is a Literal: the config refuses a bad name first",
    ("tasks.factory.draft", "MalformedProposal"): "agents/task_writer.py turns it into a malformed_reply candidate",
    ("flows.view", "ViewServerError"): "`flywheel view` catches it and raises UsageError (one line, exit 2)",
    ("warehouse.viewer", "ViewError"): "rendered by flows/view.py as an error page with its HTTP status",
    ("tasks.judge.guest.plaindata", "NotPlainData"): "inside the judge's sandbox: becomes an 'error' call result",
    ("tasks.judge.guest.runner", "_CallFailed"): "inside the judge's sandbox: becomes an 'error' call result",
    ("tasks.judge.guest.runner", "SolutionRaised"): "inside the judge's sandbox: the solution's exception, raised to a test",
    ("tasks.judge.testsplit", "_NoSplit"): "a test that cannot be split runs on the isolated path instead",
    ("tasks.loaders", "_FieldError"): "collected into TaskFileError, which is known",
    ("tasks.tools", "ToolArgumentError"): "a model's bad tool call: recorded as a model_error verdict on the row",
    ("agents.loop", "MalformedToolCall"): "a model's unreadable tool call: recorded as a model_error verdict on the row",
    ("warehouse.chat", "ConversationError"): "a row SFT cannot render: counted as dropped; export raises ExportError",
    ("sandbox.guest.kernel", "CallTimeout"): "inside the sandbox interpreter: a call's timeout verdict",
    ("sandbox.interpreter", "InterpreterError"): "the backends turn it into an infra_error verdict on the row",
    # Raised only when the code itself is wrong (input was validated before): a traceback is the right report.
    ("tasks.judge.errors", "VerifierError"): "a verifier kind the spec's Literal forbids reached verify()",
    ("training.warmup", "WarmupError"): "argument checks; the config fields are validated first (ge=0)",
    ("training.environment", "EnvironmentError_"): "TRL and tasks.tools disagree on a tool schema: a bug",
}


def exception_classes() -> dict[tuple[str, str], list[str]]:
    """(module, class) -> base names, for every class in the packages that derives, through the packages' own
    classes, from a built-in exception or an imported `...Error`/`...Exception` (read from the source: nothing is
    imported, so no heavy module loads)."""
    import ast
    import builtins

    bases: dict[tuple[str, str], list[str]] = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            mod = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ClassDef):
                    bases[(mod, node.name)] = [b.id if isinstance(b, ast.Name) else b.attr if isinstance(
                        b, ast.Attribute) else "" for b in node.bases]
    builtin_exc = {n for n, v in vars(builtins).items() if isinstance(v, type) and issubclass(v, BaseException)}
    found: dict[tuple[str, str], list[str]] = {}
    while True:
        names = {n for _m, n in found}
        new = {k: bs for k, bs in bases.items() if k not in found and any(
            b in builtin_exc or b in names or b.endswith(("Error", "Exception")) for b in bs)}
        if not new:
            return found
        found.update(new)


def test_every_error_class_is_known_to_the_cli_or_deliberately_not():
    """A class counts as known when it or one of its bases (by name, within the packages) is in KNOWN_ERRORS,
    as flows/cli.py's _is_known matches along the MRO."""
    from flows.cli import KNOWN_ERRORS

    classes = exception_classes()
    known = set(KNOWN_ERRORS) | {("flows.cli_options", "UsageError")}
    stale = sorted(known - set(classes))
    assert not stale, f"flows/cli.py KNOWN_ERRORS names classes that are not defined there: {stale}"
    stale = sorted(set(NOT_KNOWN_ERRORS) - set(classes))
    assert not stale, f"NOT_KNOWN_ERRORS (tests/test_docs.py) names classes that are not defined there: {stale}"
    both = sorted(known & set(NOT_KNOWN_ERRORS))
    assert not both, f"in both KNOWN_ERRORS and NOT_KNOWN_ERRORS: {both}"
    known_names = {n for _m, n in known}

    def is_known(key: tuple[str, str]) -> bool:
        return key in known or any(b in known_names or any(is_known(k) for k in classes if k[1] == b)
                                   for b in classes[key])

    undecided = sorted(k for k in classes if k not in NOT_KNOWN_ERRORS and not is_known(k))
    assert not undecided, (f"error classes neither in flows/cli.py KNOWN_ERRORS (bad input or environment: one "
                           f"line, exit 2) nor in NOT_KNOWN_ERRORS here (with why): {undecided}")
