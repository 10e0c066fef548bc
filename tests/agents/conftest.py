"""Fixtures of the agents tests: the fault-injecting OpenAI-compatible server (a test double on 127.0.0.1), tasks,
a backend double that refuses to hand out sandboxes (for episodes that must never need one), and the real Docker
backend when the engine and the sandbox image are there."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from tasks import arithmetic
from tasks.spec import Task

_HERE = Path(__file__).resolve().parent


def _load(name: str):
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, _HERE / f"{name}.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


fault_server = _load("fault_server")
FaultServer = fault_server.FaultServer


class NoSandboxBackend:
    """TEST DOUBLE: a backend whose acquire() fails the test -- for episodes that must end before any tool runs."""

    name = "none"
    image = None

    def __init__(self) -> None:
        self.acquired = 0

    def acquire(self):
        self.acquired += 1
        raise AssertionError("this episode was not supposed to need a sandbox")

    def shutdown(self) -> None:
        pass


@pytest.fixture
def tasks4() -> list[Task]:
    return arithmetic.generate(4, split="train", seed=7)


@pytest.fixture
def direct_tasks(tasks4) -> list[Task]:
    """Tasks that do not require the tool (so a direct answer is a plain pass, not a no_tool_use hack)."""
    return [t.model_copy(update={"verifier": t.verifier.model_copy(update={"requires_tool": None})}) for t in tasks4]


@pytest.fixture
def server(tasks4):
    solutions = {t.prompt: t.reference.steps[0].arguments["code"] for t in tasks4}
    direct = {t.prompt: str(t.verifier.answer) for t in tasks4}
    with FaultServer(solutions=solutions, direct=direct) as srv:
        yield srv


@pytest.fixture
def direct_server(tasks4):
    """A server whose model answers at once, without tools, with the right answer (after any injected fault)."""
    with FaultServer(direct={t.prompt: str(t.verifier.answer) for t in tasks4}) as srv:
        yield srv


@pytest.fixture
def no_sandbox() -> NoSandboxBackend:
    return NoSandboxBackend()


@pytest.fixture(scope="session")
def docker_backend():
    """The real Docker backend (sandbox.backend.open_backend); fails when the engine or the image is missing."""
    from sandbox.backend import open_backend
    from sandbox.result import SandboxConfig, SandboxError

    try:
        backend = open_backend(SandboxConfig(backend="docker"))
    except SandboxError as e:  # a docker-marked test must not pass silently without Docker
        pytest.fail(f"no Docker sandbox here ({e}); deselect with -m 'not docker'")
    with backend:
        yield backend
