"""Ministral (MinistralForCausalLM: Ministral-8B-Instruct-2410; model_type ministral).

Mistral's layout with its window per layer: config.layer_types says which layers slide (transformers
builds the class on Qwen2's, without its q/k/v biases)."""
from __future__ import annotations

from trtllm.builder.architectures.llama import base_spec
from trtllm.builder.architectures.mistral import layer_windows


def spec_from_config(config):
    return base_spec(config, "MinistralForCausalLM", **layer_windows(config))
