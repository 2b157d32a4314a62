"""Bamba (BambaForCausalLM: Bamba-9B v1 and v2, the hybrid granite-4.0-h builds on): Granite 4.0's
Mamba-2 layers (builder/mamba.py) with attention on config.attn_layer_indices, RoPE on the first half
of each attention head (the class sets partial_rotary_factor 0.5), and Llama's MLP without Granite's
multipliers. Its MLP is `feed_forward`, its second norm `pre_ff_layernorm` and its last `final_layernorm`,
read under Llama's names (DecoderSpec.module_names, architectures.RENAMES); LoRA names them as the
checkpoint does."""
from __future__ import annotations

from trtllm.builder.architectures.granitemoehybrid import mamba_fields
from trtllm.builder.architectures.llama import base_spec
from trtllm.builder.architectures.phi3 import partial_rotary
from trtllm.builder.checkpoint import Unsupported

NAME = "BambaForCausalLM"
RENAMES = {"pre_ff_layernorm": "post_attention_layernorm", "final_layernorm": "norm"}


def spec_from_config(config):
    mamba = tuple(i for i, kind in enumerate(config.layers_block_type) if kind == "linear_attention")
    layers = mamba_fields(config, mamba, NAME, "config.attn_layer_indices is empty")
    if getattr(config, "mlp_bias", False):
        raise Unsupported(f"{NAME}: config.mlp_bias: MLP biases are not supported")
    return base_spec(config, NAME, rotary_dim=partial_rotary(config), **layers,
                     module_names=tuple((f"mlp.{p}", f"feed_forward.{p}") for p in ("gate_proj", "up_proj",
                                                                                   "down_proj")))
