"""OLMo 2 (Olmo2ForCausalLM: OLMo-2-0425-1B, OLMo-2-1124-7B).

Llama's layout with two changes, each a DecoderSpec field: no norm before the attention and the MLP
(they take the residual stream as it is), their outputs normed instead before the residual add
(post_attention_layernorm, post_feedforward_layernorm); and q and k each normed over all their
heads at once (q_norm, k_norm), before RoPE."""
from __future__ import annotations

from trtllm.builder.architectures.llama import base_spec


def spec_from_config(config):
    return base_spec(config, "Olmo2ForCausalLM", pre_norms=False, sandwich_norms=True, full_qk_norm=True)
