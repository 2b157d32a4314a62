"""Gemma 4's image input: each image resized, its aspect ratio kept, to the largest size whose sides are
multiples of pooling_kernel_size x patch_size and that holds at most max_soft_tokens x pooling_kernel_size^2
patches; then cut into patch_size x patch_size patches, row by row, each flattened as (y, x, channel), with
its (x, y) place in the grid. As transformers' `Gemma4ImageProcessorPil` makes them, bit for bit, without
its padding to max_patches (the vision graph takes an image's own patches: builder/vision_gemma4.py).

An image takes one image token per pooling_kernel_size^2 patches (token_count), between the start and
end tokens (runtime/media.py place).

`pre` (the builder's preprocess_config, in the manifest):
    patch_size           int: a patch's side in pixels (16)
    pooling_kernel_size  int: the vision graph averages k x k patches into one token (3)
    max_soft_tokens      int: the most tokens an image takes (70, 140, 280, 560 or 1120)
    resample, rescale_factor, image_mean, image_std: as runtime/images.py's
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from trtllm.runtime import images

if TYPE_CHECKING:
    from PIL.Image import Image

SOFT_TOKENS = (70, 140, 280, 560, 1120)  # the budgets the processor takes
# Gemma4ImageProcessorPil's class attributes: what a key missing from (or null in) the config means
DEFAULTS = {
    "patch_size": 16, "pooling_kernel_size": 3, "max_soft_tokens": 280, "resample": 3, "rescale_factor": 1 / 255,
    "image_mean": [0.0, 0.0, 0.0], "image_std": [1.0, 1.0, 1.0], "do_rescale": True, "do_normalize": False,
    "do_resize": True, "do_convert_rgb": True,
}
# keys that do not change its pixels (`size` it never reads: the budget sets the size)
IGNORED = images.IGNORED | {"size"}
FLAGS = ("do_rescale", "do_normalize", "do_resize", "do_convert_rgb")


def target_size(width: int, height: int, pre: dict) -> tuple[int, int]:
    """(width, height) the image is resized to (get_aspect_ratio_preserving_size); ValueError for a shape
    the processor refuses."""
    patch, k = pre["patch_size"], pre["pooling_kernel_size"]
    most = pre["max_soft_tokens"] * k * k
    target = most * patch ** 2
    factor = math.sqrt(target / (height * width))
    side = k * patch
    h, w = int(math.floor(factor * height / side)) * side, int(math.floor(factor * width / side)) * side
    if h == 0 and w == 0:
        raise ValueError(f"a {width} x {height} image cannot be resized to sides of {side} pixels")
    longest = (most // k ** 2) * side
    if h == 0:
        h, w = side, min(int(math.floor(width / height)) * side, longest)
    elif w == 0:
        w, h = side, min(int(math.floor(height / width)) * side, longest)
    if h * w > target:
        raise ValueError(f"a {width} x {height} image resized to {w} x {h} would be more than {most} patches")
    return w, h


def token_count(width: int, height: int, pre: dict) -> int:
    """The image tokens an image of this size takes."""
    w, h = target_size(width, height, pre)
    return (w // pre["patch_size"]) * (h // pre["patch_size"]) // pre["pooling_kernel_size"] ** 2


def pixel_values(image: Image, pre: dict) -> tuple[np.ndarray, np.ndarray]:
    """(float32 [patches, patch_size^2 x 3], int64 [patches, 2]: each patch's (x, y)), the patches row by row."""
    image = images.to_rgb(image)
    w, h = target_size(image.width, image.height, pre)
    if (w, h) != (image.width, image.height):
        image = image.resize((w, h), resample=pre["resample"])
    # transformers rescales in float64 and rounds to float32, then normalizes in float32
    x = (np.asarray(image).astype(np.float64) * pre["rescale_factor"]).astype(np.float32)
    x = (x - np.array(pre["image_mean"], np.float32)) / np.array(pre["image_std"], np.float32)
    p = pre["patch_size"]
    rows, columns = h // p, w // p
    patches = x.reshape(rows, p, columns, p, 3).transpose(0, 2, 1, 3, 4).reshape(rows * columns, p * p * 3)
    gx, gy = np.meshgrid(np.arange(columns), np.arange(rows), indexing="xy")
    return np.ascontiguousarray(patches), np.stack([gx, gy], axis=-1).reshape(-1, 2).astype(np.int64)


def preprocess_config(processor_config: dict) -> dict:
    """A checkpoint's image processor config -> `pre`; refuses a setting it does not reproduce."""
    def own(cfg: dict) -> list[tuple[str, bool, str]]:
        return [("patch_size", images.is_int(cfg["patch_size"]) and cfg["patch_size"] > 0, "an int > 0"),
                ("pooling_kernel_size", images.is_int(cfg["pooling_kernel_size"]) and cfg["pooling_kernel_size"] > 0,
                 "an int > 0"),
                ("max_soft_tokens", cfg["max_soft_tokens"] in SOFT_TOKENS, f"one of {list(SOFT_TOKENS)}")]

    cfg, pixels = images.read_processor_config(processor_config, DEFAULTS, IGNORED, FLAGS, own)
    return {"patch_size": cfg["patch_size"], "pooling_kernel_size": cfg["pooling_kernel_size"],
            "max_soft_tokens": cfg["max_soft_tokens"], **pixels}
