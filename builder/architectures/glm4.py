"""GLM-4 (Glm4ForCausalLM: GLM-4-9B-0414, GLM-Z1-9B-0414; model_type glm4).

GLM's layout (builder/architectures/glm.py) with Gemma's four norms a layer: the attention and MLP
outputs are normed before their residual add too (post_self_attn_layernorm, post_mlp_layernorm,
renamed for the graph in architectures.RENAMES)."""
from __future__ import annotations

from trtllm.builder.architectures.llama import base_spec
from trtllm.builder.architectures.phi3 import partial_rotary


def spec_from_config(config):
    return base_spec(config, "Glm4ForCausalLM", fused_gate_up=True, interleaved_rope=True,
                     rotary_dim=partial_rotary(config), sandwich_norms=True)
