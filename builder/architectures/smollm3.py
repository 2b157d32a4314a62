"""SmolLM3: Llama's layout (Qwen's per-layer window keys) with NoPE layers: every
`no_rope_layer_interval`-th layer (config.no_rope_layers, 0 = no RoPE) attends without rotary."""
from __future__ import annotations

from trtllm.builder.architectures.llama import base_spec
from trtllm.builder.architectures.qwen2 import sliding
from trtllm.builder.checkpoint import Unsupported


def spec_from_config(config):
    flags = list(config.no_rope_layers)
    if len(flags) != config.num_hidden_layers:
        raise Unsupported(f"config.no_rope_layers must have one flag per layer ({config.num_hidden_layers}), "
                         f"got {len(flags)}")
    nope = tuple(i for i, use_rope in enumerate(flags) if not use_rope)
    if (not getattr(config, "use_sliding_window", False) and getattr(config, "sliding_window", None)
            and "sliding_attention" in (getattr(config, "layer_types", None) or ())):
        # transformers' mask slides those layers (config.sliding_window) while their attention
        # modules hold no window (use_sliding_window): two answers, neither one to copy
        raise Unsupported("config.layer_types names sliding_attention layers while use_sliding_window is false "
                          "(transformers' mask then slides them and its attention modules do not): set "
                          "use_sliding_window true, or the layers to full_attention")
    return base_spec(config, "SmolLM3ForCausalLM", nope_layers=nope, **sliding(config))
