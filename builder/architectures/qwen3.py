"""Qwen3: Llama's layout plus an RMSNorm over each q and k head before RoPE."""
from __future__ import annotations

from trtllm.builder.architectures.llama import base_spec
from trtllm.builder.architectures.qwen2 import sliding


def spec_from_config(config):
    return base_spec(config, "Qwen3ForCausalLM", qk_norm=True, **sliding(config))
