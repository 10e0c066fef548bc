# The two commands of the README, and a few helpers.
.PHONY: setup run test test-fast bench lint

setup:
	bash scripts/setup.sh

# Python may write bytecode (an environment that sets PYTHONDONTWRITEBYTECODE would compile every import of every
# process again; setup installs with pip --no-compile and leaves the rarely imported modules to their first import).
export PYTHONDONTWRITEBYTECODE =

# The main job on the offline default.
run: setup
	.venv/bin/flywheel run --out runs/default --backend local

# Test processes side by side (pytest-xdist), one per core of a 2-core machine (a third made a clean-clone CI run
# slower); a file's tests stay in one process, so its module fixtures are built once. Files are handed out in collection order, the longest first (tests/conftest.py LONGEST_FILES_FIRST), not
# xdist's default of the most tests first. WORKERS=0 runs everything in this process.
WORKERS ?= 2
XDIST = -n $(WORKERS) --dist loadfile --no-loadscope-reorder

# Everything CI runs: all tests but the gpu ones.
test: setup
	.venv/bin/pytest -m "not gpu" $(XDIST)

# The fast core only (no Docker, no servers, no training).
test-fast:
	.venv/bin/pytest -m "not gpu and not docker and not e2e and not slow" $(XDIST)

bench:
	.venv/bin/python benchmarks/sandbox.py
	.venv/bin/python benchmarks/warehouse.py --n 100000
	.venv/bin/python benchmarks/rollout.py
	.venv/bin/python benchmarks/http_client.py
	.venv/bin/python benchmarks/verify.py --backend both --n 10
	.venv/bin/python benchmarks/decontam.py --train 1000 --heldout 100 --code-train 100
	.venv/bin/python benchmarks/startup.py --rounds 1
	.venv/bin/python benchmarks/server_start.py --rounds 2
	.venv/bin/python benchmarks/copy_skill.py --shares 0 0.05 --steps 0 400

lint:
	.venv/bin/ruff check .
