"""Gemma 3, text only (Gemma3ForCausalLM: gemma-3-270m, gemma-3-1b; model_type gemma3_text).

Llama's layout with Gemma's changes, each a DecoderSpec field: token embeddings times
sqrt(hidden_size); every RMSNorm (q/k norms too) scales by 1 + weight; the attention and MLP
outputs are normed before their residual add (four norms a layer); a GELU (tanh) gated MLP; scores
scaled by query_pre_attn_scalar ** -0.5; and sliding-window layers between full-attention ones
(config.layer_types), the sliding ones with their own RoPE base (rope_local_base_freq)."""
from __future__ import annotations

from trtllm.builder.architectures.llama import base_spec
from trtllm.builder.architectures.mistral import sliding_window
from trtllm.builder.checkpoint import Unsupported

# transformers' names for GELU's tanh form; gelu_new is the same formula in Python ops
GELU_TANH = {"gelu_pytorch_tanh": "gelu_tanh", "gelu_new": "gelu_tanh"}


def sliding_layers(config) -> tuple[int, ...]:
    types = list(config.layer_types)
    unknown = sorted(set(types) - {"sliding_attention", "full_attention"})
    if unknown or len(types) != config.num_hidden_layers:
        raise Unsupported(f"config.layer_types must give each of the {config.num_hidden_layers} layers "
                         f"'sliding_attention' or 'full_attention', got {types!r}")
    return tuple(i for i, t in enumerate(types) if t == "sliding_attention")


def spec_from_config(config):
    for key in ("final_logit_softcapping", "attn_logit_softcapping"):
        if getattr(config, key, None) is not None:  # Gemma 2's; Gemma 3 configs have null
            raise Unsupported(f"config.{key} must be null (Gemma 3), got {getattr(config, key)!r}: "
                             "soft-capping is not supported")
    if getattr(config, "use_bidirectional_attention", False):
        raise Unsupported("config.use_bidirectional_attention must be false: the engine decodes causally")
    layers = sliding_layers(config)
    window = sliding_window(config) if layers else None
    if layers and window is None:
        raise Unsupported("config.sliding_window must be a positive integer: config.layer_types has sliding layers")
    return base_spec(config, "Gemma3ForCausalLM", act=("hidden_activation", GELU_TANH),
                     sliding_window=window, sliding_layers=layers or None, local_rope=bool(layers),
                     qk_norm=True, embed_scale=float(config.hidden_size) ** 0.5, norm_offset=1.0,
                     sandwich_norms=True, query_scale=float(config.query_pre_attn_scalar) ** -0.5)
