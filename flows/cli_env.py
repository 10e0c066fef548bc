"""`flywheel env serve SUITE`: a suite served as an OpenEnv environment (agents/env_server.py, tasks/openenv.py).

Thin wiring: the run config gives the sandbox, the episode's turn limit, the reward terms and the judge; the lake
root is --root (else the config's run.out). It loads the suite's tasks, opens the sandbox backend, and serves
openenv-core's app with uvicorn on --host/--port until Ctrl-C or SIGTERM, then prints how many episodes it
wrote. No Prefect: a served
environment is a long-lived process of its own, not a flow.
"""

from __future__ import annotations

import json
import secrets
import time
from typing import Annotated

import typer

from flows.cli_options import Config, Sets, UsageError, load_cfg

env_app = typer.Typer(no_args_is_help=True, help="OpenEnv: serve a suite as an environment.")


@env_app.command("serve")
def serve(
    suite: Annotated[str, typer.Argument(help="Suite: a built-in name, a task file, a Harbor folder, humaneval, "
                                              "bfcl-multi-turn.")],
    port: Annotated[int, typer.Option(help="TCP port to listen on.")] = 8000,
    host: Annotated[str, typer.Option(help="Address to listen on (loopback by default).")] = "127.0.0.1",
    root: Annotated[str | None, typer.Option(help="Lake root the episodes are written to (default: run.out).")] = None,
    n: Annotated[int, typer.Option("--n", help="Number of tasks served.")] = 100,
    split: Annotated[str, typer.Option(help="train or heldout.")] = "train",
    difficulty: Annotated[int, typer.Option(help="Difficulty 1-3 of built-in suites.")] = 1,
    max_sessions: Annotated[int, typer.Option("--max-sessions", help="Concurrent client sessions.")] = 16,
    backend: Annotated[str | None, typer.Option(help="Sandbox backend: docker, local or auto.")] = None,
    run_id: Annotated[str | None, typer.Option("--run-id", help="Run id of the rows (default: env-<suite>-<time>)."
                                               )] = None,
    config: Config = None,
    set_: Sets = None,
) -> None:
    """Serve SUITE as an OpenEnv environment: reset to a task, step through its tools in a sandbox, the judge's
    reward and verdict at the end; every episode played is a row (source 'env') in the lake."""
    import re

    from tasks.openenv import OPENENV_CORE, create_server_app, installed_version
    from tasks.suites import check_suite, load_suite

    if split not in ("train", "heldout"):
        raise UsageError(f"--split must be train or heldout, not {split!r}")
    if n < 1 or max_sessions < 1:
        raise UsageError(f"--n and --max-sessions must be >= 1, not {n} and {max_sessions}")
    cfg = load_cfg(config, root, set_, backend)
    check_suite(suite, split=split, n=n)
    tasks = load_suite(suite, n, split=split, seed=cfg.run.seed, difficulty=difficulty)
    slug = re.sub(r"[^A-Za-z0-9]+", "-", suite.rsplit("/", 1)[-1]).strip("-") or "suite"
    rid = run_id or f"env-{slug}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"

    import uvicorn

    from agents.env_server import SuiteServer
    from sandbox.backend import open_backend

    with open_backend(cfg.sandbox, pool_size=min(max_sessions, 8)) as be:
        server = SuiteServer(tasks=tasks, backend=be, root=cfg.run.out, run_id=rid, max_turns=cfg.rollout.max_turns,
                             verify_kwargs={"rewards": cfg.rewards, "judge_config": cfg.judge})
        app = create_server_app(server.session, name=f"flywheel-{slug}", max_sessions=max_sessions)
        print(json.dumps({"serving": suite, "tasks": len(tasks), "split": split, "url": f"http://{host}:{port}",
                          "openenv_core": installed_version(), "speaks": OPENENV_CORE, "lake": cfg.run.out,
                          "run_id": rid, "sandbox": be.name}), flush=True)
        try:
            uvicorn.run(app, host=host, port=port, log_level="warning")
        finally:
            print(json.dumps({"episodes_written": server.written, "run_id": rid}), flush=True)
