"""Gemma 4, text (Gemma4ForCausalLM: model_type gemma4_text; gemma-4-E2B, -E4B, -31B's language model).

Gemma 3's layout (scaled embeddings, four norms a layer, a GELU (tanh) MLP, sliding layers between full
ones with a RoPE table each) with these changes, each a DecoderSpec field:
- its RMSNorms scale by w, not 1 + w, and q, k and v are each normed per head (v without a scale); the
  scores are not scaled (scaling 1.0);
- full-attention layers have heads of their own size (global_head_dim, 512 in E2B against 256) and may
  have kv heads of their own; their RoPE ("proportional") turns only the first quarter of each head's
  frequencies, a table as wide as the head with the rest at frequency 0 (cos 1, sin 0: exact);
- the last num_kv_shared_layers layers compute no K and V: each attends over those of the last earlier
  layer of its kind, which the engine keeps once (manifest model.kv_layers);
- per-layer embeddings (PLE): a second table gives each token a small vector per layer, which with a
  projection of its embedding joins each layer's output through a gate (builder/per_layer.py), and
  each layer's output is times its layer_scalar;
- the KV-sharing layers' MLPs may be twice as wide (use_double_wide_mlp: their weights say so), and
  attention_k_eq_v takes a full layer's v from its k projection.
- enable_moe_block (gemma-4-26B-A4B): each layer's dense MLP has a mixture of experts beside it, each
  normed on its own and their outputs added (builder/moe.py, `beside_dense`).
Not taken: attention both ways over the whole text (use_bidirectional_attention "all")."""
from __future__ import annotations

from trtllm.builder.architectures.gemma3 import GELU_TANH, softcap
from trtllm.builder.architectures.llama import base_spec
from trtllm.builder.architectures.mistral import layer_windows
from trtllm.builder.checkpoint import Unsupported
from trtllm.builder.moe import moe_from_config


def layer_shapes(config, layers: list[int]) -> tuple[int, int] | None:
    """The (head_dim, kv heads) that per_layer_config gives every one of `layers`, or None for none."""
    shapes = {(int(config.per_layer_config[i].head_dim), int(config.per_layer_config[i].num_key_value_heads))
              for i in layers}
    if len(shapes) > 1:
        raise Unsupported(f"layers of one kind must share a head size and kv head count, got {sorted(shapes)}")
    return shapes.pop() if shapes else None


def spec_from_config(config):
    # (Gemma4TextRouter always divides the chosen weights by their sum)
    moe = moe_from_config(config, "num_experts", "moe_intermediate_size", True, top_k_key="top_k_experts",
                          router_module="router.proj", beside_dense=True) \
        if getattr(config, "enable_moe_block", False) else None
    if getattr(config, "use_bidirectional_attention", None) == "all":
        raise Unsupported("config.use_bidirectional_attention 'all' is not supported: the engine decodes causally")
    windows = layer_windows(config)
    sliding = set(windows["sliding_layers"] or ())
    local = layer_shapes(config, sorted(sliding))
    full = layer_shapes(config, [i for i in range(config.num_hidden_layers) if i not in sliding])
    head_dim, kv_heads = local or full
    global_dim, global_kv = full or local
    shared = int(getattr(config, "num_kv_shared_layers", 0) or 0)
    if not 0 <= shared < config.num_hidden_layers:
        raise Unsupported(f"config.num_kv_shared_layers must be below num_hidden_layers ({config.num_hidden_layers}), "
                          f"got {shared}")
    ple = int(getattr(config, "hidden_size_per_layer_input", 0) or 0)
    if ple and getattr(config, "vocab_size_per_layer_input", config.vocab_size) != config.vocab_size:
        raise Unsupported(f"config.vocab_size_per_layer_input ({config.vocab_size_per_layer_input}) must be the "
                          f"vocabulary size ({config.vocab_size})")
    return base_spec(config, "Gemma4ForCausalLM", act=("hidden_activation", GELU_TANH), **windows,
                     head_dim=head_dim, num_kv_heads=kv_heads,
                     global_head_dim=global_dim if global_dim != head_dim else None,
                     global_kv_heads=global_kv if global_kv != kv_heads else None,
                     embed_scale=float(config.hidden_size) ** 0.5, sandwich_norms=True, query_scale=1.0,
                     final_softcap=softcap(config, "final_logit_softcapping"), qk_norm=True, v_norm=True,
                     local_rope=bool(sliding), kv_shared_layers=shared,
                     value_is_key=bool(getattr(config, "attention_k_eq_v", False)),
                     per_layer_input=ple, layer_scalars=True, moe=moe,
                     # (transformers widens the MLP of the layers that read another's KV: kv_sharing_modes "reuse")
                     wide_mlp_layers=tuple(range(config.num_hidden_layers - shared, config.num_hidden_layers))
                     if shared and getattr(config, "use_double_wide_mlp", False) else ())
