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


def sliding_layers(config) -> tuple[int, ...]:
    """The layers config.layer_types calls sliding (none where it is absent)."""
    types = list(getattr(config, "layer_types", None) or ["full_attention"] * config.num_hidden_layers)
    unknown = sorted(set(types) - {"sliding_attention", "full_attention"})
    if unknown or len(types) != config.num_hidden_layers:
        raise Unsupported(f"config.layer_types must give each of the {config.num_hidden_layers} layers "
                         f"'sliding_attention' or 'full_attention', got {types!r}")
    return tuple(i for i, t in enumerate(types) if t == "sliding_attention")


def layer_windows(config) -> dict:
    """sliding_window and sliding_layers where config.layer_types names each layer's kind (Gemma 2
    and 3, Ministral, OLMo 3, EXAONE 4: their classes give a sliding layer config.sliding_window)."""
    layers = sliding_layers(config)
    window = sliding_window(config) if layers else None
    if layers and window is None:
        raise Unsupported("config.sliding_window must be a positive integer: config.layer_types has sliding layers")
    return {"sliding_window": window, "sliding_layers": layers or None}


def spec_from_config(config):
    return base_spec(config, "MistralForCausalLM", sliding_window=sliding_window(config))
