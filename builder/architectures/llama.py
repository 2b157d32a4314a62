"""Llama (and the SmolLM2 demo model): the base decoder every other architecture tweaks.

The biases and the lm_head tie are then taken from the loaded modules (architectures.spec_for)."""
from __future__ import annotations

from trtllm.builder.decoder import DecoderSpec


def check_common(config) -> None:
    """Refuse config features the graph does not implement, rather than export something wrong."""
    act = getattr(config, "hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"config.hidden_act must be 'silu', got {act!r}")
    if getattr(config, "mlp_bias", False):
        raise ValueError("config.mlp_bias must be false, got True")
    layer_types = getattr(config, "layer_types", None) or []
    if any(t != "full_attention" for t in layer_types) and len(set(layer_types)) > 1:
        raise ValueError(f"config.layer_types must be all the same, got {sorted(set(layer_types))!r}: "
                         "mixed sliding/full attention layers are not supported yet")


def sliding_window(config) -> int | None:
    """The window when every layer slides, else None (HF ignores sliding_window unless enabled)."""
    window = getattr(config, "sliding_window", None)
    if not window:
        return None
    if hasattr(config, "use_sliding_window") and not config.use_sliding_window:
        return None
    layer_types = getattr(config, "layer_types", None)
    if layer_types and all(t == "full_attention" for t in layer_types):
        return None
    return int(window)


def base_spec(config, architecture: str, **overrides) -> DecoderSpec:
    check_common(config)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    fields = dict(
        architecture=architecture,
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_layers=config.num_hidden_layers,
        num_heads=config.num_attention_heads,
        num_kv_heads=getattr(config, "num_key_value_heads", None) or config.num_attention_heads,
        head_dim=head_dim,
        rms_norm_eps=config.rms_norm_eps,
        attention_bias=bool(getattr(config, "attention_bias", False)),
        tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
    )
    fields.update(overrides)
    return DecoderSpec(**fields)


def spec_from_config(config) -> DecoderSpec:
    return base_spec(config, "LlamaForCausalLM")  # no window: Llama ignores config.sliding_window
