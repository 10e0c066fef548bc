"""The attention kernels the trainer can run a model with, and whether they honour GPT-OSS's attention sinks.

GPT-OSS gives each attention head a learned sink: one extra logit with no value in every query's softmax, so a
head can attend to "nothing". A kernel without sink support drops it and computes other attention probabilities
for the same weights. The GPT-OSS retrospective's root cause was exactly that: the trainer ran FlashAttention-2
(no sinks) while inference ran sink-aware kernels, so on-policy RL was silently off-policy.

Kernels, by the name `student.train_attention` takes (registered with transformers' AttentionInterface, each with
transformers' additive float mask, so causal masking, padding and sliding windows are the library's own):

- `eager`: transformers' own implementation of the model (for GPT-OSS: sink-aware). What rollouts run.
- `sdpa_sinks`: torch's `scaled_dot_product_attention` with the sinks honoured: one extra key and value of zeros
  whose score is the head's sink logit (q . 0 = 0, plus the sink in the additive mask). A different kernel from
  `eager`, sink-aware: the retrospective's fix.
- `sdpa_nosinks`: the same torch kernel with the sinks dropped. A stand-in (test double) for a kernel without sink
  support, FlashAttention-2 as the retrospective's trainer ran it; it exists to reproduce that bug on purpose.

`use_attention(model, name)` switches a loaded model; `drops_sinks(model, name)` says whether that kernel loses
the model's sinks (preflight warns). This module does not choose a kernel for anyone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    import torch

TrainAttention = Literal["eager", "sdpa_sinks", "sdpa_nosinks"]
SINK_AWARE: dict[str, bool] = {"eager": True, "sdpa_sinks": True, "sdpa_nosinks": False}


class AttentionError(ValueError):
    """An attention kernel name that is not one of TrainAttention."""


def _sdpa(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: torch.Tensor | None,
          *, scaling: float, dropout: float, sinks: torch.Tensor | None) -> torch.Tensor:
    import torch

    groups = getattr(module, "num_key_value_groups", 1)
    if groups > 1:
        key = key.repeat_interleave(groups, dim=1)
        value = value.repeat_interleave(groups, dim=1)
    b, h, q_len, d = query.shape
    k_len = key.shape[2]
    if attention_mask is None:  # causal, the queries being the last q_len positions
        attention_mask = torch.full((q_len, k_len), torch.finfo(query.dtype).min, dtype=query.dtype,
                                    device=query.device).triu(k_len - q_len + 1)[None, None]
    mask = attention_mask[:, :, :, :k_len].to(query.dtype).expand(b, h, q_len, k_len)
    if sinks is not None:
        key = torch.cat([key, key.new_zeros(b, h, 1, d)], dim=2)
        value = torch.cat([value, value.new_zeros(b, h, 1, d)], dim=2)
        sink = sinks.to(query.dtype).reshape(1, h, 1, 1).expand(b, h, q_len, 1)
        mask = torch.cat([mask, sink], dim=-1)
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask, dropout_p=dropout,
                                                           scale=scaling)
    return out.transpose(1, 2).contiguous()


def sdpa_sinks_forward(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                       attention_mask: torch.Tensor | None, scaling: float, dropout: float = 0.0,
                       **kwargs: Any) -> tuple[torch.Tensor, None]:
    """torch SDPA with the head's sink (`s_aux`, GPT-OSS) as one extra zero key whose score is the sink."""
    return _sdpa(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout,
                 sinks=kwargs.get("s_aux")), None


def sdpa_nosinks_forward(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                         attention_mask: torch.Tensor | None, scaling: float, dropout: float = 0.0,
                         **kwargs: Any) -> tuple[torch.Tensor, None]:
    """torch SDPA that drops the sinks: the stand-in for a kernel without sink support (FlashAttention-2)."""
    return _sdpa(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, sinks=None), None


def register() -> None:
    """Register the two torch kernels (idempotent) with transformers' attention and mask interfaces."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, eager_mask

    for name, fn in (("sdpa_sinks", sdpa_sinks_forward), ("sdpa_nosinks", sdpa_nosinks_forward)):
        AttentionInterface.register(name, fn)
        ALL_MASK_ATTENTION_FUNCTIONS.register(name, eager_mask)


def has_sinks(model: Any) -> bool:
    """Whether the model's attention layers carry sinks (GPT-OSS)."""
    return any(hasattr(m, "sinks") for m in model.modules())


def drops_sinks(model: Any, name: str) -> bool:
    """Whether running `model` with kernel `name` loses its sinks (the retrospective's bug)."""
    return has_sinks(model) and not SINK_AWARE[check_name(name)]


def check_name(name: str) -> str:
    if name not in SINK_AWARE:
        raise AttentionError(f"attention kernel {name!r} is none of {', '.join(SINK_AWARE)}")
    return name


def use_attention(model: Any, name: str) -> Any:
    """Run `model` with kernel `name` from now on (all its layers); returns the model."""
    check_name(name)
    if name != "eager":
        register()
    model.config._attn_implementation = name
    for sub in model.modules():
        cfg = getattr(sub, "config", None)
        if cfg is not None and cfg is not model.config and hasattr(cfg, "_attn_implementation"):
            cfg._attn_implementation = name
    return model


def sink_warning(base: str, name: str) -> str | None:
    """A warning line when the student `base` (a tiny family or a model folder) has attention sinks and the trainer
    kernel `name` drops them; None otherwise. Reads config.json only, no weights."""
    import json
    from pathlib import Path

    if SINK_AWARE[check_name(name)]:
        return None
    cfg = Path(base, "config.json")
    sinks = base == "tiny-gptoss" or (cfg.is_file() and json.loads(cfg.read_text()).get("model_type") == "gpt_oss")
    if not sinks:
        return None
    return (f"warning: student.train_attention={name!r} drops the attention sinks of {base!r} (GPT-OSS): the trainer "
            f"computes other probabilities than the rollouts, the GPT-OSS retrospective's bug; the mismatch panel "
            f"will measure it and refuse promotion. Fix: student.train_attention='eager' or 'sdpa_sinks'.")
