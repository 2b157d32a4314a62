"""LFM2 (Lfm2ForCausalLM: LFM2-350M, -700M, -1.2B, -2.6B; Liquid AI's models for devices), and LFM2-MoE
(Lfm2MoeForCausalLM: LFM2-8B-A1B).

Llama's layers with these changes: most layers are short convolutions instead of attention
(config.layer_types "conv": builder/short_conv.py, whose state the engine keeps by position as KV), the
attention layers RMS-norm each q and k head before RoPE (Qwen3's), and the final norm is called
embedding_norm. The build reads its modules under Llama's names (architectures.RENAMES). Not taken:
draft trees (a tree's tokens do not follow their parents, which a convolution reads: EAGLE heads draft
chains). LoRA adapters name its modules as the checkpoint does (DecoderSpec.module_names).

LFM2-MoE: the same layers, with a mixture of experts (builder/moe.py) in place of the MLP past the first
num_dense_layers: SiLU experts, the router's scores each logit's sigmoid, the experts chosen by the scores
plus expert_bias (a buffer) and weighted by the scores alone, normalized by their sum + 1e-6
(norm_topk_prob), times routed_scaling_factor."""
from __future__ import annotations

from trtllm.builder.architectures.llama import base_spec
from trtllm.builder.checkpoint import Unsupported
from trtllm.builder.moe import leading_dense, moe_from_config, positive_number


def mlp_width(config) -> int:
    """The MLP's width as Lfm2MLP computes it (block_auto_adjust_ff_dim: 2/3 of intermediate_size,
    times block_ffn_dim_multiplier, rounded up to block_multiple_of)."""
    width = config.intermediate_size
    if getattr(config, "block_auto_adjust_ff_dim", False):
        width = int(2 * width / 3)
        if getattr(config, "block_ffn_dim_multiplier", None) is not None:
            width = int(config.block_ffn_dim_multiplier * width)
            width = config.block_multiple_of * ((width + config.block_multiple_of - 1) // config.block_multiple_of)
    return width


def conv_fields(config, types: list[str]) -> dict:
    """The DecoderSpec fields of the convolution layers (LFM3's too), and the attention's head size."""
    if config.hidden_size % 2:
        raise Unsupported(f"hidden_size ({config.hidden_size}) must be even: a convolution layer keeps its state as "
                          "keys and values of half of it each")
    kernel = config.conv_L_cache
    if isinstance(kernel, bool) or not isinstance(kernel, int) or kernel < 1:
        raise Unsupported(f"config.conv_L_cache must be a positive integer, got {kernel!r}")
    return {"conv_layers": tuple(i for i, t in enumerate(types) if t == "conv"), "conv_kernel": kernel,
            "conv_bias": bool(config.conv_bias),
            "head_dim": getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads}


def spec_from_config(config, architecture: str = "Lfm2ForCausalLM", **extra):
    types = list(config.layer_types)
    unknown = sorted(set(types) - {"conv", "full_attention"})
    if unknown or len(types) != config.num_hidden_layers:
        raise Unsupported(f"config.layer_types must give each of the {config.num_hidden_layers} layers 'conv' or "
                          f"'full_attention', got {types!r}")
    extra = {"intermediate_size": mlp_width(config), **extra}
    return base_spec(config, architecture, rms_norm_eps=config.norm_eps, qk_norm=True, **conv_fields(config, types),
                     module_names=(("self_attn.o_proj", "self_attn.out_proj"), ("mlp.gate_proj", "feed_forward.w1"),
                                   ("mlp.up_proj", "feed_forward.w3"), ("mlp.down_proj", "feed_forward.w2")), **extra)


def moe_spec_from_config(config):
    moe = moe_from_config(config, "num_experts", "moe_intermediate_size", bool(config.norm_topk_prob),
                          dense_layers=leading_dense(config), router_module="feed_forward.gate", scoring="sigmoid",
                          selection_bias=bool(config.use_expert_bias),
                          routed_scale=positive_number(config, "routed_scaling_factor"))
    # (its dense MLP is intermediate_size wide: Lfm2MoeMLP adjusts nothing)
    return spec_from_config(config, "Lfm2MoeForCausalLM", moe=moe, intermediate_size=config.intermediate_size)
