"""Granite (GraniteForCausalLM: IBM's granite-3.x dense models, 2B and 8B).

Llama's layout with four multipliers from the config, each a DecoderSpec field: the token
embeddings times embedding_multiplier, attention scores scaled by attention_multiplier (not
head_dim ** -0.5), the attention and MLP outputs times residual_multiplier before their residual
add, and the logits divided by logits_scaling."""
from __future__ import annotations

from trtllm.builder.architectures.llama import base_spec
from trtllm.builder.moe import positive_number


def multipliers(config) -> dict:
    """The four multipliers as DecoderSpec fields (Granite MoE's too); 1 where the config has none."""
    return {"embed_scale": positive_number(config, "embedding_multiplier", 1.0),
            "query_scale": positive_number(config, "attention_multiplier", 1.0),
            "residual_scale": positive_number(config, "residual_multiplier", 1.0),
            "logits_scale": positive_number(config, "logits_scaling", 1.0)}


def spec_from_config(config):
    return base_spec(config, "GraniteForCausalLM", **multipliers(config))
