"""Llama (and the SmolLM2 demo model): the base decoder every other architecture tweaks.

The biases and the lm_head tie are then taken from the loaded modules (architectures.spec_for)."""
from __future__ import annotations

from trtllm.builder.checkpoint import Unsupported
from trtllm.builder.decoder_spec import DecoderSpec


SILU = {"silu": "silu", "swish": "silu"}  # transformers' names of the same function


def check_common(config, act_key: str = "hidden_act", acts: dict = SILU) -> str:
    """Refuse config features the graph does not implement, rather than export something wrong; the
    MLP's activation as DecoderSpec names it (acts: config value -> name)."""
    act = getattr(config, act_key, "silu")
    if act not in acts:
        raise Unsupported(f"config.{act_key} must be {' or '.join(map(repr, acts))}, got {act!r}")
    if getattr(config, "mlp_bias", False):
        raise Unsupported("config.mlp_bias must be false, got True")
    return acts[act]


def base_spec(config, architecture: str, act: tuple[str, dict] = ("hidden_act", SILU),
              **overrides) -> DecoderSpec:
    hidden_act = check_common(config, *act)
    # (read only where the architecture does not give them: Gemma 4's config refuses to name one for all layers)
    head_dim = overrides.get("head_dim") or getattr(config, "head_dim", None) or \
        config.hidden_size // config.num_attention_heads
    kv_heads = overrides.get("num_kv_heads") or getattr(config, "num_key_value_heads", None) or \
        config.num_attention_heads
    fields = dict(
        architecture=architecture,
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=overrides.get("intermediate_size") or config.intermediate_size,
        num_layers=config.num_hidden_layers,
        num_heads=config.num_attention_heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        rms_norm_eps=overrides.get("rms_norm_eps") or config.rms_norm_eps,
        attention_bias=bool(getattr(config, "attention_bias", False)),
        tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
        hidden_act=hidden_act,
    )
    fields.update(overrides)
    return DecoderSpec(**fields)


def spec_from_config(config) -> DecoderSpec:
    return base_spec(config, "LlamaForCausalLM")  # no window: Llama ignores config.sliding_window
