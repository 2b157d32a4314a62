"""Granite MoE (GraniteMoeForCausalLM: granite-3.0/3.1-1b-a400m and -3b-a800m;
GraniteMoeSharedForCausalLM, with a shared expert on every token): Granite's multipliers
(builder/architectures/granite.py) and a mixture of experts whose softmax over the top-k logits is
the normalized form (builder/moe.py)."""
from __future__ import annotations

from trtllm.builder.architectures.granite import multipliers
from trtllm.builder.architectures.llama import base_spec
from trtllm.builder.moe import moe_from_config


def spec(config, architecture: str, shared_size: int = 0, **overrides):
    moe = moe_from_config(config, "num_local_experts", "intermediate_size", normalize=True, shared_size=shared_size,
                          shared_fused=True, router_module="block_sparse_moe.router")  # (shared_mlp.input_linear: gate|up)
    return base_spec(config, architecture, moe=moe, **multipliers(config), **overrides)


def spec_from_config(config):
    return spec(config, "GraniteMoeForCausalLM")


def shared_spec_from_config(config):
    size = getattr(config, "shared_intermediate_size", 0) or 0
    return spec(config, "GraniteMoeSharedForCausalLM", shared_size=int(size))
