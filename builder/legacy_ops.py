"""The legacy graph profile (opset 20) for TensorRT 10.3 on JetPack 6.

TensorRT 10.3's parser reads opset <= 20 and has none of the four ops the modern graph is built
on; DecoderWriter(graph="legacy") writes each as the older standard ops that define it:

    RMSNormalization(x, w)      Cast(x * 1/sqrt(mean(x^2) + eps)) * w      float32 inside (stash_type=1)
    RotaryEmbedding(x, pos)     x * [c, c] + [x2, x1] * [-s, s]            c, s = caches gathered at pos
    TensorScatter(past, new)    ScatterND(past, idx, new)                  idx [B,Hkv,S,3] = (b, h, write_index[b]+s)
    Attention(q, K, V, mask)    Softmax(q' K^T + bias) V                   q' = q * scale as [B,kv_heads,groups*S,D]

What depends only on the step's inputs (the gathered cos/sin, the scatter addresses, the additive
mask) is built once per graph and shared by every layer.

In place: ONNX Runtime's ScatterND skips its input-to-output copy when both are the same memory,
so binding present_* to past_*'s buffer (runtime/backends/onnxruntime.py) writes only the new rows,
as TensorScatter does (measured on ORT 1.32 CPU: 2 us for one decode row whatever the capacity,
4.7 ms when the output is a separate 64K-slot buffer). TensorRT's ScatterND writes a copy.
"""
from __future__ import annotations

import numpy as np
from onnx import TensorProto

from trtllm.builder.graph import GraphWriter

F32 = TensorProto.FLOAT
OPSET = 20       # TensorRT 10.0/10.1's table covers opset 9-20; assumed for 10.3 (no newer table documents it)
IR_VERSION = 9   # the IR of onnx 1.15, whose newest opset is 20: what a parser of that era reads


def refuse(quant, ort_attention: bool) -> None:
    """The options the legacy profile cannot honour raise, never fall back silently."""
    if quant is not None:
        raise ValueError(f"quant must be None for graph='legacy' (opset {OPSET}), got {quant!r}: the quantized "
                         "weights need DequantizeLinear with block_size and int4 codes, both opset 21; "
                         "build the modern graph (TensorRT >= 10.15) to quantize")
    if ort_attention:
        raise ValueError("ort_attention must be False for graph='legacy': the GroupQueryAttention lowering "
                         "is written from the modern graph only")


def rms_norm(g: GraphWriter, name: str, x: str, scale: str, eps: float, ftype: int) -> str:
    """RMSNormalization(axis=-1, stash_type=1): the statistics and the normalization in float32, cast
    back to the input's type before the scale multiply (as the op's function body and HF do)."""
    xf = g.op("Cast", f"{name}/Cast", [x], to=F32) if ftype != F32 else x
    sq = g.op("Mul", f"{name}/Square", [xf, xf])
    mean = g.op("ReduceMean", f"{name}/ReduceMean", [sq, g.const([-1])], keepdims=1)
    rms = g.op("Sqrt", f"{name}/Sqrt", [g.op("Add", f"{name}/AddEps", [mean, g.const(eps, np.float32)])])
    y = g.op("Mul", f"{name}/Normalize", [xf, g.op("Reciprocal", f"{name}/Reciprocal", [rms])])
    if ftype != F32:
        y = g.op("Cast", f"{name}/CastBack", [y], to=ftype)
    return g.op("Mul", f"{name}/Scale", [y, scale])


def rope_tables(g: GraphWriter, position_ids: str, cos: str, sin: str, prefix: str = "/model/rotary") -> tuple[str, str]:
    """The caches [positions, D/2] (the modern graph's, checkpoint.rope_tables) gathered at
    position_ids and laid out for the rotate-half form: cos [B,1,S,D] = [c, c], sin = [-s, s]."""
    c = g.op("Gather", f"{prefix}/cos/Gather", [cos, position_ids], axis=0)             # [B,S,D/2]
    s = g.op("Gather", f"{prefix}/sin/Gather", [sin, position_ids], axis=0)
    c = g.op("Concat", f"{prefix}/cos/Concat", [c, c], axis=-1)                          # [B,S,D]
    s = g.op("Concat", f"{prefix}/sin/Concat", [g.op("Neg", f"{prefix}/sin/Neg", [s]), s], axis=-1)
    heads_axis = g.const([1])
    return (g.op("Unsqueeze", f"{prefix}/cos/Unsqueeze", [c, heads_axis]),             # [B,1,S,D]
            g.op("Unsqueeze", f"{prefix}/sin/Unsqueeze", [s, heads_axis]))


def rotary(g: GraphWriter, name: str, x: str, tables: tuple[str, str], head_dim: int,
           rotary_dim: int | None = None) -> str:
    """RotaryEmbedding, non-interleaved, on x [B,heads,S,D]: with x = [x1, x2] (halves),
    [x1 c - x2 s, x2 c + x1 s] = x * [c, c] + [x2, x1] * [-s, s]. With rotary_dim < D, on the first
    rotary_dim of each head only (rotary_embedding_dim), the rest passed through."""
    rest = None
    if rotary_dim not in (None, head_dim):
        x, rest = g.op("Split", f"{name}/SplitRotary", [x, g.const([rotary_dim, head_dim - rotary_dim])],
                       num_outputs=2, axis=-1)
        head_dim = rotary_dim
    half = head_dim // 2
    x1, x2 = g.op("Split", f"{name}/Split", [x, g.const([half, half])], num_outputs=2, axis=-1)
    swapped = g.op("Concat", f"{name}/Concat", [x2, x1], axis=-1)
    y = g.op("Add", f"{name}/Add", [g.op("Mul", f"{name}/MulCos", [x, tables[0]]),
                                    g.op("Mul", f"{name}/MulSin", [swapped, tables[1]])])
    return y if rest is None else g.op("Concat", f"{name}/ConcatRest", [y, rest], axis=-1)


def scatter_indices(g: GraphWriter, input_ids: str, write_index: str, num_kv_heads: int, suffix: str = "") -> str:
    """int64 [B,kv_heads,S,3]: the cache address (b, h, write_index[b] + s) of each new K/V row (`suffix`
    names a second set, for layers with another number of kv heads)."""
    zero, one, n = g.const(0), g.const(1), f"/model/kv_index{suffix}"
    ids_shape = g.op("Shape", f"{n}/ids_shape", [input_ids])
    batch = g.op("Gather", f"{n}/batch", [ids_shape, zero], axis=0)
    seq = g.op("Gather", f"{n}/seq_len", [ids_shape, one], axis=0)
    slot = g.op("Add", f"{n}/slot", [g.op("Unsqueeze", f"{n}/wi", [write_index, g.const([1])]),
                                     g.op("Range", f"{n}/s", [zero, seq, one])])                  # [B,S]
    slot = g.op("Unsqueeze", f"{n}/slot4", [slot, g.const([1, 3])])                               # [B,1,S,1]
    # + zeros [1,H,1,1] broadcasts the slots to every head: [B,H,S,1], whose shape the rest expand to
    slot = g.op("Add", f"{n}/slot_per_head", [slot, g.const(np.zeros((1, num_kv_heads, 1, 1)))])
    full = g.op("Shape", f"{n}/shape", [slot])
    heads = g.const(np.arange(num_kv_heads).reshape(1, num_kv_heads, 1, 1))
    rows = g.op("Reshape", f"{n}/rows", [g.op("Range", f"{n}/b", [zero, batch, one]), g.const([-1, 1, 1, 1])])  # [B,1,1,1]
    rows = g.op("Expand", f"{n}/rows_full", [rows, full])
    heads = g.op("Expand", f"{n}/heads_full", [heads, full])
    return g.op("Concat", f"{n}/Concat", [rows, heads, slot], axis=-1)


def kv_write(g: GraphWriter, name: str, past: str, new: str, indices: str, present: str) -> str:
    """TensorScatter(axis=-2): new [B,kv_heads,S,D] into past [B,kv_heads,C,D] at `indices`."""
    return g.op("ScatterND", f"{name}/ScatterND", [past, indices, new], outputs=[present], reduction="none")


def attention_bias(g: GraphWriter, mask: str, groups: int, name: str = "/model/mask/bias") -> str:
    """float32 [B,1,groups*S,C] from the modern bool mask [B,1,S,C]: 0 where visible, -inf where not
    (how Attention reads a bool mask), repeated per query group to match the grouped q layout."""
    bias = g.op("Where", name, [mask, g.const(0.0, np.float32), g.const(-np.inf, np.float32)])
    if groups > 1:
        bias = g.op("Tile", f"{name}_groups", [bias, g.const([1, 1, groups, 1])])
    return bias


def attention(g: GraphWriter, name: str, q: str, k: str, v: str, bias: str, num_heads: int, num_kv_heads: int,
              head_dim: int, ftype: int, scale: float | None = None, softcap: float | None = None) -> str:
    """Attention(q [B,heads,S,D], K, V [B,kv_heads,C,D]) -> [B,heads,S,D], softmax in float32.

    GQA without copying the cache per head: query head h uses kv head h // groups, and the heads
    of one group are adjacent, so q reshapes (no copy) to [B,kv_heads,groups*S,D] (row g*S + s)
    and meets K and V as they are. q is scaled before the product, which keeps float16 scores small;
    in float32 with the exact scale, then rounded (as torch scales a 16-bit q: a scale rounded to
    bfloat16, 1/sqrt(128) or Gemma's, would be up to 1/256 off). `softcap` c (Gemma 2): the scores
    become c tanh(scores / c) before the mask, in float32.
    """
    factor = g.const(float(head_dim) ** -0.5 if scale is None else scale, np.float32)
    if ftype == F32:
        q = g.op("Mul", f"{name}/ScaleQ", [q, factor])
    else:
        wide = g.op("Mul", f"{name}/ScaleQ", [g.op("Cast", f"{name}/ScaleQ/Cast", [q], to=F32), factor])
        q = g.op("Cast", f"{name}/ScaleQ/CastBack", [wide], to=ftype)
    q = g.op("Reshape", f"{name}/GroupQ", [q, g.const([0, num_kv_heads, -1, head_dim])])      # [B,Hkv,G*S,D]
    kt = g.op("Transpose", f"{name}/KT", [k], perm=[0, 1, 3, 2])                              # [B,Hkv,D,C]
    scores = g.op("MatMul", f"{name}/QK", [q, kt])                                            # [B,Hkv,G*S,C]
    if ftype != F32:
        scores = g.op("Cast", f"{name}/QK/Cast", [scores], to=F32)
    if softcap is not None:
        cap = g.const(float(softcap), np.float32)
        scores = g.op("Mul", f"{name}/Softcap", [g.op("Tanh", f"{name}/Softcap/Tanh",
                                                      [g.op("Div", f"{name}/Softcap/Div", [scores, cap])]), cap])
    probs = g.op("Softmax", f"{name}/Softmax", [g.op("Add", f"{name}/Mask", [scores, bias])], axis=-1)
    if ftype != F32:
        probs = g.op("Cast", f"{name}/Softmax/Cast", [probs], to=ftype)
    y = g.op("MatMul", f"{name}/PV", [probs, v])                                              # [B,Hkv,G*S,D]
    return g.op("Reshape", f"{name}/UngroupY", [y, g.const([0, num_heads, -1, head_dim])])    # [B,H,S,D]
