"""EAGLE-3 draft heads at build time: `--eagle DRAFT_DIR` reads a draft head in the format EAGLE-3's
trainers write (SpecForge, the EAGLE repo; vLLM and TensorRT Edge-LLM read the same), and the build
writes two things from it:

- into the base graph (builder/decoder.py): `eagle_hidden` = fc(concat of the residual stream at the
  input of three layers) for every position, and `verify_ids`, the greedy token at any positions;
- ENGINE_DIR/eagle/draft.onnx (+ its ONNX Runtime form): the draft's one decoder layer, which takes
  (token, hidden) pairs and gives the drafted token and its own hidden state.

    DRAFT_DIR/config.json        architectures [LlamaForCausalLMEagle3], the layer's shape, draft_vocab_size,
                                 eagle_config.eagle_aux_hidden_state_layer_ids (default [2, L//2, L-3])
    DRAFT_DIR/model.safetensors  fc.weight [H, 3H], midlayer.{input_layernorm, hidden_norm,
                                 post_attention_layernorm, self_attn.{q,k,v}_proj [*, 2H], o_proj, mlp.*},
                                 norm.weight, lm_head.weight [Vd, H], d2t [Vd] (target id = draft id + d2t)
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from onnx import TensorProto

from trtllm.builder.checkpoint import Weights
from trtllm.builder.config import ConfigError
from trtllm.builder.decoder import DecoderWriter
from trtllm.builder.decoder_spec import DecoderSpec
from trtllm.builder.architectures.llama import SILU
from trtllm.runtime.manifest import whole

ARCHITECTURES = ("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM")
DRAFT_DIR = "eagle"
DRAFT_ONNX, DRAFT_SOURCE, DRAFT_COMPILED = (f"{DRAFT_DIR}/draft.onnx", f"{DRAFT_DIR}/draft.ort-source.onnx",
                                            f"{DRAFT_DIR}/draft.ort.onnx")
DRAFT_PLAN = f"{DRAFT_DIR}/draft.plan"  # TensorRT
# Tokens drafted per verification when a run starts (trtllm-run's --spec-draft-step auto then
# moves it cycle by cycle, runtime/draft_policy.py). On a CPU a verified token is not free: a step
# of k+1 tokens of the int4 demo model cost 1.3x (k=1) to 2.3x (k=4) a one-token step here, so
# short drafts win; a GPU decode step is bound by reading the weights, and verifies several tokens
# for about the price of one.
DRAFT_STEP = {"onnxruntime": 1, "tensorrt": 4}
# The head's best proposals per position, best first, with their log-probabilities (draft_top_ids,
# draft_top_logprobs): what draft trees expand (trtllm-run --spec-draft-top-k, at most this;
# Edge-LLM's default --specDraftTopK is 10).
TOP_K = 10
# A run's default --spec-draft-top-k: 1 (a chain) on a CPU, where each extra token widens the step;
# 4 on a GPU, where a few more tokens cost next to nothing.
DRAFT_TOP_K = {"onnxruntime": 1, "tensorrt": 4}
F32, I64 = TensorProto.FLOAT, TensorProto.INT64
LAYER_KEYS = ("input_layernorm.weight", "hidden_norm.weight", "post_attention_layernorm.weight",
              "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
              "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight")


@dataclass
class Draft:
    """A loaded draft head: its layer as a one-layer DecoderSpec (vocabulary: the draft's), its
    weights under the decoder writer's names, and what joins it to the target."""

    path: Path
    spec: DecoderSpec
    weights: Weights        # (the target's embedding, where the head shares it, as its rows: Weights.rows)
    fc: np.ndarray          # [H, 3H]
    d2t: np.ndarray         # int64 [Vd]
    aux_layers: tuple[int, int, int]
    config: dict


def fail(path: Path, message: str) -> None:
    raise ConfigError(f"--eagle {path}: {message}")


def read(path: Path) -> tuple[dict, dict]:
    from safetensors.numpy import load_file

    files = sorted(path.glob("*.safetensors")) if path.is_dir() else []
    if not (path / "config.json").is_file() or not files:
        fail(path, "must be a directory with config.json and model.safetensors (an EAGLE-3 draft head)")
    try:
        config = json.loads((path / "config.json").read_text())
        tensors = {}
        for f in files:
            try:
                tensors.update(load_file(f))
            except TypeError:  # bfloat16 (numpy has no such type, as SpecForge often saves): widened exactly
                import torch
                from safetensors.torch import load_file as load_torch

                tensors.update({k: (v.float() if v.dtype == torch.bfloat16 else v).numpy()
                                for k, v in load_torch(f).items()})
    except Exception as e:  # noqa: BLE001 - safetensors' own error type too (a truncated or foreign file)
        fail(path, f"cannot be read: {type(e).__name__}: {str(e)[:200]}")
    if not isinstance(config, dict):
        fail(path, f"config.json must hold a JSON object, got {type(config).__name__}")
    # bfloat16 read as numpy's (where ml_dtypes is loaded), widened exactly as above
    return config, {k.removeprefix("model."): v.astype(np.float32) if v.dtype.name == "bfloat16" else v
                    for k, v in tensors.items()}


def load(path_arg: str, target: DecoderSpec, embed) -> Draft:
    """Read and check a draft head against its target (`embed`: the target's token embedding, an array
    or a held table's rows (checkpoint.Weights.rows), which EAGLE-3 heads share unless they carry their
    own)."""
    path = Path(path_arg)
    config, t = read(path)
    arch = config.get("architectures") or []
    if not set(arch) & set(ARCHITECTURES):
        fail(path, f"architectures is {arch}; only EAGLE-3 heads ({ARCHITECTURES[0]}) are supported "
                   "(EAGLE-1/2 heads have no fc over three layers)")
    h, layers = target.hidden_size, target.num_layers
    if config.get("hidden_size") != h:
        fail(path, f"hidden_size {config.get('hidden_size')} differs from the target's {h}")
    if config.get("num_hidden_layers", 1) != 1:
        fail(path, f"num_hidden_layers is {config.get('num_hidden_layers')}; EAGLE-3 heads have one layer")
    act = config.get("hidden_act", "silu")
    if not isinstance(act, str) or act not in SILU:  # the head's MLP is written as SiLU's
        fail(path, f"config.hidden_act must be 'silu' or 'swish', got {config.get('hidden_act')!r}")
    eagle_config = config.get("eagle_config")
    if eagle_config is not None and not isinstance(eagle_config, dict):
        fail(path, f"config.eagle_config must be an object, got {eagle_config!r}")
    given = (eagle_config or {}).get("eagle_aux_hidden_state_layer_ids")
    aux = [2, layers // 2, layers - 3] if given is None else given  # (an empty list is refused, not the default)
    if not isinstance(aux, list) or len(aux) != 3 or not all(whole(i, 0) and i < layers for i in aux):
        fail(path, f"eagle_aux_hidden_state_layer_ids must be three layer indices in [0, {layers}), got {aux}"
                   + ("" if given else f" (EAGLE-3's default [2, L/2, L-3] for the target's {layers} layers: set "
                                        "eagle_config.eagle_aux_hidden_state_layer_ids in the head's config.json)"))
    heads = config.get("num_attention_heads", target.num_heads)
    kv_heads = config.get("num_key_value_heads", heads)
    if not whole(heads):
        fail(path, f"config.num_attention_heads must be a positive integer, got {heads!r}")
    head_dim = config.get("head_dim") or h // heads
    inter = config.get("intermediate_size", target.intermediate_size)
    vocab = target.vocab_size
    if config.get("vocab_size", vocab) != vocab:  # (a head trained for another tokenizer is never right)
        fail(path, f"config.vocab_size {config.get('vocab_size')!r} differs from the target's {vocab}")
    draft_vocab = config.get("draft_vocab_size") or vocab
    for key, value in (("num_attention_heads", heads), ("num_key_value_heads", kv_heads), ("head_dim", head_dim),
                       ("intermediate_size", inter), ("draft_vocab_size", draft_vocab)):
        if not whole(value):
            fail(path, f"config.{key} must be a positive integer, got {value!r}")
    if heads % kv_heads:
        fail(path, f"config.num_attention_heads {heads} must be a multiple of num_key_value_heads {kv_heads}")
    eps = config.get("rms_norm_eps", target.rms_norm_eps)
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 < eps < 1:
        fail(path, f"config.rms_norm_eps must be a number in (0, 1), got {eps!r}")
    expected = {"fc.weight": (h, 3 * h), "norm.weight": (h,), "lm_head.weight": (draft_vocab, h),
                "midlayer.input_layernorm.weight": (h,), "midlayer.hidden_norm.weight": (h,),
                "midlayer.post_attention_layernorm.weight": (h,),
                "midlayer.self_attn.q_proj.weight": (heads * head_dim, 2 * h),
                "midlayer.self_attn.k_proj.weight": (kv_heads * head_dim, 2 * h),
                "midlayer.self_attn.v_proj.weight": (kv_heads * head_dim, 2 * h),
                "midlayer.self_attn.o_proj.weight": (h, heads * head_dim),
                "midlayer.mlp.gate_proj.weight": (inter, h), "midlayer.mlp.up_proj.weight": (inter, h),
                "midlayer.mlp.down_proj.weight": (h, inter)}
    for key, shape in expected.items():
        if key not in t:
            fail(path, f"{key} is missing")
        if tuple(t[key].shape) != shape:
            fail(path, f"{key} is {list(t[key].shape)}, expected {list(shape)}")
        if not np.issubdtype(t[key].dtype, np.floating):
            fail(path, f"{key} is {t[key].dtype}; a head's weights are floating point")
        if not np.isfinite(t[key].astype(np.float32)).all():
            fail(path, f"{key} holds NaN or infinite values")
    extra = sorted(k for k in t if k not in expected and k not in ("d2t", "t2d", "embed_tokens.weight"))
    if extra:
        fail(path, f"unexpected tensors {extra[:4]}: not an EAGLE-3 head this version can build")
    d2t = np.asarray(t.get("d2t", np.zeros(draft_vocab, np.int64)))
    if d2t.dtype.kind not in "iu":  # (a float one would be cast here but not by the build's reference check)
        fail(path, f"d2t is {d2t.dtype}, expected integer ids (int64)")
    d2t = d2t.astype(np.int64)
    if d2t.shape != (draft_vocab,):
        fail(path, f"d2t is {list(d2t.shape)}, expected [{draft_vocab}]")
    mapped = np.arange(draft_vocab) + d2t
    if mapped.min() < 0 or mapped.max() >= vocab:
        fail(path, f"d2t maps draft ids outside the target vocabulary [0, {vocab})")
    if "t2d" in t:  # (the target's ids the head drafts: what d2t maps to, no more)
        t2d = np.asarray(t["t2d"])
        want = np.zeros(vocab, bool)
        want[mapped] = True
        if t2d.shape != (vocab,) or not np.array_equal(t2d.astype(bool), want):
            fail(path, f"t2d ({list(t2d.shape)}) is not the target ids d2t maps to: expected [{vocab}] true exactly "
                       "at draft id + d2t")
    if "embed_tokens.weight" in t:
        embed = t["embed_tokens.weight"]
        if embed.shape != (vocab, h):
            fail(path, f"embed_tokens.weight is {list(embed.shape)}, expected [{vocab}, {h}]")
    f32 = {k: np.asarray(v, np.float32) for k, v in t.items() if k not in ("d2t", "t2d")}
    weights = {f"model.layers.0.{k}": f32[f"midlayer.{k}"] for k in LAYER_KEYS}
    weights.update({"model.norm.weight": f32["norm.weight"], "lm_head.weight": f32["lm_head.weight"],
                    "model.embed_tokens.weight": f32.get("embed_tokens.weight", embed)})
    spec = DecoderSpec(architecture="eagle3", vocab_size=draft_vocab, hidden_size=h, intermediate_size=inter,
                       num_layers=1, num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
                       rms_norm_eps=float(config.get("rms_norm_eps", target.rms_norm_eps)))
    return Draft(path, spec, Weights(weights), f32["fc.weight"], d2t, tuple(aux), config)


def rope_tables(draft: Draft, num_positions: int):
    """The draft's own RoPE (its config's rope_theta / rope_scaling), from transformers' Llama rotary."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    from trtllm.builder.checkpoint import CheckpointError, rotary_tables

    keys = ("rope_theta", "rope_scaling", "rope_parameters", "max_position_embeddings", "partial_rotary_factor")
    try:
        cfg = LlamaConfig(hidden_size=draft.spec.hidden_size, num_attention_heads=draft.spec.num_heads,
                          num_key_value_heads=draft.spec.num_kv_heads, head_dim=draft.spec.head_dim,
                          **{k: draft.config[k] for k in keys if draft.config.get(k) is not None})
        cos, sin = rotary_tables(LlamaRotaryEmbedding(cfg), num_positions)
    except (KeyError, ValueError, TypeError, CheckpointError) as e:  # transformers' own checks: an unknown
        # rope_type, a bad theta; ours: positions past what one table holds
        fail(draft.path, f"its RoPE settings ({', '.join(k for k in keys if k in draft.config)}) cannot be used: "
                         f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}")
    theta = draft.config.get("rope_theta", 10000.0)
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not 0 < theta < float("inf") \
            or not (np.isfinite(cos).all() and np.isfinite(sin).all()):
        fail(draft.path, f"config.rope_theta must be a positive finite number (its RoPE tables are not finite), got "
                         f"{theta!r}")
    if 2 * cos.shape[1] != draft.spec.head_dim:  # (transformers' Llama layer, the reference, rotates whole heads)
        fail(draft.path, f"its partial_rotary_factor rotates {2 * cos.shape[1]} of each head's {draft.spec.head_dim} "
                         "dimensions; an EAGLE-3 head is a Llama layer, which rotates whole heads")
    return cos, sin


class DraftWriter(DecoderWriter):
    """The draft head's graph: one step over (token, hidden) pairs, its KV cache as the base's.

        input_ids [B,S], hidden_in [B,S,H] (fc'd target hidden states, or the draft's own)
        x = concat(input_layernorm(embed(input_ids)), hidden_norm(hidden_in))     [B,S,2H]
        h = hidden_in + o_proj(attention(q|k|v_proj(x)))                            (past_key.0 etc.)
        h = h + mlp(post_attention_layernorm(h))
        draft_hidden [B,H] = h[b, last_index[b]]
        draft_ids [B] = argmax(lm_head(norm(draft_hidden))) + d2t[argmax]
        draft_top_ids, draft_top_logprobs [B,1+T,K]: the TOP_K best at last_index and at the T
            positions of draft_index [B,T] (a draft tree's nodes), best first (+ d2t)
        draft_node_hidden [B,T,H]: the hidden states at draft_index (draft trees: their children's input)
    """

    def __init__(self, draft: Draft, rope_cos: np.ndarray, rope_sin: np.ndarray, tree: bool = False, **options):
        # tree: the head runs over a draft tree's nodes (tree_mask, as the model's graph) and gives
        # each one's best children
        super().__init__(draft.spec, draft.weights, rope_cos, rope_sin, max_top_k=1, tree=tree, **options)
        self.d2t = draft.d2t
        # A quantized engine's head keeps its copy of the token embedding (vocab x hidden) in float16:
        # the head only proposes, and the copy would otherwise be the largest thing in the engine
        # (float32: 113 MB for SmolLM2-135M, beside 88 MB of int4 model weights).
        self.half_embedding = self.quant is not None

    def write(self) -> "onnx.ModelProto":  # noqa: F821
        g, s, io = self.g, self.spec, self.io
        input_ids, position_ids, write_index, last_index, e, mask = self.prologue()
        hidden = g.input(io.hidden_in, F32, ["batch", "seq", s.hidden_size])
        if self.ftype != F32:
            hidden = g.op("Cast", "/draft/hidden/Cast", [hidden], to=self.ftype)
        e = self.rms_norm("/model/layers.0/input_layernorm", e, "model.layers.0.input_layernorm.weight")
        x = self.rms_norm("/model/layers.0/hidden_norm", hidden, "model.layers.0.hidden_norm.weight")
        x = g.op("Concat", "/model/layers.0/concat", [e, x], axis=-1)
        branch = ("/model/layers.0/attn/residual", self.attention(0, x, position_ids, write_index, mask))
        x, h = self.residual_norm("/model/layers.0/post_attention_layernorm", hidden, branch,
                                  "model.layers.0.post_attention_layernorm.weight")
        h = g.op("Add", "/model/layers.0/mlp/residual", [h, self.mlp(0, x)])              # [B,S,H]
        # the positions that give outputs: last_index, then a tree's nodes (draft_index [B,T])
        idx = g.op("Unsqueeze", "/draft/last", [last_index, g.const([1])])                  # [B,1]
        if self.tree:
            idx = g.op("Concat", "/draft/index", [idx, g.input(io.draft_index, I64, ["batch", "nodes"])], axis=1)
        idx3 = g.op("Expand", "/draft/Expand", [g.op("Unsqueeze", "/draft/idx3", [idx, g.const([2])]),
                                                 g.const([1, 1, s.hidden_size])])
        h = g.op("GatherElements", "/draft/GatherElements", [h, idx3], axis=1)             # [B,1+T,H]
        flat = g.op("Reshape", "/draft/flat", [h, g.const([-1, s.hidden_size])])
        logits = self.matmul("/lm_head", self.rms_norm("/model/norm", flat, "model.norm.weight"), "lm_head",
                             self.w["lm_head.weight"], rank=2)                              # [B(1+T),Vd]
        if self.ftype != F32:
            logits = g.op("Cast", "/draft/logits/Cast", [logits], to=F32)
        shape = g.op("Concat", "/draft/shape", [g.op("Shape", "/draft/idx_shape", [idx]), g.const([s.vocab_size])],
                     axis=0)
        logits = g.op("Reshape", "/draft/logits", [logits, shape])                         # [B,1+T,Vd]
        first = g.op("Squeeze", "/draft/first", [g.op("Gather", "/draft/first/Gather", [logits, g.const([0])],
                                                       axis=1), g.const([1])])             # [B,Vd]
        best = g.op("ArgMax", "/draft/ArgMax", [first], axis=-1, keepdims=0)                # a draft vocab id
        d2t = g.weight("d2t", self.d2t)
        offset = g.op("Gather", "/draft/d2t", [d2t, best], axis=0)
        g.op("Add", "/draft/target_id", [best, offset], outputs=[io.draft_ids])
        g.output(io.draft_ids, I64, ["batch"])
        # each position's TOP_K best proposals and their log-probabilities, for draft trees
        k = min(TOP_K, s.vocab_size)
        lp = g.op("LogSoftmax", "/draft/LogSoftmax", [logits], axis=-1)
        values, top = g.op("TopK", "/draft/TopK", [lp, g.const([k])], outputs=[io.draft_top_logprobs, "/draft/top"],
                           axis=-1, largest=1, sorted=1)
        g.output(io.draft_top_logprobs, F32, ["batch", "outputs", k])
        offsets = g.op("Gather", "/draft/top_d2t", [d2t, top], axis=0)
        g.op("Add", "/draft/top_target_ids", [top, offsets], outputs=[io.draft_top_ids])
        g.output(io.draft_top_ids, I64, ["batch", "outputs", k])
        last = g.op("Squeeze", "/draft/hidden_last", [g.op("Gather", "/draft/hidden_last/Gather", [h, g.const([0])],
                                                            axis=1), g.const([1])])         # [B,H]
        if self.ftype == F32:
            g.op("Identity", "/draft/hidden_out", [last], outputs=[io.draft_hidden])
        else:
            g.op("Cast", "/draft/hidden_out", [last], outputs=[io.draft_hidden], to=F32)
        g.output(io.draft_hidden, F32, ["batch", s.hidden_size])
        if self.tree:  # the nodes' own hidden states, which their children take
            nodes = g.op("Slice", "/draft/nodes", [h, g.const([1]), g.const([2**62]), g.const([1])])
            g.op("Identity" if self.ftype == F32 else "Cast", "/draft/node_hidden", [nodes],
                 outputs=[io.draft_node_hidden], **({} if self.ftype == F32 else {"to": F32}))
            g.output(io.draft_node_hidden, F32, ["batch", "nodes", s.hidden_size])
        return self.finish()
