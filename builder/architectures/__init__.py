"""Architecture registry: HF `architectures[0]` -> a function turning its config into a DecoderSpec.

A new architecture is one file here and one line in ARCHITECTURES.
"""
from __future__ import annotations

from trtllm.builder.architectures import llama, mistral, qwen2, qwen3

ARCHITECTURES = {
    "LlamaForCausalLM": llama.spec_from_config,
    "MistralForCausalLM": mistral.spec_from_config,
    "Qwen2ForCausalLM": qwen2.spec_from_config,
    "Qwen3ForCausalLM": qwen3.spec_from_config,
}


def spec_for(config, model_class: str | None = None):
    """The DecoderSpec for a transformers config, or a ValueError naming the supported ones.
    `model_class` (the loaded model's class name) stands in when the config names no
    architecture, as with checkpoints loaded from GGUF."""
    names = list(getattr(config, "architectures", None) or []) or ([model_class] if model_class else [])
    for name in names:
        if name in ARCHITECTURES:
            return ARCHITECTURES[name](config)
    raise ValueError(f"config.architectures must name one of {sorted(ARCHITECTURES)}, got {names!r}")
