"""Qwen2: Llama's layout with biases on the q/k/v projections, and Qwen's per-layer window."""
from __future__ import annotations

from trtllm.builder.architectures.llama import base_spec


def sliding(config) -> dict:
    """sliding_window and sliding_layers as Qwen2/Qwen3 configs say them per layer (layer_types, from
    use_sliding_window and max_window_layers): the window, and the layers it applies to when not all."""
    window = getattr(config, "sliding_window", None)
    if not getattr(config, "use_sliding_window", False):
        window = None  # what Qwen2Config itself does
    layer_types = getattr(config, "layer_types", None) or \
        ["sliding_attention" if window else "full_attention"] * config.num_hidden_layers
    layers = tuple(i for i, kind in enumerate(layer_types) if kind == "sliding_attention")
    if not window or not layers:
        return {"sliding_window": None}
    return {"sliding_window": int(window), "sliding_layers": None if len(layers) == len(layer_types) else layers}


def spec_from_config(config):
    return base_spec(config, "Qwen2ForCausalLM", attention_bias=True, **sliding(config))
