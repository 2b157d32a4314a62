"""Architecture registry: the transformers class a checkpoint loads as -> a function turning its
config into a DecoderSpec.

A new architecture is one file here and one line in ARCHITECTURES.
"""
from __future__ import annotations

import dataclasses

from trtllm.builder import moe
from trtllm.builder.architectures import (afmoe, apertus, arcee, bamba, ernie4_5, ernie4_5_moe, exaone4, gemma,
                                          gemma2, gemma3, gemma4, glm, glm4, granite, granitemoe, granitemoehybrid,
                                          helium, hunyuan, lfm2, lfm3, llama, ministral, mistral, mixtral, olmo2,
                                          olmo3, olmoe, phi3, qwen2, qwen2_moe, qwen3, qwen3_moe, smollm3)
from trtllm.builder.checkpoint import Unsupported, Weights, state_dict_numpy
from trtllm.runtime.lora import rope_pair_order

ARCHITECTURES = {
    "AfmoeForCausalLM": afmoe.spec_from_config,
    "ApertusForCausalLM": apertus.spec_from_config,
    "ArceeForCausalLM": arcee.spec_from_config,
    "BambaForCausalLM": bamba.spec_from_config,
    "Ernie4_5ForCausalLM": ernie4_5.spec_from_config,
    "Ernie4_5_MoeForCausalLM": ernie4_5_moe.spec_from_config,
    "Exaone4ForCausalLM": exaone4.spec_from_config,
    "GemmaForCausalLM": gemma.spec_from_config,
    "Gemma2ForCausalLM": gemma2.spec_from_config,
    "Gemma3ForCausalLM": gemma3.spec_from_config,
    "Gemma4ForCausalLM": gemma4.spec_from_config,
    "GlmForCausalLM": glm.spec_from_config,
    "Glm4ForCausalLM": glm4.spec_from_config,
    "GraniteForCausalLM": granite.spec_from_config,
    "GraniteMoeForCausalLM": granitemoe.spec_from_config,
    "GraniteMoeSharedForCausalLM": granitemoe.shared_spec_from_config,
    "GraniteMoeHybridForCausalLM": granitemoehybrid.spec_from_config,
    "HeliumForCausalLM": helium.spec_from_config,
    "HunYuanDenseV1ForCausalLM": hunyuan.spec_from_config,
    "Lfm2ForCausalLM": lfm2.spec_from_config,
    "Lfm2MoeForCausalLM": lfm2.moe_spec_from_config,
    "Lfm3ForCausalLM": lfm3.spec_from_config,
    "LlamaForCausalLM": llama.spec_from_config,
    "MinistralForCausalLM": ministral.spec_from_config,
    "MistralForCausalLM": mistral.spec_from_config,
    "MixtralForCausalLM": mixtral.spec_from_config,
    "Olmo2ForCausalLM": olmo2.spec_from_config,
    "Olmo3ForCausalLM": olmo3.spec_from_config,
    "OlmoeForCausalLM": olmoe.spec_from_config,
    "Phi3ForCausalLM": phi3.spec_from_config,
    "Qwen2ForCausalLM": qwen2.spec_from_config,
    "Qwen2MoeForCausalLM": qwen2_moe.spec_from_config,
    "Qwen3ForCausalLM": qwen3.spec_from_config,
    "Qwen3MoeForCausalLM": qwen3_moe.spec_from_config,
    "SmolLM3ForCausalLM": smollm3.spec_from_config,
}


# A layer's module names where a checkpoint's differ from those DecoderWriter reads (Llama's, and
# Gemma's four norms with sandwich_norms): Hunyuan's q/k norms; GLM-4's norms on the attention and MLP
# outputs, its pre-MLP norm keeping Llama's name for it
RENAMES = {
    "AfmoeForCausalLM": {"pre_mlp_layernorm": "pre_feedforward_layernorm",
                         "post_mlp_layernorm": "post_feedforward_layernorm"},
    "ApertusForCausalLM": {"attention_layernorm": "input_layernorm",
                           "feedforward_layernorm": "post_attention_layernorm"},
    "BambaForCausalLM": bamba.RENAMES,
    "HunYuanDenseV1ForCausalLM": {"query_layernorm": "q_norm", "key_layernorm": "k_norm"},
    "Glm4ForCausalLM": {"post_self_attn_layernorm": "post_attention_layernorm",
                        "post_attention_layernorm": "pre_feedforward_layernorm",
                        "post_mlp_layernorm": "post_feedforward_layernorm"},
    # LFM2's (its convolutions' out_proj too: conv.o_proj)
    "Lfm2ForCausalLM": {"out_proj": "o_proj", "q_layernorm": "q_norm", "k_layernorm": "k_norm",
                        "feed_forward": "mlp", "w1": "gate_proj", "w3": "up_proj", "w2": "down_proj",
                        "operator_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
                        "embedding_norm": "norm"},
}
RENAMES["Lfm2MoeForCausalLM"] = RENAMES["Lfm2ForCausalLM"]  # (its router feed_forward.gate: mlp.gate)
RENAMES["Lfm3ForCausalLM"] = lfm3.renames  # (a function of the spec: its norms' names hang on sandwich_norms)


def spec_for(model):
    """The DecoderSpec of a loaded transformers model, or a ValueError naming the supported ones.

    The class is the one transformers built (from config.model_type), not config.architectures:
    the weights went into that class, whatever the config's label says. What the class reads from
    the config is then checked against its modules, since a config may carry keys a class ignores
    (sliding_window on Llama) or a class may do more than a key says (attention_bias also puts a
    bias on Llama's o_proj)."""
    spec = spec_of_class(type(model).__name__, model.config)
    if spec.num_kv_heads < 1 or spec.num_heads % spec.num_kv_heads:  # (grouped-query attention shares each kv head)
        raise Unsupported(f"num_attention_heads ({spec.num_heads}) must be a multiple of num_key_value_heads "
                          f"({spec.num_kv_heads}): each key/value head serves a group of query heads (transformers "
                          "cannot run it either)")
    return dataclasses.replace(spec, **from_modules(model, spec))


def spec_of_class(name: str, config):
    """The DecoderSpec the config gives class `name` (what it refuses raised), before its modules are read."""
    if name not in ARCHITECTURES:
        raise Unsupported(f"the checkpoint loads as {name} (config.model_type "
                          f"{getattr(config, 'model_type', None)!r}); supported: {sorted(ARCHITECTURES)}")
    return ARCHITECTURES[name](config)


def refuse_before_loading(config) -> None:
    """What spec_for would refuse from the config alone (a class without a graph, a config its class's graph
    does not take: granite-4.0-h's Mamba-2 layers), said before the weights load: a large checkpoint took
    minutes to load, or more memory than the machine has, before it was refused. A model_type transformers
    does not map to a causal LM is left to its own loader's error."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    name = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(getattr(config, "model_type", None))
    if name is not None:
        spec_of_class(name, config)


def from_modules(model, spec) -> dict:
    """The biases and the lm_head tie as the loaded modules have them; refuses what the graph lacks."""
    layers = model.model.layers
    # (the first attention layer's: LFM2's first layers are convolutions, and its MLP is feed_forward, w1
    # w3 w2, without biases)
    # (Granite 4's Mamba layers: self_attn None)
    attn = next(layer.self_attn for layer in layers if getattr(layer, "self_attn", None) is not None)
    if spec.moe is not None:
        moe.check_modules(layers, spec)
    # the MLP's biases, on a dense layer (a mixture of experts has none: moe.check_modules)
    mlp = next((layer.mlp for i, layer in enumerate(layers) if hasattr(layer, "mlp") and
                (spec.moe is None or i in spec.moe.dense_layers or spec.moe.beside_dense)), None)

    def has_bias(module) -> bool:
        return getattr(module, "bias", None) is not None

    fused = spec.fused_projections  # Phi-3's qkv_proj and gate_up_proj
    qkv = {has_bias(m) for m in ((attn.qkv_proj,) if fused else (attn.q_proj, attn.k_proj, attn.v_proj))}
    if len(qkv) > 1:
        raise Unsupported("q_proj, k_proj and v_proj must all have a bias or none")
    if mlp is not None:
        gate_up = (mlp.gate_up_proj,) if fused or spec.fused_gate_up else \
            (mlp.up_proj,) if not spec.gated_mlp else (mlp.gate_proj, mlp.up_proj)  # (GLM: gate|up; Arcee: up)
        if any(has_bias(m) for m in gate_up + (mlp.down_proj,)):
            raise Unsupported("MLP biases (config.mlp_bias) are not supported")
    expected = [spec.window(i) for i in range(len(layers))]
    # the window a layer's attention uses: EXAONE 4's keeps config.sliding_window on every layer, and
    # applies it where is_sliding
    windows = [w if getattr(layer, "self_attn", None) is None else  # (a convolution or Mamba layer: no window)
               getattr(layer.self_attn, "sliding_window", w) if getattr(layer.self_attn, "is_sliding", True) else None
               for layer, w in zip(layers, expected)]
    if windows != expected:  # a class that keeps its window per layer says what it uses
        raise Unsupported(f"the layers' sliding windows {windows} differ from what the config gives ({expected})")
    head = model.get_output_embeddings().weight
    tied = head.data_ptr() == model.get_input_embeddings().weight.data_ptr()
    out = getattr(attn, "o_proj", None) or attn.out_proj  # (LFM2's name)
    return {"attention_bias": qkv.pop(), "o_proj_bias": has_bias(out), "tie_word_embeddings": tied}


def weights_of(model, spec) -> Weights:
    """The checkpoint's weights as DecoderWriter reads them: float32 numpy under transformers' names,
    with module names RENAMES maps, projections a checkpoint stores whole (Phi-3's qkv_proj and
    gate_up_proj, GLM's gate_up_proj) split into q/k/v and gate/up, which the graph fuses again its own
    way, and an interleaved RoPE's q and k rows reordered for the graph's rotate-half RoPE."""
    w = state_dict_numpy(model)
    names = RENAMES.get(spec.architecture, {})
    names = names(spec) if callable(names) else names
    if names:  # all at once: a name may be another's new name (GLM-4's post_attention_layernorm)
        w = w.renamed(lambda k: ".".join(names.get(part, part) for part in k.split(".")))
    if spec.module_names:  # a layer's modules the class names otherwise (Granite 4's shared_mlp as its MLP)
        ours = {theirs: mine for mine, theirs in spec.module_names}
        w = w.renamed(lambda k: module_renamed(k, ours))
    if spec.interleaved_rope:
        reorder_rope_rows(w, spec)
    if spec.moe is not None:
        moe.canonical_names(w, spec)
    if not (spec.fused_projections or spec.fused_gate_up):
        return w
    q, kv = spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
    for i in range(spec.num_layers):
        p = f"model.layers.{i}"
        for suffix in ("weight", "bias"):
            if f"{p}.self_attn.qkv_proj.{suffix}" in w:
                w.split(f"{p}.self_attn.qkv_proj.{suffix}", [f"{p}.self_attn.{n}_proj.{suffix}" for n in "qkv"],
                        [q, q + kv])
        w.split(f"{p}.mlp.gate_up_proj.weight", [f"{p}.mlp.gate_proj.weight", f"{p}.mlp.up_proj.weight"], 2)
    return w


def module_renamed(key: str, ours: dict[str, str]) -> str:
    """A layer's weight under our module name (model.layers.N.<theirs>.weight -> model.layers.N.<ours>.weight)."""
    parts = key.split(".")
    if parts[:2] == ["model", "layers"] and len(parts) > 3:
        for n in range(4, len(parts)):
            if ".".join(parts[3:n]) in ours:
                return ".".join(parts[:3] + [ours[".".join(parts[3:n])]] + parts[n:])
    return key


def reorder_rope_rows(w: Weights, spec) -> None:
    """q and k rows (weights, biases, per-head norm weights) in rope_pair_order, in place: the graph's
    rotate-half RoPE then computes the checkpoint's interleaved one, and every score is unchanged."""
    if spec.fused_projections:
        raise Unsupported("an interleaved RoPE with q|k|v stored whole is not supported")
    rotary = spec.rotary_dim or spec.head_dim
    for i in range(spec.num_layers):
        for name, heads in (("q", spec.num_heads), ("k", spec.num_kv_heads)):
            order = rope_pair_order(heads * spec.head_dim, spec.head_dim, rotary)
            for key in (f"{name}_proj.weight", f"{name}_proj.bias", f"{name}_norm.weight"):
                key = f"model.layers.{i}.self_attn.{key}"
                rows = w.shape(key)[0] if key in w else None
                if rows == len(order):  # a norm over one head (Qwen3's) has one head's order
                    w.derive(key, key, lambda a, order=order: a[order])
                elif rows == spec.head_dim:
                    w.derive(key, key, lambda a, order=order[:spec.head_dim]: a[order])
