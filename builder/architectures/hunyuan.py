"""Hunyuan dense (HunYuanDenseV1ForCausalLM: Hunyuan-0.5B, -1.8B, -4B, -7B and their -Instruct models;
model_type hunyuan_v1_dense).

Llama's layout with an RMSNorm over each q and k head after RoPE (query_layernorm, key_layernorm:
Qwen3 norms before it), and its RoPE's NTK alpha (a fixed stretch of the base, read from the model's
own rotary module like every RoPE variant)."""
from __future__ import annotations

from trtllm.builder.architectures.llama import base_spec


def spec_from_config(config):
    return base_spec(config, "HunYuanDenseV1ForCausalLM", qk_norm=True, qk_norm_after_rope=True)
