"""The trainer's attention kernels (training/attention.py) on a small random GPT-OSS: the sink-aware torch kernel
computes what transformers' own attention computes, with padding and a sliding window; the sink-less stand-in does
not; the names, the sink check and the preflight's warning line."""

from __future__ import annotations

import json

import pytest
import torch

from training.attention import AttentionError, drops_sinks, has_sinks, sink_warning, use_attention


@pytest.fixture(scope="module")
def gptoss():
    from transformers import GptOssConfig, GptOssForCausalLM

    torch.manual_seed(0)
    cfg = GptOssConfig(vocab_size=96, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=8, intermediate_size=64, num_local_experts=4,
                       num_experts_per_tok=2, sliding_window=4, max_position_embeddings=64,
                       layer_types=["sliding_attention", "full_attention"])
    model = GptOssForCausalLM(cfg).eval()
    with torch.no_grad():  # sinks a trained model would have (init puts them near 0)
        for m in model.modules():
            if hasattr(m, "sinks"):
                m.sinks.normal_(0.0, 1.0)
    return model


def _logits(model, name, ids, att):
    use_attention(model, name)
    try:
        with torch.no_grad():
            return model(input_ids=ids, attention_mask=att).logits
    finally:
        use_attention(model, "eager")


def test_sink_aware_kernel_matches_eager_and_the_sinkless_one_does_not(gptoss):
    ids = torch.randint(0, 96, (2, 12), generator=torch.Generator().manual_seed(1))
    att = torch.ones_like(ids)
    att[0, :3] = 0  # a left-padded row: padding and the sliding window of 4 both matter
    real = att.bool()
    eager = _logits(gptoss, "eager", ids, att)
    sinks = _logits(gptoss, "sdpa_sinks", ids, att)
    nosinks = _logits(gptoss, "sdpa_nosinks", ids, att)
    assert (sinks - eager)[real].abs().max() < 1e-5
    assert (nosinks - eager)[real].abs().max() > 1e-2  # the sinks matter, and the kernel was really swapped
    # generation with a KV cache runs through the same kernels
    use_attention(gptoss, "sdpa_sinks")
    a = gptoss.generate(input_ids=ids[1:], attention_mask=att[1:], max_new_tokens=6, do_sample=False)
    use_attention(gptoss, "eager")
    b = gptoss.generate(input_ids=ids[1:], attention_mask=att[1:], max_new_tokens=6, do_sample=False)
    assert a.tolist() == b.tolist()


def test_names_and_the_sink_check(gptoss, tmp_path):
    assert has_sinks(gptoss) and drops_sinks(gptoss, "sdpa_nosinks")
    assert not drops_sinks(gptoss, "eager") and not drops_sinks(gptoss, "sdpa_sinks")
    with pytest.raises(AttentionError, match="flash_attention_2"):
        use_attention(gptoss, "flash_attention_2")
    line = sink_warning("tiny-gptoss", "sdpa_nosinks")
    assert line and "drops the attention sinks" in line and "student.train_attention='eager'" in line
    assert sink_warning("tiny-gptoss", "sdpa_sinks") is None and sink_warning("tiny", "sdpa_nosinks") is None
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "gpt_oss"}))
    assert sink_warning(str(folder), "sdpa_nosinks")
    (folder / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    assert sink_warning(str(folder), "sdpa_nosinks") is None
