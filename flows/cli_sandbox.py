"""The `flywheel sandbox` group: run one command in a fresh sandbox (`exec`) and build the sandbox image
(`build-image`). Thin wiring over sandbox/backend.py and sandbox/image.py; no Prefect server.
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from flows.cli_options import (
    UsageError,
)

sandbox_app = typer.Typer(no_args_is_help=True, help="Run commands in sandboxes; build the sandbox image.")


@sandbox_app.command("exec", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def sandbox_exec(
    ctx: typer.Context,
    backend: Annotated[str | None, typer.Option(help="docker, local or auto (docker if an engine answers); default: "
                                                     "sandbox.backend's.")] = None,
    timeout: Annotated[float | None, typer.Option(help="Wall-clock limit in seconds; default: sandbox.timeout_s's.")
                       ] = None,
    memory: Annotated[int | None, typer.Option(help="Memory limit in MB (swap included); default: "
                                                    "sandbox.memory_mb's.")] = None,
    image: Annotated[str | None, typer.Option(help="Sandbox image tag; default: sandbox.image's.")] = None,
) -> None:
    """Run CMD in a fresh sandbox and print one JSON result: flywheel sandbox exec -- CMD [ARG...]. An option not
    given takes the sandbox config's default (sandbox/result.py SandboxConfig: the one definition of each)."""
    from pydantic import ValidationError

    from sandbox.backend import exec_once
    from sandbox.result import SandboxConfig

    argv = list(ctx.args)
    if not argv:
        raise UsageError("no command given; usage: flywheel sandbox exec [OPTIONS] -- CMD [ARG...]")
    given = {"backend": backend, "timeout_s": timeout, "memory_mb": memory, "image": image}
    kw = {k: v for k, v in given.items() if v is not None}
    try:
        cfg = SandboxConfig(**kw)
    except ValidationError as e:  # -> one line
        raise UsageError(f"bad sandbox option: {e.errors()[0]['loc'][0]}: {e.errors()[0]['msg']}") from None
    stdin = None if sys.stdin is None or sys.stdin.isatty() else sys.stdin.buffer.read()
    result = exec_once(cfg, argv, stdin=stdin or None)
    print(result.model_dump_json())


@sandbox_app.command("build-image")
def sandbox_build_image(
    tag: Annotated[str | None, typer.Option(help="Image tag.")] = None,
    force: Annotated[bool, typer.Option(help="Rebuild even if the image exists.")] = False,
) -> None:
    """Build the sandbox image from Debian packages (no registry needed); reuse it when present."""
    from sandbox.image import build_image
    from sandbox.result import SandboxConfig

    image_id = build_image(tag or SandboxConfig().image, force=force)
    print(image_id)
