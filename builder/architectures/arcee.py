"""Arcee (ArceeForCausalLM: AFM-4.5B and its -Base; model_type arcee).

Llama's layout with an MLP without a gate: down(relu(up(x))^2) (DecoderSpec.gated_mlp, hidden_act
relu2), and Llama's RoPE types (AFM-4.5B's YaRN)."""
from __future__ import annotations

from trtllm.builder.architectures.llama import base_spec

RELU2 = {"relu2": "relu2"}


def spec_from_config(config):
    return base_spec(config, "ArceeForCausalLM", act=("hidden_act", RELU2), gated_mlp=False)
