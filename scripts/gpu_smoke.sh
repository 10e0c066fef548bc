#!/usr/bin/env bash
# GPU smoke test (scripts/gpu_smoke.py says what it runs): tiny-gptoss and tiny-qwen3 through vLLM, the mismatch
# panel between vLLM and the trainer in bf16, `vllm serve` with the OpenAI policy, and one GRPO step with vLLM
# generation; one table, a few minutes on one GPU.
#
# Usage: scripts/gpu_smoke.sh [MODEL_DIR_OR_ID]   (a model rolled out beside the tiny students)
# Needs a CUDA GPU and `pip install 'flywheel[gpu]'`; without them the CPU parts run, the GPU steps say `skip` and
# why, and it exits 2 with the fix. Sandboxes: FLYWHEEL_SANDBOX=docker|local (default docker).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
[ -x "$PY" ] || PY=python3
exec "$PY" scripts/gpu_smoke.py "$@"
