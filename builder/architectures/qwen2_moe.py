"""Qwen2-MoE (Qwen2MoeForCausalLM: Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B): Qwen2's attention (q/k/v
biases, its per-layer window) and a mixture of experts with a shared expert on every token, gated by
sigmoid(x @ shared_expert_gate.T) (builder/moe.py)."""
from __future__ import annotations

from trtllm.builder.architectures.llama import base_spec
from trtllm.builder.architectures.qwen2 import sliding
from trtllm.builder.moe import moe_from_config, positive, qwen_dense_layers


def spec_from_config(config):
    moe = moe_from_config(config, "num_experts", "moe_intermediate_size", config.norm_topk_prob,
                          shared_size=positive(config, "shared_expert_intermediate_size"), shared_gate=True,
                          dense_layers=qwen_dense_layers(config))
    return base_spec(config, "Qwen2MoeForCausalLM", moe=moe, **sliding(config))
