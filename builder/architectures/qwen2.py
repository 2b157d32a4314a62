"""Qwen2: Llama's layout with biases on the q/k/v projections, and Qwen's per-layer window."""
from __future__ import annotations

from trtllm.builder.architectures.llama import base_spec


def sliding_window(config) -> int | None:
    """The window when every layer slides, else None. Qwen2/Qwen3 configs say it per layer
    (layer_types, from use_sliding_window and max_window_layers); mixed layers are refused."""
    window = getattr(config, "sliding_window", None)
    if not getattr(config, "use_sliding_window", False):
        window = None  # what Qwen2Config itself does
    layer_types = getattr(config, "layer_types", None) or \
        ["sliding_attention" if window else "full_attention"] * config.num_hidden_layers
    kinds = set(layer_types)
    if len(kinds) > 1:
        raise ValueError(f"config.layer_types must be all the same, got {sorted(kinds)!r}: "
                         "mixed sliding/full attention layers are not supported yet")
    return int(window) if window and kinds == {"sliding_attention"} else None


def spec_from_config(config):
    return base_spec(config, "Qwen2ForCausalLM", attention_bias=True, sliding_window=sliding_window(config))
