#!/usr/bin/env bash
# Sets up everything flywheel needs on a fresh Debian/Ubuntu machine, idempotently:
# system packages (Docker engine, debootstrap, bubblewrap), a running dockerd, a virtualenv in .venv with the CPU
# build of torch installed first, the project (editable, with the dev, ray and openenv extras), and the sandbox image.
# GPU users: install your CUDA build of torch into .venv before running this (it is kept).
set -euo pipefail
cd "$(dirname "$0")/.."
SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
log() { printf '\033[1m[setup %s]\033[0m %s\n' "$(date +%T)" "$*"; }

need=()
command -v dockerd >/dev/null 2>&1 || need+=(docker.io)
command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)
command -v bwrap >/dev/null 2>&1 || need+=(bubblewrap)
if [ "${FLYWHEEL_BROWSER_TESTS:-0}" = "1" ]; then
  command -v chromium >/dev/null 2>&1 || need+=(chromium)
fi
if [ ${#need[@]} -gt 0 ]; then
  log "installing system packages: ${need[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi

if ! docker info >/dev/null 2>&1; then
  log "starting dockerd"
  $SUDO sh -c 'nohup dockerd >/var/log/flywheel-dockerd.log 2>&1 &'
  for _ in $(seq 1 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
  docker info >/dev/null 2>&1 || { echo "error: dockerd did not start; see /var/log/flywheel-dockerd.log" >&2; exit 1; }
fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  log "creating .venv"
  $PY -m venv .venv
fi
if ! .venv/bin/python -c 'import torch' >/dev/null 2>&1; then
  log "installing torch==2.13.0 (CPU build) first"
  .venv/bin/pip install -q --no-compile torch==2.13.0
fi
if ! .venv/bin/python -c 'import flows.cli, trl, prefect, duckdb, datasketch, prefect_ray, s3fs, moto.server' >/dev/null 2>&1 \
   || ! .venv/bin/python -c 'from importlib.metadata import version; assert version("openenv-core") == "0.3.0"' >/dev/null 2>&1 \
   || [ pyproject.toml -nt .venv/.flywheel-installed ]; then
  log "installing flywheel and its dependencies"
  .venv/bin/pip install -q --no-compile -e '.[dev,ray,openenv]'
  # Bytecode for what the commands import, not for every installed file: pip compiles all of them, one at a time
  # (~70 s of setup on 2 cores); the rest is compiled on first import (`make` lets Python write it).
  log "compiling the bytecode of what flywheel imports"
  PYTHONDONTWRITEBYTECODE= .venv/bin/python -c 'import flows.cli, flows.generate, flows.train, flows.flywheel, trl, transformers, torch, prefect.server.api.server, duckdb, datasketch'
  touch .venv/.flywheel-installed
fi

# Spec and benchmark wheels some tests read (never installed, no dependencies; cached, so tests need no network).
spec_cache=${FLYWHEEL_SPEC_CACHE:-$HOME/.cache/flywheel-spec}
if ! ls "$spec_cache"/harbor-*.whl >/dev/null 2>&1; then
  log "fetching the harbor wheel (the ATIF spec) into $spec_cache"
  .venv/bin/python -m pip download -q --no-deps --disable-pip-version-check --python-version 3.12 \
    --only-binary=:all: harbor -d "$spec_cache" || log "could not fetch the harbor wheel; the ATIF tests will skip (a failure with CI=true)"
fi
if ! .venv/bin/python -c 'from tasks.bfcl import wheel_path; wheel_path(fetch=False)' >/dev/null 2>&1; then
  log "fetching the bfcl-eval wheel (no dependencies)"
  .venv/bin/python -c 'from tasks.bfcl import wheel_path; wheel_path()' || log "could not fetch bfcl-eval; its tests will skip (a failure with CI=true)"
fi

log "building the sandbox image (reused when present)"
.venv/bin/flywheel sandbox build-image
log "ready"
