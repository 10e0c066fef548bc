"""Fixtures of the sandbox tests: the image (built once, reused), small limits, a backend per kind, and the
"host is clean" checks (no container of ours left, no host process carrying a test's marker)."""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

import pytest

from sandbox.result import SandboxConfig

# A host secret every sandbox must not see (set before any backend starts, so a leak would show).
HOST_SECRET = f"fw-host-secret-{uuid.uuid4().hex}"
os.environ["FLYWHEEL_TEST_HOST_SECRET"] = HOST_SECRET

# Small limits keep the hostile suite quick on 2 cores.
SMALL = {"memory_mb": 128, "pids_limit": 64, "cpus": 1.0, "timeout_s": 3.0, "output_limit_bytes": 64_000,
         "tmpfs_mb": 16}


def small_config(backend: str, **kw) -> SandboxConfig:
    return SandboxConfig(backend=backend, **{**SMALL, **kw})


@pytest.fixture(scope="session")
def sandbox_image() -> str:
    """The sandbox image id (built from Debian packages on first use, then reused)."""
    from sandbox.image import build_image
    from sandbox.result import SandboxUnavailable

    try:
        return build_image(SandboxConfig().image)
    except SandboxUnavailable as e:
        pytest.fail(f"the docker tests need the engine and the image: {e}")


@pytest.fixture(scope="module", params=[pytest.param("docker", marks=pytest.mark.docker),
                                        pytest.param("docker-reuse", marks=pytest.mark.docker), "local", "local-reuse"])
def backend(request: pytest.FixtureRequest):
    """One backend of each kind per test module, with small limits; shut down (and checked empty) at the end.
    `local-reuse` is the local backend with SandboxConfig.reuse: its episodes mostly run in sandboxes that earlier
    tests' episodes used and the backend reset, so every hostile program is also tried against the reset;
    `docker-reuse` likewise for Docker (its default), `docker` is its fresh-container path (reuse=false)."""
    kind = request.param
    if kind.startswith("docker"):
        request.getfixturevalue("sandbox_image")
    from sandbox.backend import open_backend

    if kind.endswith("-reuse"):
        config = small_config(kind.removesuffix("-reuse"), reuse=True)
    else:
        config = small_config(kind, reuse=False)
    with open_backend(config) as b:
        yield b
    if kind.startswith("docker"):
        assert own_containers(b) == [], "containers of this backend survived shutdown"


def own_containers(backend) -> list[str]:
    """Ids of containers labelled as this Docker backend's (its instance label: other backends of the same test
    process, opened by other test modules, share the owner label)."""
    cs = backend.client.api.containers(all=True, filters={"label": f"flywheel.backend={backend.instance}"})
    return [c["Id"] for c in cs]


def host_pids_with(marker: str) -> list[int]:
    """Pids of host processes whose command line contains marker (sandboxed processes are host processes too)."""
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            if marker.encode() in (d / "cmdline").read_bytes():
                found.append(int(d.name))
        except OSError:
            continue
    return found


def wait_gone(marker: str, timeout_s: float = 10.0) -> list[int]:
    """Wait until no host process carries marker; return the ones still there at the deadline."""
    end = time.monotonic() + timeout_s
    while True:
        left = host_pids_with(marker)
        if not left or time.monotonic() > end:
            return left
        time.sleep(0.1)


class Host:
    """What the sandbox tests check on the host side (a fixture, since tests cannot import this conftest)."""

    secret = HOST_SECRET
    small = SMALL
    pids_with = staticmethod(host_pids_with)
    wait_gone = staticmethod(wait_gone)
    own_containers = staticmethod(own_containers)
    small_config = staticmethod(small_config)


@pytest.fixture(scope="session")
def host() -> type[Host]:
    return Host


@pytest.fixture
def marker() -> str:
    """A unique token a test puts in the command lines it starts, to find leftovers on the host."""
    return f"fwmark{uuid.uuid4().hex[:12]}"


@pytest.fixture
def episode(backend, marker):
    """A fresh sandbox for one test; afterwards: closed, its container gone, no process with the marker left."""
    sb = backend.acquire()
    yield sb
    cid = getattr(sb, "container_id", None)
    sb.close()
    assert wait_gone(marker) == [], f"processes carrying {marker} outlived their sandbox"
    if cid is not None and not backend.reuse:  # with reuse the container is reset for the next episode, or removed
        deadline = time.monotonic() + 10
        while backend.client.api.containers(all=True, filters={"id": cid}) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not backend.client.api.containers(all=True, filters={"id": cid}), f"container {cid[:12]} left over"
