"""EXAONE 4.0 (Exaone4ForCausalLM: EXAONE-4.0-1.2B, EXAONE-4.0-32B; model_type exaone4).

OLMo 2's norm placement (no norm before the attention and the MLP, their outputs normed before the
residual add) with Qwen3's RMSNorm over each q and k head, and, where config.sliding_window is set,
EXAONE's hybrid attention: sliding layers (config.layer_types) with RoPE, and full-attention layers
without it (transformers rotates every layer only when the model has no window)."""
from __future__ import annotations

from trtllm.builder.architectures.llama import base_spec
from trtllm.builder.architectures.mistral import layer_windows


def spec_from_config(config):
    windows = layer_windows(config)
    hybrid = getattr(config, "sliding_window", None) is not None
    sliding = set(windows["sliding_layers"] or ())
    nope = tuple(i for i in range(config.num_hidden_layers) if hybrid and i not in sliding)
    return base_spec(config, "Exaone4ForCausalLM", pre_norms=False, sandwich_norms=True, qk_norm=True,
                     nope_layers=nope, **windows)
