"""The Prefect UI in a real browser: headless Chromium (Debian's package) finds the served deployment and the
finished flow run's report artifact; screenshots are kept.

Chromium is driven over the Chrome DevTools Protocol with the `websockets` client Prefect already depends on (no
browser download, no driver binary). The deployment is served by `flywheel serve` and run through the API as in
tests/flows/test_serve_e2e.py. Screenshots are written under the test's tmp dir and copied to
$FLYWHEEL_TEST_OUTPUT (default /tmp/flywheel-test-output)/ui-browser/, printed at the end.
Skipped only when chromium is missing AND FLYWHEEL_BROWSER_TESTS is not 1 (CI sets it and installs chromium).
The `browser` fixture (headless Chromium over the DevTools protocol) lives in tests/conftest.py.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import stop_group

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.docker]

FLYWHEEL = str(Path(sys.executable).with_name("flywheel"))
DEPLOYMENT = "generate/flywheel"
REPORT_KEY = "generate-summary"  # the report artifact a generate run publishes
OUT = Path(os.environ.get("FLYWHEEL_TEST_OUTPUT", "/tmp/flywheel-test-output")) / "ui-browser"


def _serve_and_run(prefect_api: str, work: Path):
    """`flywheel serve` (own process group) + one custom run through the API; returns (deployment, run, stop)."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    lake = work / "lake"
    config = work / "flywheel.toml"
    config.write_text(f'[run]\nout = "{lake}"\nmax_workers = 2\n\n[generate]\nn_tasks = 2\nsamples = 1\n'
                      '\n[rollout]\nconcurrency = 2\n\n[teacher]\nkind = "reference"\n\n[sandbox]\nbackend = "docker"\n')
    log_path = work / "serve.log"
    log = open(log_path, "w")  # noqa: SIM115 - closed by stop()
    proc = subprocess.Popen([FLYWHEEL, "serve", "--config", str(config), "--flow", "generate"], cwd=work,
                            env={**os.environ, "PREFECT_API_URL": prefect_api}, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)

    def stop() -> None:
        stop_group(proc)
        log.close()

    try:
        with get_client(sync_client=True) as client:
            deadline = time.time() + 120
            while True:
                try:
                    dep = client.read_deployment_by_name(DEPLOYMENT)
                    break
                except ObjectNotFound:
                    if proc.poll() is not None or time.time() > deadline:
                        raise AssertionError(f"no deployment; serve log:\n{log_path.read_text()[-4000:]}")
                    time.sleep(1)
            params = {"overrides": ["run.run_id=ui-browser-1"]}  # the form's edit; the served config rides along
            fr = client.create_flow_run_from_deployment(dep.id, parameters=params)
            deadline = time.time() + 400
            while not (run := client.read_flow_run(fr.id)).state.is_final():
                if time.time() > deadline:
                    raise AssertionError(f"run not final; serve log:\n{log_path.read_text()[-4000:]}")
                time.sleep(1)
        assert run.state.is_completed(), f"{run.state_name}: {log_path.read_text()[-4000:]}"
        return dep, run, stop
    except BaseException:
        stop()
        raise


def test_ui_shows_deployment_and_report_artifact(prefect_api, browser, tmp_path):
    ui = prefect_api.rsplit("/api", 1)[0]
    with urllib.request.urlopen(f"{ui}/ui-settings", timeout=10) as r:
        ui_api = json.load(r)["api_url"]
    assert ui_api == prefect_api, (
        f"the server's UI talks to {ui_api}, not to {prefect_api}: start `prefect server start --port P` with "
        "PREFECT_UI_API_URL (or PREFECT_SERVER_API_PORT) set to match (tests/conftest.py prefect_api)")
    dep, run, stop = _serve_and_run(prefect_api, tmp_path)
    shots: list[Path] = []
    try:
        browser.goto(f"{ui}/deployments")
        browser.wait_for_text("generate", "flywheel", timeout_s=90)
        shots.append(browser.screenshot(tmp_path / "1-deployments.png"))

        browser.goto(f"{ui}/deployments/deployment/{dep.id}")
        browser.wait_for_text("flywheel", "Run", timeout_s=60)
        shots.append(browser.screenshot(tmp_path / "2-deployment.png"))

        # the Run > Custom run page: the deployment's own few typed parameters, served values as defaults
        browser.goto(f"{ui}/deployments/deployment/{dep.id}/run")
        body = browser.wait_for_text("n_tasks", "How many tasks to draw from the suite.", "overrides",
                                     timeout_s=60)
        time.sleep(1)  # let the form finish laying out
        shots.append(browser.screenshot(tmp_path / "2b-run-form.png", full_page=True))
        height = browser.eval("Math.max(...[...document.querySelectorAll('*')].map(e => e.scrollHeight))")
        inputs = browser.eval("document.querySelectorAll('input, textarea, select, [contenteditable=true]').length")
        print(f"run form: {height} px tall (viewport 1000 px), {inputs} inputs")
        for gone in ("Ray Address", "Serve", "Concurrency Per Flow", "RunConfig", "FlywheelConfig", "Cfg"):
            # whole words: a field's help text may say "Served model name"
            assert not re.search(rf"\b{gone}\b", body), \
                f"the run form shows {gone!r}: only the deployment's own parameters belong"
        assert height <= 2000, f"the run form is {height} px tall: more than two 1000 px screens"
        assert inputs <= 30, f"the run form has {inputs} inputs"

        browser.goto(f"{ui}/runs/flow-run/{run.id}")
        browser.wait_for_text(run.name, "Completed", timeout_s=60)
        assert browser.click_text("Artifacts"), "the flow run page has no Artifacts tab"
        body = browser.wait_for_text(REPORT_KEY, timeout_s=60)
        shots.append(browser.screenshot(tmp_path / "3-flow-run-artifacts.png"))

        assert browser.click_text(REPORT_KEY), f"artifact {REPORT_KEY} is listed but cannot be opened:\n{body[:2000]}"
        browser.wait_for_text("verdict", "episodes", timeout_s=60)
        shots.append(browser.screenshot(tmp_path / "4-report-artifact.png"))
    finally:
        stop()
        OUT.mkdir(parents=True, exist_ok=True)
        kept = [shutil.copy(s, OUT / s.name) for s in shots]
        print(f"screenshots: {', '.join(map(str, kept))}")
    for s in shots:
        assert s.stat().st_size > 10_000, f"{s} looks blank"
