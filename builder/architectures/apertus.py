"""Apertus (ApertusForCausalLM: Apertus-8B, Apertus-70B and their -Instruct; model_type apertus).

Llama's layout with an MLP without a gate whose activation is xIELU (DecoderSpec.gated_mlp, hidden_act
xielu): each layer's own learned alpha_p, alpha_n (through a softplus) and its beta and eps,

    xielu(x) = alpha_p x^2 + beta x                          (x > 0)
               alpha_n (expm1(min(x, eps)) - x) + beta x     (else)

RMSNorm over each q and k head before RoPE (Qwen3's), and its two norms named attention_layernorm and
feedforward_layernorm (architectures.RENAMES)."""
from __future__ import annotations

from trtllm.builder.architectures.llama import base_spec

XIELU = {"xielu": "xielu"}


def spec_from_config(config):
    return base_spec(config, "ApertusForCausalLM", act=("hidden_act", XIELU), gated_mlp=False, qk_norm=True)
