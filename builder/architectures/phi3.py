"""Phi-3 (Phi3ForCausalLM: Phi-3-mini, Phi-3.5-mini, Phi-4-mini): Llama's layout with q|k|v and
gate|up stored as one projection each (split into the usual parts for the graph, and LoRA's modules
named as the checkpoint has them), a window on every layer when config.sliding_window is set,
RoPE on the first partial_rotary_factor of each head (Phi-4-mini), and LongRoPE, whose short
factors the engine's RoPE table holds (checkpoint.rope_position_limit keeps the capacity to
original_max_position_embeddings, past which transformers switches to the long factors)."""
from __future__ import annotations

from trtllm.builder.architectures.llama import base_spec
from trtllm.builder.architectures.mistral import sliding_window
from trtllm.builder.checkpoint import Unsupported


def partial_rotary(config) -> int | None:
    """The rotary dimensions of a head (rope_parameters' partial_rotary_factor of it), or None: all."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    factor = (getattr(config, "rope_parameters", None) or {}).get("partial_rotary_factor", 1.0)
    rotary_dim = int(head_dim * factor)
    if rotary_dim % 2 or not 0 < rotary_dim <= head_dim:
        raise Unsupported(f"partial_rotary_factor {factor} gives {rotary_dim} rotary dimensions of a head of "
                         f"{head_dim}: must be even and positive")
    return None if rotary_dim == head_dim else rotary_dim


def spec_from_config(config):
    return base_spec(config, "Phi3ForCausalLM", sliding_window=sliding_window(config), fused_projections=True,
                     rotary_dim=partial_rotary(config))
