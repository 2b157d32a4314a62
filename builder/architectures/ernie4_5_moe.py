"""ERNIE 4.5 MoE (Ernie4_5_MoeForCausalLM: ERNIE-4.5-21B-A3B and its -Base, -PT; model_type ernie4_5_moe).

ERNIE 4.5's layers (builder/architectures/ernie4_5.py: Llama's with an interleaved RoPE) with a mixture
of experts (builder/moe.py) in place of the MLP on the layers from moe_layer_start_index to
moe_layer_end_index, every moe_layer_interval-th, the others dense: the router's softmax in float32,
the experts chosen by the scores plus e_score_correction_bias (moe_statics) and weighted by the scores
alone, divided by their sum clamped below at moe_norm_min; moe_num_shared_experts shared experts as one
MLP of their summed width on every token, ungated."""
from __future__ import annotations

from trtllm.builder.architectures.ernie4_5 import refuse_bias
from trtllm.builder.architectures.llama import base_spec
from trtllm.builder.checkpoint import Unsupported
from trtllm.builder.moe import SHARED_EXPERTS_NAMES, moe_from_config, positive


def moe_layers(config) -> tuple[int, ...]:
    """The layers Ernie4_5_MoeDecoderLayer gives experts."""
    step, first, last = (int(getattr(config, key)) for key in
                         ("moe_layer_interval", "moe_layer_start_index", "moe_layer_end_index"))
    if step < 1:
        raise Unsupported(f"config.moe_layer_interval must be a positive integer, got {step}")
    return tuple(i for i in range(config.num_hidden_layers) if (i + 1) % step == 0 and first <= i <= last)


def spec_from_config(config):
    refuse_bias(config)
    norm_min = config.moe_norm_min
    if isinstance(norm_min, bool) or not isinstance(norm_min, (int, float)) or not norm_min >= 0:
        raise Unsupported(f"config.moe_norm_min must be a number >= 0, got {norm_min!r}")
    shared = int(config.moe_num_shared_experts or 0)
    if shared < 0:
        raise Unsupported(f"config.moe_num_shared_experts must be >= 0, got {shared}")
    sparse = moe_layers(config)
    moe = moe_from_config(config, "num_experts", "moe_intermediate_size", True,
                          shared_size=shared * positive(config, "moe_intermediate_size"),
                          dense_layers=tuple(i for i in range(config.num_hidden_layers) if i not in sparse),
                          selection_bias=True, norm_min=float(norm_min))
    # (its shared experts are one MLP under mlp.shared_experts: the graph's mlp.shared_expert)
    return base_spec(config, "Ernie4_5_MoeForCausalLM", moe=moe, interleaved_rope=True,
                     module_names=SHARED_EXPERTS_NAMES)
