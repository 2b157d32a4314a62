"""LFM3 (Lfm3ForCausalLM: LFM3-1.7B; Liquid AI's models for devices after LFM2).

LFM2's layers (builder/architectures/lfm2.py: short convolutions, conv_L_cache wide, in place of
attention on most layers; per-head q/k norms before RoPE; the final norm embedding_norm) with these
changes: attention layers of two kinds (config.layer_types "sliding_attention", in a window of
sliding_window, and "full_attention"), each with its own RoPE table (the full layers' a "proportional" one
on part of each head: its table turns the rest by 0); every layer's operator and MLP outputs RMS-normed
before their residual add (use_sandwich_norm: post_operator_norm, post_ffn_norm, as Gemma's four norms);
each attention head's output times sigmoid of its own logit from g_proj(x) before o_proj
(use_attention_gate: DecoderSpec.attn_gate); the MLP intermediate_size wide as the config says. The
build reads its modules under Llama's and Gemma's names (architectures.RENAMES); LoRA names them as the
checkpoint does (DecoderSpec.module_names)."""
from __future__ import annotations

from trtllm.builder.architectures.lfm2 import conv_fields
from trtllm.builder.architectures.llama import base_spec
from trtllm.builder.architectures.mistral import sliding_window
from trtllm.builder.checkpoint import Unsupported

NAME = "Lfm3ForCausalLM"
KINDS = ("conv", "sliding_attention", "full_attention")


def renames(spec) -> dict[str, str]:
    """LFM3's module names -> the graph's (Llama's; with sandwich norms, Gemma's four)."""
    norms = {"post_operator_norm": "post_attention_layernorm", "ffn_norm": "pre_feedforward_layernorm",
             "post_ffn_norm": "post_feedforward_layernorm"} if spec.sandwich_norms else \
        {"ffn_norm": "post_attention_layernorm"}
    return {"out_proj": "o_proj", "feed_forward": "mlp", "w1": "gate_proj", "w3": "up_proj", "w2": "down_proj",
            "operator_norm": "input_layernorm", "embedding_norm": "norm", **norms}


def spec_from_config(config):
    types = list(config.layer_types)
    if sorted(set(types) - set(KINDS)) or len(types) != config.num_hidden_layers:
        raise Unsupported(f"config.layer_types must give each of the {config.num_hidden_layers} layers one of "
                          f"{list(KINDS)}, got {types!r}")
    sliding = tuple(i for i, t in enumerate(types) if t == "sliding_attention")
    window = sliding_window(config) if sliding else None
    if sliding and window is None:
        raise Unsupported("config.sliding_window must be a positive integer: config.layer_types has sliding layers")
    return base_spec(config, NAME, rms_norm_eps=config.norm_eps, qk_norm=True,
                     sandwich_norms=bool(config.use_sandwich_norm),
                     attn_gate="head" if config.use_attention_gate else "",
                     sliding_window=window, sliding_layers=sliding or None, local_rope=bool(sliding),
                     **conv_fields(config, types),
                     module_names=(("mlp.gate_proj", "feed_forward.w1"), ("mlp.up_proj", "feed_forward.w3"),
                                   ("mlp.down_proj", "feed_forward.w2")))
