"""Granite 4.0 (GraniteMoeHybridForCausalLM, model_type granitemoehybrid) where every layer is attention:
granite-4.0-micro, granite-4.0-1b and granite-4.0-350m (dense), and the same layers with experts.

Granite's four multipliers (builder/architectures/granite.py) on every layer. A dense model's MLP is the
class's shared_mlp, its input_linear holding gate|up (split for the graph, as GLM's gate_up_proj; LoRA
names the checkpoint's modules: DecoderSpec.module_names); with num_local_experts, Granite MoE's
mixture beside it (builder/architectures/granitemoe.py). RoPE where position_embedding_type is "rope",
else none on any layer. The hybrid releases (granite-4.0-h-*) put Mamba-2 layers between the attention
ones, which the graph has no layer for: refused."""
from __future__ import annotations

from trtllm.builder.architectures import granitemoe
from trtllm.builder.architectures.granite import multipliers
from trtllm.builder.architectures.llama import base_spec
from trtllm.builder.checkpoint import Unsupported

NAME = "GraniteMoeHybridForCausalLM"


def spec_from_config(config):
    kinds = list(config.layer_types)
    # (transformers reads the hub's "mamba" and "attention" as linear_attention and full_attention, and builds
    # attention on every layer but a linear_attention one)
    mamba = [i for i, kind in enumerate(kinds) if kind in ("linear_attention", "mamba")]
    if mamba:
        raise Unsupported(f"{NAME}: layers {mamba} of {config.num_hidden_layers} are Mamba-2 layers "
                          f"(config.layer_types: {sorted(set(kinds))}), which the graph has no layer for: a hybrid "
                          "release (granite-4.0-h-*); granite-4.0-micro, -1b and -350m are attention only")
    nope = {} if config.position_embedding_type == "rope" else {"nope_layers": tuple(range(config.num_hidden_layers))}
    size = int(config.shared_intermediate_size)
    if config.num_local_experts:
        return granitemoe.spec(config, NAME, shared_size=size, **nope)
    return base_spec(config, NAME, intermediate_size=size, fused_gate_up=True,
                     module_names=(("mlp.gate_up_proj", "shared_mlp.input_linear"),
                                   ("mlp.down_proj", "shared_mlp.output_linear")),
                     **nope, **multipliers(config))
