"""Helium (HeliumForCausalLM: Kyutai's helium-1-2b; model_type helium).

Llama's layout with an interleaved RoPE (each head's pairs (2i, 2i + 1) turned together), which the
graph computes by reordering q and k (DecoderSpec.interleaved_rope); o_proj never has a bias."""
from __future__ import annotations

from trtllm.builder.architectures.llama import base_spec


def spec_from_config(config):
    return base_spec(config, "HeliumForCausalLM", interleaved_rope=True)
