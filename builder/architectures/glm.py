"""GLM (GlmForCausalLM: glm-edge-1.5b-chat, glm-edge-4b-chat, glm-4-9b-chat-hf; model_type glm).

Llama's layout with q/k/v biases (never on o_proj), gate|up stored as one projection (split for the
graph; LoRA's module is gate_up_proj, as the checkpoint has it), and an interleaved RoPE on the
first partial_rotary_factor (a half) of each head: the build reorders q and k's rotary rows
(DecoderSpec.interleaved_rope) for the graph's rotate-half RoPE, the rest of each head unrotated."""
from __future__ import annotations

from trtllm.builder.architectures.llama import base_spec
from trtllm.builder.architectures.phi3 import partial_rotary


def spec_from_config(config):
    return base_spec(config, "GlmForCausalLM", fused_gate_up=True, interleaved_rope=True,
                     rotary_dim=partial_rotary(config))
