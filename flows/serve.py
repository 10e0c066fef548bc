"""`flywheel serve`: register the flywheel's flows as Prefect deployments and execute their runs.

One long-running process (`prefect.serve`) registers a deployment per flow (generate, curate, train-sft,
train-grpo, evaluate, flywheel), with the cron or interval schedule of the `[serve]` config section, and runs every flow run that the
schedules, the UI's Run button or the API create for them. The config `serve` was started with is the base of
every run: it is the default of the flow's `cfg` parameter, stored in the deployment and left out of the run form
(`run_form`), so it reaches every run however the run was made (UI, `prefect deployment run`, schedule, a work
pool's worker on another machine), with no file or side channel to keep in step. The form shows only the flow's
few plain parameters (flows/config.py's RUN_PARAMETERS, served values as defaults) and `overrides`, which the
flow lays over the served config (`run_config_of`). Adding a flow is one line in `SERVED`. The flow itself
chooses its task runner (threads or Ray) from its parameters at run time (flows/runners.py), so a run triggered
from the UI can ask for Ray (overrides=["run.ray_address=auto"]).

This module registers and serves; it does not define flows or create work pools (for a work-pool deployment see
README's "A process work pool, step by step"); `serve_command` uses the shared local server of flows/localserver.py
when no PREFECT_API_URL is set. Its `[serve]` section (ServeConfig, ScheduleConfig) lives in flows/config.py with
the rest of the config.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any

import typer

from flows.config import (
    RUN_PARAMETERS,
    SERVED_FLOWS,
    ConfigError,
    FlywheelConfig,
    ScheduleConfig,
    ServeConfig,
    load_config,
    run_config,
)


class ServeError(RuntimeError):
    """`flywheel serve` cannot start as configured; the message names the problem and the fix."""


# --- what is served ----------------------------------------------------------------------------------------------

def served_parameters(cfg: FlywheelConfig, flow: str) -> dict[str, Any]:
    """A deployment's default parameters: `cfg` = the served config as JSON ([serve] left out: it is about the
    serve process, not a run; kept out of the form by `run_form`), each plain run parameter = its served value,
    and no overrides."""
    data = cfg.model_dump(mode="json")
    data.pop("serve", None)
    params: dict[str, Any] = {"cfg": data}
    for param, key in RUN_PARAMETERS[flow].items():
        section, field = key.split(".")
        params[param] = data[section][field]
    params["overrides"] = []
    return params


def _refs(node: Any) -> set[str]:
    if isinstance(node, dict):
        own = {node["$ref"].rsplit("/", 1)[-1]} if isinstance(node.get("$ref"), str) else set()
        return own.union(*(_refs(v) for v in node.values()))
    if isinstance(node, list):
        return set().union(*(_refs(v) for v in node))
    return set()


def run_form(schema: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    """The deployment's parameter schema as the UI's run form shows it: without `cfg` (the served config rides
    along in the deployment's parameters), each plain parameter typed by its served value (no null toggle where
    the served value is set) with that value as its default, and only the model definitions still used."""
    props = {k: dict(v) for k, v in schema.get("properties", {}).items() if k != "cfg"}
    for name, p in props.items():
        if name in defaults:
            p["default"] = defaults[name]
        kinds = p.get("anyOf")
        if kinds and defaults.get(name) is not None:
            rest = [k for k in kinds if k.get("type") != "null"]
            if len(rest) == 1:
                del p["anyOf"]
                p.update(rest[0])
    defs = dict(schema.get("definitions", {}))
    used, todo = set(), _refs(props)
    while todo:
        name = todo.pop()
        if name not in used and name in defs:
            used.add(name)
            todo |= _refs(defs[name])
    return {**schema, "properties": props, "required": [r for r in schema.get("required", []) if r != "cfg"],
            "definitions": {k: v for k, v in defs.items() if k in used}}


def run_config_of(cfg: FlywheelConfig, flow: str, params: dict[str, Any],
                  overrides: list[str] | None) -> FlywheelConfig:
    """The config a flow run uses: its plain parameters (RUN_PARAMETERS[flow]), then its `overrides`, laid over
    `cfg`, the served config in a deployment run (its hidden `cfg` parameter) or the CLI's. ConfigError names a
    bad key. In a deployment run a `cfg` that lacks sections was replaced by hand (`--param cfg=...`) and would
    drop the served config's values for the defaults: refused, naming the parameters to use instead."""
    from prefect.context import FlowRunContext

    ctx = FlowRunContext.get()  # the run's own record: no API call (prefect.runtime.deployment.id makes one)
    if ctx is not None and ctx.flow_run is not None and ctx.flow_run.deployment_id is not None:
        from prefect.runtime import deployment

        missing = [s for s in FlywheelConfig.model_fields if s != "serve" and s not in cfg.model_fields_set]
        if missing:
            raise ConfigError(
                f"parameter cfg of deployment {deployment.name} holds the served config; this run passed one "
                f"without [{'], ['.join(missing)}], which would replace the served values by the defaults: drop "
                f"cfg and pass the run's own parameters ({', '.join([*RUN_PARAMETERS[flow], 'overrides'])}), e.g. "
                "--param n_tasks=12 or --param 'overrides=[\"rollout.concurrency=4\"]'")
    keys = RUN_PARAMETERS[flow]
    return run_config(cfg, {keys[k]: v for k, v in params.items()}, overrides)


@dataclass(frozen=True)
class Served:
    """One deployable flow: its name (also the [serve] schedule key and the RUN_PARAMETERS key), `module:attribute`
    and a description."""

    name: str
    target: str
    description: str


SERVED: list[Served] = [
    Served("generate", "flows.generate:generate_flow", "Teacher rollouts in sandboxes -> verified trajectories."),
    Served("curate", "flows.curate:curate_flow", "Trajectories + demos -> a training snapshot."),
    Served("train_sft", "flows.train:train_sft_flow", "SFT of the student on a training snapshot."),
    Served("train_grpo", "flows.train:train_grpo_flow", "GRPO of the student with the tasks' verifiers as reward."),
    Served("evaluate", "flows.evaluate:evaluate_flow", "Score base/student/teacher on the held-out split."),
    Served("flywheel", "flows.flywheel:flywheel_flow", "Rounds of generate -> curate -> train -> evaluate."),
]
assert tuple(s.name for s in SERVED) == SERVED_FLOWS, "flows/config.py's SERVED_FLOWS and SERVED drifted apart"


def load_flow(entry: Served) -> Any:
    """Import the flow object of an entry; ServeError naming the module when it is not there."""
    from prefect import Flow

    module, attr = entry.target.split(":")
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name != module:  # the module exists but one of ITS imports is missing: a real bug, show it
            raise
        raise ServeError(f"flow {entry.name!r} is not available: module {module} does not exist; serve only the "
                         f"flows you have (serve.flows / --flow), or pass skip_missing") from None
    obj = getattr(mod, attr, None)
    if not isinstance(obj, Flow):
        raise ServeError(f"flow {entry.name!r}: {entry.target} is not a Prefect flow ({type(obj).__name__}); "
                         "fix SERVED in flows/serve.py")
    return obj


def parameter_form_problems(schema: dict[str, Any]) -> list[str]:
    """What keeps a deployment's parameter schema from being a complete UI form: a plain (non-model) parameter
    without a default or without a description (Google-style `Args:` in the flow's docstring), a model field
    without a default, a description or a type."""
    problems: list[str] = []
    defs = schema.get("definitions", {})
    for pname, p in schema.get("properties", {}).items():
        if "$ref" in p:
            continue
        if "default" not in p:
            problems.append(f"parameter {pname!r} has no default")
        if not p.get("description"):
            problems.append(f"parameter {pname!r} has no description")
    for mname, model in defs.items():
        for fname, f in model.get("properties", {}).items():
            where = f"{mname}.{fname}"
            if not f.get("description"):
                problems.append(f"{where} has no description")
            if "default" not in f and fname in model.get("required", []):
                problems.append(f"{where} has no default")
            if not any(k in f for k in ("type", "$ref", "anyOf", "allOf", "oneOf", "enum", "const")):
                problems.append(f"{where} has no type (the UI shows a raw JSON box)")
    return problems


def _schedules(s: ScheduleConfig) -> list[Any]:
    from prefect.schedules import Cron, Interval

    if s.cron:
        return [Cron(s.cron, timezone=s.timezone, active=s.active)]
    if s.interval_s:
        return [Interval(timedelta(seconds=s.interval_s), timezone=s.timezone, active=s.active)]
    return []


def build_deployments(cfg: FlywheelConfig, serve_cfg: ServeConfig, flows: list[str] | None = None, *,
                      skip_missing: bool = False) -> list[Any]:
    """RunnerDeployments for the chosen flows (default: serve_cfg.flows); talks to no server.

    A flow that cannot be imported is a ServeError unless `skip_missing` (then it is logged and left out)."""
    from prefect.logging import get_logger
    from prefect.types.entrypoint import EntrypointType
    from prefect.utilities.callables import ParameterSchema

    logger = get_logger("flywheel.serve")
    wanted = flows or serve_cfg.flows
    by_name = {s.name: s for s in SERVED}
    unknown = [f for f in wanted if f not in by_name]
    if unknown:
        raise ServeError(f"unknown flow(s) {', '.join(unknown)}; choose from {', '.join(by_name)}")
    deployments = []
    for name in dict.fromkeys(wanted):
        entry = by_name[name]
        try:
            flow = load_flow(entry)
        except ServeError as e:
            if not skip_missing:
                raise
            logger.warning("skipping %s: %s", name, e)
            continue
        sched = serve_cfg.schedule(name)
        params = served_parameters(cfg, name)
        dep = flow.to_deployment(
            name=serve_cfg.name,
            schedules=_schedules(sched) or None,
            parameters=params,
            description=f"{entry.description}\n\n{(flow.description or '').strip()}".strip(),
            tags=list(serve_cfg.tags),
            concurrency_limit=serve_cfg.concurrency_per_flow,
            enforce_parameter_schema=True,
            entrypoint_type=EntrypointType.MODULE_PATH,
        )
        schema = run_form(dep._parameter_openapi_schema.model_dump_for_openapi(),
                          {k: v for k, v in params.items() if k != "cfg"})
        dep._parameter_openapi_schema = ParameterSchema.model_validate(schema)
        problems = parameter_form_problems(schema)
        if problems:
            logger.warning("deployment %s/%s: its UI form is incomplete: %s", flow.name, serve_cfg.name,
                           "; ".join(problems))
        unfilled = [p for p in schema.get("required", []) if p not in dep.parameters]
        if sched.is_set and unfilled:
            raise ServeError(f"[serve.{name}] schedules {flow.name}, but its parameter(s) {', '.join(unfilled)} "
                             "have no default, so every scheduled run would be rejected; remove the schedule or "
                             "give the flow defaults for them")
        deployments.append(dep)
    if not deployments:
        raise ServeError(f"no flow to serve: none of {', '.join(wanted)} could be loaded")
    return deployments


def require_server() -> str:
    """The Prefect API URL this process talks to; ServeError when none is set (serving against the temporary
    server Prefect starts by itself would lose every deployment and schedule when the process ends)."""
    from prefect.settings import PREFECT_API_URL

    url = PREFECT_API_URL.value()
    if not url:
        raise ServeError("no Prefect server: run `flywheel server start` (a local one), or `prefect server start` "
                         "and export PREFECT_API_URL=http://127.0.0.1:4200/api")
    return str(url)


def serve(cfg: FlywheelConfig, *, flows: list[str] | None = None, serve_cfg: ServeConfig | None = None,
          skip_missing: bool = False, limits: Any | None = None) -> None:
    """Register the deployments and execute their runs until interrupted (Ctrl-C / SIGTERM pause the schedules).

    cfg: the config whose values become every deployment's default parameters (the UI form's defaults).
    flows: names to serve (default: serve_cfg.flows). serve_cfg: the [serve] section (default: cfg.serve).
    skip_missing: leave out flows whose module does not exist instead of failing.
    limits: a flows.concurrency.LimitsConfig to set on the server at start (default: cfg.limits when the config
    has that section, else the LimitsConfig defaults).
    """
    from prefect import serve as prefect_serve

    serve_cfg = serve_cfg or getattr(cfg, "serve", None) or ServeConfig()
    url = require_server()
    deployments = build_deployments(cfg, serve_cfg, flows, skip_missing=skip_missing)
    apply_limits(cfg, limits)
    print(f"serving {', '.join(f'{d.flow_name}/{d.name}' for d in deployments)} on {url} "
          f"(pid {os.getpid()}, {serve_cfg.limit} run(s) at once)", flush=True)
    prefect_serve(*deployments, limit=serve_cfg.limit, pause_on_shutdown=True, print_starting_message=False)


def apply_limits(cfg: FlywheelConfig, limits: Any | None = None) -> None:
    """Create the GPU and sandbox global concurrency limits on the server and set them to the config (`limits`,
    else cfg.limits, else the defaults), unless the config switches limits off; prints what is in force."""
    from flows.concurrency import LimitsConfig, default_limits, ensure_limits

    limits = limits or getattr(cfg, "limits", None) or LimitsConfig()
    if limits.enabled:
        in_force = ensure_limits(default_limits(limits), update=True)
        print(f"concurrency limits: {', '.join(f'{k}={v}' for k, v in in_force.items())}", flush=True)


def deploy(cfg: FlywheelConfig, *, work_pool: str, flows: list[str] | None = None,
           serve_cfg: ServeConfig | None = None, skip_missing: bool = False) -> list[str]:
    """Register the deployments on a work pool instead of serving them: runs are then executed by the pool's
    workers (`prefect worker start --pool NAME`, one per machine, each with this project installed), not by this
    process. Same schedules, parameters, forms and concurrency limits as `serve`. Returns the deployment ids.

    The pool must exist (`prefect work-pool create NAME --type process`); the entrypoints are module paths, so a
    worker only needs the `flywheel` package importable, not this checkout.
    """
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    serve_cfg = serve_cfg or getattr(cfg, "serve", None) or ServeConfig()
    url = require_server()
    with get_client(sync_client=True) as client:
        try:
            pool = client.read_work_pool(work_pool)
        except ObjectNotFound:
            raise ServeError(f"work pool {work_pool!r} does not exist on {url}; create it with "
                             f"`prefect work-pool create {work_pool} --type process`") from None
    ids = []
    for dep in build_deployments(cfg, serve_cfg, flows, skip_missing=skip_missing):
        ids.append(str(dep.apply(work_pool_name=work_pool)))
        print(f"registered {dep.flow_name}/{dep.name} on work pool {work_pool} ({pool.type})", flush=True)
    apply_limits(cfg)
    return ids


def serve_command(
    config: Annotated[Path | None, typer.Option("--config", "-c", help="TOML config file.")] = None,
    flow: Annotated[list[str] | None, typer.Option(
        "--flow", help="Flow to serve (repeat for several); default: serve.flows of the config.")] = None,
    skip_missing: Annotated[bool, typer.Option(
        "--skip-missing", help="Leave out flows whose module does not exist instead of failing.")] = False,
    set_: Annotated[list[str] | None, typer.Option("--set", help="Override a config key: section.key=value.")]
    = None,
) -> None:
    """Register the flows as Prefect deployments (schedules from the serve section) and run what the UI, the API
    and the schedules trigger, on PREFECT_API_URL or else the shared local server (started if none runs; it stays
    up while `serve` runs). Ctrl-C stops, pausing schedules; a killed `serve` takes its flow runs with it."""
    from flows import localserver
    from flows.child_guard import guard_children

    cfg = load_config(config, list(set_ or []))
    localserver.start()
    localserver.wait_ready()
    guard_children()  # the flow runs it starts (sessions of their own) go when it goes
    serve(cfg, flows=list(flow) if flow else None, skip_missing=skip_missing)


def deploy_command(
    work_pool: Annotated[str, typer.Option("--work-pool", "-p", help="Prefect work pool (type process) to "
                                           "register the deployments on.")],
    config: Annotated[Path | None, typer.Option("--config", "-c", help="TOML config file.")] = None,
    flow: Annotated[list[str] | None, typer.Option(
        "--flow", help="Flow to deploy (repeat for several); default: serve.flows of the config.")] = None,
    skip_missing: Annotated[bool, typer.Option(
        "--skip-missing", help="Leave out flows whose module does not exist instead of failing.")] = False,
    set_: Annotated[list[str] | None, typer.Option("--set", help="Override a config key: section.key=value.")]
    = None,
) -> None:
    """Register the flows as deployments on a work pool (schedules from the serve section) and exit; the pool's
    workers (`prefect worker start --pool NAME`) run them. Needs PREFECT_API_URL."""
    cfg = load_config(config, list(set_ or []))
    deploy(cfg, work_pool=work_pool, flows=list(flow) if flow else None, skip_missing=skip_missing)
