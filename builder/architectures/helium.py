"""Helium (HeliumForCausalLM: Kyutai's helium-1-2b; model_type helium).

Llama's layout with an interleaved RoPE (each head's pairs (2i, 2i + 1) turned together), which the
graph computes by reordering q and k (DecoderSpec.interleaved_rope); o_proj never has a bias."""
from __future__ import annotations

from trtllm.builder.architectures.llama import base_spec
from trtllm.builder.checkpoint import Unsupported


def spec_from_config(config):
    spec = base_spec(config, "HeliumForCausalLM", interleaved_rope=True)
    if spec.num_heads * spec.head_dim != spec.hidden_size:  # (transformers cannot run it either)
        raise Unsupported(f"HeliumForCausalLM needs num_attention_heads x head_dim = hidden_size (its o_proj is "
                          f"hidden_size x hidden_size), got {spec.num_heads} x {spec.head_dim} != {spec.hidden_size}")
    return spec
