"""What every command module of the `flywheel` command line shares: the usage error, the option types, the config
built from a command's options, the lake-root check of read commands, and the two calls around the local Prefect
server (start it early, wait for it before the first flow).

It defines no command and imports neither prefect nor any stage module at import time (`--help` stays fast).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer


class UsageError(Exception):
    """Bad command-line input detected here."""


Config = Annotated[Path | None, typer.Option("--config", "-c", help="TOML config file.")]
Sets = Annotated[list[str] | None, typer.Option("--set", help="Override a config key: section.key=value.")]
Root = Annotated[str, typer.Option(help="Lake root folder or URL.")]


def load_cfg(config: Path | None, out: str | None, set_: list[str] | None, backend: str | None = None):
    """The run config of a command: the config file, then --set overrides, then --out and --backend."""
    from flows.config import load_config

    overrides = list(set_ or [])
    if out is not None:
        overrides.append(f"run.out={json.dumps(out)}")
    if backend is not None:
        overrides.append(f"sandbox.backend={json.dumps(backend)}")
    return load_config(config, overrides)


def start_server() -> None:
    """With no PREFECT_API_URL: find the shared local Prefect server, or start it now (detached, in parallel with
    the checks and imports that follow); flows/localserver.py."""
    from flows import localserver

    localserver.start()


def server_ready() -> None:
    """Wait for the server of `start_server` to answer (and release slots that dead commands held)."""
    from flows import localserver

    localserver.wait_ready()


def print_dict(d: dict) -> None:
    print(json.dumps(d, indent=1, default=str))


def lake_root(root: str) -> str:
    """A local lake root must exist for read commands (a typo would otherwise read as an empty lake)."""
    if "://" not in root and not Path(root).is_dir():
        raise UsageError(f"lake root {root} does not exist; pass the --root (or --out) a run wrote to")
    return root
