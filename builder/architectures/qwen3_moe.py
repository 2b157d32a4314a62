"""Qwen3-MoE (Qwen3MoeForCausalLM: Qwen3-30B-A3B, Qwen3-235B-A22B): Qwen3's attention, and a
mixture of experts in place of the MLP (builder/moe.py) on all but config.mlp_only_layers and the
layers off config.decoder_sparse_step. Its attention takes config.sliding_window on every layer (the
config itself clears it unless use_sliding_window)."""
from __future__ import annotations

from trtllm.builder.architectures.llama import base_spec
from trtllm.builder.architectures.mistral import sliding_window
from trtllm.builder.moe import moe_from_config, qwen_dense_layers


def spec_from_config(config):
    moe = moe_from_config(config, "num_experts", "moe_intermediate_size", config.norm_topk_prob,
                          dense_layers=qwen_dense_layers(config))
    return base_spec(config, "Qwen3MoeForCausalLM", qk_norm=True, sliding_window=sliding_window(config), moe=moe)
