"""The README is a promise: its file tree names every tracked source file, every CLI command has a section,
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


def test_tree_names_every_source_file():
    tree = README.split("## Files", 1)[1].split("\n## ", 1)[0]
    missing = [f for f in tracked_files()
               if (f.endswith((".py", ".sh", ".toml", "Dockerfile", "Makefile")) or f.startswith(".ci/"))
               and not f.startswith("tests/") and f.split("/")[-1] not in tree]
    assert not missing, f"README's file tree lacks: {missing}"


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
