"""Gemma 2 (Gemma2ForCausalLM: gemma-2-2b, -9b, -27b and their -it models; model_type gemma2).

Gemma 3's layout (builder/architectures/gemma3.py) without its q/k norms and local RoPE base, and
with tanh soft-capping: each attention score s becomes c tanh(s / c) before the mask
(attn_logit_softcapping, 50) and the logits likewise (final_logit_softcapping, 30)."""
from __future__ import annotations

from trtllm.builder.architectures.gemma3 import gemma_spec, softcap


def spec_from_config(config):
    return gemma_spec(config, "Gemma2ForCausalLM", attn_softcap=softcap(config, "attn_logit_softcapping"))
