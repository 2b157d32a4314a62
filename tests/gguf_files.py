"""Tiny GGUF files from the tiny checkpoints, laid out as llama.cpp's converter writes a Llama:
float32 tensors under GGUF names, q/k rows permuted for its RoPE, a GPT-2 style BPE vocabulary."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

LAYER_NAMES = {"input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
               "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
               "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
               "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
               "mlp.down_proj.weight": "ffn_down.weight",
               # Phi-3's fused projections, as llama.cpp writes them (its RoPE is NeoX's: no row order change)
               "self_attn.qkv_proj.weight": "attn_qkv.weight", "mlp.gate_up_proj.weight": "ffn_up.weight",
               # Qwen2's q/k/v biases
               "self_attn.q_proj.bias": "attn_q.bias", "self_attn.k_proj.bias": "attn_k.bias",
               "self_attn.v_proj.bias": "attn_v.bias"}
# Gemma 2's and 3's norms around each block (its post_attention_layernorm is its own, not Llama's ffn_norm)
GEMMA_NAMES = {**LAYER_NAMES, "post_attention_layernorm.weight": "post_attention_norm.weight",
               "pre_feedforward_layernorm.weight": "ffn_norm.weight",
               "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
               "self_attn.q_norm.weight": "attn_q_norm.weight", "self_attn.k_norm.weight": "attn_k_norm.weight"}
TOP_NAMES = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}


def gguf_name(key: str, names: dict = LAYER_NAMES) -> str:
    if key.startswith("model.layers."):
        _, _, layer, rest = key.split(".", 3)
        return f"blk.{layer}.{names[rest]}"
    return TOP_NAMES[key]


def rope_rows(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's order of a q/k projection's rows: each head's two halves interleaved."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def writer(out: Path, arch: str, cfg: dict):
    """A GGUFWriter with the keys every architecture's converter writes from the config."""
    import gguf

    w = gguf.GGUFWriter(str(out), arch)
    w.add_name("tiny")
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    rope = cfg.get("rope_parameters") or {}
    w.add_rope_freq_base(cfg.get("rope_theta") or rope.get("full_attention", rope).get("rope_theta", 10000.0))
    return w


def add_tokenizer(w, ckpt: Path, cfg: dict, pre: str | None, mask: bool = False) -> None:
    """The tiny checkpoint's byte-level BPE as llama.cpp's converter writes it (`mask`: Gemma's <mask>
    added where the vocabulary lacks it, as transformers' Gemma tokenizer adds it)."""
    import gguf

    tokenizer = json.loads((ckpt / "tokenizer.json").read_text())
    added = {a["id"]: a["content"] for a in tokenizer["added_tokens"]}
    tokens = {**{i: t for t, i in tokenizer["model"]["vocab"].items()}, **added}
    if mask and "<mask>" not in tokens.values():
        added[len(tokens)] = tokens[len(tokens)] = "<mask>"
    w.add_tokenizer_model("gpt2")
    if pre is not None:
        w.add_tokenizer_pre(pre)
    w.add_token_list([tokens[i] for i in range(len(tokens))])
    w.add_token_types([gguf.TokenType.CONTROL if i in added else gguf.TokenType.NORMAL for i in range(len(tokens))])
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in tokenizer["model"]["merges"]])
    w.add_bos_token_id(cfg["bos_token_id"])
    w.add_eos_token_id(cfg["eos_token_id"])
    if cfg.get("pad_token_id") is not None:
        w.add_pad_token_id(cfg["pad_token_id"])


def write_llama_gguf(ckpt: Path, out: Path, drop: tuple[str, ...] = (), extra_tensors: dict | None = None,
                     rope_scaling: tuple[str, float] | None = None, fields: dict | None = None,
                     arch: str = "llama", rope_dims: int | None = None, original_context: bool = True,
                     attn_factor: float | None = None, pre: str | None = "gpt-2",
                     weight_type: str | None = None) -> Path:
    """`ckpt` (a tiny Llama checkpoint) as a GGUF; `drop` leaves tensors out (GGUF names),
    `rope_scaling` = (type, factor) adds llama.cpp's scaling keys, `fields` more keys: name -> float
    (float32), int (uint16) or str; `arch` labels it another architecture (general.architecture):
    "qwen2" a Qwen2 checkpoint's (its q/k/v biases, q/k rows as they are); "phi3" writes a Phi-3
    checkpoint's keys as llama.cpp's converter does (its sliding window, 0 for none; its original
    context); "gemma2" and "gemma3" a Gemma's (its norms' weights plus 1, q and k rows as they are,
    the head size, window and soft-caps); `rope_dims` the rotary dimensions it gives (default: the
    head's, or its partial_rotary_factor's share); a phi3 with LongRoPE gets its factors as the
    tensors rope_factors_long/short.weight and the attention factor, as llama.cpp's converter writes
    them (`drop` can leave those tensors out too; `original_context` False leaves out the context
    its short factors hold, `attn_factor` sets the attention factor written, 0 leaves it out); `pre`
    is its tokenizer.ggml.pre (llama.cpp's name for how text is split before merging; None: no key;
    the tiny tokenizers split as GPT-2); `weight_type` (a GGML type gguf-py quantizes: "Q4_0", "Q8_0")
    stores the layers' projections so, as llama-quantize would."""
    import gguf
    from safetensors.numpy import load_file

    cfg = json.loads((ckpt / "config.json").read_text())
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    w = writer(out, arch, cfg)
    rope = cfg.get("rope_parameters") or {}
    gemma = arch in ("gemma2", "gemma3")
    if gemma:  # (the converter leaves the window out where no layer slides, the soft-caps where none)
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
        if cfg.get("sliding_window"):
            w.add_sliding_window(cfg["sliding_window"])
        for name in ("attn_logit_softcapping", "final_logit_softcapping"):
            if cfg.get(name) is not None:
                w.add_float32(f"{arch}.{name}", cfg[name])
    w.add_rope_dimension_count(rope_dims or int(head_dim * rope.get("partial_rotary_factor", 1.0)))
    if arch == "phi3":
        w.add_sliding_window(cfg.get("sliding_window") or 0)
        original = cfg.get("original_max_position_embeddings") or cfg["max_position_embeddings"]
        if original_context:
            w.add_rope_scaling_orig_ctx_len(original)
        if rope.get("rope_type") == "longrope":  # (the converter's generate_extra_tensors)
            scale = cfg["max_position_embeddings"] / original
            if attn_factor is None:  # (the converter's rule, transformers' too)
                attn_factor = math.sqrt(1 + math.log(scale) / math.log(original)) if scale > 1 else 1.0
            if attn_factor:  # (0: the key left out)
                w.add_rope_scaling_attn_factors(attn_factor)
            extra_tensors = {"rope_factors_long.weight": np.array(rope["long_factor"], np.float32),
                             "rope_factors_short.weight": np.array(rope["short_factor"], np.float32),
                             **(extra_tensors or {})}
    if rope_scaling:
        w.add_rope_scaling_type(gguf.RopeScalingType(rope_scaling[0]))
        w.add_rope_scaling_factor(rope_scaling[1])
    for name, field in (fields or {}).items():
        (w.add_string if isinstance(field, str) else w.add_float32 if isinstance(field, float) else w.add_uint16)(
            name, field)
    add_tokenizer(w, ckpt, cfg, pre, mask=gemma)
    for key, value in load_file(ckpt / "model.safetensors").items():
        name = gguf_name(key, GEMMA_NAMES if gemma else LAYER_NAMES)
        if name in drop:
            continue
        if gemma:  # (llama.cpp multiplies by the weight: Gemma's 1 + w is stored)
            value = value + 1 if "norm" in name else value
        elif arch != "qwen2" and name.endswith("attn_q.weight"):  # (Qwen2's RoPE is NeoX's: rows as they are)
            value = rope_rows(value, cfg["num_attention_heads"])
        elif arch != "qwen2" and name.endswith("attn_k.weight"):
            value = rope_rows(value, cfg["num_key_value_heads"])
        if weight_type and name.startswith("blk.") and value.ndim == 2:
            qtype = gguf.GGMLQuantizationType[weight_type]
            w.add_tensor(name, gguf.quants.quantize(np.ascontiguousarray(value, np.float32), qtype), raw_dtype=qtype)
            continue
        w.add_tensor(name, np.ascontiguousarray(value, np.float32))
    for name, value in (extra_tensors or {}).items():
        if name not in drop:
            w.add_tensor(name, value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


def llama3_rope_factors(dim: int, rope: dict) -> np.ndarray:
    """rope_freqs.weight as llama.cpp's converter writes it for Llama 3's RoPE scaling: its loop, in
    float32 (0-d torch tensors) as it computes it."""
    import math

    import torch

    factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
    original = rope["original_max_position_embeddings"]
    out = []
    for freq in 1.0 / (rope["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)):
        wavelen = 2 * math.pi / freq
        if wavelen < original / high:
            out.append(1)
        elif wavelen > original / low:
            out.append(factor)
        else:
            smooth = (original / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return torch.tensor(out, dtype=torch.float32).numpy()


def llama3_checkpoint(ckpt: Path, out: Path) -> Path:
    """A copy of the tiny Llama checkpoint `ckpt` with Llama 3's RoPE scaling (LLAMA3_ROPE)."""
    import shutil

    shutil.copytree(ckpt, out)
    cfg = json.loads((out / "config.json").read_text())
    cfg.pop("rope_theta", None)
    (out / "config.json").write_text(json.dumps({**cfg, "rope_parameters": LLAMA3_ROPE}))
    return out


MOE_NAMES = {"input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
             "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
             "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
             "self_attn.q_norm.weight": "attn_q_norm.weight", "self_attn.k_norm.weight": "attn_k_norm.weight",
             "self_attn.q_proj.bias": "attn_q.bias", "self_attn.k_proj.bias": "attn_k.bias",
             "self_attn.v_proj.bias": "attn_v.bias", "mlp.gate.weight": "ffn_gate_inp.weight",
             "mlp.shared_expert.gate_proj.weight": "ffn_gate_shexp.weight",
             "mlp.shared_expert.up_proj.weight": "ffn_up_shexp.weight",
             "mlp.shared_expert.down_proj.weight": "ffn_down_shexp.weight",
             "mlp.shared_expert_gate.weight": "ffn_gate_inp_shexp.weight"}


def write_moe_gguf(ckpt: Path, out: Path, arch: str, weight_type: str | None = None, drop: tuple[str, ...] = ()) -> Path:
    """A tiny Qwen3-MoE (`arch` "qwen3moe") or Qwen2-MoE ("qwen2moe", every layer a mixture) checkpoint
    as llama.cpp's converter writes it: each layer's experts stacked (ffn_gate_exps [E, I, H], ...),
    its keys expert_count, expert_used_count, expert_feed_forward_length (and the shared expert's);
    q/k rows as they are (NeoX's RoPE). `weight_type` ("Q8_0", "Q4_0") stores the experts so; `drop`
    leaves keys out (their names without the architecture)."""
    import gguf
    from safetensors.numpy import load_file

    cfg = json.loads((ckpt / "config.json").read_text())
    w = writer(out, arch, cfg)
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    experts = cfg.get("num_experts") or cfg["num_local_experts"]
    keys = {"expert_count": experts, "expert_used_count": cfg["num_experts_per_tok"],
            "expert_feed_forward_length": cfg["moe_intermediate_size"]}
    if cfg.get("shared_expert_intermediate_size"):
        keys["expert_shared_feed_forward_length"] = cfg["shared_expert_intermediate_size"]
    for key, value in keys.items():
        if key not in drop:
            w.add_uint32(f"{arch}.{key}", value)
    add_tokenizer(w, ckpt, cfg, "gpt-2")
    weights = load_file(ckpt / "model.safetensors")
    for i in range(cfg["num_hidden_layers"]):
        prefix = f"model.layers.{i}."
        for key, name in MOE_NAMES.items():
            if prefix + key in weights:  # (the shared expert's one-row gate as a vector, as llama.cpp has it)
                value = weights[prefix + key]
                w.add_tensor(f"blk.{i}.{name}", np.ascontiguousarray(value.reshape(-1) if "inp_shexp" in name else value,
                                                                     np.float32))
        for proj, name in (("gate_proj", "ffn_gate_exps"), ("up_proj", "ffn_up_exps"), ("down_proj", "ffn_down_exps")):
            stacked = np.ascontiguousarray(np.stack([weights[f"{prefix}mlp.experts.{e}.{proj}.weight"]
                                                     for e in range(experts)]), np.float32)
            if weight_type:
                qtype = gguf.GGMLQuantizationType[weight_type]
                w.add_tensor(f"blk.{i}.{name}.weight", gguf.quants.quantize(stacked, qtype), raw_dtype=qtype)
            else:
                w.add_tensor(f"blk.{i}.{name}.weight", stacked)
    for key, name in TOP_NAMES.items():
        if key in weights:
            w.add_tensor(name, weights[key])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out
