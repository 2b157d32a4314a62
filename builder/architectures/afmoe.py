"""AFMoE (AfmoeForCausalLM: Arcee's Trinity-Nano-6B-A1B, Trinity-Mini-26B-A3B; model_type afmoe).

Sliding-window layers with three of every four (config.layer_types; global_attn_every_n_layers), RoPE on
those alone (the full layers attend without it), RMSNorm over each q and k head, each attention output
value times sigmoid of its own from gate_proj(x) (DecoderSpec.attn_gate "element"), the attention and MLP
outputs normed before their residual add (Gemma's four norms: pre_mlp_layernorm, post_mlp_layernorm),
the embeddings times sqrt(hidden_size) where mup_enabled; dense MLPs on the first num_dense_layers,
then a mixture of experts (builder/moe.py): the router's scores each logit's sigmoid, the experts chosen
by the scores plus expert_bias and weighted by the scores alone, divided by their sum + 1e-20 and times
route_scale, beside num_shared_experts shared experts (one MLP that wide) on every token."""
from __future__ import annotations

import math

from trtllm.builder.architectures.llama import base_spec
from trtllm.builder.architectures.mistral import layer_windows
from trtllm.builder.moe import SHARED_EXPERTS_NAMES, leading_dense, moe_from_config, positive, positive_number


def spec_from_config(config):
    windows = layer_windows(config)
    sliding = windows["sliding_layers"] or ()
    shared = int(config.num_shared_experts or 0) * positive(config, "moe_intermediate_size")
    moe = moe_from_config(config, "num_experts", "moe_intermediate_size", True, shared_size=shared,
                          dense_layers=leading_dense(config), router_module="mlp.router.gate", scoring="sigmoid",
                          selection_bias=True, routed_scale=positive_number(config, "route_scale"), norm_add=1e-20)
    return base_spec(config, "AfmoeForCausalLM", moe=moe, qk_norm=True, sandwich_norms=True, attn_gate="element",
                     nope_layers=tuple(i for i in range(config.num_hidden_layers) if i not in sliding),
                     embed_scale=math.sqrt(config.hidden_size) if config.mup_enabled else 1.0,
                     module_names=SHARED_EXPERTS_NAMES, **windows)
