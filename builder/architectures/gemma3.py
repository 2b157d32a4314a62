"""Gemma 3, text only (Gemma3ForCausalLM: gemma-3-270m, gemma-3-1b; model_type gemma3_text).

Llama's layout with Gemma's changes, each a DecoderSpec field: token embeddings times
sqrt(hidden_size); every RMSNorm (q/k norms too) scales by 1 + weight; the attention and MLP
outputs are normed before their residual add (four norms a layer); a GELU (tanh) gated MLP; scores
scaled by query_pre_attn_scalar ** -0.5; and sliding-window layers between full-attention ones
(config.layer_types), the sliding ones with their own RoPE base (rope_local_base_freq)."""
from __future__ import annotations

import math

from trtllm.builder.architectures.llama import base_spec
from trtllm.builder.architectures.mistral import layer_windows, sliding_layers
from trtllm.builder.checkpoint import Unsupported

# transformers' names for GELU's tanh form; gelu_new is the same formula in Python ops
GELU_TANH = {"gelu_pytorch_tanh": "gelu_tanh", "gelu_new": "gelu_tanh"}


def softcap(config, key: str) -> float | None:
    """A soft-capping constant c (scores or logits -> c tanh(x / c)), or None."""
    value = getattr(config, key, None)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise Unsupported(f"config.{key} must be a positive number or null, got {value!r}")
    return float(value)


def gemma_spec(config, architecture: str, **overrides):
    """What Gemma 2 and 3 share: sliding layers from config.layer_types, the scaled embeddings, 1 + w
    norms, four norms a layer, the GELU MLP, their own score scale, and the logits soft-capped where
    the config sets it (Gemma 2; null in Gemma 3's configs, but its class caps them too when set)."""
    if getattr(config, "use_bidirectional_attention", False):
        raise Unsupported("config.use_bidirectional_attention must be false: the engine decodes causally")
    return base_spec(config, architecture, act=("hidden_activation", GELU_TANH), **layer_windows(config),
                     embed_scale=float(config.hidden_size) ** 0.5,
                     norm_offset=1.0, sandwich_norms=True, query_scale=float(config.query_pre_attn_scalar) ** -0.5,
                     final_softcap=softcap(config, "final_logit_softcapping"), **overrides)


def spec_from_config(config):
    # no attn_softcap: transformers' Gemma 3 keeps config.attn_logit_softcapping but never applies it
    return gemma_spec(config, "Gemma3ForCausalLM", local_rope=bool(sliding_layers(config)), qk_norm=True)
