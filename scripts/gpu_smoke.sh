#!/usr/bin/env bash
# GPU smoke test: a tiny model through vLLM -- the offline engine (agents.vllm_policy.VLLMPolicy) and the server path
# (`vllm serve --enable-auto-tool-choice --tool-call-parser hermes` + the OpenAI policy) -- on 8 arithmetic tasks x 2
# samples through the real episode loop; prints one table (verdicts, tokens, token ids / logprobs captured, speed)
# and writes $OUT/gpu_smoke.json when OUT is set.
#
# Usage: scripts/gpu_smoke.sh [MODEL_DIR_OR_ID]
#   default model: the offline tiny model built here by training/tiny.py (random weights: verdicts will mostly be
#   fail / model_error -- the smoke checks the plumbing, not the model).
# Needs a CUDA GPU and `pip install 'flywheel[gpu]'`; exits 2 with the fix when either is missing.
# Sandboxes: FLYWHEEL_SANDBOX=docker|local (default docker); without one, episodes that call a tool become
# infra_error rows (said in the output), episodes that do not still run.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
[ -x "$PY" ] || PY=python3
exec "$PY" - "$@" <<'PYEOF'
import asyncio, gc, json, os, sys, tempfile, time

from agents.policy import PolicySetupError
from agents.vllm_policy import VLLMPolicy, VLLMServer, require_vllm, server_policy

try:
    vllm = require_vllm()
except PolicySetupError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)
import torch

if not torch.cuda.is_available():
    print("error: vllm is installed but no CUDA GPU is visible; fix: run on a GPU machine", file=sys.stderr)
    sys.exit(2)

from agents.rollout import rollout
from sandbox.result import SandboxConfig, SandboxError
from tasks import arithmetic

tasks = arithmetic.generate(8, split="train", seed=0)
model = sys.argv[1] if len(sys.argv) > 1 else None
if model is None:
    from training.tiny import build_tiny_model, task_corpus

    t0 = time.perf_counter()
    model = str(build_tiny_model(tempfile.mkdtemp(prefix="flywheel-tiny-"), task_corpus(tasks)))
    print(f"built tiny model {model} in {time.perf_counter() - t0:.1f}s")


class NoSandbox:
    """No sandbox on this machine: a tool call becomes an infra_error row (the runner retries it once)."""
    name, image = "none", None

    def acquire(self):
        raise SandboxError("no sandbox backend on this machine (set FLYWHEEL_SANDBOX=docker|local)")

    def shutdown(self):
        pass


try:
    from sandbox.backend import open_backend

    backend = open_backend(SandboxConfig(backend=os.environ.get("FLYWHEEL_SANDBOX", "docker")), auto_fallback=True)
except SandboxError as e:
    print(f"note: {e}; tool calls will be infra_error rows")
    backend = NoSandbox()

results = []


def run(path, pol):
    rows = []
    s = asyncio.run(rollout(tasks, pol, backend, run_id="gpu-smoke", samples=2, concurrency=16, progress=False,
                            max_turns=3, infra_retries=1, retry_backoff_s=0.1, on_rows=rows.extend))
    turns = sum(r.turns for r in rows) or 1
    results.append({
        "path": path, "episodes": s.episodes, "verdicts": s.verdicts, "wall_s": round(s.wall_s, 2),
        "episodes_per_s": round(s.episodes_per_s, 2),
        "completion_tokens_per_turn": round(sum(r.completion_tokens for r in rows) / turns, 1),
        "rows_with_token_ids": sum(1 for r in rows if r.completion_token_ids and any(r.completion_token_ids)),
        "rows_with_logprobs": sum(1 for r in rows if r.completion_logprobs and any(r.completion_logprobs)),
        "tool_calls": sum(r.n_tool_calls for r in rows),
    })


try:
    pol = VLLMPolicy(model=model, name="vllm-offline", temperature=0.0, max_tokens=64, logprobs=True,
                     gpu_memory_utilization=0.3, max_model_len=1024)
    run("offline LLM.chat", pol)
    del pol
    gc.collect()
    torch.cuda.empty_cache()
    with VLLMServer(model, port=int(os.environ.get("VLLM_PORT", "8011")), served_name="tiny",
                    extra=["--gpu-memory-utilization", "0.3", "--max-model-len", "1024"]) as srv:
        run("vllm serve + OpenAI", server_policy(srv.base_url, "tiny", name="vllm-serve", temperature=0.0,
                                                 max_tokens=64, timeout_s=60))
finally:
    backend.shutdown()

cols = ["path", "episodes", "verdicts", "episodes_per_s", "wall_s", "completion_tokens_per_turn",
        "rows_with_token_ids", "rows_with_logprobs", "tool_calls"]
print(f"\nvLLM {vllm.__version__}, torch {torch.__version__}, {torch.cuda.get_device_name(0)}, model {model}")
print(" | ".join(cols))
for r in results:
    print(" | ".join(str(r[c]) for c in cols))
if os.environ.get("OUT"):
    with open(os.path.join(os.environ["OUT"], "gpu_smoke.json"), "w") as f:
        json.dump({"vllm": vllm.__version__, "torch": torch.__version__, "model": model, "results": results}, f,
                  indent=2)
PYEOF
