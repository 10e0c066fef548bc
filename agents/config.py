"""Policy configuration: one typed `PolicyConfig` per teacher/student, and `build_policy` that makes the policy.

Kinds: `reference` (replays the task's reference solution, offline default), `openai` (any OpenAI-compatible
endpoint), `transformers` (in-process student, agents/transformers_policy.py, imported lazily), `vllm` (vLLM's
offline engine, imported lazily; needs `pip install 'flywheel[gpu]'`). `MixtureConfig` holds several weighted
policies; `RolloutConfig` the knobs of running episodes (concurrency, turns, batches, infra retries). This
module only validates and constructs; it sends no request.
"""

from __future__ import annotations

import os
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from agents.policy import Policy, PolicySetupError
from agents.reference import ReferenceNoise, ReferencePolicy


class PriceTable(BaseModel):
    """What an endpoint charges, in USD per 1M tokens (0 for self-hosted)."""

    model_config = ConfigDict(extra="forbid")
    prompt_per_1m: float = Field(default=0.0, ge=0, description="USD per 1M prompt tokens.")
    completion_per_1m: float = Field(default=0.0, ge=0, description="USD per 1M completion tokens.")


class PolicyConfig(BaseModel):
    """One policy: what serves it, how it samples, how it is retried and what it costs."""

    model_config = ConfigDict(extra="forbid")
    kind: Literal["reference", "openai", "transformers", "vllm"] = Field(
        default="reference", description="reference (offline replay) | openai (endpoint) | transformers "
                                         "(in-process) | vllm (offline engine, gpu extra).")
    name: str | None = Field(default=None, description="Policy name on rows; default: 'reference' or the model.")
    source: Literal["teacher", "student"] = Field(default="teacher", description="Row source: teacher or student.")
    base_url: str | None = Field(default=None, description="OpenAI-compatible base URL, e.g. http://127.0.0.1:8000/v1.")
    model: str | None = Field(default=None, description="Served model name (openai) or model folder/id "
                                                        "(transformers, vllm).")
    api_key_env: str = Field(default="OPENAI_API_KEY",
                             description="Environment variable holding the API key ('EMPTY' is sent when unset).")
    temperature: float | None = Field(default=0.7, ge=0, description="Sampling temperature.")
    top_p: float | None = Field(default=None, gt=0, le=1, description="Nucleus sampling; None = server default.")
    max_tokens: int | None = Field(default=512, gt=0, description="Max completion tokens per assistant turn.")
    timeout_s: float = Field(default=60.0, gt=0, description="Per-request timeout in seconds.")
    max_retries: int = Field(default=4, ge=0, description="Retries of a request on 429/5xx/timeouts/drops.")
    backoff_base_s: float = Field(default=0.5, ge=0, description="First retry backoff (doubles, jittered).")
    concurrency: int = Field(default=16, gt=0, description="Requests in flight to this endpoint at once.")
    weight: float = Field(default=1.0, gt=0, description="Share of episodes in a mixture of policies.")
    price: PriceTable = Field(default_factory=PriceTable, description="USD per 1M prompt/completion tokens.")
    logprobs: bool = Field(default=False, description="Ask for completion logprobs (and token ids where served).")
    extra_body: dict[str, Any] = Field(default_factory=dict,
                                       description="Extra request fields, e.g. {return_token_ids = true} for vLLM.")
    token_ids: bool = Field(default=False, description="Ask a vLLM server for prompt and completion token ids "
                                                       "(its return_token_ids extension); rows keep them.")
    reasoning_history: Literal["field", "inline", "drop"] = Field(
        default="field", description="How earlier turns' reasoning is sent back: 'field' (reasoning_content, for "
                                     "templates that render it), 'inline' (<think> in the content, for templates "
                                     "that do not, e.g. the tiny student's), 'drop'.")
    text_tool_calls: bool = Field(default=True, description="Parse <tool_call> blocks left in content by servers "
                                                            "without a tool parser.")
    noise: ReferenceNoise = Field(default_factory=ReferenceNoise, description="Reference teacher noise and hacks.")
    seed: int = Field(default=0, description="Seed (reference noise draws; sampling seed where supported).")
    gpu_memory_utilization: float = Field(default=0.5, gt=0, le=1, description="vLLM share of GPU memory.")
    max_model_len: int | None = Field(default=None, gt=0, description="vLLM context length; None = model's.")

    @model_validator(mode="after")
    def _needs(self) -> PolicyConfig:
        if self.kind == "openai" and (not self.base_url or not self.model):
            raise ValueError("kind 'openai' needs base_url and model (e.g. --base-url http://127.0.0.1:8000/v1 "
                             "--model NAME)")
        if self.kind in ("transformers", "vllm") and not self.model:
            raise ValueError(f"kind {self.kind!r} needs model (a model folder or hub id)")
        return self

    def policy_name(self) -> str:
        if self.name:
            return self.name
        if self.kind == "reference":
            return "reference"
        if self.kind == "transformers":
            from pathlib import Path

            return Path(str(self.model)).name or str(self.model)
        return str(self.model)

    def name_or_kind(self) -> str:
        """The name rows carry (alias of policy_name, used by flows)."""
        return self.policy_name()


class RolloutConfig(BaseModel):
    """The `[rollout]` section: how every stage runs episodes into the lake (generate's chunks, the flywheel's
    teacher, baseline and student stages, evaluate), through the one path in flows/rollouts.py, and the
    benchmarks' scoring (training/scoring.py)."""

    model_config = ConfigDict(extra="forbid")
    concurrency: int = Field(default=8, gt=0, description="Episodes in flight at once in one rollout; it holds "
                             "that many flywheel-sandbox slots (and endpoint slots for an openai policy).")
    max_turns: int = Field(default=6, gt=0, description="Assistant turns per episode (per user turn of a multi-turn "
                                                        "task, e.g. BFCL's) before it is cut off.")
    batch_size: int = Field(default=25, gt=0, description="Rows per Parquet file written.")
    infra_retries: int = Field(default=2, ge=0, description="Retries of an episode that hit an infra_error "
                               "(never counted as the model's failure).")


class MixtureConfig(BaseModel):
    """Several policies in one run; each (task, sample) goes to one of them in proportion to its weight."""

    model_config = ConfigDict(extra="forbid")
    policies: list[PolicyConfig] = Field(min_length=1, description="The policies and their weights.")
    seed: int = Field(default=0, description="Seed of the deterministic assignment.")


def build_policy(cfg: PolicyConfig) -> Policy:
    """Construct the policy `cfg` describes. Optional backends are imported only here, with a fix on failure."""
    if cfg.kind == "reference":
        return ReferencePolicy(noise=cfg.noise, seed=cfg.seed, name=cfg.policy_name(), source=cfg.source)
    if cfg.kind == "openai":
        from agents.openai_policy import OpenAIPolicy

        assert cfg.base_url and cfg.model
        return OpenAIPolicy(
            base_url=cfg.base_url, model=cfg.model, name=cfg.policy_name(), api_key=os.environ.get(cfg.api_key_env),
            api_key_env=cfg.api_key_env, source=cfg.source, temperature=cfg.temperature, top_p=cfg.top_p,
            max_tokens=cfg.max_tokens, timeout_s=cfg.timeout_s, max_retries=cfg.max_retries,
            backoff_base_s=cfg.backoff_base_s, concurrency=cfg.concurrency,
            prompt_price_per_1m=cfg.price.prompt_per_1m, completion_price_per_1m=cfg.price.completion_per_1m,
            logprobs=cfg.logprobs, text_tool_calls=cfg.text_tool_calls, extra_body=cfg.extra_body,
            token_ids=cfg.token_ids, reasoning_history=cfg.reasoning_history)
    if cfg.kind == "transformers":
        try:
            from agents import transformers_policy
        except ImportError as e:
            raise PolicySetupError(f"the transformers policy cannot be imported ({e}); fix: pip install -e . "
                              "(transformers and torch are core dependencies)") from e
        if hasattr(transformers_policy, "from_config"):
            return transformers_policy.from_config(cfg)
        return transformers_policy.TransformersPolicy(
            str(cfg.model), name=cfg.policy_name(), temperature=cfg.temperature or 0.0, top_p=cfg.top_p or 1.0,
            max_new_tokens=cfg.max_tokens or 128, seed=cfg.seed, source=cfg.source)
    if cfg.kind == "vllm":
        from agents.vllm_policy import VLLMPolicy

        return VLLMPolicy.from_config(cfg)
    raise ValueError(f"unknown policy kind {cfg.kind!r}")  # pragma: no cover - Literal guards it


def build_policies(cfgs: list[PolicyConfig]) -> list[Policy]:
    """Build several policies; names must be unique (they are part of trajectory ids)."""
    names = [c.policy_name() for c in cfgs]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"policy names must be unique in one run, {dup} repeat; set `name` on each policy")
    return [build_policy(c) for c in cfgs]


def check_policy(cfg: PolicyConfig, timeout: float = 5.0) -> None:
    """Preflight before anything is written: the endpoint answers and serves the model, or the optional backend
    is installed, or the model folder exists. Raises EndpointError / PolicySetupError (one line)."""
    if cfg.kind == "openai":
        from agents.openai_policy import check_endpoint

        assert cfg.base_url
        check_endpoint(cfg.base_url, cfg.model, timeout=timeout, api_key=os.environ.get(cfg.api_key_env))
    elif cfg.kind == "vllm":
        from agents.vllm_policy import require_vllm

        require_vllm()
    elif cfg.kind == "transformers":
        from pathlib import Path

        p = Path(str(cfg.model))
        if not p.exists() and (str(cfg.model).startswith((".", "/")) or len(p.parts) > 2):
            raise PolicySetupError(f"model folder {cfg.model} does not exist; fix: pass a folder written by "
                                    "save_pretrained (or a hub id available offline) as --model")
