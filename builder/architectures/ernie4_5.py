"""ERNIE 4.5 dense (Ernie4_5ForCausalLM: ERNIE-4.5-0.3B and its -Base; model_type ernie4_5).

Llama's layout with an interleaved RoPE (each head's pairs (2i, 2i + 1) turned together), which the
graph computes by reordering q and k (DecoderSpec.interleaved_rope), and config.use_bias for every
projection (the released checkpoints have none; MLP biases are refused)."""
from __future__ import annotations

from trtllm.builder.architectures.llama import base_spec
from trtllm.builder.checkpoint import Unsupported


def refuse_bias(config) -> None:
    """config.use_bias (ERNIE 4.5's, dense and MoE) puts biases on the MLP too, which are not supported."""
    if getattr(config, "use_bias", False):
        raise Unsupported("config.use_bias must be false: it puts biases on the MLP too, which are not supported")


def spec_from_config(config):
    refuse_bias(config)
    return base_spec(config, "Ernie4_5ForCausalLM", interleaved_rope=True)
