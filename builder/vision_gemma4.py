"""Gemma 4's image encoder as vision.onnx (builder/vision.py says what the graph is for): transformers'
Gemma4Model.get_image_features, the vision tower and the multimodal embedder, for one image's patches.

    pixel_values        [P, patch^2 x 3] f32   an image's patches, row by row (runtime/images_gemma4.py)
    pixel_position_ids  [P, 2] int64           each patch's (x, y) in the image's grid
      -> 2 (x - 0.5) @ input_proj + position_embedding_table[0][x] + [1][y]
      -> layers: x += norm(attn(norm(x))); x += norm(mlp(norm(x)))   (4 norms that scale by w)
           attention: q and k normed per head and turned by a 2-D RoPE (the first half of each head by x,
           the second by y), v normed per head, scores unscaled, every patch seeing every other
      -> k x k patches averaged into a token (k = pooling_kernel_size), x sqrt(hidden)
      -> (standardize: (x - std_bias) * std_scale) -> RMSNorm (no scale) -> @ embedding_projection
      -> image_embeds [P / k^2, text hidden] f32

transformers pads every image's patches to max_soft_tokens x k^2 and masks the padding out of the
attention and the pooling; the graph takes an image's own patches alone, which is the same sum.
Where the config clips the linears' inputs and outputs (use_clipped_linears), the graph clips them.

In the language model an image's tokens see each other both ways on the sliding layers only, where
text_config.use_bidirectional_attention is "vision" (DecoderSpec.image_ahead_windows_only); else causally,
as the smaller models' configs have it.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx

from trtllm.builder import vision
from trtllm.builder.config import ConfigError, Unsupported
from trtllm.builder.vision import ACTIVATIONS, EMBEDS, F32, VisionWriter
from trtllm.builder.vision_gemma3 import image_tokens

MODEL_TYPES = ("gemma4",)
POSITIONS = "pixel_position_ids"
I64 = onnx.TensorProto.INT64
# the tokenizer's names for the image tokens (Gemma4Processor's), and transformers' defaults for their text
TOKENS = {"boi_token": "<|image>", "image_token": "<|image|>", "eoi_token": "<image|>"}


@dataclass(frozen=True)
class Gemma4VisionSpec:
    patch_size: int
    hidden_size: int
    num_heads: int
    head_dim: int
    num_layers: int
    eps: float
    act: str             # Gelu's approximate
    rope_theta: float
    pooling: int         # k: k x k patches a token
    standardize: bool
    out_hidden: int      # the language model's hidden size
    clipped: bool        # use_clipped_linears

    @property
    def patch_values(self) -> int:
        return self.patch_size ** 2 * 3


def spec_of(config) -> Gemma4VisionSpec:
    """Gemma4Config -> Gemma4VisionSpec; what the graph does not do is refused by name."""
    v = config.vision_config
    rope = v.rope_parameters or {}
    checks = [
        (v.hidden_activation in ACTIVATIONS, f"vision_config.hidden_activation {v.hidden_activation!r}: supported "
         f"{sorted(ACTIVATIONS)}"),
        (v.num_key_value_heads == v.num_attention_heads, f"vision_config.num_key_value_heads {v.num_key_value_heads} "
         f"must be its num_attention_heads {v.num_attention_heads}"),
        (v.head_dim % 4 == 0, f"vision_config.head_dim {v.head_dim} must be a multiple of 4 (two axes, each turned "
         "by half pairs)"),
        (rope.get("rope_type", "axial") == "axial", f"vision_config.rope_parameters.rope_type {rope.get('rope_type')!r}: "
         "only 'axial'"),
        (not getattr(v, "attention_bias", False), "vision_config.attention_bias true"),
    ]
    for ok, what in checks:
        if not ok:
            raise Unsupported(f"the vision encoder: {what}")
    return Gemma4VisionSpec(v.patch_size, v.hidden_size, v.num_attention_heads, v.head_dim, v.num_hidden_layers,
                            float(v.rms_norm_eps), ACTIVATIONS[v.hidden_activation], float(rope.get("rope_theta", 100.0)),
                            v.pooling_kernel_size, bool(v.standardize), config.text_config.hidden_size,
                            bool(v.use_clipped_linears))


def bidirectional(config) -> bool:
    """Whether an image's tokens see each other both ways (on the sliding layers); "all" is refused
    before (builder/architectures/gemma4.py: not a causal model)."""
    return getattr(config.text_config, "use_bidirectional_attention", None) == "vision"


def placeholders(config) -> dict:
    """DecoderSpec's placeholder fields: the image, video and audio tokens, which Gemma4Model.forward reads
    as the pad token in its token tables (the image embeddings then replace the prompt's image tokens' rows;
    a generated one stays the pad's)."""
    ids = tuple(sorted({int(t) for t in (config.image_token_id, getattr(config, "video_token_id", None),
                                         getattr(config, "audio_token_id", None)) if t is not None}))
    return {"placeholder_ids": ids, "placeholder_pad_id": int(config.text_config.pad_token_id)}


def weights_of(vlm) -> dict[str, np.ndarray]:
    """The tower's and the embedder's weights, float32 numpy, without the model's `model.` prefix."""
    return {name[len("model."):]: tensor.detach().float().numpy() for name, tensor in vlm.state_dict().items()
            if name.startswith(("model.vision_tower.", "model.embed_vision."))}


class Gemma4Writer(VisionWriter):
    """vision.onnx for Gemma 4 (`native`: vision.ort.onnx, each layer's attention one
    trtllm.cpu::SegmentAttention over the image's patches, its memory linear in them)."""

    def linear(self, name: str, x: str, module: str, bias: bool = False) -> str:
        """A Gemma4ClippableLinear: its input and output clipped where the config says and a bound is finite."""
        x = self.clip(f"{name}/clip_in", x, module, "input")
        return self.clip(f"{name}/clip_out", super().linear(name, x, f"{module}.linear", bias=False), module, "output")

    def clip(self, name: str, x: str, module: str, side: str) -> str:
        if not self.s.clipped:
            return x
        lo, hi = (float(self.w[f"{module}.{side}_{b}"]) for b in ("min", "max"))
        if np.isinf(lo) and np.isinf(hi):
            return x
        big = float(np.finfo(np.float32).max)
        return self.g.op("Clip", name, [x, self.g.const(max(lo, -big), np.float32), self.g.const(min(hi, big), np.float32)])

    def rms(self, name: str, x: str, module: str | None) -> str:
        """Gemma4RMSNorm over the last axis (VisionWriter.norm's): x / sqrt(mean(x^2) + eps), times w where
        module has one."""
        return self.norm(name, x, module, "rms_norm", self.s.eps)

    def rope_tables(self, positions: str) -> tuple[str, str]:
        """cos, sin [P, 1, D]: the x angles on each head's first half, the y angles on its second (each
        half turned as rotate_half turns a head: Gemma4VisionRotaryEmbedding's H-H-W-W layout)."""
        s, g = self.s, self.g
        half = s.head_dim // 2
        inv = (1.0 / (s.rope_theta ** (np.arange(0, half, 2, dtype=np.float32) / half))).astype(np.float32)
        pos = g.op("Cast", "/vision/rope/Cast", [positions], to=F32)                            # [P, 2]
        freqs = g.op("Mul", "/vision/rope/freqs", [g.op("Unsqueeze", "/vision/rope/Unsqueeze", [pos, g.const([-1])]),
                                                   g.const(inv, np.float32)])                               # [P, 2, D/4]
        out = []
        for fn in ("Cos", "Sin"):
            t = g.op(fn, f"/vision/rope/{fn}", [freqs])
            xs, ys = g.op("Split", f"/vision/rope/{fn}/Split", [t, g.const([1, 1])], num_outputs=2, axis=1)
            out.append(g.op("Concat", f"/vision/rope/{fn}/Concat", [xs, xs, ys, ys], axis=-1))  # [P, 1, D]
        return out[0], out[1]

    def rotate(self, name: str, x: str, cos: str, sin: str) -> str:
        """[P, H, D] turned: each half of a head by rotate_half at its axis' angles."""
        g, q = self.g, self.s.head_dim // 4
        a, b, c, d = g.op("Split", f"{name}/Split", [x, g.const([q] * 4)], num_outputs=4, axis=-1)
        turned = g.op("Concat", f"{name}/Concat", [g.op("Neg", f"{name}/Neg0", [b]), a,
                                                   g.op("Neg", f"{name}/Neg1", [d]), c], axis=-1)
        return g.op("Add", f"{name}/Add", [g.op("Mul", f"{name}/Cos", [x, cos]), g.op("Mul", f"{name}/Sin", [turned, sin])])

    def layer_attention(self, i: int, x: str, cos: str, sin: str) -> str:
        s, g = self.s, self.g
        p, name = f"vision_tower.encoder.layers.{i}.self_attn", f"/vision/layers.{i}/attn"
        heads = g.const([0, s.num_heads, s.head_dim])
        parts = {}
        for proj in ("q", "k", "v"):
            y = g.op("Reshape", f"{name}/{proj}/Reshape", [self.linear(f"{name}/{proj}_proj", x, f"{p}.{proj}_proj"), heads])
            y = self.rms(f"{name}/{proj}_norm", y, f"{p}.{proj}_norm" if proj != "v" else None)
            parts[proj] = y if proj == "v" else self.rotate(f"{name}/{proj}/rope", y, cos, sin)     # [P, H, D]
        width = s.num_heads * s.head_dim
        if self.native:  # [P, 3 H D], the image's patches one segment
            qkv = g.op("Concat", f"{name}/qkv", [g.op("Reshape", f"{name}/{k}/flat", [v, g.const([0, width])])
                                                 for k, v in parts.items()], axis=-1)
            out = g.op("SegmentAttention", f"{name}/SegmentAttention", [qkv, "", "", self.segment_ids(x)],
                       domain=vision.CPU_DOMAIN, num_heads=s.num_heads, scale=1.0)
        else:
            t = {k: g.op("Transpose", f"{name}/{k}/Transpose", [v], perm=[1, 0, 2]) for k, v in parts.items()}  # [H,P,D]
            k_t = g.op("Transpose", f"{name}/k/TransposeT", [t["k"]], perm=[0, 2, 1])
            probs = g.op("Softmax", f"{name}/Softmax", [g.op("MatMul", f"{name}/Scores", [t["q"], k_t])], axis=-1)
            out = g.op("Transpose", f"{name}/Context/Transpose", [g.op("MatMul", f"{name}/Context", [probs, t["v"]])],
                       perm=[1, 0, 2])
            out = g.op("Reshape", f"{name}/Context/Reshape", [out, g.const([0, width])])
        return self.linear(f"{name}/o_proj", out, f"{p}.o_proj")

    def segment_ids(self, x: str) -> str:
        """[P] int64 zeros: one image a run, one segment."""
        if self.segments is None:
            g = self.g
            rows = g.op("Slice", "/vision/segments/rows", [g.op("Shape", "/vision/segments/shape", [x]),
                                                           g.const([0]), g.const([1])])
            self.segments = g.op("ConstantOfShape", "/vision/segments/zeros", [rows],
                                 value=onnx.helper.make_tensor("value", I64, [1], [0]))
        return self.segments

    def layer(self, i: int, x: str, cos: str = "", sin: str = "") -> str:
        s, g = self.s, self.g
        p, name = f"vision_tower.encoder.layers.{i}", f"/vision/layers.{i}"
        y = self.layer_attention(i, self.rms(f"{name}/input_layernorm", x, f"{p}.input_layernorm"), cos, sin)
        x = g.op("Add", f"{name}/attn/Residual", [x, self.rms(f"{name}/post_attention_layernorm", y,
                                                             f"{p}.post_attention_layernorm")])
        y = self.rms(f"{name}/pre_feedforward_layernorm", x, f"{p}.pre_feedforward_layernorm")
        gate = g.op("Gelu", f"{name}/mlp/act", [self.linear(f"{name}/mlp/gate_proj", y, f"{p}.mlp.gate_proj")],
                    approximate=s.act)
        y = g.op("Mul", f"{name}/mlp/Mul", [gate, self.linear(f"{name}/mlp/up_proj", y, f"{p}.mlp.up_proj")])
        y = self.linear(f"{name}/mlp/down_proj", y, f"{p}.mlp.down_proj")
        return g.op("Add", f"{name}/mlp/Residual", [x, self.rms(f"{name}/post_feedforward_layernorm", y,
                                                               f"{p}.post_feedforward_layernorm")])

    def pool(self, x: str, positions: str) -> str:
        """[P, C] -> [P / k^2, C]: each k x k block of patches averaged, the blocks row by row, as
        Gemma4VisionPooler weights them (one-hot / k^2, then a product); the grid is as wide as the largest
        x + 1. (No shape is read from the positions' values: TensorRT would take them as a shape tensor.)"""
        g, k = self.g, self.s.pooling
        at = {a: g.op("Div", f"/vision/pool/{a}_k", [g.op("Gather", f"/vision/pool/{a}", [positions, g.const(i)], axis=1),
                                                     g.const(k)]) for i, a in enumerate("xy")}
        width = g.op("Add", "/vision/pool/width", [g.op("ReduceMax", "/vision/pool/max_x", [at["x"], g.const([0])],
                                                        keepdims=1), g.const([1])])            # [1]: blocks a row
        block = g.op("Add", "/vision/pool/block", [at["x"], g.op("Mul", "/vision/pool/row", [at["y"], width])])  # [P]
        patches = g.op("Gather", "/vision/pool/patches", [g.op("Shape", "/vision/pool/shape", [x]), g.const(0)], axis=0)
        tokens = g.op("Range", "/vision/pool/tokens", [g.const(0), g.op("Div", "/vision/pool/count", [
            patches, g.const(k * k)]), g.const(1)])                                           # [T]
        hot = g.op("Equal", "/vision/pool/Equal", [g.op("Unsqueeze", "/vision/pool/blocks", [block, g.const([0])]),
                                                   g.op("Unsqueeze", "/vision/pool/slots", [tokens, g.const([1])])])
        weights = g.op("Mul", "/vision/pool/weights", [g.op("Cast", "/vision/pool/Cast", [hot], to=F32),
                                                       g.const(np.float32(1.0 / (k * k)), np.float32)])  # [T, P]
        return g.op("MatMul", "/vision/pool/MatMul", [weights, x])

    def write(self):
        s, g = self.s, self.g
        pixels = g.input(vision.PIXELS, F32, ["patches", s.patch_values])
        positions = g.input(POSITIONS, I64, ["patches", 2])
        e = "vision_tower.patch_embedder"
        x = g.op("Mul", "/vision/patch/Scale", [g.op("Sub", "/vision/patch/Center", [pixels, g.const(0.5, np.float32)]),
                                                g.const(2.0, np.float32)])
        x = super().linear("/vision/patch/input_proj", x, f"{e}.input_proj", bias=False)
        table = self.w[f"{e}.position_embedding_table"]
        for axis in (0, 1):  # (each axis' table a weight of its own: Gather by that axis' index)
            rows = g.weight(f"{e}.position_embedding_table.{'xy'[axis]}", np.ascontiguousarray(table[axis]))
            at = g.op("Gather", f"/vision/position/{'xy'[axis]}", [positions, g.const(axis)], axis=1)
            x = g.op("Add", f"/vision/position/Add{axis}", [x, g.op("Gather", f"/vision/position/{'xy'[axis]}/Gather",
                                                                    [rows, at], axis=0)])
        cos, sin = self.rope_tables(positions)
        for i in range(s.num_layers):
            x = self.layer(i, x, cos, sin)
        x = self.pool(x, positions)
        x = g.op("Mul", "/vision/pool/Scale", [x, g.const(np.float32(s.hidden_size ** 0.5), np.float32)])
        if s.standardize:
            x = g.op("Mul", "/vision/standardize/Scale", [
                g.op("Sub", "/vision/standardize/Bias", [x, self.weight("vision_tower.std_bias")]),
                self.weight("vision_tower.std_scale")])
        x = self.rms("/embed_vision/norm", x, None)
        x = super().linear("/embed_vision/projection", x, "embed_vision.embedding_projection", bias=False)
        g.op("Identity", "/vision/out", [x], outputs=[EMBEDS])
        g.output(EMBEDS, F32, ["image_tokens", s.out_hidden])
        return self.model()


def section(vlm, tokenizer, spec: Gemma4VisionSpec, source, max_tokens: int | None = None) -> dict:
    """The manifest's vision section: the graph, the image tokens and how pixels are made
    (runtime/images_gemma4.py); `max_tokens` (--max-image-tokens): the token budget an image is resized to,
    in place of the processor's max_soft_tokens (as transformers' processor takes it in a call)."""
    from transformers.image_processing_utils import ImageProcessingMixin

    from trtllm.runtime.images_gemma4 import SOFT_TOKENS, preprocess_config

    if max_tokens is not None and max_tokens not in SOFT_TOKENS:
        raise ConfigError(f"--max-image-tokens must be one of {', '.join(map(str, SOFT_TOKENS))} (the budgets "
                          f"Gemma 4's image processor takes), got {max_tokens}")
    try:
        processor, _ = ImageProcessingMixin.get_image_processor_dict(source)
        pre = preprocess_config(processor)
    except (OSError, ValueError) as e:
        raise Unsupported(f"its image processor's config (preprocessor_config.json) cannot be used: {e}") from e
    if max_tokens is not None:
        pre["max_soft_tokens"] = max_tokens
    for key, want in (("patch_size", spec.patch_size), ("pooling_kernel_size", spec.pooling)):
        if pre[key] != want:
            raise Unsupported(f"preprocessor_config.{key} {pre[key]} is not the vision encoder's {want}")
    config = vlm.config
    text, ids = image_tokens(tokenizer, config, TOKENS)
    return {"architecture": "gemma4", "graph": vision.VISION_NAME, "hidden_size": spec.out_hidden,
            "image_token": text["image_token"], "image_token_id": ids["image_token"],
            "start_token_id": ids["boi_token"], "end_token_id": ids["eoi_token"],
            "bidirectional": bidirectional(config), "max_patches": pre["max_soft_tokens"] * spec.pooling ** 2,
            "preprocess": pre}


def verify(graph_path, vlm, spec: Gemma4VisionSpec, grid: tuple[int, int] | None = None, save=None,
           compiled=None) -> dict:
    """vision.onnx (and vision.ort.onnx) against transformers' get_image_features on random patches of a
    grid (columns, rows: 2 x 3 tokens' worth where None), fed padded as its processor pads them; a
    mismatch raises (vision.verify's figures; a near miss asks transformers in float64: embeddings_error)."""
    import copy

    import torch

    from trtllm.builder.verify_logits import fits_in_float64

    columns, rows = grid or (2 * spec.pooling, 3 * spec.pooling)
    rng = np.random.default_rng(0)
    pixels = rng.uniform(0, 1, (rows * columns, spec.patch_values)).astype(np.float32)
    gx, gy = np.meshgrid(np.arange(columns), np.arange(rows), indexing="xy")
    positions = np.stack([gx, gy], axis=-1).reshape(-1, 2).astype(np.int64)
    pad = spec.pooling ** 2  # (one token's worth of padding, as a smaller image than the budget has)
    padded = np.concatenate([pixels, np.zeros((pad, spec.patch_values), np.float32)])[None]
    padded_at = np.concatenate([positions, np.full((pad, 2), -1, np.int64)])[None]
    def features(model, dtype):
        with torch.no_grad():
            out = model.model.get_image_features(torch.from_numpy(padded).to(dtype), torch.from_numpy(padded_at),
                                                 return_dict=True)
        return torch.cat(out.pooler_output).numpy()

    ref = features(vlm, torch.float32)
    wide = {}

    def float64():  # (once, for either form: a near miss's yardstick, embeddings_error; the encoder alone)
        if "ref" not in wide:
            encoder = torch.nn.ModuleList([vlm.model.vision_tower, vlm.model.embed_vision])
            wide["ref"] = None
            if fits_in_float64(encoder):
                tower, embed = copy.deepcopy(encoder).double()
                with torch.no_grad():
                    hidden = tower(pixel_values=torch.from_numpy(padded).double(),
                                   pixel_position_ids=torch.from_numpy(padded_at)).last_hidden_state
                    wide["ref"] = embed(inputs_embeds=hidden).numpy()
        return wide["ref"]

    feeds = {vision.PIXELS: pixels, POSITIONS: positions}
    if save is not None:
        np.savez(save, image_embeds=ref, **feeds)
    return {"max_abs_value": float(np.abs(ref).max()), "patches": int(len(pixels)),
            **vision.forms_errors(graph_path, compiled, feeds, ref, float64)}
