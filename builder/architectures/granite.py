"""Granite (GraniteForCausalLM: IBM's granite-3.x dense models, 2B and 8B).

Llama's layout with four multipliers from the config, each a DecoderSpec field: the token
embeddings times embedding_multiplier, attention scores scaled by attention_multiplier (not
head_dim ** -0.5), the attention and MLP outputs times residual_multiplier before their residual
add, and the logits divided by logits_scaling."""
from __future__ import annotations

import math

from trtllm.builder.architectures.llama import base_spec
from trtllm.builder.checkpoint import Unsupported


def multiplier(config, key: str) -> float:
    value = getattr(config, key, 1.0)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise Unsupported(f"config.{key} must be a positive number, got {value!r}")
    return float(value)


def multipliers(config) -> dict:
    """The four multipliers as DecoderSpec fields (Granite MoE's too)."""
    return {"embed_scale": multiplier(config, "embedding_multiplier"),
            "query_scale": multiplier(config, "attention_multiplier"),
            "residual_scale": multiplier(config, "residual_multiplier"),
            "logits_scale": multiplier(config, "logits_scaling")}


def spec_from_config(config):
    return base_spec(config, "GraniteForCausalLM", **multipliers(config))
