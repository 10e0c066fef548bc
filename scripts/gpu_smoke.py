"""GPU smoke test: the tiny students of real families through vLLM, the mismatch panel, and GRPO with vLLM.

One command of a few minutes on one GPU (`scripts/gpu_smoke.sh [MODEL]`), one table. Steps, each a row:

  1. build (CPU): tiny-gptoss, tiny-qwen3 and the default tiny student from 8 arithmetic tasks' corpus (random
     weights: verdicts will mostly be fail / model_error; the smoke checks the plumbing and the numerics, not the
     model). A MODEL argument (folder or hub id) is rolled out too.
  2. vLLM offline (GPU), per model: 8 tasks x 2 samples through the real episode loop with `VLLMPolicy` (bf16,
     logprobs on): verdicts, episodes/s, rows carrying token ids and logprobs.
  3. panel (GPU), per model: the mismatch panel (training/mismatch.py) between vLLM's logprobs and the trainer's
     (transformers, bf16, sink-aware eager attention for GPT-OSS) on the same tokens: mean and max |dlogp|,
     token_mult_prob_error, importance-weight range.
  4. vllm serve + OpenAI (GPU): the default tiny student behind `vllm serve` and the OpenAI-compatible policy.
  5. GRPO with vLLM (GPU): one GRPO step of tiny-gptoss (training/grpo.py, `use_vllm`, colocate mode): episodes,
     verdicts, the step's gradient norm.

Without vLLM or a CUDA GPU, step 1 still runs, each GPU step is a row that says `skip` and why, and the script exits
2 with the fix on stderr (a smoke that checked nothing never passes). Any step that fails is a row with its error;
the others still run; the exit status is 1 then. Writes $OUT/gpu_smoke.json when OUT is set. Sandboxes:
FLYWHEEL_SANDBOX=docker|local (default docker); without one, episodes that call a tool become infra_error rows.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

FAMILIES = ("tiny-gptoss", "tiny-qwen3")
COLUMNS = ("step", "model", "status", "episodes", "verdicts", "eps/s", "ids", "logprobs", "mean|Δ|", "max|Δ|",
           "tmpe", "iw range", "grad norm")


def build_models(tasks: list, work: Path) -> dict[str, str]:
    """The tiny students the smoke rolls out, built from the tasks' corpus (CPU)."""
    from training.tiny import build_tiny_model, task_corpus

    return {fam: str(build_tiny_model(work / fam, task_corpus(tasks, family=fam), family=fam, vocab_size=1024))
            for fam in (*FAMILIES, "tiny")}


def gpu_missing() -> str | None:
    """Why the GPU steps cannot run here, with the fix; None when they can."""
    from agents.policy import PolicySetupError
    from agents.vllm_policy import require_vllm

    try:
        require_vllm()
    except PolicySetupError as e:
        return str(e)
    import torch

    if not torch.cuda.is_available():
        return "vllm is installed but no CUDA GPU is visible; fix: run on a GPU machine"
    return None


def run_rollout(tasks: list, policy: Any, backend: Any) -> tuple[list, dict[str, Any]]:
    """The rows of 2 samples per task, and the table cells of the rollout's own summary."""
    from agents.rollout import rollout

    rows: list = []
    s = asyncio.run(rollout(tasks, policy, backend, run_id="gpu-smoke", samples=2, concurrency=16, progress=False,
                            max_turns=3, infra_retries=1, retry_backoff_s=0.1, on_rows=rows.extend))
    return rows, {"episodes": s.episodes, "verdicts": s.verdicts, "eps/s": round(s.episodes_per_s, 2),
                  "ids": sum(1 for r in rows if r.completion_token_ids and any(r.completion_token_ids)),
                  "logprobs": sum(1 for r in rows if r.completion_logprobs and any(r.completion_logprobs))}


def vllm_and_panel(model: str, tasks: list, backend: Any) -> list[dict[str, Any]]:
    """Steps 2 and 3 for one model: vLLM offline rollouts, then the panel against the trainer in bf16."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agents.vllm_policy import VLLMPolicy
    from training.attention import use_attention
    from training.mismatch import panel, row_sequences, trainer_logprobs

    pol = VLLMPolicy(model=model, name="vllm-offline", temperature=1.0, max_tokens=64, logprobs=True,
                     gpu_memory_utilization=0.3, max_model_len=1024, engine_kwargs={"dtype": "bfloat16"})
    rows, cells = run_rollout(tasks, pol, backend)
    del pol
    gc.collect()
    torch.cuda.empty_cache()
    out = [{"step": "vLLM offline", "model": model, "status": "ok", **cells}]
    tok = AutoTokenizer.from_pretrained(model)
    seqs, vllm_lp, _ = row_sequences(rows, tok)
    trainer = use_attention(AutoModelForCausalLM.from_pretrained(model, dtype=torch.bfloat16), "eager")
    logp = trainer_logprobs(trainer.cuda().eval(), seqs, batch_size=8, pad_token_id=tok.pad_token_id or 0)
    p = panel(logp, vllm_lp, old=vllm_lp)
    out.append({"step": "panel vLLM vs trainer bf16", "model": model, "status": "ok",
                "mean|Δ|": f"{p.mean_abs_diff:.2e}", "max|Δ|": f"{p.max_abs_diff:.2e}",
                "tmpe": f"{p.token_mult_prob_error:.4f}", "iw range": f"{p.iw_min:.3f}-{p.iw_max:.3f}"})
    del trainer
    gc.collect()
    torch.cuda.empty_cache()
    return out


def served(model: str, tasks: list, backend: Any) -> list[dict[str, Any]]:
    """Step 4: `vllm serve` and the OpenAI-compatible policy."""
    from agents.vllm_policy import VLLMServer, server_policy

    with VLLMServer(model, port=int(os.environ.get("VLLM_PORT", "8011")), served_name="tiny",
                    extra=["--gpu-memory-utilization", "0.3", "--max-model-len", "1024"]) as srv:
        _, cells = run_rollout(tasks, server_policy(srv.base_url, "tiny", name="vllm-serve", temperature=0.0,
                                                    max_tokens=64, timeout_s=60), backend)
    return [{"step": "vllm serve + OpenAI", "model": model, "status": "ok", **cells}]


def grpo_step(model: str, tasks: list, backend: Any, work: Path) -> list[dict[str, Any]]:
    """Step 5: one GRPO step with vLLM generation (colocate)."""
    from training.config import GRPOConfig
    from training.grpo import train_grpo

    cfg = GRPOConfig(max_steps=1, num_generations=4, prompts_per_step=2, use_vllm=True, bf16=True)
    res = train_grpo(model, tasks[:2], work / "grpo", cfg, backend=backend, progress=False)
    norms = [d.get("grad_norm") for d in res.steps_diagnostics if d.get("grad_norm") is not None]
    return [{"step": "GRPO, vLLM colocate", "model": model, "status": "ok", "episodes": res.episodes,
             "verdicts": res.verdicts, "grad norm": f"{norms[-1]:.4g}" if norms else "-"}]


def open_sandboxes() -> Any:
    from sandbox.backend import open_backend
    from sandbox.result import SandboxConfig, SandboxError

    class NoSandbox:
        """No sandbox on this machine: a tool call becomes an infra_error row (the runner retries it once)."""
        name, image = "none", None

        def acquire(self) -> Any:
            raise SandboxError("no sandbox backend on this machine (set FLYWHEEL_SANDBOX=docker|local)")

        def shutdown(self) -> None:
            pass

    try:
        return open_backend(SandboxConfig(backend=os.environ.get("FLYWHEEL_SANDBOX", "docker")), auto_fallback=True)
    except SandboxError as e:
        print(f"note: {e}; tool calls will be infra_error rows")
        return NoSandbox()


def print_table(results: list[dict[str, Any]]) -> None:
    print(" | ".join(COLUMNS))
    for r in results:
        print(" | ".join(str(r.get(c, "-")) for c in COLUMNS))


def main(argv: list[str]) -> int:
    from tasks import arithmetic

    with tempfile.TemporaryDirectory(prefix="flywheel-gpu-smoke-") as work:
        return smoke(arithmetic.generate(8, split="train", seed=0), argv[:1], Path(work))


def smoke(tasks: list, extra: list[str], work: Path) -> int:
    """Every step in order (module docstring); the exit status."""
    t0 = time.perf_counter()
    models = build_models(tasks, work)
    results: list[dict[str, Any]] = [{"step": "build", "model": ", ".join(models), "status": "ok"}]
    print(f"built {', '.join(models)} in {time.perf_counter() - t0:.1f}s")
    rolled = [models[f] for f in FAMILIES] + extra
    steps: list[tuple[str, str, Any]] = [("vLLM offline + panel", m, lambda m=m: vllm_and_panel(m, tasks, backend))
                                         for m in rolled]
    steps += [("vllm serve + OpenAI", models["tiny"], lambda: served(models["tiny"], tasks, backend)),
              ("GRPO, vLLM colocate", models["tiny-gptoss"],
               lambda: grpo_step(models["tiny-gptoss"], tasks, backend, work))]
    missing = gpu_missing()
    failed = False
    if missing:
        for name, model, _ in steps:
            print(f"skip: {name} ({Path(model).name}): {missing}")
            results.append({"step": name, "model": model, "status": "skip"})
    else:
        backend = open_sandboxes()
        try:
            for name, model, run in steps:
                try:
                    results += run()
                except Exception as e:  # noqa: BLE001 -- a failing step is a row; the others still run
                    failed = True
                    print(f"error: {name} ({model}): {type(e).__name__}: {e}", file=sys.stderr)
                    results.append({"step": name, "model": model, "status": f"error: {type(e).__name__}"})
        finally:
            backend.shutdown()
        import torch
        import vllm

        print(f"\nvLLM {vllm.__version__}, torch {torch.__version__}, {torch.cuda.get_device_name(0)}")
    print_table(results)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "gpu_smoke.json").write_text(json.dumps({"results": results}, indent=2, default=str))
    if missing:
        print(f"error: the GPU steps were skipped: {missing}", file=sys.stderr)
        return 2
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
