"""Shared fixtures: a real Prefect server on loopback for the whole session (started once, ~10 s), the project
root, the path of the `flywheel` console script in the venv, a lake footer cache of its own for every test, and
headless Chromium driven over the DevTools protocol (`browser`; Debian's chromium, no driver binary)."""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FLYWHEEL = str(Path(sys.executable).with_name("flywheel"))

# The CLI starts a shared local Prefect server on first use (flows/localserver.py). Tests get a Prefect home of
# their own, so they never reuse or stop a user's server, and that server is stopped when the session ends.
_OWN_HOME = not os.environ.get("FLYWHEEL_TEST_PREFECT_HOME")
_SESSION_HOME = os.environ.get("FLYWHEEL_TEST_PREFECT_HOME") or tempfile.mkdtemp(prefix="fw-test-prefect-")
os.environ["PREFECT_HOME"] = _SESSION_HOME
# Warm starts of `generate` (flows/warm.py) are off for the session: every test has an environment of its own
# (PYTEST_CURRENT_TEST, a fresh FLYWHEEL_CACHE_DIR), so each CLI generate would leave a fresh pre-imported starter
# that no later command uses. tests/flows/test_warm.py and test_kill.py's warm case turn them on for their commands.
os.environ["FLYWHEEL_WARM"] = "0"


# In CI (CI=true, as .ci/run's caller sets it) a skipped test is a failure: a test that silently stops running (a
# wheel setup did not cache, a tool not installed, a leftover guard) must turn CI red, not stay hidden in a "1
# skipped". The one exception, by marker:
CI_ALLOWED_SKIP_MARKERS = (
    "gpu",  # needs a CUDA GPU; CI has none (`make test` deselects these anyway; one run by hand may skip)
)


# `make test` runs two xdist workers that take one test file at a time, in collection order (--dist loadfile
# --no-loadscope-reorder). These files go first, the longest first (per-file seconds of a CI run's --durations), so
# that the run never ends with one worker alone on a 200 s file: longest-processing-time-first scheduling. The other
# files keep their order after them. tests/test_ci_order.py keeps the list honest (each file exists).
LONGEST_FILES_FIRST = (
    "tests/flows/test_kill.py",
    "tests/flows/test_flywheel.py",
    "tests/tasks/test_humaneval.py",
    "tests/warehouse/test_s3_e2e.py",
    "tests/tasks/test_bfcl.py",
    "tests/flows/test_promotion_incumbent.py",
    "tests/flows/test_localserver.py",
    "tests/tasks/test_audit.py",
    "tests/flows/test_serve_e2e.py",
    "tests/training/test_preflight.py",
    "tests/flows/test_warm.py",
    "tests/tasks/test_harbor.py",
    "tests/agents/test_serve.py",
    "tests/flows/test_ray.py",
    "tests/tasks/test_synthesize_cli.py",
    "tests/training/test_warmup.py",
    "tests/tasks/test_sandboxed.py",
    "tests/flows/test_cli.py",
    "tests/sandbox/test_hostile.py",
    "tests/warehouse/test_crash.py",
    "tests/flows/test_workpool_e2e.py",
)


def pytest_collection_modifyitems(session, config, items):  # noqa: ARG001 - pytest's hook signature
    """Put the files of LONGEST_FILES_FIRST first, in its order; a stable sort, so every other test keeps its
    place (and every xdist worker computes the same order, as xdist requires)."""
    rank = {f: i for i, f in enumerate(LONGEST_FILES_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if (os.environ.get("CI", "").lower() in ("1", "true") and report.skipped and not hasattr(report, "wasxfail")
            and not any(item.get_closest_marker(m) for m in CI_ALLOWED_SKIP_MARKERS)):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = (f"skipped in CI, where a skip is a failure (tests/conftest.py CI_ALLOWED_SKIP_MARKERS): "
                           f"{reason}")


def pytest_sessionfinish(session, exitstatus):  # noqa: ARG001 - pytest's hook signature
    """Stop the shared server the session's commands started (if any), so nothing of the tests keeps running,
    and remove the session's Prefect home when the session made it."""
    if Path(_SESSION_HOME, "flywheel-server.json").exists():
        subprocess.run([FLYWHEEL, "server", "stop"], env={**os.environ, "PREFECT_HOME": _SESSION_HOME},
                       capture_output=True, timeout=60, check=False)
    if _OWN_HOME:
        shutil.rmtree(_SESSION_HOME, ignore_errors=True)


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    """Keep the lake's footer cache of each test out of the user's home."""
    monkeypatch.setenv("FLYWHEEL_CACHE_DIR", str(tmp_path_factory.mktemp("fw-cache")))


def stop_group(proc: subprocess.Popen, term_wait_s: float = 20, kill_wait_s: float = 10) -> None:
    """Stop a process started with start_new_session=True and its group: SIGTERM, then SIGKILL if it lingers."""
    for sig, wait_s in ((signal.SIGTERM, term_wait_s), (signal.SIGKILL, kill_wait_s)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=wait_s)
            break
        except subprocess.TimeoutExpired:
            continue


@contextmanager
def in_background(argv: list[str], log_path: Path, **popen):
    """argv in its own process group, stdout and stderr to log_path (a file: no pipe to fill or hold open);
    yields the process, and stops its group afterwards, however the block ends."""
    with open(log_path, "w") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, **popen)
        try:
            yield proc
        finally:
            stop_group(proc)


def wait_until_answers(url: str, proc: subprocess.Popen, log_path: Path, deadline_s: float = 180) -> None:
    """Poll GET url until it answers 200; RuntimeError with the log's tail when proc dies or the deadline passes."""
    deadline = time.time() + deadline_s
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        if proc.poll() is not None or time.time() > deadline:
            raise RuntimeError(f"{url} did not answer: {Path(log_path).read_text()[-3000:]}")
        time.sleep(0.3)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def prefect_api(tmp_path_factory: pytest.TempPathFactory):
    """A real `prefect server` on 127.0.0.1; yields its API URL and points this process and children at it."""
    from flows.prefect_db import seed

    home = tmp_path_factory.mktemp("prefect-home")
    seed(home)  # a migrated database, as flywheel's own servers get one (flows/prefect_db.py)
    port = free_port()
    env = {**os.environ, "PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "PREFECT_SERVER_UI_ENABLED": os.environ.get("PREFECT_SERVER_UI_ENABLED", "true"),
           "PREFECT_UI_API_URL": f"http://127.0.0.1:{port}/api"}
    env.pop("PREFECT_API_URL", None)
    log = open(home / "server.log", "w")
    proc = subprocess.Popen([str(Path(sys.executable).with_name("prefect")), "server", "start", "--host",
                             "127.0.0.1", "--port", str(port)], env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}/api"
    deadline = time.time() + 240  # a 2-core machine under load took 77-94 s to answer (measured)
    while True:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                if r.status == 200:
                    break
        except OSError:
            pass
        if proc.poll() is not None or time.time() > deadline:
            proc.kill()
            raise RuntimeError(f"prefect server did not start; log: {(home / 'server.log').read_text()[-2000:]}")
        time.sleep(0.5)
    from prefect.settings import PREFECT_API_URL, temporary_settings

    old = os.environ.get("PREFECT_API_URL")
    os.environ["PREFECT_API_URL"] = url
    with temporary_settings(updates={PREFECT_API_URL: url}):
        yield url
        try:  # send buffered logs while the server still answers, so nothing retries against a dead one at exit
            from prefect.logging.handlers import APILogHandler

            APILogHandler.flush()
        except Exception:  # noqa: BLE001 - best effort
            pass
    if old is None:
        os.environ.pop("PREFECT_API_URL", None)
    else:
        os.environ["PREFECT_API_URL"] = old
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
    log.close()


def chromium_path() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path:
        return path
    if os.environ.get("FLYWHEEL_BROWSER_TESTS") == "1":
        pytest.fail("FLYWHEEL_BROWSER_TESTS=1 but chromium is not installed: apt-get install -y chromium")
    pytest.skip("chromium is not installed (apt-get install -y chromium); FLYWHEEL_BROWSER_TESTS=1 makes this a "
                "failure instead of a skip")


class Browser:
    """Headless Chromium and one page, driven over the DevTools protocol (synchronous websocket)."""

    def __init__(self, exe: str, width: int = 1440, height: int = 1000):
        from websockets.sync.client import connect

        self.profile = tempfile.mkdtemp(prefix="chromium-")
        self.proc = subprocess.Popen(
            [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--disable-dev-shm-usage", f"--user-data-dir={self.profile}", "--remote-debugging-address=127.0.0.1",
             "--remote-debugging-port=0", f"--window-size={width},{height}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        port_file = Path(self.profile, "DevToolsActivePort")
        deadline = time.time() + 60
        while not (port_file.exists() and port_file.read_text().strip()):
            if self.proc.poll() is not None or time.time() > deadline:
                self.close()
                raise RuntimeError("chromium did not open its DevTools port")
            time.sleep(0.2)
        port = int(port_file.read_text().split()[0])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as r:
            page = next(t for t in json.load(r) if t["type"] == "page")
        self.ws = connect(page["webSocketDebuggerUrl"], max_size=64 * 2**20, open_timeout=20)
        self._id = 0
        self.send("Page.enable")
        self.send("Runtime.enable")

    def send(self, method: str, **params):
        self._id += 1
        self.ws.send(json.dumps({"id": self._id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv(timeout=60))
            if msg.get("id") == self._id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})

    def goto(self, url: str) -> None:
        self.send("Page.navigate", url=url)

    def text(self) -> str:
        res = self.send("Runtime.evaluate", expression="document.body ? document.body.innerText : ''",
                        returnByValue=True)
        return res.get("result", {}).get("value", "") or ""

    def wait_for_text(self, *needles: str, timeout_s: float = 60) -> str:
        deadline = time.time() + timeout_s
        while True:
            body = self.text()
            if all(n in body for n in needles):
                return body
            if time.time() > deadline:
                raise AssertionError(f"page never showed {needles!r}; it shows:\n{body[:3000]}")
            time.sleep(0.5)

    def click_text(self, label: str) -> bool:
        """Click the first link/button/tab whose own text is `label` (exact, trimmed)."""
        js = ("(() => { const els = [...document.querySelectorAll('a,button,[role=tab],li,span,div')];"
              f" const el = els.find(e => e.children.length === 0 && e.innerText && e.innerText.trim() === {json.dumps(label)});"
              " if (!el) return false; el.click(); return true; })()")
        return bool(self.send("Runtime.evaluate", expression=js, returnByValue=True)["result"].get("value"))

    def eval(self, expression: str):
        """The value of a JavaScript expression in the page."""
        return self.send("Runtime.evaluate", expression=expression, returnByValue=True)["result"].get("value")

    def screenshot(self, path: Path, full_page: bool = False) -> Path:
        """A PNG of the viewport, or of the whole page (up to 6000 px tall) with full_page."""
        params: dict = {"format": "png", "captureBeyondViewport": full_page}
        if full_page:
            size = self.eval("[document.documentElement.scrollWidth, document.documentElement.scrollHeight]")
            params["clip"] = {"x": 0, "y": 0, "width": size[0], "height": min(size[1], 6000), "scale": 1}
        data = self.send("Page.captureScreenshot", **params)["data"]
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        try:
            if getattr(self, "ws", None):
                self.ws.close()
        finally:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(timeout=10)
            shutil.rmtree(self.profile, ignore_errors=True)


@pytest.fixture
def browser():
    b = Browser(chromium_path())
    try:
        yield b
    finally:
        b.close()
