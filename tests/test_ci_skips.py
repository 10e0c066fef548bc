"""In CI (CI=true) a skipped test fails unless it carries an allowed marker (tests/conftest.py
CI_ALLOWED_SKIP_MARKERS: gpu); outside CI a skip stays a skip; an expected failure is never turned into one."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import ROOT

TESTS = textwrap.dedent("""
    import pytest

    def test_skips():
        pytest.skip("a wheel is missing")

    @pytest.mark.gpu
    def test_gpu_skips():
        pytest.skip("no CUDA GPU")

    @pytest.mark.xfail(reason="known")
    def test_expected_failure():
        assert False

    def test_passes():
        pass
""")


def _run(tmp_path, ci: str | None, *args: str) -> str:
    (tmp_path / "conftest.py").write_text("from tests.conftest import pytest_runtest_makereport  # noqa: F401\n")
    (tmp_path / "test_some.py").write_text(TESTS)
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env.update({"PYTHONPATH": str(ROOT), "FLYWHEEL_TEST_PREFECT_HOME": str(tmp_path / "prefect-home")})
    if ci is not None:
        env["CI"] = ci
    p = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-o", "markers=gpu: gpu",
                        "-rfs", "-c", os.devnull, "--rootdir", str(tmp_path), *args, str(tmp_path)],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False)
    return p.stdout + p.stderr


@pytest.mark.parametrize("args", [(), ("-n", "2", "--dist", "loadfile", "--no-loadscope-reorder")],
                         ids=["one-process", "xdist-as-make-test"])
def test_in_ci_a_skip_fails_unless_allowed(tmp_path, args):
    out = _run(tmp_path, "true", *args)
    assert "1 failed, 1 passed, 1 skipped, 1 xfailed" in out, out
    assert "FAILED" in out and "test_skips" in out and "a wheel is missing" in out and "CI_ALLOWED_SKIP_MARKERS" in out
    assert "test_gpu_skips" not in out.split("short test summary")[1].split("SKIPPED")[0]


def test_outside_ci_a_skip_stays_a_skip(tmp_path):
    out = _run(tmp_path, None)
    assert "1 passed, 2 skipped, 1 xfailed" in out, out
