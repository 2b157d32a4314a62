"""Granite 4.0 (GraniteMoeHybridForCausalLM, model_type granitemoehybrid): granite-4.0-micro, -1b and -350m
(attention only), the hybrid releases granite-4.0-h-micro, -h-1b, -h-350m (Mamba-2 layers between the
attention ones: builder/mamba.py) and -h-tiny, -h-small (with experts).

Granite's four multipliers (builder/architectures/granite.py) on every layer. A dense model's MLP is the
class's shared_mlp, its input_linear holding gate|up (split for the graph, as GLM's gate_up_proj; LoRA
names the checkpoint's modules: DecoderSpec.module_names); with num_local_experts, Granite MoE's
mixture beside it (builder/architectures/granitemoe.py). RoPE where position_embedding_type is "rope",
else none on any layer."""
from __future__ import annotations

from trtllm.builder.architectures import granitemoe
from trtllm.builder.architectures.granite import multipliers
from trtllm.builder.architectures.llama import base_spec
from trtllm.builder.checkpoint import Unsupported
from trtllm.builder.mamba import Mamba

NAME = "GraniteMoeHybridForCausalLM"


def spec_from_config(config):
    kinds = list(config.layer_types)
    # (transformers reads the hub's "mamba" and "attention" as linear_attention and full_attention, and builds
    # attention on every layer but a linear_attention one)
    mamba = tuple(i for i, kind in enumerate(kinds) if kind in ("linear_attention", "mamba"))
    layers = mamba_fields(config, mamba, NAME, "config.layer_types")
    nope = {} if config.position_embedding_type == "rope" else {"nope_layers": tuple(range(config.num_hidden_layers))}
    size = int(config.shared_intermediate_size)
    if config.num_local_experts:
        return granitemoe.spec(config, NAME, shared_size=size, **nope, **layers)
    return base_spec(config, NAME, intermediate_size=size, fused_gate_up=True,
                     module_names=(("mlp.gate_up_proj", "shared_mlp.input_linear"),
                                   ("mlp.down_proj", "shared_mlp.output_linear")),
                     **nope, **layers, **multipliers(config))


def mamba_fields(config, mamba: tuple[int, ...], name: str, where: str) -> dict:
    """The DecoderSpec fields of the Mamba-2 layers `mamba` (none: {}); a model of Mamba layers alone is
    refused (`where`: the config key that says which layers are which)."""
    if len(mamba) == config.num_hidden_layers:
        raise Unsupported(f"{name}: every layer is a Mamba-2 layer ({where}), and the graph needs at least one "
                          "attention layer")
    return {"mamba_layers": mamba, "mamba": mamba_shape(config, name)} if mamba else {}


def mamba_shape(config, name: str = NAME) -> Mamba:
    """The hybrid releases' Mamba-2 layers (builder/mamba.py; Bamba's too), refusing what their graph does
    not compute: another activation than SiLU, a time step limit (transformers applies it to a prompt's
    scan but not to a generated token's)."""
    if config.hidden_act != "silu":
        raise Unsupported(f"{name}: the Mamba-2 layers' hidden_act {config.hidden_act!r}: the graph's convolution "
                          "and gate take silu only")
    limit = tuple(config.time_step_limit) if config.time_step_limit is not None else (0.0, float("inf"))
    if limit != (0.0, float("inf")):
        raise Unsupported(f"{name}: time_step_limit {list(limit)}: only (0, inf), no limit, is taken")
    heads, groups = int(config.mamba_n_heads), int(config.mamba_n_groups)
    if heads % groups:
        raise Unsupported(f"{name}: mamba_n_heads {heads} must be a multiple of mamba_n_groups {groups}")
    return Mamba(heads=heads, head_dim=int(config.mamba_d_head), state_size=int(config.mamba_d_state),
                 groups=groups, conv_kernel=int(config.mamba_d_conv), conv_bias=bool(config.mamba_conv_bias),
                 proj_bias=bool(config.mamba_proj_bias))
