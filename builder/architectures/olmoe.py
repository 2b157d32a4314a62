"""OLMoE (OlmoeForCausalLM: OLMoE-1B-7B): Llama's layout with q and k each normed over all their
heads at once before RoPE (as OLMo 2), and a mixture of experts in place of the MLP (builder/moe.py)."""
from __future__ import annotations

from trtllm.builder.architectures.llama import base_spec
from trtllm.builder.checkpoint import Unsupported
from trtllm.builder.moe import moe_from_config


def spec_from_config(config):
    if getattr(config, "clip_qkv", None) is not None:
        raise Unsupported(f"config.clip_qkv must be null (q, k and v clamped is not in the graph), got {config.clip_qkv!r}")
    moe = moe_from_config(config, "num_experts", "intermediate_size", config.norm_topk_prob)
    return base_spec(config, "OlmoeForCausalLM", full_qk_norm=True, moe=moe)
