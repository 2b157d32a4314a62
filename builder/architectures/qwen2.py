"""Qwen2: Llama's layout with biases on the q/k/v projections."""
from __future__ import annotations

from trtllm.builder.architectures.llama import base_spec, sliding_window


def spec_from_config(config):
    return base_spec(config, "Qwen2ForCausalLM", attention_bias=True, sliding_window=sliding_window(config))
