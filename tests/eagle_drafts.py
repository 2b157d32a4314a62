"""Random EAGLE-3 draft heads for tests, in the trainers' format (the reference they are checked
with is builder/eagle_reference.py)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np


def random_draft(target_dir: Path, out_dir: Path, seed: int = 0, draft_vocab: int | None = None,
                 aux: list[int] | None = None, std: float = 2.0, intermediate_size: int | None = None) -> Path:
    """A random EAGLE-3 head for the checkpoint in target_dir (its shapes, RoPE and vocabulary; an
    MLP width of its own if given). A smaller draft vocabulary takes every other target id from 3 on
    (d2t then maps it back)."""
    from safetensors.numpy import save_file

    cfg = json.loads((Path(target_dir) / "config.json").read_text())
    cfg = cfg.get("text_config") or cfg  # (a vision-language model's: its language model's)
    h, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    kv, d, inter, vocab = cfg["num_key_value_heads"], cfg.get("head_dim") or h // heads, cfg["intermediate_size"], \
        cfg["vocab_size"]
    inter = intermediate_size or inter
    vd = draft_vocab or vocab
    ids = np.arange(vd) if vd == vocab else 3 + 2 * np.arange(vd)
    rng = np.random.default_rng(seed)

    def w(*shape):
        return (rng.standard_normal(shape) * std / shape[-1] ** 0.5).astype(np.float32)

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    tensors = {"fc.weight": w(h, 3 * h), "norm.weight": norm(h), "lm_head.weight": w(vd, h),
               "midlayer.input_layernorm.weight": norm(h), "midlayer.hidden_norm.weight": norm(h),
               "midlayer.post_attention_layernorm.weight": norm(h),
               "midlayer.self_attn.q_proj.weight": w(heads * d, 2 * h), "midlayer.self_attn.k_proj.weight": w(kv * d, 2 * h),
               "midlayer.self_attn.v_proj.weight": w(kv * d, 2 * h), "midlayer.self_attn.o_proj.weight": w(h, heads * d),
               "midlayer.mlp.gate_proj.weight": w(inter, h), "midlayer.mlp.up_proj.weight": w(inter, h),
               "midlayer.mlp.down_proj.weight": w(h, inter),
               "d2t": (ids - np.arange(vd)).astype(np.int64), "t2d": np.isin(np.arange(vocab), ids)}
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out_dir / "model.safetensors"))
    rope = {k: cfg[k] for k in ("rope_theta", "rope_parameters", "rope_scaling") if cfg.get(k) is not None}
    params = cfg.get("rope_parameters") or {}
    per_type = bool(params) and all(isinstance(v, dict) for v in params.values())  # (LFM3: a set per layer type)
    params = params.get("full_attention", next(iter(params.values()))) if per_type else params
    if per_type or params.get("partial_rotary_factor", 1.0) != 1.0:
        # the head is a Llama layer, which rotates whole heads (the builder refuses a partial factor):
        # the model's base, without its scaling (Phi-4-mini's LongRoPE factors are for half a head)
        rope = {"rope_parameters": {"rope_type": "default", "rope_theta": params["rope_theta"]}}
    config = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": h,
              "intermediate_size": inter, "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": d,
              "num_hidden_layers": 1, "rms_norm_eps": cfg.get("rms_norm_eps", cfg.get("norm_eps")), "vocab_size": vocab,
              "draft_vocab_size": vd, "max_position_embeddings": cfg["max_position_embeddings"], **rope}
    if aux is not None:
        config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": aux}
    (out_dir / "config.json").write_text(json.dumps(config, indent=2))
    return out_dir
