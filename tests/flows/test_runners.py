"""Task runners, serve config and deployments, concurrency limits, artifacts.

Fast tests need no server. The `slow` ones run real flows against the session's real Prefect server
(conftest.prefect_api) and read back what the server recorded.
"""

from __future__ import annotations

import json
import pickle
import socket
import sys
import threading
import time

import pytest
from pydantic import BaseModel, Field, ValidationError

from flows.artifacts import (
    ArtifactError,
    Progress,
    artifact_key,
    check_key,
    table_rows,
)
from flows.concurrency import ConcurrencyError, LimitsConfig, endpoint_limit_name, retry_on_transient
from flows.config import FlywheelConfig, ServeConfig, valid_cron
from flows.runners import RunnerError, make_task_runner
from flows.serve import ServeError, build_deployments, parameter_form_problems

# --- runners -------------------------------------------------------------------------------------------------

def test_thread_runner_is_capped():
    r = make_task_runner(None, 3)
    assert type(r).__name__ == "ThreadPoolTaskRunner"
    assert r._max_workers == 3


def test_bad_max_workers_names_the_key():
    with pytest.raises(RunnerError, match="run.max_workers"):
        make_task_runner(None, 0)


def test_ray_runner_addresses():
    pytest.importorskip("prefect_ray")
    r = make_task_runner("ray://127.0.0.2:10001")
    assert type(r).__name__ == "RayTaskRunner" and r.address == "ray://127.0.0.2:10001"
    auto = make_task_runner("auto")
    assert auto.address is None and auto.init_kwargs["address"] == "auto"  # look up, never start, a cluster


def test_missing_prefect_ray_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "prefect_ray", None)  # fault injection: the package is not installed
    with pytest.raises(RunnerError, match=r"flywheel\[ray\]"):
        make_task_runner("auto")


# --- serve config and deployments ----------------------------------------------------------------------------

def test_schedule_validation_messages():
    with pytest.raises(ValidationError, match="5-field cron"):
        ServeConfig(generate={"cron": "every day"})
    with pytest.raises(ValidationError, match="either cron or interval_s"):
        ServeConfig(generate={"cron": "0 3 * * *", "interval_s": 60})
    with pytest.raises(ValidationError, match="IANA time zone"):
        ServeConfig(generate={"cron": "0 3 * * *", "timezone": "Mars/Olympus"})
    with pytest.raises(ValidationError, match="unknown flow"):
        ServeConfig(flows=["generate", "deploy"])
    s = ServeConfig(generate={"interval_s": 3600})
    assert s.generate.is_set and not s.curate.is_set
    for name, f in ServeConfig.model_fields.items():
        assert f.description, f"ServeConfig.{name} needs a description"


def test_generate_deployment_schedule_entrypoint_and_form():
    from flows.config import FlywheelConfig

    cfg = FlywheelConfig.model_validate({"generate": {"n_tasks": 3}})
    serve_cfg = ServeConfig(name="nightly", flows=["generate"],
                            generate={"cron": "30 2 * * *", "timezone": "Europe/Paris"})
    (dep,) = build_deployments(cfg, serve_cfg)
    assert (dep.flow_name, dep.name) == ("generate", "nightly")
    assert dep.entrypoint == "flows.generate.generate_flow"  # a module path: works from any directory
    (sched,) = dep.schedules
    assert sched.schedule.cron == "30 2 * * *" and sched.schedule.timezone == "Europe/Paris"
    assert dep.parameters["cfg"]["generate"]["n_tasks"] == 3  # the served config rides along, hidden
    assert "serve" not in dep.parameters["cfg"]
    schema = dep._parameter_openapi_schema.model_dump_for_openapi()
    assert list(schema["properties"]) == ["suite", "split", "n_tasks", "samples", "teacher_kind", "teacher_model",
                                          "teacher_endpoint", "backend", "overrides"]
    assert schema.get("definitions", {}) == {} and "cfg" not in schema.get("required", [])
    n = schema["properties"]["n_tasks"]
    assert n["type"] == "integer" and n["default"] == dep.parameters["n_tasks"] == 3 and n["description"]
    assert "anyOf" not in n  # served value set: no null toggle
    assert schema["properties"]["overrides"]["items"] == {"type": "string"}
    assert not parameter_form_problems(schema)
    assert dep.enforce_parameter_schema


def test_every_run_form_is_small_and_has_no_serve_settings():
    for dep in build_deployments(FlywheelConfig(), ServeConfig()):
        schema = dep._parameter_openapi_schema.model_dump_for_openapi()
        text = json.dumps(schema)
        assert "cfg" not in schema["properties"] and "ServeConfig" not in text and "FlywheelConfig" not in text
        assert len(schema["properties"]) <= 9 and "overrides" in schema["properties"], dep.flow_name
        assert set(schema.get("definitions", {})) <= {"SuiteStep"}, dep.flow_name


def test_run_parameters_and_overrides_lay_over_the_served_config():
    from flows.config import ConfigError, run_config

    served = FlywheelConfig.model_validate({"run": {"out": "/lake"}, "generate": {"n_tasks": 2, "samples": 1}})
    cfg = run_config(served, {"generate.n_tasks": 12, "generate.split": None}, ["rollout.concurrency=3"])
    assert (cfg.generate.n_tasks, cfg.generate.samples, cfg.rollout.concurrency) == (12, 1, 3)
    assert cfg.run.out == "/lake" and cfg.generate.split == served.generate.split
    assert run_config(served, {"generate.n_tasks": 12}, ["generate.n_tasks=5"]).generate.n_tasks == 5  # last wins
    with pytest.raises(ConfigError, match="unknown config key 'generate.ntasks'"):
        run_config(served, {}, ["generate.ntasks=5"])
    with pytest.raises(ConfigError, match="config value 'generate.n_tasks' .* is invalid"):
        run_config(served, {"generate.n_tasks": 0}, [])
    with pytest.raises(ConfigError, match="not of the form section.key=value"):
        run_config(served, {}, ["n_tasks"])
    with pytest.raises(ConfigError, match=r"override of \[serve\]"):
        run_config(served, {}, ["serve.limit=4"])


def test_flywheel_run_parameters_set_their_keys():
    from flows.config import SuiteStep
    from flows.serve import run_config_of, served_parameters

    served = FlywheelConfig.model_validate({"sft": {"max_steps": 7}})
    params = served_parameters(served, "flywheel")
    assert (params["rounds"], params["grpo"], params["student_base"]) == (2, True, "tiny")
    assert params["suites"] == served.model_dump(mode="json")["flywheel"]["suites"] and params["overrides"] == []
    cfg = run_config_of(served, "flywheel", {"rounds": 1, "suites": [SuiteStep(suite="arithmetic", train_tasks=8)],
                                             "student_base": None, "grpo": False}, ["sft.learning_rate=1e-3"])
    assert (cfg.flywheel.rounds, cfg.flywheel.grpo, cfg.student.base) == (1, False, "tiny")
    assert [s.train_tasks for s in cfg.flywheel.suites] == [8]
    assert (cfg.sft.max_steps, cfg.sft.learning_rate) == (7, 1e-3)


@pytest.mark.parametrize("expr,ok", [
    ("0 3 * * *", True), ("*/30 * * * *", True), ("0 9-17/2 * * mon-fri", True), ("5,35 0 1 jan,jul sun", True),
    ("0 0 29 2 7", True), ("every day", False), ("0 3 * *", False), ("60 * * * *", False), ("0 24 * * *", False),
    ("* * 0 * *", False), ("0 0 * 13 *", False), ("*/0 * * * *", False), ("5-1 * * * *", False),
    ("H * * * *", False), ("R 0 * * *", False), ("0 3 * * * *", False),
])
def test_cron_expressions_are_checked_without_prefect(expr, ok):
    assert valid_cron(expr) is ok


def test_missing_flow_is_an_error_unless_skipped(monkeypatch):
    from flows.config import FlywheelConfig

    serve_cfg = ServeConfig(flows=["generate", "curate"])
    from flows import serve as serve_mod

    # fault injection: an entry whose module does not exist (a flow not written yet)
    monkeypatch.setattr(serve_mod, "SERVED", [*serve_mod.SERVED[:1], serve_mod.Served(
        "curate", "flows.no_such_module:curate_flow", "missing")])
    with pytest.raises(ServeError, match="flows.no_such_module does not exist"):
        build_deployments(FlywheelConfig(), serve_cfg)
    deps = build_deployments(FlywheelConfig(), serve_cfg, skip_missing=True)
    assert [d.flow_name for d in deps] == ["generate"]


def test_all_flywheel_flows_deploy():
    deps = build_deployments(FlywheelConfig(), ServeConfig())
    assert [d.flow_name for d in deps] == ["generate", "curate", "train-sft", "train-grpo", "evaluate", "flywheel"]
    assert all(d.entrypoint.startswith("flows.") for d in deps)


def test_schedule_of_a_flow_with_required_parameters_is_refused():
    with pytest.raises(ServeError, match=r"\[serve.curate\] schedules curate, but its parameter\(s\) run_id"):
        build_deployments(FlywheelConfig(), ServeConfig(flows=["curate"], curate={"cron": "0 * * * *"}))


class Good(BaseModel):
    n: int = Field(default=1, description="how many")


class Bad(BaseModel):
    m: int = 2


def _flow_fn(a: Good, b: Bad, d: str, c: int = 3): ...


def test_parameter_form_problems_finds_bare_and_undescribed():
    from prefect.utilities.callables import parameter_schema

    fn = _flow_fn
    problems = parameter_form_problems(parameter_schema(fn).model_dump_for_openapi())
    assert "parameter 'c' has no description" in problems and "parameter 'd' has no default" in problems
    assert "Bad.m has no description" in problems
    assert not any(p.startswith("Good.") or "'a'" in p for p in problems)


# --- concurrency and retries (no server) ---------------------------------------------------------------------

def test_endpoint_limit_names():
    assert endpoint_limit_name("http://127.0.0.1:8000/v1") == "flywheel-endpoint-127-0-0-1-8000"
    assert endpoint_limit_name("https://API.example.com/v1") == "flywheel-endpoint-api-example-com-443"
    with pytest.raises(ConcurrencyError, match="has no host"):
        endpoint_limit_name("http:///v1")


def test_retry_only_transient_infrastructure():
    from prefect.states import Failed

    from agents.policy import EndpointError, RequestRejected
    from sandbox.result import SandboxError, SandboxUnavailable

    def retried(exc):
        return retry_on_transient(None, None, Failed(data=exc))

    assert retried(EndpointError("503 after 3 tries"))
    assert retried(SandboxError("container died"))
    assert retried(ConnectionResetError())
    assert not retried(RequestRejected("401: bad key"))
    assert not retried(SandboxUnavailable("no image"))
    assert not retried(ValueError("bad suite"))
    assert not retried(KeyError("bug"))


# --- artifacts (pure parts) ----------------------------------------------------------------------------------

def test_artifact_keys():
    assert artifact_key("Generate", "run_1", 3) == "generate-run-1-3"
    assert check_key("round-report") == "round-report"
    with pytest.raises(ArtifactError, match="lowercase letters"):
        check_key("Round_Report")
    with pytest.raises(ArtifactError, match="empty"):
        artifact_key("__")


def test_table_rows_union_and_json_safe():
    rows = table_rows([{"a": 1, "b": float("nan")}, {"c": {"x": 1}, "a": 2.1234567}])
    assert rows == [{"a": 1, "b": None, "c": None}, {"a": 2.123457, "b": None, "c": '{"x": 1}'}]


def test_progress_pickles_without_its_lock():
    p = Progress("00000000-0000-0000-0000-000000000000", total=10, description="chunk 1/2")
    p.done = 4
    q = pickle.loads(pickle.dumps(p))
    assert (q.done, q.total, q.percent) == (4, 10, 40.0)
    assert isinstance(q._lock, type(threading.Lock()))


# --- against a real Prefect server ---------------------------------------------------------------------------

@pytest.mark.slow
def test_submit_all_runs_tasks_of_the_flow_run_on_capped_threads(prefect_api):
    from prefect import flow, task
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    from flows.runners import submit_all

    active, peak, lock = [0], [0], threading.Lock()

    @task(name="square")
    def square(x: int) -> int:
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        time.sleep(0.2)
        with lock:
            active[0] -= 1
        return x * x

    @flow(name="runner-check")
    def f(n: int) -> tuple[str, list[int]]:
        from prefect.runtime import flow_run

        return flow_run.id, submit_all(square, [{"x": i} for i in range(n)], max_workers=2)

    run_id, out = f(5)
    assert out == [0, 1, 4, 9, 16]
    assert peak[0] == 2  # capped at max_workers, and really parallel
    with get_client(sync_client=True) as c:
        runs = c.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run_id])))
    assert sorted(r.state.type.value for r in runs if r.name.startswith("square")) == ["COMPLETED"] * 5


@pytest.mark.slow
def test_submit_all_raises_the_task_error(prefect_api):
    from prefect import flow, task

    from flows.runners import submit_all

    @task(name="boom")
    def boom(x: int) -> int:
        if x == 1:
            raise ValueError("bad input 1")
        return x

    @flow(name="runner-error-check")
    def f() -> list[int]:
        return submit_all(boom, [{"x": 0}, {"x": 1}, {"x": 2}])

    with pytest.raises(ValueError, match="bad input 1"):
        f()


@pytest.mark.slow
def test_limits_are_created_held_and_refused_when_too_small(prefect_api):
    from prefect.client.orchestration import get_client

    from flows.concurrency import ensure_limits, hold, rollout_slots

    name = f"flywheel-test-{time.monotonic_ns()}"
    assert ensure_limits({name: 2}) == {name: 2}
    assert ensure_limits({name: 5}) == {name: 2}  # exists: left as the operator set it
    assert ensure_limits({name: 3}, update=True) == {name: 3}
    with hold(name, 2, default_limit=3), get_client(sync_client=True) as c:
        assert c.read_global_concurrency_limit_by_name(name).active_slots == 2
    with get_client(sync_client=True) as c:
        assert c.read_global_concurrency_limit_by_name(name).active_slots == 0
    too_many = f"needs 4 slots of the concurrency limit '{name}', which has 3"
    with pytest.raises(ConcurrencyError, match=too_many), hold(name, 4, default_limit=3):
        pass
    # a rollout chunk with an endpoint teacher holds sandbox slots and request slots of that endpoint
    from agents.config import PolicyConfig

    limits = LimitsConfig(endpoint_slots=6)  # the default sandbox size: the session server's limit is shared
    teacher = PolicyConfig(kind="openai", base_url="http://127.0.0.1:9/v1", model="m")
    with rollout_slots(limits, teacher, 3), get_client(sync_client=True) as c:
        assert c.read_global_concurrency_limit_by_name("flywheel-sandbox").active_slots == 3
        assert c.read_global_concurrency_limit_by_name("flywheel-endpoint-127-0-0-1-9").active_slots == 3
    with rollout_slots(LimitsConfig(enabled=False), teacher, 100):
        pass  # disabled: holds nothing, asks the server nothing


def test_a_task_that_waits_for_slots_says_which_and_how_to_reset(prefect_api):
    import logging

    from flows.concurrency import hold

    # Outside a flow run the warning goes to the `flywheel.concurrency` logger. Prefect's logging setup (run again
    # inside the session) replaces the root handlers that capfd/caplog rely on: listen on the logger itself.
    log = logging.getLogger("flywheel.concurrency")
    records: list[logging.LogRecord] = []
    listener = logging.Handler(logging.WARNING)
    listener.emit = records.append
    log.disabled = False
    log.addHandler(listener)
    name = f"flywheel-test-{time.monotonic_ns()}"
    try:
        with hold(name, 2, default_limit=2), pytest.raises(TimeoutError), hold(name, 1, default_limit=2, timeout_s=1):
            pass
    finally:
        log.removeHandler(listener)
    said = "\n".join(r.getMessage() for r in records)
    assert f"waiting for 1 slot(s) of concurrency limit '{name}': 2 of 2 are taken" in said
    assert f"prefect gcl inspect {name}" in said and f"prefect gcl update {name} --active-slots 0" in said


@pytest.mark.slow
def test_artifacts_land_on_the_flow_run(prefect_api):
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey, FlowRunFilter, FlowRunFilterId

    from flows.artifacts import progress_callback, publish_markdown, publish_table

    @flow(name="artifact-check")
    def f() -> str:
        from prefect.runtime import flow_run

        cb = progress_callback(10, key="test-progress", description="chunk 1/1", min_interval_s=3600)
        cb(4)  # throttled: not sent
        cb(6)  # the last one is always sent
        publish_table("test-table", [{"verdict": "pass", "n": 3}, {"verdict": "fail", "n": 1}], "verdicts")
        publish_markdown("test-report", "# Round 0\n\nok")
        return flow_run.id

    run_id = f()
    with get_client(sync_client=True) as c:
        arts = c.read_artifacts(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run_id])))
        by_key = {a.key: a for a in arts}
        assert set(by_key) == {"test-progress", "test-table", "test-report"}
        assert by_key["test-progress"].data == 100.0
        assert by_key["test-progress"].description == "chunk 1/1: 10/10"
        assert by_key["test-table"].type == "table" and '"verdict": "pass"' in by_key["test-table"].data
        assert by_key["test-report"].type == "markdown"
        assert c.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["test-report"])))


def test_unreachable_ray_address_fails_fast():
    from flows.runners import check_ray_address, open_task_runner

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0 = time.perf_counter()
    with pytest.raises(RunnerError, match=f"no Ray cluster answers at '127.0.0.1:{port}'"):
        check_ray_address(f"127.0.0.1:{port}")
    with pytest.raises(RunnerError, match="is not host:port"):
        check_ray_address("head-node")
    if "prefect_ray" in sys.modules or _has_prefect_ray():
        with pytest.raises(RunnerError, match="no Ray cluster answers"), open_task_runner(f"ray://127.0.0.1:{port}"):
            pass
    assert time.perf_counter() - t0 < 5


def _has_prefect_ray() -> bool:
    try:
        import prefect_ray  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.slow
def test_resumable_task_is_cached_across_flow_runs(prefect_api, tmp_path, monkeypatch):
    from prefect import flow, task
    from prefect.settings import PREFECT_LOCAL_STORAGE_PATH, temporary_settings

    from flows.runners import resumable_task_options

    calls = tmp_path / "calls.txt"

    @task(name="stage", **resumable_task_options())
    def stage(cfg: FlywheelConfig) -> int:
        with open(calls, "a") as f:
            f.write("x")
        return cfg.generate.n_tasks * 10

    @flow(name="resume-check")
    def f(cfg: FlywheelConfig):
        return stage(cfg, return_state=True)

    cfg = FlywheelConfig.model_validate({"run": {"run_id": "resume-1"}, "generate": {"n_tasks": 4}})
    with temporary_settings(updates={PREFECT_LOCAL_STORAGE_PATH: str(tmp_path / "results")}):
        first, second = f(cfg), f(cfg)
        other = f(cfg.model_copy(update={"run": cfg.run.model_copy(update={"run_id": "resume-2"})}))
    assert first.result() == second.result() == other.result() == 40
    assert second.name == "Cached" and first.name == "Completed"
    assert calls.read_text() == "xx"  # the second run reused the persisted result; a new run id recomputed


@pytest.mark.slow
def test_retry_options_retry_transient_errors_only(prefect_api):
    from prefect import flow, task

    from flows.concurrency import ENDPOINT_RETRIES, SANDBOX_RETRIES
    from sandbox.result import SandboxError

    assert task(**ENDPOINT_RETRIES)(lambda: None).retry_delay_seconds == [10, 20, 40]
    attempts: list[str] = []
    fast = {**SANDBOX_RETRIES, "retry_delay_seconds": 0}  # same condition, no waiting in the test

    @task(name="flaky", **fast)
    def flaky(kind: str) -> str:
        attempts.append(kind)
        if kind == "transient" and attempts.count(kind) < 2:
            raise SandboxError("container died (injected)")
        if kind == "bad-input":
            raise ValueError("no such suite (injected)")
        return "ok"

    @flow(name="retry-check")
    def f(kind: str) -> str:
        state = flaky(kind, return_state=True)
        return state.result() if state.is_completed() else state.name

    assert f("transient") == "ok" and attempts.count("transient") == 2
    assert f("bad-input") == "Failed" and attempts.count("bad-input") == 1
