"""Mistral: Llama's layout with an optional sliding window (handled by llama.sliding_window)."""
from __future__ import annotations

from trtllm.builder.architectures.llama import base_spec, sliding_window


def spec_from_config(config):
    return base_spec(config, "MistralForCausalLM", sliding_window=sliding_window(config))
