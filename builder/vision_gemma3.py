"""Gemma 3's image encoder as vision.onnx (builder/vision.py says what the graph is for): transformers'
Gemma3Model.get_image_features, the SigLIP tower and the multimodal projector.

    pixel_values [images, 3, S, S] f32 (an image, and with pan-and-scan its crops, each one S x S tile:
                                        runtime/images_gemma3.py)
      -> Conv(patch) + position embeddings
      -> layers: x += attn(LayerNorm(x)); x += mlp(LayerNorm(x))   (SigLIP's, bidirectional attention)
      -> LayerNorm -> the P x P patches average-pooled to n x n (n^2 = mm_tokens_per_image)
      -> RMSNorm (1 + w) -> @ mm_input_projection_weight
      -> image_embeds [images * n^2, hidden] f32

In the language model an image's n^2 tokens see each other both ways in the prompt (DecoderSpec
image_bidirectional), and its prompt text is the processor's: each <start_of_image> the chat template
writes becomes "\\n\\n<start_of_image>", n^2 image tokens, "<end_of_image>\\n\\n" before tokenizing
(runtime/media.py expanded_text)."""
from __future__ import annotations

import numpy as np

from trtllm.builder import vision
from trtllm.builder.config import Unsupported
from trtllm.builder.vision import ACTIVATIONS, EMBEDS, F32, PIXELS, VisionSpec
from trtllm.builder.vision_idefics3 import Idefics3Writer, refuse

MODEL_TYPES = ("gemma3",)
# the tokenizer's names for the three tokens (tokenizer_config.json's extra_special_tokens), and their text
TOKENS = {"boi_token": "<start_of_image>", "image_token": "<image_soft_token>", "eoi_token": "<end_of_image>"}
# Gemma3ImageProcessorPil's defaults where its config leaves a key out or null (runtime/images.py's keys)
DEFAULTS = {
    "size": {"height": 224, "width": 224}, "crop_to_patches": False, "min_patches": 1, "max_patches": 1,
    "resample": 2, "rescale_factor": 1 / 255, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
    "do_rescale": True, "do_normalize": True, "do_resize": True, "do_convert_rgb": True,
}
PAN_AND_SCAN = ("pan_and_scan_min_crop_size", "pan_and_scan_max_num_crops", "pan_and_scan_min_ratio_to_activate")


def spec_of(config) -> VisionSpec:
    """Gemma3Config -> VisionSpec (SigLIP's LayerNorm layers, a final LayerNorm; `downsample` is the
    projector's pooling kernel); what the graph does not do is refused by name."""
    v, tokens = config.vision_config, int(config.mm_tokens_per_image)
    grid, side = v.image_size // v.patch_size, round(tokens ** 0.5)
    refuse([(getattr(v, "model_type", None) == "siglip_vision_model", f"vision_config.model_type "
             f"{getattr(v, 'model_type', None)!r}: only SigLIP's ('siglip_vision_model')"),
            (side * side == tokens and side >= 1 and grid % side == 0, f"mm_tokens_per_image {tokens} must be the "
             f"square of a number dividing the {grid} patches a side")], v)
    return VisionSpec((v.image_size, v.image_size), v.patch_size, v.hidden_size, v.num_attention_heads,
                      v.num_hidden_layers, "layer_norm", float(v.layer_norm_eps), False, ACTIVATIONS[v.hidden_act],
                      "none", grid // side, True, config.text_config.hidden_size)


def weights_of(vlm) -> dict[str, np.ndarray]:
    """The tower's weights under Idefics3's names (vision_model.*) and the projector's (multi_modal_projector.*),
    float32 numpy; the projector's norm scale as the 1 + w it multiplies by."""
    out = {}
    for name, tensor in vlm.state_dict().items():
        if name.startswith("model.vision_tower."):  # (SiglipVisionModel's modules, with or without .vision_model)
            out["vision_model." + name[len("model.vision_tower."):].removeprefix("vision_model.")] = \
                tensor.detach().float().numpy()
        elif name.startswith("model.multi_modal_projector."):
            out[name[len("model."):]] = tensor.detach().float().numpy()
    norm = "multi_modal_projector.mm_soft_emb_norm.weight"
    out[norm] = out[norm] + np.float32(1.0)
    return out


class Gemma3Writer(Idefics3Writer):
    def write(self):
        s, g = self.s, self.g
        pixels = g.input(PIXELS, F32, ["tiles", 3, *s.image_size])
        e = "vision_model.embeddings"
        x = self.patches(pixels, f"{e}.patch_embedding")
        x = g.op("Add", "/vision/position/Add", [x, self.weight(f"{e}.position_embedding.weight")])
        for i in range(s.num_layers):
            x = self.layer(i, x)
        x = self.norm("/vision/post_layernorm", x, "vision_model.post_layernorm", "layer_norm", s.eps)
        # [images, P*P, C] -> [images, C, P, P] -> average over k x k patches -> [images, n*n, C]
        x = g.op("Transpose", "/projector/Transpose", [x], perm=[0, 2, 1])
        x = g.op("Reshape", "/projector/grid", [x, g.const([0, s.hidden_size, s.grid, s.grid])])
        k = s.downsample
        x = g.op("AveragePool", "/projector/avg_pool", [x], kernel_shape=[k, k], strides=[k, k])
        x = g.op("Reshape", "/projector/flat", [x, g.const([0, s.hidden_size, -1])])
        x = g.op("Transpose", "/projector/tokens", [x], perm=[0, 2, 1])
        p = "multi_modal_projector"
        x = self.norm("/projector/mm_soft_emb_norm", x, f"{p}.mm_soft_emb_norm", "rms_norm", s.eps)
        x = g.op("MatMul", "/projector/MatMul", [x, self.weight(f"{p}.mm_input_projection_weight")])
        g.op("Reshape", "/vision/flatten", [x, g.const([-1, s.out_hidden])], outputs=[EMBEDS])
        g.output(EMBEDS, F32, ["image_tokens", s.out_hidden])
        return self.model()


def pan_and_scan(processor: dict, max_tiles: int | None) -> dict | None:
    """The processor's pan-and-scan settings (runtime/images_gemma3.py), or None where it is off: on where
    the config turns it on, or where `max_tiles` (--max-image-tiles) is 2 or more, then with at most
    max_tiles - 1 crops (the whole image is the other tile); Gemma3Processor's defaults where the config
    has none. transformers leaves it off unless a call asks for it."""
    on = bool(processor.get("do_pan_and_scan")) if max_tiles is None else max_tiles > 1
    if not on:
        return None
    out = {}
    for key, default, least in (("min_crop_size", 256, 1), ("max_num_crops", 4, 1), ("min_ratio_to_activate", 1.2, 1)):
        value = processor.get(f"pan_and_scan_{key}")
        value = default if value is None else value
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < least \
                or (key != "min_ratio_to_activate" and not isinstance(value, int)):
            raise ValueError(f"preprocessor_config.pan_and_scan_{key} must be a number >= {least}"
                             + " (an integer)" * (key != "min_ratio_to_activate") + f", got {value!r}")
        out[key] = value
    if max_tiles is not None:
        out["max_num_crops"] = max_tiles - 1
    return out


def section(vlm, tokenizer, spec: VisionSpec, source, max_tiles: int | None = None) -> dict:
    """The manifest's vision section: the graph, the image tokens and their text, and how pixels are made
    (runtime/images_gemma3.py: the whole image resized to one tile, and with pan-and-scan its crops);
    `max_tiles` (--max-image-tiles): 1 turns pan-and-scan off, N >= 2 on with at most N - 1 crops."""
    from transformers.image_processing_utils import ImageProcessingMixin

    from trtllm.runtime.images import preprocess_config

    try:
        processor, _ = ImageProcessingMixin.get_image_processor_dict(source)
        pre = preprocess_config({k: v for k, v in processor.items() if k not in ("do_pan_and_scan", *PAN_AND_SCAN)},
                                defaults=DEFAULTS)
        pre["pan_and_scan"] = pan_and_scan(processor, max_tiles)
    except (OSError, ValueError) as e:
        raise Unsupported(f"its image processor's config (preprocessor_config.json) cannot be used: {e}") from e
    if pre["size"] != list(spec.image_size):
        raise Unsupported(f"preprocessor_config.size {pre['size']} is not the vision encoder's image_size "
                          f"{list(spec.image_size)}")
    seq_len = processor.get("image_seq_length")
    if seq_len is not None and seq_len != spec.tokens_per_tile:
        raise Unsupported(f"preprocessor_config.image_seq_length {seq_len} is not the {spec.tokens_per_tile} tokens "
                          "the vision encoder gives an image")
    text, ids = image_tokens(tokenizer, vlm.config, TOKENS)
    out = {"architecture": "gemma3", "graph": vision.VISION_NAME, "image_size": list(spec.image_size),
           "tokens_per_tile": spec.tokens_per_tile, "hidden_size": spec.out_hidden,
           "image_token": text["image_token"], "image_token_id": ids["image_token"],
           "start_token": text["boi_token"], "start_token_id": ids["boi_token"],
           "end_token": text["eoi_token"], "end_token_id": ids["eoi_token"], "bidirectional": True,
           "preprocess": pre}
    # the processor's text for an image, tokenized whole as the prompt is: its tokens must come out as
    # the start token, the image tokens and the end token (special tokens, which no neighbour joins)
    from trtllm.runtime.media import expanded_text

    got = tokenizer(expanded_text(f"a{text['boi_token']}b", out), add_special_tokens=False)["input_ids"]
    want = [ids["boi_token"], *[ids["image_token"]] * spec.tokens_per_tile, ids["eoi_token"]]
    at = got.index(ids["boi_token"]) if ids["boi_token"] in got else -1
    if at < 0 or got[at:at + len(want)] != want or got.count(ids["image_token"]) != spec.tokens_per_tile:
        raise Unsupported(f"its tokenizer does not keep {text['boi_token']!r}, {text['image_token']!r} and "
                          f"{text['eoi_token']!r} as tokens of their own (they must be special tokens)")
    return out


def image_tokens(tokenizer, config, tokens: dict) -> tuple[dict, dict]:
    """(text, id) of each of `tokens` {tokenizer attribute: default text} (boi_token, image_token, eoi_token:
    Gemma 3's and 4's), each checked to be a token of the tokenizer's and the config's `{key}_id`."""
    text, ids = {}, {}
    for key, default in tokens.items():
        text[key] = getattr(tokenizer, key, None) or default
        token_id = tokenizer.convert_tokens_to_ids(text[key])
        if token_id is None or token_id == tokenizer.unk_token_id:
            raise Unsupported(f"the tokenizer has no {text[key]!r} token ({key}), which its prompts' images need")
        ids[key] = int(token_id)
        name = f"{key}_id"
        if ids[key] != getattr(config, name):
            raise Unsupported(f"config.{name} {getattr(config, name)} is not the tokenizer's {text[key]!r} ({ids[key]})")
    return text, ids


def verify(graph_path, vlm, spec: VisionSpec, tiles: int = 2, save=None, compiled=None) -> dict:
    """vision.onnx (and vision.ort.onnx) against transformers' get_image_features on random images
    (vision.verify)."""
    return vision.verify(graph_path, vlm, spec, tiles, save=save, compiled=compiled)
