"""Mixtral (MixtralForCausalLM: Mixtral-8x7B, 8x22B): Mistral's layout (config.sliding_window on every
layer) with a mixture of experts in place of the MLP, its top-k weights always normalized (builder/moe.py)."""
from __future__ import annotations

from trtllm.builder.architectures.llama import base_spec
from trtllm.builder.architectures.mistral import sliding_window
from trtllm.builder.moe import moe_from_config


def spec_from_config(config):
    moe = moe_from_config(config, "num_local_experts", "intermediate_size", normalize=True)
    return base_spec(config, "MixtralForCausalLM", sliding_window=sliding_window(config), moe=moe)
