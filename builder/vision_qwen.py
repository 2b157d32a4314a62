"""Qwen2.5-VL's, Qwen2-VL's and Qwen3-VL's image encoder as `vision.onnx` (transformers'
Qwen2_5_VisionTransformerPretrainedModel / Qwen2VisionTransformerPretrainedModel / Qwen3VLVisionModel),
float32, op by op as vision.py writes InternVL's.

Images of any size come in as one packed sequence of patch rows; what is per image (positions, which
rows may attend to which) comes in as inputs the runtime computes from the grids (see `_inputs`):

    pixel_values    [P, C*T*ps*ps] f32  rows in window order (Qwen2-VL: the processor's order)
    patch_positions [P, 2] i64          each row's (h, w) on its image's patch grid
    window_rows     [Nw, W] i64         Qwen2.5-VL only: each window's rows, -1 after them (a padded batch)
    window_slots    [P] i64             ... and each row's place in window_rows (runtime/images_qwen.py's
                                        window_layout)
    image_ids       [P] i64             equal ids attend to each other in full-attention layers
    pos_index       [P, 4] i64          Qwen3-VL only: each row's 4 taps into the learned position table
    pos_weights     [P, 4] f32          ... and their bilinear weights (get_vision_interpolation_indices_and_weights)
      -> MatMul (the Conv3d patch embedding: kernel = stride = the whole row; Qwen3-VL: + its bias,
         + sum_k pos_embed[pos_index[:, k]] * pos_weights[:, k])
      -> blocks: x += proj(attn(norm1(x))); x += mlp(norm2(x))   2-D rotary q/k, bidirectional: a
         windowed layer over each window alone (rows gathered into the padded batch and back), a
         full-attention layer over its image (ONNX's Attention either way: one fused node)
         (Qwen3-VL: after each deepstack layer, that layer's own merger on its output, norm after the fold)
      -> merger: norm, [P, C] -> [P/m^2, C*m^2] (m^2 consecutive rows), Linear, GELU, Linear
    image_embeds    [P/m^2, out_hidden * (1 + K)] f32, in window order (argsort(window_index) puts them back):
                    the merger's output, then the K deepstack mergers' (K = 0 but on Qwen3-VL), side by side
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from trtllm.builder.config import Unsupported
from trtllm.builder.vision import VisionWriter
from trtllm.plugins.cpu import DOMAIN as CPU_DOMAIN

PIXELS, POSITIONS, WINDOW_ROWS, WINDOW_SLOTS, IMAGE_IDS, EMBEDS = (
    "pixel_values", "patch_positions", "window_rows", "window_slots", "image_ids", "image_embeds")
POS_INDEX, POS_WEIGHTS = "pos_index", "pos_weights"
WINDOW_IDS = "window_ids"  # what window_rows and window_slots are made from (an input of the native form only)
MODEL_TYPES = ("qwen2_5_vl", "qwen2_vl", "qwen3_vl", "qwen3_vl_moe")
F32, I64 = onnx.TensorProto.FLOAT, onnx.TensorProto.INT64
ACTIVATIONS = ("silu", "quick_gelu", "gelu", "gelu_pytorch_tanh")
PREFIX = "model.visual."


@dataclass(frozen=True)
class QwenVisionSpec:
    model_type: str
    patch_size: int
    temporal_patch_size: int
    in_channels: int
    hidden_size: int
    num_heads: int
    depth: int
    intermediate_size: int
    hidden_act: str
    spatial_merge_size: int
    window_size: int | None          # pixels a window's side; None: Qwen2-VL, every layer full attention
    fullatt_block_indexes: tuple[int, ...]
    out_hidden_size: int
    norm: str                        # "rms_norm" (Qwen2.5-VL) or "layer_norm" (Qwen2-VL, Qwen3-VL), eps 1e-6 all
    mlp: str                         # "gated" (gate/up/down), "fc" (fc1, act, fc2) or "linear_fc" (linear_fc1, ...)
    eps: float = 1e-6
    num_position_embeddings: int | None = None    # Qwen3-VL: its learned position table's rows (a square grid)
    deepstack_visual_indexes: tuple[int, ...] = ()  # Qwen3-VL: the layers whose outputs get a merger of their own

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def deepstack_layers(self) -> int:
        """K: the deepstack mergers, whose outputs follow the merger's in image_embeds."""
        return len(self.deepstack_visual_indexes)

    @property
    def num_grid_per_side(self) -> int | None:
        """The learned position table's side (transformers' num_grid_per_side), or None: no table."""
        return None if self.num_position_embeddings is None else round(self.num_position_embeddings ** 0.5)

    @property
    def patch_dim(self) -> int:
        return self.in_channels * self.temporal_patch_size * self.patch_size ** 2

    def full_attention(self, layer: int) -> bool:
        return self.window_size is None or layer in self.fullatt_block_indexes


def spec_of(config) -> QwenVisionSpec:
    """Qwen2_5_VLConfig, Qwen2VLConfig or Qwen3VLConfig -> QwenVisionSpec; what the graph does not do is
    refused by name."""
    v, kind = config.vision_config, config.model_type
    if kind not in MODEL_TYPES:
        raise Unsupported(f"config.model_type must be one of {list(MODEL_TYPES)}, got {kind!r}")
    kind = "qwen3_vl" if kind == "qwen3_vl_moe" else kind  # (the same encoder: the experts are the text model's)
    qwen2 = kind == "qwen2_vl"  # (its vision_config names the widths otherwise)
    hidden = v.embed_dim if qwen2 else v.hidden_size
    out_hidden = v.hidden_size if qwen2 else v.out_hidden_size
    field = "vision_config.embed_dim" if qwen2 else "vision_config.hidden_size"
    heads = v.num_heads
    for key in ("patch_size", "temporal_patch_size", "spatial_merge_size"):  # (before the checks' arithmetic)
        if not isinstance(getattr(v, key), int):
            raise Unsupported(f"the vision encoder: vision_config.{key} must be an int, got {getattr(v, key)!r}")
    checks = [
        (v.hidden_act in ACTIVATIONS,
         f"vision_config.hidden_act must be one of {list(ACTIVATIONS)}, got {v.hidden_act!r}"),
        (hidden % heads == 0 and (hidden // heads) % 4 == 0,
         f"{field} {hidden} must be num_heads {heads} x a multiple of 4 (the 2-D rotary's h and w halves)"),
        (getattr(v, "head_dim", None) in (None, hidden // max(heads, 1)),
         f"vision_config.head_dim must be {field} / num_heads, got {getattr(v, 'head_dim', None)!r}"),
        ((v.rope_parameters or {}).get("rope_type", "axial") == "axial",
         f"vision_config.rope_parameters.rope_type must be 'axial', got {v.rope_parameters!r}"),
        (out_hidden == config.text_config.hidden_size, f"vision_config's output size {out_hidden} must be "
         f"text_config.hidden_size {config.text_config.hidden_size}"),
    ]
    checks += window_checks(v) if kind == "qwen2_5_vl" else deepstack_checks(v) if kind == "qwen3_vl" else []
    for ok, what in checks:
        if not ok:
            raise Unsupported(f"the vision encoder: {what}")
    qwen3, qwen25 = kind == "qwen3_vl", kind == "qwen2_5_vl"
    return QwenVisionSpec(
        kind, v.patch_size, v.temporal_patch_size, v.in_channels, hidden, heads, v.depth,
        int(hidden * v.mlp_ratio) if qwen2 else v.intermediate_size, v.hidden_act, v.spatial_merge_size,
        v.window_size if qwen25 else None, tuple(v.fullatt_block_indexes) if qwen25 else (), out_hidden,
        "rms_norm" if qwen25 else "layer_norm", "gated" if qwen25 else "linear_fc" if qwen3 else "fc",
        num_position_embeddings=v.num_position_embeddings if qwen3 else None,
        deepstack_visual_indexes=tuple(v.deepstack_visual_indexes) if qwen3 else ())


def window_checks(v) -> list[tuple[bool, str]]:
    """Qwen2.5-VL's windows: (ok, what) pairs, as spec_of's."""
    full = set(v.fullatt_block_indexes) & set(range(v.depth))
    return [
        (v.window_size // v.spatial_merge_size // v.patch_size >= 1, f"vision_config.window_size must be at "
         f"least spatial_merge_size x patch_size = {v.spatial_merge_size * v.patch_size}, got {v.window_size}"),
        # (the graph takes both windows and image_ids: each must feed some layer)
        (0 < len(full) < v.depth, "vision_config.fullatt_block_indexes must name some but not all of the "
         f"{v.depth} layers, got {list(v.fullatt_block_indexes)}"),
    ]


def deepstack_checks(v) -> list[tuple[bool, str]]:
    """Qwen3-VL's position table and deepstack layers: (ok, what) pairs, as spec_of's."""
    n, layers = v.num_position_embeddings, list(v.deepstack_visual_indexes)
    side = round(n ** 0.5) if isinstance(n, int) and not isinstance(n, bool) and n > 0 else 0
    return [
        # (transformers resamples int(sqrt(n)) a side: the runtime's pos_index reads the same square)
        (side > 0 and side * side == n,
         f"vision_config.num_position_embeddings must be a square number > 0 (a side x side grid), got {n!r}"),
        # transformers gathers the features in layer order: the graph's columns follow the list's
        (all(isinstance(i, int) for i in layers) and layers == sorted(set(layers))
         and all(0 <= i < v.depth for i in layers), "vision_config.deepstack_visual_indexes must be increasing "
         f"layer numbers below depth {v.depth}, got {layers}"),
    ]


def weights_of(vlm) -> dict[str, np.ndarray]:
    """The visual tower's weights (model.visual.*), float32 numpy, without the prefix; and the rotary's
    inverse frequencies (a buffer, not in the state dict), so the graph's angles are transformers'."""
    out = {name[len(PREFIX):]: t.detach().float().numpy() for name, t in vlm.state_dict().items()
           if name.startswith(PREFIX)}
    out["rotary_pos_emb.inv_freq"] = vlm.model.visual.rotary_pos_emb.inv_freq.detach().float().numpy()
    return out  # (Qwen3-VL's pos_embed.weight is in the state dict: [num_position_embeddings, hidden])


class QwenVisionWriter(VisionWriter):  # (its weight, linear and norm ops: every Linear here has a bias)
    def __init__(self, spec: QwenVisionSpec, weights: dict[str, np.ndarray], native: bool = False):
        """native: ONNX Runtime's form, each layer's rotary and attention one trtllm.cpu::SegmentAttention
        node (plugins/cpu/segment_attention.cc: memory linear in the patches), its windows as window_ids;
        else the canonical graph TensorRT parses."""
        super().__init__(spec, weights)
        self.native = native

    def norm(self, name: str, x: str, module: str) -> str:
        return super().norm(name, x, module, self.s.norm, self.s.eps)

    def act(self, name: str, x: str) -> str:
        g, a = self.g, self.s.hidden_act
        if a in ("gelu", "gelu_pytorch_tanh"):
            return g.op("Gelu", name, [x], approximate="none" if a == "gelu" else "tanh")
        z = x if a == "silu" else g.op("Mul", f"{name}/Mul1702", [x, g.const(1.702, np.float32)])  # QuickGELU
        return g.op("Mul", f"{name}/Mul", [x, g.op("Sigmoid", f"{name}/Sigmoid", [z])])

    def rotary(self, positions: str) -> tuple[str, str]:
        """(cos, sin) [P, head_dim]: angles pos * inv_freq in float32, laid out as transformers'
        recomposition_frequencies does: [h freqs | w freqs | h freqs | w freqs] (rotate_half form); the
        native form's [P, head_dim / 2], their first half (SegmentAttention's tables)."""
        g, n = self.g, "/vision/rotary"
        pos = g.op("Unsqueeze", f"{n}/Unsqueeze", [g.op("Cast", f"{n}/Cast", [positions], to=F32), g.const([-1])])
        freqs = g.op("Mul", f"{n}/Mul", [pos, self.weight("rotary_pos_emb.inv_freq")])      # [P, 2, head/4]
        freqs = g.op("Reshape", f"{n}/Reshape", [freqs, g.const([0, self.s.head_dim // 2])])  # [P, head/2]
        if not self.native:
            freqs = g.op("Concat", f"{n}/Concat", [freqs, freqs], axis=-1)                  # [P, head]
        return g.op("Cos", f"{n}/Cos", [freqs]), g.op("Sin", f"{n}/Sin", [freqs])

    def mask(self, name: str, ids: str) -> str:
        """[1, 1, P, P] bool: row i may attend to row j when ids[i] == ids[j]."""
        g = self.g
        rows = g.op("Unsqueeze", f"{name}/Rows", [ids, g.const([0, 1, 3])])
        cols = g.op("Unsqueeze", f"{name}/Cols", [ids, g.const([0, 1, 2])])
        return g.op("Equal", f"{name}/Equal", [rows, cols])

    def rotate(self, name: str, x: str, cos: str, sin: str) -> str:
        """x * cos + rotate_half(x) * sin, rotate_half(x) = [-x2, x1]."""
        g = self.g
        half = self.s.head_dim // 2
        x1, x2 = g.op("Split", f"{name}/Split", [x, g.const([half, half])], num_outputs=2, axis=-1)
        rotated = g.op("Concat", f"{name}/RotateHalf", [g.op("Neg", f"{name}/Neg", [x2]), x1], axis=-1)
        return g.op("Add", f"{name}/Add", [g.op("Mul", f"{name}/MulCos", [x, cos]),
                                          g.op("Mul", f"{name}/MulSin", [rotated, sin])])

    def attention(self, i: int, x: str, rope: tuple[str, str], mask: str, windows: tuple[str, str] | None) -> str:
        """A block's attention: over its image (a full-attention layer), or each window alone (windows:
        (rows, slots), the padded batch window_layout makes; rope: the rows' cos/sin, gathered alike)."""
        s, g = self.s, self.g
        p, name = f"blocks.{i}.attn", f"/vision/blocks.{i}/attn"
        qkv = self.linear(f"{name}/qkv", x, f"{p}.qkv")                                     # [P, 3C]
        if self.native:  # mask: the segment ids (image_ids, or window_ids in a windowed layer)
            out = g.op("SegmentAttention", f"{name}/SegmentAttention", [qkv, *rope, mask], domain=CPU_DOMAIN,
                       num_heads=s.num_heads, scale=s.head_dim ** -0.5)                      # [P, C]
            return self.linear(f"{name}/proj", out, f"{p}.proj")
        if windows is not None:                                                              # [Nw, W, 3C]
            qkv = g.op("Gather", f"{name}/qkv/Windows", [qkv, windows[0]], axis=0)
        qkv = g.op("Reshape", f"{name}/qkv/Reshape", [qkv, g.const([0, -1, 3, s.num_heads, s.head_dim] if windows
                                                                   else [1, -1, 3, s.num_heads, s.head_dim])])
        qkv = g.op("Transpose", f"{name}/qkv/Transpose", [qkv], perm=[2, 0, 3, 1, 4])        # [3, N, heads, n, d]
        q, k, v = (g.op("Squeeze", f"{name}/{t}/Squeeze", [part, g.const([0])]) for t, part in zip(
            "qkv", g.op("Split", f"{name}/qkv/Split", [qkv, g.const([1, 1, 1])], num_outputs=3, axis=0)))
        q, k = self.rotate(f"{name}/q_rotary", q, *rope), self.rotate(f"{name}/k_rotary", k, *rope)
        # ONNX's Attention (a fused kernel on ONNX Runtime and TensorRT): [N, heads, n, d], mask [N or 1, 1, n, n]
        out = g.op("Attention", f"{name}/Attention", [q, k, v, mask], scale=s.head_dim ** -0.5,
                   softmax_precision=onnx.TensorProto.FLOAT)                                 # [N, heads, n, d]
        out = g.op("Transpose", f"{name}/Context/Transpose", [out], perm=[0, 2, 1, 3])        # [N, n, heads, d]
        out = g.op("Reshape", f"{name}/Context/Reshape", [out, g.const([-1, s.hidden_size])])
        if windows is not None:  # each row from its window's place
            out = g.op("Gather", f"{name}/Context/Rows", [out, windows[1]], axis=0)
        return self.linear(f"{name}/proj", out, f"{p}.proj")

    def mlp(self, i: int, x: str) -> str:
        p, name = f"blocks.{i}.mlp", f"/vision/blocks.{i}/mlp"
        if self.s.mlp in ("fc", "linear_fc"):
            fc1, fc2 = ("fc1", "fc2") if self.s.mlp == "fc" else ("linear_fc1", "linear_fc2")
            hidden = self.act(f"{name}/act", self.linear(f"{name}/{fc1}", x, f"{p}.{fc1}"))
            return self.linear(f"{name}/{fc2}", hidden, f"{p}.{fc2}")
        gate = self.act(f"{name}/act", self.linear(f"{name}/gate_proj", x, f"{p}.gate_proj"))
        up = self.linear(f"{name}/up_proj", x, f"{p}.up_proj")
        return self.linear(f"{name}/down_proj", self.g.op("Mul", f"{name}/Mul", [gate, up]), f"{p}.down_proj")

    def merger(self, module: str, x: str, postshuffle: bool = False, output: str | None = None) -> str:
        """[P, C] -> [P/m^2, out_hidden]: norm, then [P/m^2, C*m^2] (m^2 consecutive rows), Linear, GELU,
        Linear; `postshuffle` (Qwen3-VL's deepstack mergers): the rows folded first, the norm over C*m^2."""
        s, g, name = self.s, self.g, f"/vision/{module}"
        norm, fc1, fc2 = ("ln_q", "mlp.0", "mlp.2") if s.mlp != "linear_fc" else ("norm", "linear_fc1", "linear_fc2")

        def fold(y: str) -> str:  # [P, C] -> [P/m^2, C*m^2]
            return g.op("Reshape", f"{name}/Reshape", [y, g.const([-1, s.hidden_size * s.spatial_merge_size ** 2])])

        if postshuffle:
            x = self.norm(f"{name}/{norm}", fold(x), f"{module}.{norm}")
        else:
            x = fold(self.norm(f"{name}/{norm}", x, f"{module}.{norm}"))
        x = g.op("Gelu", f"{name}/act", [self.linear(f"{name}/{fc1}", x, f"{module}.{fc1}")], approximate="none")
        y = g.op("MatMul", f"{name}/{fc2}/MatMul", [x, self.weight(f"{module}.{fc2}.weight", transpose=True)])
        return g.op("Add", f"{name}/{fc2}/Add", [y, self.weight(f"{module}.{fc2}.bias")],
                    outputs=[output] if output else None)

    def position_embedding(self, x: str, index: str, weights: str) -> str:
        """x + sum_k pos_embed[index[:, k]] * weights[:, k]: Qwen3-VL's learned table resampled to the rows'
        grids (the taps and weights of the bilinear interpolation come in: [P, 4] each)."""
        g, n = self.g, "/vision/pos_embed"
        taps = g.op("Gather", f"{n}/Gather", [self.weight("pos_embed.weight"), index], axis=0)  # [P, 4, C]
        taps = g.op("Mul", f"{n}/Mul", [taps, g.op("Unsqueeze", f"{n}/Unsqueeze", [weights, g.const([-1])])])
        return g.op("Add", f"{n}/Add", [x, g.op("ReduceSum", f"{n}/ReduceSum", [taps, g.const([1])], keepdims=0)])

    def write(self) -> onnx.ModelProto:
        s, g = self.s, self.g
        pixels = g.input(PIXELS, F32, ["patches", s.patch_dim])
        positions = g.input(POSITIONS, I64, ["patches", 2])
        ids = g.input(IMAGE_IDS, I64, ["patches"])
        # Conv3d with kernel = stride = the patch: one dot product a row, the kernel flattened as the row
        # is, (C, T, H, W)
        kernel = self.w["patch_embed.proj.weight"].reshape(s.hidden_size, -1)
        x = g.op("MatMul", "/vision/patch_embed/MatMul", [pixels, g.weight("patch_embed.proj.weight", kernel.T.copy())])
        if "patch_embed.proj.bias" in self.w:  # (Qwen3-VL's)
            x = g.op("Add", "/vision/patch_embed/Add", [x, self.weight("patch_embed.proj.bias")])
        if s.num_position_embeddings is not None:
            x = self.position_embedding(x, g.input(POS_INDEX, I64, ["patches", 4]),
                                        g.input(POS_WEIGHTS, F32, ["patches", 4]))
        cos, sin = self.rotary(positions)                                                    # [P, d]
        full = (ids if self.native else self.mask("/vision/image_mask", ids), (cos, sin), None)  # mask [1, 1, P, P]
        if s.window_size is not None and self.native:
            windowed = (g.input(WINDOW_IDS, I64, ["patches"]), (cos, sin), None)
        elif s.window_size is not None:  # (shared by every windowed layer)
            rows = g.input(WINDOW_ROWS, I64, ["windows", "window_width"])
            windows = (g.op("Max", "/vision/windows/rows", [rows, g.const(0)]),
                       g.input(WINDOW_SLOTS, I64, ["patches"]))
            valid = g.op("GreaterOrEqual", "/vision/windows/valid", [rows, g.const(0)])      # [Nw, W]
            # [Nw, 1, W, W]: every row of a window (its padding too: gathered out after) sees its real rows
            # (expanded: ONNX Runtime 1.32's Attention refuses a [Nw, 1, 1, W] mask, which ONNX's broadcasts)
            shape = g.op("Shape", "/vision/windows/shape", [rows])
            square = g.op("Concat", "/vision/windows/square", [
                g.op("Slice", "/vision/windows/count", [shape, g.const([0]), g.const([1])]), g.const([1]),
                g.op("Slice", "/vision/windows/width", [shape, g.const([1]), g.const([2])]),
                g.op("Slice", "/vision/windows/width2", [shape, g.const([1]), g.const([2])])], axis=0)
            mask = g.op("Expand", "/vision/windows/mask", [
                g.op("Unsqueeze", "/vision/windows/keys", [valid, g.const([1, 2])]), square])
            rope = tuple(g.op("Unsqueeze", f"/vision/windows/{n}4", [
                g.op("Gather", f"/vision/windows/{n}", [t, windows[0]], axis=0), g.const([1])])
                for n, t in (("cos", cos), ("sin", sin)))                                    # [Nw, 1, W, d]
            windowed = (mask, rope, windows)
        deepstack = []  # [P/m^2, out_hidden] each, in layer order
        for i in range(s.depth):
            name = f"/vision/blocks.{i}"
            mask, rope, at = full if s.full_attention(i) else windowed
            attn = self.attention(i, self.norm(f"{name}/norm1", x, f"blocks.{i}.norm1"), rope, mask, at)
            x = g.op("Add", f"{name}/attn/Residual", [x, attn])
            mlp = self.mlp(i, self.norm(f"{name}/norm2", x, f"blocks.{i}.norm2"))
            x = g.op("Add", f"{name}/mlp/Residual", [x, mlp])
            if i in s.deepstack_visual_indexes:
                j = s.deepstack_visual_indexes.index(i)
                deepstack.append(self.merger(f"deepstack_merger_list.{j}", x, postshuffle=True))
        x = self.merger("merger", x, output=None if deepstack else EMBEDS)
        if deepstack:
            g.op("Concat", "/vision/deepstack/Concat", [x, *deepstack], axis=-1, outputs=[EMBEDS])
        g.output(EMBEDS, F32, ["image_tokens", s.out_hidden_size * (1 + s.deepstack_layers)])
        return g.model("trtllm-edge", {CPU_DOMAIN: 1} if self.native else None)


def _inputs(grids, spec: QwenVisionSpec) -> dict[str, np.ndarray]:
    """What the runtime must reproduce for grids [(t, h, w), ...] in patches, from transformers' own helpers
    (Qwen2_5_VisionTransformerPretrainedModel.forward's):
      window_index  [P/m^2]  get_vision_window_index: merge units in window order (identity for Qwen2-VL);
      rows          [P]      window_index[u] * m^2 + k for each unit u, k < m^2: pixel_values = pixels[rows];
      patch_positions [P, 2] get_vision_position_ids (block-major (h, w)), then [rows];
      window_ids    [P]      the window of each row *in window order*: segment numbers of cu_window_seqlens;
      image_ids     [P]      likewise of get_vision_cu_seqlens (one segment a frame, h * w rows);
      unpermute     [P/m^2]  argsort(window_index): image_embeds[unpermute] is transformers' order;
      pos_index, pos_weights [P, 4]  Qwen3-VL: get_vision_interpolation_indices_and_weights (bilinear,
                             corners aligned, as Qwen3VLVisionModel calls it), then [rows]."""
    import torch
    from transformers.vision_utils import (get_vision_cu_seqlens, get_vision_interpolation_indices_and_weights,
                                           get_vision_position_ids, get_vision_window_index)

    grid_thw = torch.tensor(grids, dtype=torch.int64)
    unit = spec.spatial_merge_size ** 2
    total = int(grid_thw.prod(-1).sum())
    positions = get_vision_position_ids(grid_thw, spec.spatial_merge_size).numpy()
    cu_seqlens = get_vision_cu_seqlens(grid_thw).numpy()  # (what get_vision_attention_seqlens returns first)
    if spec.window_size is None:
        window_index, cu_windows = np.arange(total // unit), None
    else:
        window_index, cu_windows = (t.numpy() for t in get_vision_window_index(
            grid_thw, spec.spatial_merge_size, spec.window_size, spec.patch_size))
    rows = (window_index[:, None] * unit + np.arange(unit)).reshape(-1)

    def segment(cu):  # row r (in window order) lies in segment j when cu[j] <= r < cu[j + 1]
        return np.searchsorted(cu[1:], np.arange(total), side="right").astype(np.int64)

    out = {"rows": rows, "unpermute": np.argsort(window_index), POSITIONS: positions[rows].astype(np.int64),
           IMAGE_IDS: segment(cu_seqlens)}
    if cu_windows is not None:
        out[WINDOW_IDS] = segment(cu_windows)
    if spec.num_grid_per_side is not None:
        index, weights = get_vision_interpolation_indices_and_weights(
            grid_thw, spec.num_grid_per_side, mode="bilinear", align_corners=True,
            spatial_merge_size=spec.spatial_merge_size)
        out[POS_INDEX], out[POS_WEIGHTS] = index.numpy()[rows].astype(np.int64), weights.numpy()[rows]
    return out


def verify(graph_path, vlm, spec: QwenVisionSpec, grids=((1, 8, 12), (1, 4, 4)), compiled=None, save=None) -> dict:
    """vision.onnx through ONNX Runtime against transformers' get_image_features (its pooler_output and
    deepstack_features side by side) on random pixels for `grids` (one run, all images packed), and
    `compiled` (vision.ort.onnx, on our kernels) alike; a mismatch raises. `save`: a path for
    vision.onnx's feeds and transformers' embeddings (a TensorRT engine's vision plan is checked against
    them where it is built: builder/verify_logits.py). Returns the figures for verify.json."""
    import torch

    from trtllm.builder.verify_logits import embeddings_error

    total = sum(t * h * w for t, h, w in grids)
    pixels = np.random.default_rng(0).standard_normal((total, spec.patch_dim)).astype(np.float32)
    feeds = _inputs(grids, spec)
    with torch.no_grad():
        ref = vlm.model.get_image_features(torch.from_numpy(pixels), torch.tensor(grids), return_dict=True)
    # pooler_output: a tuple, one entry an image; Qwen3-VL's deepstack_features: a list, one entry a
    # deepstack layer (in layer order), each such a tuple: side by side as image_embeds has them
    blocks = [ref.pooler_output, *(getattr(ref, "deepstack_features", None) or ())]
    ref = torch.cat([torch.cat(list(images)) for images in blocks], dim=-1).numpy()
    scale = float(np.abs(ref).max())
    out = {"max_abs_value": scale, "grids": [list(g) for g in grids]}
    if save is not None:
        np.savez(save, image_embeds=ref, unpermute=feeds["unpermute"], **canonical_feeds(pixels[feeds["rows"]], feeds))
    for key, path in (("max_abs_error", graph_path), ("compiled_max_abs_error", compiled)):
        if path is None:
            continue
        ours = _run(path, pixels[feeds["rows"]], feeds, native=key != "max_abs_error")[feeds["unpermute"]]
        out[key] = embeddings_error(ours, ref, f"the vision graph {Path(path).name}")
    return out


def canonical_feeds(pixels, feeds) -> dict:
    """What _inputs made as vision.onnx's feeds (its windows as a padded batch), with the rows' pixels."""
    from trtllm.runtime.images_qwen import window_layout

    out = {PIXELS: pixels, **{k: feeds[k] for k in (POSITIONS, IMAGE_IDS, POS_INDEX, POS_WEIGHTS) if k in feeds}}
    if WINDOW_IDS in feeds:
        out[WINDOW_ROWS], out[WINDOW_SLOTS] = window_layout(feeds[WINDOW_IDS])
    return out


def _run(path, pixels, feeds, native: bool) -> np.ndarray:
    """One run of a vision graph (`native`: with our kernel library) on what _inputs made."""
    import onnxruntime as ort

    from trtllm.plugins import cpu as cpu_kernels

    opts = ort.SessionOptions()
    if native:
        opts.register_custom_ops_library(str(cpu_kernels.library()))
    session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    feeds = {**feeds, **canonical_feeds(pixels, feeds)}
    names = [i.name for i in session.get_inputs()]
    return session.run(None, {n: feeds[n] for n in names})[0]


def section(vlm, tokenizer, spec: QwenVisionSpec, source, max_pixels: int | None = None) -> dict:
    """The manifest's vision section: the graph, the image tokens (the config's ids), the language
    model's M-RoPE sections (Qwen3-VL's interleaved), the deepstack layers (image_embeds' extra column
    blocks, K: the language model's first K layers each add one to their image rows), the learned
    position grid's side (Qwen3-VL; else None), and how pixels are made (runtime/images_qwen.py);
    `max_pixels` (--max-image-pixels) lowers the processor's max_pixels."""
    from transformers.image_processing_utils import ImageProcessingMixin

    from trtllm.builder.config import ConfigError
    from trtllm.builder.vision import VISION_NAME, mrope_interleaved, mrope_section
    from trtllm.runtime.images_qwen import preprocess_config

    config = vlm.config
    ids = {}
    for key in ("image_token_id", "vision_start_token_id", "vision_end_token_id"):
        value = getattr(config, key, None)
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < len(tokenizer):
            raise Unsupported(f"config.{key} {value!r} is not a token of its tokenizer ({len(tokenizer)} tokens)")
        ids[key] = value
    try:
        processor, _ = ImageProcessingMixin.get_image_processor_dict(source)
        pre = preprocess_config(processor)
    except (OSError, ValueError) as e:
        raise Unsupported(f"its image processor's config (preprocessor_config.json) cannot be used: {e}") from e
    for key, want in (("patch_size", spec.patch_size), ("temporal_patch_size", spec.temporal_patch_size),
                      ("merge_size", spec.spatial_merge_size)):
        if pre[key] != want:
            raise Unsupported(f"preprocessor_config.{key} {pre[key]} is not the vision encoder's {want}")
    if max_pixels is not None:
        if max_pixels < pre["min_pixels"]:
            raise ConfigError(f"--max-image-pixels {max_pixels} is below the processor's min_pixels "
                              f"{pre['min_pixels']}")
        if max_pixels > pre["max_pixels"]:
            raise ConfigError(f"--max-image-pixels {max_pixels} is above the processor's max_pixels "
                              f"{pre['max_pixels']}: it only lowers it")
        pre["max_pixels"] = max_pixels
    return {"architecture": spec.model_type, "graph": VISION_NAME, "hidden_size": spec.out_hidden_size,
            "image_token": tokenizer.convert_ids_to_tokens(ids["image_token_id"]),
            "image_token_id": ids["image_token_id"], "start_token_id": ids["vision_start_token_id"],
            "end_token_id": ids["vision_end_token_id"], "mrope_section": list(mrope_section(config)),
            "mrope_interleaved": mrope_interleaved(config), "window_size": spec.window_size,
            "deepstack_layers": spec.deepstack_layers, "num_grid_per_side": spec.num_grid_per_side,
            "preprocess": pre}
