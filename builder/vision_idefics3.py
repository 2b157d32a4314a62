"""Idefics3's and SmolVLM's image encoder as vision.onnx (builder/vision.py says what the graph is
for): transformers' Idefics3Model.get_image_features on whole tiles.

    pixel_values [tiles, 3, S, S] f32
      -> Conv(patch) + position embeddings
      -> layers: x += attn(LayerNorm(x)); x += mlp(LayerNorm(x))   (SigLIP's, bidirectional attention)
      -> LayerNorm -> pixel shuffle (scale_factor) -> Linear (no bias)
      -> image_embeds [tiles * tokens_per_tile, hidden] f32

Every tile the processor makes is S x S (runtime/images_idefics3.py), so no patch is masked and each
tile's position ids are the same: the builder takes them from transformers' own embedding module (its
bucketing of fractional coordinates) and the graph adds those rows of the table as one constant.
"""
from __future__ import annotations

import numpy as np

from trtllm.builder import vision
from trtllm.builder.config import ConfigError, Unsupported
from trtllm.builder.vision import ACTIVATIONS, EMBEDS, F32, PIXELS, VisionSpec, VisionWriter
from trtllm.runtime.images_idefics3 import largest_side

MODEL_TYPES = ("idefics3", "smolvlm")
LANGUAGE_PREFIX = "model.text_model"  # where their decoder layers are (PEFT adapters name them so)
# the processor's text for an image: Idefics3Processor's fixed strings; SmolVLMProcessor takes the
# tokenizer's attributes of these names where it has them
TOKENS = {"image_token": "<image>", "fake_image_token": "<fake_token_around_image>",
          "global_image_token": "<global-img>"}


def spec_of(config) -> VisionSpec:
    """Idefics3Config / SmolVLMConfig -> InternVL's VisionSpec (LayerNorm layers without q/k norms, a
    final LayerNorm; its connector has no activation); what the graph does not do is refused by name."""
    v, n = config.vision_config, int(config.scale_factor)
    grid = v.image_size // v.patch_size
    refuse([(n >= 1 and grid % n == 0, f"scale_factor {config.scale_factor} must divide the {grid} patches a side")],
           v)
    return VisionSpec((v.image_size, v.image_size), v.patch_size, v.hidden_size, v.num_attention_heads,
                      v.num_hidden_layers, "layer_norm", float(v.layer_norm_eps), False, ACTIVATIONS[v.hidden_act],
                      "none", n, True, config.text_config.hidden_size)


def refuse(checks: list[tuple[bool, str]], v) -> None:
    """Raise Unsupported for the first of `checks` (ok, what) that fails, after what every SigLIP tower
    (vision_config `v`) must be here: whole patches, an activation the graph has, whole heads, RGB."""
    checks = [
        (v.image_size % v.patch_size == 0, f"vision_config.image_size {v.image_size} must be a multiple of "
         f"patch_size {v.patch_size}"),
        (v.hidden_act in ACTIVATIONS, f"vision_config.hidden_act {v.hidden_act!r}: supported {sorted(ACTIVATIONS)}"),
        (v.hidden_size % v.num_attention_heads == 0, "vision hidden_size must be a multiple of its heads"),
        (getattr(v, "num_channels", 3) == 3, f"vision_config.num_channels {getattr(v, 'num_channels', 3)}: images "
         "are RGB"),
        *checks,
    ]
    for ok, what in checks:
        if not ok:
            raise Unsupported(f"the vision encoder: {what}")


def weights_of(vlm) -> dict[str, np.ndarray]:
    """The encoder's and connector's weights, float32 numpy, under names without "model.", and the
    position embeddings a whole tile takes (`positions`, [patches, hidden])."""
    import torch

    out = {name[len("model."):]: tensor.detach().float().numpy() for name, tensor in vlm.state_dict().items()
           if name.startswith(("model.vision_model.", "model.connector."))}
    embeddings, taken = vlm.model.vision_model.embeddings, []
    hook = embeddings.position_embedding.register_forward_hook(lambda m, args, y: taken.append(y))
    try:
        size = embeddings.image_size
        with torch.no_grad():
            embeddings(torch.zeros(1, 3, size, size), torch.ones(1, size // embeddings.patch_size,
                                                                 size // embeddings.patch_size, dtype=torch.bool))
    finally:
        hook.remove()
    out["positions"] = taken[0][0].float().numpy()
    return out


class Idefics3Writer(VisionWriter):
    def layer(self, i: int, x: str) -> str:
        s, g = self.s, self.g
        p, name = f"vision_model.encoder.layers.{i}", f"/vision/layers.{i}"
        y = self.norm(f"{name}/layer_norm1", x, f"{p}.layer_norm1", "layer_norm", s.eps)
        x = g.op("Add", f"{name}/attn/Residual", [x, self.self_attention(f"{name}/attn", y, f"{p}.self_attn",
                                                                          "out_proj")])
        y = self.norm(f"{name}/layer_norm2", x, f"{p}.layer_norm2", "layer_norm", s.eps)
        y = self.linear(f"{name}/mlp/fc1", y, f"{p}.mlp.fc1")
        y = g.op("Gelu", f"{name}/mlp/act", [y], approximate=s.act)
        return g.op("Add", f"{name}/mlp/Residual", [x, self.linear(f"{name}/mlp/fc2", y, f"{p}.mlp.fc2")])

    def write(self):
        s, g = self.s, self.g
        pixels = g.input(PIXELS, F32, ["tiles", 3, *s.image_size])
        x = self.patches(pixels, "vision_model.embeddings.patch_embedding")
        x = g.op("Add", "/vision/position/Add", [x, self.weight("positions")])
        for i in range(s.num_layers):
            x = self.layer(i, x)
        x = self.norm("/vision/post_layernorm", x, "vision_model.post_layernorm", "layer_norm", s.eps)
        x = self.linear("/connector/proj", self.pixel_shuffle(x), "connector.modality_projection.proj", bias=False)
        g.op("Reshape", "/vision/flatten", [x, g.const([-1, s.out_hidden])], outputs=[EMBEDS])
        g.output(EMBEDS, F32, ["image_tokens", s.out_hidden])
        return self.model()


def most_tiles(pre: dict) -> int:
    side = largest_side(pre)
    return side * side + 1 if side > 1 else 1


def section(vlm, tokenizer, spec: VisionSpec, source, max_tiles: int | None = None) -> dict:
    """The manifest's vision section: the graph, the ids an image's prompt is made of and how pixels are
    made (runtime/images_idefics3.py); `max_tiles` (--max-image-tiles) lowers the longest edge to the
    most whole tiles a side that keep an image within that many tiles."""
    from transformers.image_processing_utils import ImageProcessingMixin

    from trtllm.runtime import images_idefics3

    try:
        processor, _ = ImageProcessingMixin.get_image_processor_dict(source)
        pre = images_idefics3.preprocess_config(processor, tile=spec.image_size[0])
    except (OSError, ValueError) as e:
        raise Unsupported(f"its image processor's config (preprocessor_config.json) cannot be used: {e}") from e
    if max_tiles is not None:
        if max_tiles > most_tiles(pre):
            raise ConfigError(f"--max-image-tiles {max_tiles} is above the {most_tiles(pre)} tiles an image takes at "
                              f"the processor's longest_edge {pre['longest_edge']}: it only lowers it")
        side = max([1] + [n for n in range(2, largest_side(pre) + 1) if n * n + 1 <= max_tiles])
        pre["longest_edge"] = min(pre["longest_edge"], side * pre["tile"])
    seq_len = vision.processor_file(source, "processor_config.json").get("image_seq_len")
    if isinstance(seq_len, int) and seq_len != spec.tokens_per_tile:
        raise Unsupported(f"processor_config.image_seq_len {seq_len} is not the {spec.tokens_per_tile} tokens the "
                          "vision encoder gives a tile")
    smol = vlm.config.model_type == "smolvlm"
    text = {k: (getattr(tokenizer, k, None) or v) if smol else v for k, v in TOKENS.items()}
    single = {}
    for key in ("image_token", "fake_image_token"):
        token_id = tokenizer.convert_tokens_to_ids(text[key])
        if token_id is None or token_id == tokenizer.unk_token_id:
            raise Unsupported(f"the tokenizer has no {text[key]!r} token, which its prompts' images need")
        single[key] = int(token_id)
    if single["image_token"] != vlm.config.image_token_id:
        raise Unsupported(f"config.image_token_id {vlm.config.image_token_id} is not the tokenizer's {text['image_token']!r} "
                          f"({single['image_token']})")

    def ids(piece: str) -> list[int]:
        return tokenizer(piece, add_special_tokens=False)["input_ids"]

    side = largest_side(pre)
    out = {"architecture": "idefics3", "graph": vision.VISION_NAME, "image_size": list(spec.image_size),
           "tokens_per_tile": spec.tokens_per_tile, "hidden_size": spec.out_hidden,
           "image_token": text["image_token"], "image_token_id": single["image_token"],
           "start_token_id": single["fake_image_token"], "end_token_id": single["fake_image_token"],
           "global_ids": ids(text["global_image_token"]),
           "row_col_ids": [[ids(f"<row_{r + 1}_col_{c + 1}>") for c in range(side)] for r in range(side)],
           "newline_ids": ids("\n"), "break_ids": ids("\n\n"), "preprocess": pre}
    # the pieces put together as the processor's whole text would be tokenized, or the model's prompts differ
    for rows, columns in {(0, 0)} | ({(min(side, 2), 1), (side, side)} if side else set()):
        if ids(layout_text(rows, columns, spec.tokens_per_tile, text)) != images_idefics3.prompt_ids(rows, columns, out):
            raise Unsupported(f"its tokenizer splits the text of an image of {rows} x {columns} tiles otherwise "
                              "than piece by piece (its image tokens are not special tokens)")
    return out


def layout_text(rows: int, columns: int, tokens: int, text: dict) -> str:
    """The processor's text for an image of rows x columns tiles (transformers' replace_image_token)."""
    fake, image = text["fake_image_token"], text["image_token"] * tokens
    whole = f"{fake}{text['global_image_token']}{image}{fake}"
    if not rows:
        return whole
    return "".join("".join(f"{fake}<row_{r + 1}_col_{c + 1}>{image}" for c in range(columns)) + "\n"
                   for r in range(rows)) + "\n" + whole


def verify(graph_path, vlm, spec: VisionSpec, tiles: int = 2, save=None) -> dict:
    """vision.onnx against transformers' get_image_features on random tiles (vision.verify)."""
    return vision.verify(graph_path, vlm, spec, tiles, features=image_features, save=save)


def image_features(vlm, pixels):
    """The tiles as one image of a batch of one, as Idefics3Model takes them (its features come back a
    list, one entry a row)."""
    import torch

    return torch.cat(list(vlm.model.get_image_features(pixels[None], return_dict=True).pooler_output))
