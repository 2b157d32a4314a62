"""Mistral: Llama's layout with a sliding window on every layer.

transformers' Mistral reads config.sliding_window alone: `use_sliding_window` and `layer_types`
(Qwen's keys) do not switch it off, so they must not here either."""
from __future__ import annotations

from trtllm.builder.architectures.llama import base_spec
from trtllm.builder.checkpoint import Unsupported


def sliding_window(config) -> int | None:
    window = getattr(config, "sliding_window", None)
    if window is None:
        return None
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise Unsupported(f"config.sliding_window must be a positive integer or null, got {window!r}")
    return window


def spec_from_config(config):
    return base_spec(config, "MistralForCausalLM", sliding_window=sliding_window(config))
