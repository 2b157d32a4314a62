"""A vision-language model's image encoder as its own graph, `vision.onnx`: pixels in, the language
model's input embeddings of the image tokens out. InternVL's: InternViT, the pixel shuffle, the MLP
projector (transformers' InternVLModel.get_image_features).

    pixel_values [tiles, 3, H, W] f32
      -> Conv(patch) + [CLS] + position embeddings
      -> layers: x += lambda_1 * attn(norm(x)); x += lambda_2 * mlp(norm(x))   (bidirectional attention)
      -> drop [CLS] -> pixel shuffle (downsample_ratio) -> LayerNorm, Linear, GELU, Linear
      -> image_embeds [tiles * tokens_per_tile, hidden] f32

Written op by op as the decoder is (no tracing), in float32 whatever the language model's --dtype:
the encoder runs once per image, its cost is in the prompt's prefill, and its numbers then match
transformers' to float32 rounding.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx

from trtllm.builder.config import ConfigError, Unsupported
from trtllm.builder.graph import GraphWriter
from trtllm.plugins.cpu import DOMAIN as CPU_DOMAIN

PIXELS, EMBEDS = "pixel_values", "image_embeds"
VISION_NAME = "vision.onnx"
VISION_COMPILED = "vision.ort.onnx"  # ONNX Runtime's form on our kernels (builder/vision_export.write_sharing)
# config.model_type of the vision-language models built
MODEL_TYPES = ("internvl", "qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe", "idefics3", "smolvlm", "gemma3",
               "gemma4")
# the encoders the build takes (left_out: the others a multimodal config gives its model, e.g. Gemma 4's
# audio encoder: the engine takes text and images then)
BUILT_ENCODERS = ("vision",)
LANGUAGE_PREFIX = "model.language_model"  # where their decoder layers are (PEFT adapters name them so)
TEXT_MODEL = ("idefics3", "smolvlm")  # ...but these call it model.text_model
F32 = onnx.TensorProto.FLOAT
# Qwen-VL language models: a text model's layers (Qwen2's; Qwen3-VL: Qwen3's), their RoPE multimodal
# (DecoderSpec.mrope_section), with no causal LM class of their own: the text model's, holding theirs
QWEN_TEXT = {"qwen2_vl_text": "Qwen2", "qwen2_5_vl_text": "Qwen2", "qwen3_vl_text": "Qwen3", "qwen3_vl_moe_text": "Qwen3Moe"}
MROPE_DEFAULT = {"qwen2_vl_text": (16, 24, 24), "qwen2_5_vl_text": (16, 24, 24), "qwen3_vl_text": (24, 20, 20),
                 "qwen3_vl_moe_text": (24, 20, 20)}
ACTIVATIONS = {"gelu": "none", "gelu_pytorch_tanh": "tanh", "gelu_new": "tanh"}  # Gelu's `approximate`


@dataclass(frozen=True)
class VisionSpec:
    image_size: tuple[int, int]
    patch_size: int
    hidden_size: int
    num_heads: int
    num_layers: int
    norm: str             # "layer_norm" or "rms_norm"
    eps: float
    qk_norm: bool
    act: str              # Gelu's approximate: "none" or "tanh"
    projector_act: str
    downsample: int       # 1 / downsample_ratio: the pixel shuffle folds downsample x downsample patches into one
    final_norm: bool      # use_mean_pooling false: a LayerNorm after the last layer
    out_hidden: int       # the language model's hidden size

    @property
    def grid(self) -> int:
        return self.image_size[0] // self.patch_size

    @property
    def tokens_per_tile(self) -> int:
        return (self.grid // self.downsample) ** 2


def is_vision_language(model) -> bool:
    return has_vision(model.config)


def has_vision(config) -> bool:
    """Whether a config is a vision-language model's with a vision encoder (a Gemma 4 checkpoint may have
    none: its language model is then built alone)."""
    return getattr(config, "model_type", None) in MODEL_TYPES and getattr(config, "vision_config", True) is not None


def load(source, config, dtype):
    """(the whole model, transformers' loading info) in `dtype` (float32, or its 16-bit type: builder/held.py)."""
    from transformers import AutoModelForImageTextToText

    return AutoModelForImageTextToText.from_pretrained(source, config=config, dtype=dtype,
                                                       output_loading_info=True, ignore_mismatched_sizes=True)


def processor_file(source, name: str) -> dict:
    """A JSON file of the checkpoint's processor (a directory's, or the hub's cache), {} where it has none."""
    import json

    from transformers.utils import cached_file

    path = cached_file(str(source), name, _raise_exceptions_for_missing_entries=False)
    if path is None:
        return {}
    with open(path) as f:
        return json.load(f)


def encoders_of(config) -> tuple[str, ...]:
    """The encoders a multimodal config gives its model."""
    return tuple(name for name, key in (("vision", "vision_config"), ("audio", "audio_config"))
                 if getattr(config, key, None) is not None)


def language_fields(config) -> dict:
    """DecoderSpec fields that a multimodal checkpoint's language model, built alone, takes from the whole
    config: Gemma 4's placeholder tokens, read as the pad token by its token tables as Gemma4Model reads
    them (a generated one, say an audio token of the audio-only form, is embedded as the pad)."""
    if getattr(config, "model_type", None) != "gemma4":
        return {}
    from trtllm.builder import vision_gemma4  # (it imports this module)

    return vision_gemma4.placeholders(config)


def left_out(config) -> tuple[str, ...]:
    """The encoders of a multimodal config that the build does not take (Gemma 4's audio)."""
    return tuple(name for name in encoders_of(config) if name not in BUILT_ENCODERS)


def tokenizer_of(source):
    """The tokenizer, with the processor's chat template where the tokenizer has none: many
    vision-language checkpoints keep theirs in chat_template.json alone (the processor's legacy
    file), which AutoTokenizer does not read."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(source)
    if tok.chat_template is None:
        tok.chat_template = processor_file(source, "chat_template.json").get("chat_template")
    return tok


def language_model(vlm):
    """The language model of a loaded vision-language model as a causal LM of its text_config's class,
    holding the same modules (no copy): what the rest of the build reads, and verifies against."""
    import torch
    import transformers

    config = vlm.config.text_config
    with torch.device("meta"):  # (its own weights are replaced at once)
        if config.model_type in QWEN_TEXT:
            kept = {k: v for k, v in config.to_dict().items() if k not in ("model_type", "architectures")}
            kept["rope_parameters"] = {k: v for k, v in (kept.get("rope_parameters") or {}).items()
                                       if k not in ("mrope_section", "mrope_interleaved")}
            base = QWEN_TEXT[config.model_type]
            if base == "Qwen3Moe":  # (its router always renormalizes the chosen experts' weights)
                kept["num_experts"], kept["norm_topk_prob"] = config.num_experts, True
            text = getattr(transformers, f"{base}ForCausalLM")(getattr(transformers, f"{base}Config")(**kept))
        else:
            text = transformers.AutoModelForCausalLM.from_config(config)
    text.model, text.lm_head = language_module(vlm), vlm.lm_head
    text.generation_config = vlm.generation_config
    return text.eval()


def language_module(vlm):
    """The whole model's language model (its decoder, without the head)."""
    return vlm.model.text_model if vlm.config.model_type in TEXT_MODEL else vlm.model.language_model


def language_prefix(vlm) -> str:
    """Where the whole model's decoder layers are, as its PEFT adapters name them."""
    return "model.text_model" if vlm.config.model_type in TEXT_MODEL else LANGUAGE_PREFIX


def mrope_section(config) -> tuple[int, ...] | None:
    """The language model's multimodal RoPE sections (DecoderSpec.mrope_section), or None: the rotary
    columns turned by a token's temporal, height and width positions (transformers' default where the
    config names none)."""
    text = config.text_config
    if text.model_type not in QWEN_TEXT:
        return None
    section = tuple(int(n) for n in (text.rope_parameters or {}).get("mrope_section") or MROPE_DEFAULT[text.model_type])
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    # (interleaved: height and width take every third column from the second and the third)
    interleaved_fits = len(section) == 3 and (not mrope_interleaved(config) or (
        3 * section[1] <= sum(section) + 1 and 3 * section[2] <= sum(section)))
    if len(section) != 3 or sum(section) != head_dim // 2 or min(section) < 1 or not interleaved_fits:
        raise Unsupported(f"rope_parameters.mrope_section {list(section)} must be three widths adding up to half "
                          f"the head size ({head_dim // 2})" + " (interleaved: each of the last two about a third of"
                          " it at most)" * mrope_interleaved(config))
    return section


def mrope_interleaved(config) -> bool:
    """Whether the sections take the rotary columns in turn (Qwen3-VL's recomposition always does)."""
    return config.text_config.model_type in ("qwen3_vl_text", "qwen3_vl_moe_text")


def spec_of(config) -> VisionSpec:
    """InternVLConfig -> VisionSpec; what the graph does not do is refused by name."""
    v = config.vision_config
    size, patch = tuple(v.image_size), tuple(v.patch_size)
    ratio = float(config.downsample_ratio)
    down = round(1 / ratio)
    checks = [
        (size[0] == size[1] and patch[0] == patch[1], f"vision_config.image_size {list(size)} and patch_size "
         f"{list(patch)} must be square"),
        (size[0] % patch[0] == 0, "vision_config.image_size must be a multiple of patch_size"),
        (abs(down * ratio - 1) < 1e-9 and (size[0] // patch[0]) % down == 0,
         f"downsample_ratio {ratio} must be 1/n for an n dividing the {size[0] // patch[0]} patches a side"),
        (config.vision_feature_layer == -1, f"vision_feature_layer {config.vision_feature_layer!r}: only -1 (the "
         "last layer's output) is supported"),
        (config.vision_feature_select_strategy == "default", "vision_feature_select_strategy "
         f"{config.vision_feature_select_strategy!r}: only 'default' (the [CLS] token dropped) is supported"),
        (v.hidden_act in ACTIVATIONS and config.projector_hidden_act in ACTIVATIONS,
         f"activations {v.hidden_act!r} / {config.projector_hidden_act!r}: supported {sorted(ACTIVATIONS)}"),
        (v.norm_type in ("layer_norm", "rms_norm"), f"vision_config.norm_type {v.norm_type!r}"),
        (v.use_absolute_position_embeddings, "vision_config.use_absolute_position_embeddings false"),
        (v.hidden_size % v.num_attention_heads == 0, "vision hidden_size must be a multiple of its heads"),
    ]
    for ok, what in checks:
        if not ok:
            raise Unsupported(f"the vision encoder: {what}")
    return VisionSpec(size, patch[0], v.hidden_size, v.num_attention_heads, v.num_hidden_layers, v.norm_type,
                      float(v.layer_norm_eps), bool(v.use_qk_norm), ACTIVATIONS[v.hidden_act],
                      ACTIVATIONS[config.projector_hidden_act], down, not v.use_mean_pooling,
                      config.text_config.hidden_size)


def weights_of(vlm) -> dict[str, np.ndarray]:
    """The encoder's and projector's weights, float32 numpy, under names without the model's prefix."""
    out = {}
    for prefix in ("model.vision_tower.", "model.multi_modal_projector."):
        for name, tensor in vlm.state_dict().items():
            if name.startswith(prefix):
                out[name[len("model."):]] = tensor.detach().float().numpy()
    return out


class VisionWriter:
    def __init__(self, spec: VisionSpec, weights: dict[str, np.ndarray], native: bool = False):
        """native: ONNX Runtime's form on our kernels (vision.ort.onnx), each layer's attention one
        trtllm.cpu::SegmentAttention over each tile's patches, its memory linear in them (Gemma 3's 4,096
        patches an image: builder/vision_export.native_form)."""
        self.s, self.w, self.g, self.native = spec, weights, GraphWriter("vision"), native
        self.segments = None  # native: each patch row's tile, [tiles x patches] int64 (made once)

    def model(self) -> onnx.ModelProto:
        return self.g.model("trtllm-edge", {CPU_DOMAIN: 1} if self.native else None)

    def weight(self, name: str, transpose: bool = False) -> str:
        array = self.w[name]
        return self.g.weight(name, np.ascontiguousarray(array.T) if transpose else array)

    def linear(self, name: str, x: str, module: str, bias: bool = True) -> str:
        y = self.g.op("MatMul", f"{name}/MatMul", [x, self.weight(f"{module}.weight", transpose=True)])
        if bias and f"{module}.bias" in self.w:
            y = self.g.op("Add", f"{name}/Add", [y, self.weight(f"{module}.bias")])
        return y

    def norm(self, name: str, x: str, module: str | None, kind: str, eps: float) -> str:
        """LayerNorm, or RMSNorm in float32 (times module's weight; none where module is None: Gemma 4's)."""
        g = self.g
        if kind == "layer_norm":
            return g.op("LayerNormalization", name, [x, self.weight(f"{module}.weight"), self.weight(f"{module}.bias")],
                        axis=-1, epsilon=eps)
        # RMSNorm in float32, as InternVLVisionRMSNorm computes it
        mean = g.op("ReduceMean", f"{name}/ReduceMean", [g.op("Mul", f"{name}/Square", [x, x]), g.const([-1])])
        root = g.op("Sqrt", f"{name}/Sqrt", [g.op("Add", f"{name}/Eps", [mean, g.const(eps, np.float32)])])
        y = g.op("Div", f"{name}/Div", [x, root])
        return y if module is None else g.op("Mul", f"{name}/Scale", [y, self.weight(f"{module}.weight")])

    def attention(self, i: int, x: str) -> str:
        return self.self_attention(f"/vision/layers.{i}/attn", x, f"vision_tower.encoder.layer.{i}.attention",
                                   "projection_layer", self.s.qk_norm)

    def self_attention(self, name: str, x: str, p: str, out_proj: str, qk_norm: bool = False) -> str:
        """Bidirectional multi-head attention of module `p` (its q_proj, k_proj, v_proj and `out_proj`)."""
        s, g = self.s, self.g
        head = s.hidden_size // s.num_heads
        heads = {}
        for proj in ("q", "k", "v"):
            y = self.linear(f"{name}/{proj}_proj", x, f"{p}.{proj}_proj")
            if qk_norm and proj != "v":  # over the whole projection, before the heads split
                y = self.norm(f"{name}/{proj}_norm", y, f"{p}.{proj}_norm", "rms_norm", 1e-6)
            heads[proj] = y
        if self.native:  # [tiles, n, C] x 3 -> rows [tiles * n, 3C], each tile's rows one segment
            qkv = g.op("Reshape", f"{name}/qkv/Reshape", [g.op("Concat", f"{name}/qkv", list(heads.values()), axis=-1),
                                                           g.const([-1, 3 * s.hidden_size])])
            out = g.op("SegmentAttention", f"{name}/SegmentAttention", [qkv, "", "", self.segment_ids(x)],
                       domain=CPU_DOMAIN, num_heads=s.num_heads, scale=head ** -0.5)
            out = g.op("Reshape", f"{name}/Context/Reshape", [out, g.op("Shape", f"{name}/Shape", [x])])
            return self.linear(f"{name}/{out_proj}", out, f"{p}.{out_proj}")
        split = g.const([0, -1, s.num_heads, head])
        for proj in ("q", "k", "v"):
            y = g.op("Reshape", f"{name}/{proj}/Reshape", [heads[proj], split])
            heads[proj] = g.op("Transpose", f"{name}/{proj}/Transpose", [y], perm=[0, 2, 1, 3])
        k_t = g.op("Transpose", f"{name}/k/TransposeT", [heads["k"]], perm=[0, 1, 3, 2])
        scores = g.op("MatMul", f"{name}/Scores", [heads["q"], k_t])
        scores = g.op("Mul", f"{name}/Scale", [scores, g.const(head ** -0.5, np.float32)])
        probs = g.op("Softmax", f"{name}/Softmax", [scores], axis=-1)
        out = g.op("MatMul", f"{name}/Context", [probs, heads["v"]])
        out = g.op("Transpose", f"{name}/Context/Transpose", [out], perm=[0, 2, 1, 3])
        out = g.op("Reshape", f"{name}/Context/Reshape", [out, g.const([0, -1, s.hidden_size])])
        return self.linear(f"{name}/{out_proj}", out, f"{p}.{out_proj}")

    def segment_ids(self, x: str) -> str:
        """[tiles * n] int64: each row's tile (x [tiles, n, C]), SegmentAttention's segments."""
        if self.segments is None:
            g = self.g
            shape = g.op("Shape", "/vision/segments/shape", [x])
            rows = g.op("ReduceProd", "/vision/segments/rows", [g.op("Slice", "/vision/segments/tiles_n", [
                shape, g.const([0]), g.const([2])])], keepdims=0)
            n = g.op("Gather", "/vision/segments/n", [shape, g.const(1)], axis=0)
            self.segments = g.op("Div", "/vision/segments/Div", [g.op("Range", "/vision/segments/Range", [
                g.const(0), rows, g.const(1)]), n])
        return self.segments

    def layer(self, i: int, x: str) -> str:
        s, g = self.s, self.g
        p, name = f"vision_tower.encoder.layer.{i}", f"/vision/layers.{i}"
        attn = self.attention(i, self.norm(f"{name}/layernorm_before", x, f"{p}.layernorm_before", s.norm, s.eps))
        x = g.op("Add", f"{name}/attn/Residual", [x, g.op("Mul", f"{name}/lambda_1", [attn, self.weight(f"{p}.lambda_1")])])
        y = self.norm(f"{name}/layernorm_after", x, f"{p}.layernorm_after", s.norm, s.eps)
        y = self.linear(f"{name}/mlp/fc1", y, f"{p}.mlp.fc1")
        y = g.op("Gelu", f"{name}/mlp/act", [y], approximate=s.act)
        y = self.linear(f"{name}/mlp/fc2", y, f"{p}.mlp.fc2")
        return g.op("Add", f"{name}/mlp/Residual", [x, g.op("Mul", f"{name}/lambda_2", [y, self.weight(f"{p}.lambda_2")])])

    def write(self) -> onnx.ModelProto:
        s, g = self.s, self.g
        pixels = g.input(PIXELS, F32, ["tiles", 3, *s.image_size])
        e = "vision_tower.embeddings"
        x = self.patches(pixels, f"{e}.patch_embeddings.projection")
        tiles = g.op("Slice", "/vision/tiles", [g.op("Shape", "/vision/Shape", [pixels]), g.const([0]), g.const([1])])
        cls_shape = g.op("Concat", "/vision/cls/shape", [tiles, g.const([1, s.hidden_size])], axis=0)
        cls = g.op("Expand", "/vision/cls/Expand", [self.weight(f"{e}.cls_token"), cls_shape])
        x = g.op("Concat", "/vision/cls/Concat", [cls, x], axis=1)
        x = g.op("Add", "/vision/position/Add", [x, self.weight(f"{e}.position_embeddings")])
        for i in range(s.num_layers):
            x = self.layer(i, x)
        if s.final_norm:
            x = self.norm("/vision/layernorm", x, "vision_tower.layernorm", "layer_norm", s.eps)
        x = self.pixel_shuffle(g.op("Slice", "/vision/drop_cls", [x, g.const([1]), g.const([2 ** 62]), g.const([1])]))
        p = "multi_modal_projector"
        x = g.op("LayerNormalization", "/projector/layer_norm", [x, self.weight(f"{p}.layer_norm.weight"),
                                                                 self.weight(f"{p}.layer_norm.bias")],
                 axis=-1, epsilon=1e-5)  # (nn.LayerNorm's default eps: the projector's config names none)
        x = self.linear("/projector/linear_1", x, f"{p}.linear_1")
        x = g.op("Gelu", "/projector/act", [x], approximate=s.projector_act)
        x = self.linear("/projector/linear_2", x, f"{p}.linear_2")
        g.op("Reshape", "/vision/flatten", [x, g.const([-1, s.out_hidden])], outputs=[EMBEDS])
        g.output(EMBEDS, F32, ["image_tokens", s.out_hidden])
        return self.model()

    def patches(self, pixels: str, conv: str) -> str:
        """[tiles, 3, H, W] -> [tiles, patches, hidden]: module `conv`, a Conv whose stride is its kernel."""
        s, g = self.s, self.g
        x = g.op("Conv", "/vision/patch/Conv", [pixels, self.weight(f"{conv}.weight"), self.weight(f"{conv}.bias")],
                 kernel_shape=[s.patch_size, s.patch_size], strides=[s.patch_size, s.patch_size])
        x = g.op("Reshape", "/vision/patch/Reshape", [x, g.const([0, s.hidden_size, -1])])
        return g.op("Transpose", "/vision/patch/Transpose", [x], perm=[0, 2, 1])

    def pixel_shuffle(self, x: str) -> str:
        """[tiles, F*F, C] -> [tiles, (F/n)^2, C*n*n] as InternVLModel.pixel_shuffle folds it (its two
        reshapes and transposes, for a square grid)."""
        s, g, n, f = self.s, self.g, self.s.downsample, self.s.grid
        c = s.hidden_size
        x = g.op("Reshape", "/vision/shuffle/Reshape0", [x, g.const([0, f, f // n, c * n])])
        x = g.op("Transpose", "/vision/shuffle/Transpose0", [x], perm=[0, 2, 1, 3])
        x = g.op("Reshape", "/vision/shuffle/Reshape1", [x, g.const([0, f // n, f // n, c * n * n])])
        x = g.op("Transpose", "/vision/shuffle/Transpose1", [x], perm=[0, 2, 1, 3])
        return g.op("Reshape", "/vision/shuffle/Reshape2", [x, g.const([0, -1, c * n * n])])


def image_features(vlm, pixels):
    return vlm.model.get_image_features(pixels, return_dict=True).pooler_output


def section(vlm, tokenizer, spec: VisionSpec, source, max_tiles: int | None = None) -> dict:
    """The manifest's vision section: the graph, the image tokens and how pixels are made (runtime/images.py);
    `max_tiles` (--max-image-tiles) lowers the processor's max_patches."""
    from transformers.image_processing_utils import ImageProcessingMixin

    from trtllm.runtime.images import preprocess_config

    config = vlm.config
    if config.image_seq_length != spec.tokens_per_tile:
        raise Unsupported(f"image_seq_length {config.image_seq_length} is not the {spec.tokens_per_tile} tokens the "
                          "vision encoder gives a tile")
    tokens = {}
    for key in ("context_image_token", "start_image_token", "end_image_token"):
        text = getattr(tokenizer, key, None)
        token_id = tokenizer.convert_tokens_to_ids(text) if isinstance(text, str) else None
        if token_id is None or token_id == tokenizer.unk_token_id:
            raise Unsupported(f"the tokenizer names no {key} (tokenizer_config.json's extra_special_tokens), "
                              "which InternVL's prompts need")
        tokens[key] = (text, int(token_id))
    if tokens["context_image_token"][1] != config.image_token_id:
        raise Unsupported(f"config.image_token_id {config.image_token_id} is not the tokenizer's context_image_token "
                          f"{tokens['context_image_token']}")
    try:
        processor, _ = ImageProcessingMixin.get_image_processor_dict(source)
        pre = preprocess_config(processor, crop_to_patches=True)  # (InternVLProcessor always tiles)
    except (OSError, ValueError) as e:
        raise Unsupported(f"its image processor's config (preprocessor_config.json) cannot be used: {e}") from e
    if max_tiles is not None:
        if max_tiles < pre["min_patches"]:
            raise ConfigError(f"--max-image-tiles {max_tiles} is below the processor's min_patches {pre['min_patches']}")
        if max_tiles > pre["max_patches"]:
            raise ConfigError(f"--max-image-tiles {max_tiles} is above the processor's max_patches "
                              f"{pre['max_patches']}: it only lowers it")
        pre["max_patches"] = max_tiles
    if pre["size"] != list(spec.image_size):
        raise Unsupported(f"preprocessor_config.size {pre['size']} is not the vision encoder's image_size "
                          f"{list(spec.image_size)}")
    return {"architecture": config.model_type, "graph": VISION_NAME, "image_size": list(spec.image_size),
            "tokens_per_tile": spec.tokens_per_tile, "hidden_size": spec.out_hidden,
            "image_token": tokens["context_image_token"][0], "image_token_id": tokens["context_image_token"][1],
            "start_token_id": tokens["start_image_token"][1], "end_token_id": tokens["end_image_token"][1],
            "preprocess": pre}


def verify(graph_path, vlm, spec: VisionSpec, tiles: int = 2, features=None, save=None, compiled=None) -> dict:
    """vision.onnx through ONNX Runtime against transformers' get_image_features on random pixels
    (`features(vlm, pixels)`: the family's call of it, InternVL's where None), and `compiled`
    (vision.ort.onnx, on our kernels) alike; a mismatch raises. `save`: a path for the pixels and
    transformers' embeddings (a TensorRT engine's vision plan is checked against them where it is built:
    builder/verify_logits.py). Returns the figures for verify.json."""
    import torch

    pixels = np.random.default_rng(0).standard_normal((tiles, 3, *spec.image_size)).astype(np.float32)
    with torch.no_grad():
        ref = (features or image_features)(vlm, torch.from_numpy(pixels))
    ref = ref.reshape(-1, spec.out_hidden).numpy()
    if save is not None:
        np.savez(save, pixel_values=pixels, image_embeds=ref)
    return {"max_abs_value": float(np.abs(ref).max()), "tiles": tiles,
            **forms_errors(graph_path, compiled, {PIXELS: pixels}, ref)}


def forms_errors(graph_path, compiled, feeds: dict, ref: np.ndarray, float64=None) -> dict:
    """vision.onnx (and vision.ort.onnx, where `compiled` names it) run on `feeds` through ONNX Runtime against
    transformers' embeddings `ref`: {"max_abs_error", "compiled_max_abs_error"}; a mismatch raises
    (verify_logits.embeddings_error, which asks `float64()` for transformers' float64 ones on a near miss)."""
    import onnxruntime as ort

    from trtllm.builder.verify_logits import embeddings_error
    from trtllm.plugins import cpu as cpu_kernels

    out = {}
    for key, path in (("max_abs_error", graph_path), ("compiled_max_abs_error", compiled)):
        if path is None:
            continue
        opts = ort.SessionOptions()
        if path == compiled:
            opts.register_custom_ops_library(str(cpu_kernels.library()))
        ours = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
        out[key] = embeddings_error(ours, ref, "the vision graph" + "'s ONNX Runtime form" * (path == compiled), float64)
    return out
