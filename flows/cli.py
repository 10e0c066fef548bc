"""The `flywheel` command line: the typer app, its error handling and the console script's entry point.

Every command has --help. Known bad input (config, suite, task file, endpoint, sandbox engine) ends in one line
`error: ...` that names the problem and the fix, and exit code 2; nothing half-written is left behind.
Heavy imports happen inside commands so that `--help` stays fast. The commands live in modules by group, thin
typer wiring over the flows and the plain stage functions: flows/cli_stages.py (generate, run, curate, evaluate,
train), flows/cli_lake.py (sql, export, stats, view, demos), flows/cli_tasks.py (verify, tasks),
flows/cli_sandbox.py (sandbox), flows/cli_server.py (server), flows/cli_env.py (env), flows/serve.py (serve,
deploy); what they share is flows/cli_options.py. This module registers them, in the order `--help` lists them.
"""

from __future__ import annotations

import os
import sys

import typer

from flows import cli_env, cli_lake, cli_sandbox, cli_server, cli_stages, cli_tasks
from flows.cli_options import UsageError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="flywheel: teacher rollouts in sandboxes -> verified trajectories -> SFT -> GRPO -> repeat.")
app.add_typer(cli_sandbox.sandbox_app, name="sandbox")
app.add_typer(cli_tasks.tasks_app, name="tasks")
app.add_typer(cli_lake.demos_app, name="demos")
app.add_typer(cli_stages.train_app, name="train")
app.add_typer(cli_server.server_app, name="server")
app.add_typer(cli_env.env_app, name="env")
for _command in (cli_stages.generate, cli_stages.run, cli_stages.curate, cli_stages.evaluate, cli_lake.sql,
                 cli_lake.export, cli_lake.stats, cli_lake.view, cli_tasks.verify):
    app.command()(_command)


# (module, class) of every error that means bad input or an unusable environment: one line, exit 2, not a bug.
KNOWN_ERRORS = (
    ("flows.config", "ConfigError"), ("flows.runners", "RunnerError"), ("flows.serve", "ServeError"),
    ("agents.policy", "PolicyError"), ("sandbox.result", "SandboxError"), ("tasks.suites", "UnknownSuiteError"),
    ("tasks.suites", "SuiteSizeError"),
    ("tasks.loaders", "TaskFileError"), ("tasks.judge.errors", "VerifierUnavailable"), ("warehouse.lakefs", "LakeError"),
    ("tasks.harbor", "HarborTaskError"), ("tasks.bfcl", "BfclError"), ("tasks.humaneval", "HumanEvalMissing"),
    ("tasks.openenv", "OpenEnvError"), ("agents.env_server", "EnvServerError"),
    ("warehouse.query", "QueryError"), ("warehouse.export", "ExportError"), ("warehouse.stats", "StatsError"),
    ("curate.demos", "DemoImportError"), ("curate.mixing", "SnapshotError"),
    ("flows.concurrency", "ConcurrencyError"), ("flows.artifacts", "ArtifactError"),
    ("flows.prefect_home", "LocalServerError"),
    ("training.registry", "RegistryError"), ("training.sft", "TrainingError"), ("training.tiny", "TinyModelError"),
    ("training.mismatch", "MismatchError"),
)


def _is_known(e: BaseException) -> bool:
    """Matched by (module, class name) along the MRO, so that no stage module is imported just to catch errors."""
    known = set(KNOWN_ERRORS) | {(UsageError.__module__, "UsageError")}
    return any((c.__module__, c.__name__) in known for c in type(e).__mro__)


def _register_ops_commands() -> None:
    """Add `serve` and `deploy` (flows/serve.py) to the app, once."""
    if any(c.name == "serve" for c in app.registered_commands):
        return
    from flows.serve import deploy_command, serve_command

    app.command("serve")(serve_command)
    app.command("deploy")(deploy_command)


# `flywheel generate` defers flows/serve.py (its config models are most of this module's import time) to `_main`:
# the warm client of flows/warm.py needs none of it.
if sys.argv[1:2] != ["generate"]:
    _register_ops_commands()


def _usage_exit(e: BaseException) -> int:
    """A click usage error (typer's vendored click or the installed one): the usage line and hint as click shows
    them, then one `error:` line; its exit code (2 for usage errors)."""
    from typer._click.exceptions import NoArgsIsHelpError
    from typer._click.exceptions import UsageError as TyperUsageError

    if isinstance(e, NoArgsIsHelpError):  # a bare group: its help, exit 2 as click does
        e.show()
        return e.exit_code
    ctx = getattr(e, "ctx", None)
    if isinstance(e, TyperUsageError) and ctx is not None:
        hint = f"Try '{ctx.command_path} {ctx.help_option_names[0]}' for help." if ctx.help_option_names else ""
        print(ctx.get_usage(), file=sys.stderr)
        if hint:
            print(hint, file=sys.stderr)
    print(f"error: {e.format_message()}", file=sys.stderr)
    return e.exit_code


def main() -> None:
    """The console script: exit code 0 on success, 2 and one `error:` line on bad input or a usage error,
    130 when aborted; a traceback only for bugs. `generate` goes through a warm starter when one answers
    (flows/warm.py); when none does, it runs here and starts one at its end for the next command."""
    from flows import warm

    if not warm.eligible(sys.argv):
        return _main()
    env, path = dict(os.environ), list(sys.path)
    fp = warm.fingerprint(env, path)
    try:
        code = warm.run_warm(sys.argv, env, fp)
    except KeyboardInterrupt:
        print("aborted", file=sys.stderr)
        sys.exit(130)
    if code is not None:
        sys.exit(code)
    try:
        _main()
    except SystemExit as e:
        if e.code not in (0, None):
            raise  # a failed or aborted command leaves no starter behind
    try:
        warm.spawn_starter(env, path, fp)
    except OSError as e:  # the command's own result stands; the next one runs in-process too
        print(f"warning: could not start the warm starter of generate: {e}", file=sys.stderr)
    sys.exit(0)


def warm_starter() -> None:
    """The process of a warm starter of `generate` (spawned by flows/warm.py `spawn_starter`): flows/warm_process.py
    forks `main` for each client."""
    from flows import warm_process

    warm_process.boot(main)


def _main() -> None:
    _register_ops_commands()
    # This machine (and many clusters) has no route to Prefect's telemetry endpoint: do not try.
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    import click
    from typer._click import exceptions as tclick

    try:
        # standalone_mode=False: typer.Exit(n) comes back as the return value, errors are raised to us
        rv = app(standalone_mode=False)
    except (typer.Abort, click.exceptions.Abort, KeyboardInterrupt):
        _stop_server_if_unused()
        print("aborted", file=sys.stderr)
        sys.exit(130)
    except (tclick.ClickException, click.exceptions.ClickException) as e:
        _stop_server_if_unused()
        sys.exit(_usage_exit(e))
    except (typer.Exit, click.exceptions.Exit) as e:
        if e.exit_code:
            _stop_server_if_unused()
        sys.exit(e.exit_code)
    except Exception as e:
        _stop_server_if_unused()
        if _is_known(e):
            print(f"error: {e}", file=sys.stderr)
            sys.exit(2)
        raise
    if rv not in (None, 0):
        _stop_server_if_unused()
    sys.exit(rv if isinstance(rv, int) else 0)


def _stop_server_if_unused() -> None:
    """A command that failed stops the shared server it started, unless another command uses it."""
    mod = sys.modules.get("flows.shared_server")
    if mod is not None:
        mod.stop_if_unused()


if __name__ == "__main__":
    main()

