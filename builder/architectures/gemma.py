"""Gemma (GemmaForCausalLM: gemma-2b, gemma-7b, gemma-1.1 and CodeGemma; model_type gemma).

Llama's layout with three of Gemma 3's changes: the token embeddings times sqrt(hidden_size), every
RMSNorm scaling by 1 + weight, and a GELU (tanh) gated MLP (config.hidden_act; transformers reads a
legacy "gelu" there as the tanh form)."""
from __future__ import annotations

from trtllm.builder.architectures.gemma3 import GELU_TANH
from trtllm.builder.architectures.llama import base_spec


def spec_from_config(config):
    return base_spec(config, "GemmaForCausalLM", act=("hidden_act", GELU_TANH),
                     embed_scale=float(config.hidden_size) ** 0.5, norm_offset=1.0)
