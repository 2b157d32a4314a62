"""OLMo 3 (Olmo3ForCausalLM: Olmo-3-7B, Olmo-3-32B and their Instruct/Think models; model_type olmo3).

OLMo 2's layout (builder/architectures/olmo2.py) with sliding-window layers between full-attention
ones (config.layer_types; three of every four by default), each kind with its own RoPE table
(config.rope_parameters per layer type: the full layers' may be scaled, as YaRN scales them)."""
from __future__ import annotations

from trtllm.builder.architectures.llama import base_spec
from trtllm.builder.architectures.mistral import layer_windows


def spec_from_config(config):
    windows = layer_windows(config)
    return base_spec(config, "Olmo3ForCausalLM", pre_norms=False, sandwich_norms=True, full_qk_norm=True,
                     local_rope=windows["sliding_layers"] is not None, **windows)
