"""Idefics3's and SmolVLM's image input: an image -> the vision tower's tiles, and the prompt ids that
stand for it.

Reproduces transformers 5.24's `Idefics3ImageProcessorPil` (SmolVLMImageProcessorPil is the same) and
the image part of `Idefics3Processor` / `SmolVLMProcessor` with numpy and Pillow; PIL is imported only
when an image is touched.

    image -> RGB (alpha over white) -> resize: the longest edge to `longest_edge` (both edges' ratio
             kept, the other made even; at most 4096)
          -> splitting: resize again to multiples of `tile` a side, then cut into tiles row by row,
             plus the whole at one tile's size (the "global" tile) when there is more than one;
             no splitting: the whole at one tile's size alone
          -> uint8 * rescale_factor (in float64, then float32) -> (x - mean) / std in float32

The processor writes an image as
    rows x columns > 1:  per row: per tile <fake><row_r_col_c><image> x T ; "\\n"
                         then "\\n" <fake><global-img><image> x T <fake>
    one tile:            <fake><global-img><image> x T <fake>
where T is tokens_per_tile. The ids of each piece are the builder's (builder/vision_idefics3.py checks
them against the tokenizer on whole layouts).

`pre`, written by the builder into the manifest (see preprocess_config):
    longest_edge     int: the first resize's longest edge (size.longest_edge)
    tile             int: a tile's side in pixels (max_image_size.longest_edge, the encoder's image_size)
    splitting        bool: do_image_splitting
    resample         int: PIL's filter number (1 = Lanczos)
    rescale_factor   float: uint8 -> [0, 1] (1.0 where the checkpoint has do_rescale false)
    image_mean       3 floats (0s where the checkpoint has do_normalize false)
    image_std        3 floats (1s where the checkpoint has do_normalize false)
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from trtllm.runtime.images import is_int, read_processor_config, to_rgb

if TYPE_CHECKING:
    from PIL.Image import Image

# Idefics3ImageProcessorPil's class attributes: what a key missing from (or null in) the config means
DEFAULTS = {
    "size": {"longest_edge": 4 * 364}, "max_image_size": {"longest_edge": 364}, "do_image_splitting": True,
    "resample": 1, "rescale_factor": 1 / 255, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
    "do_rescale": True, "do_normalize": True, "do_resize": True, "do_convert_rgb": True, "do_pad": True,
}
# Keys that do not change its pixels: bookkeeping, output form; do_pad pads a batch's images to one size,
# and every tile here is tile x tile already
IGNORED = {"image_processor_type", "processor_class", "auto_map", "data_format", "input_data_format", "device",
           "return_tensors", "disable_grouping", "return_row_col_info", "image_seq_len", "video_sampling",
           "do_pad", "pad_size"}
FLAGS = ("do_image_splitting", "do_rescale", "do_normalize", "do_resize", "do_convert_rgb", "do_pad")
MAX_IMAGE_SIZE = 4096  # the processor's cap on the first resize's edges


def resized(width: int, height: int, pre: dict) -> tuple[int, int]:
    """(width, height) after the first resize: the longest edge to longest_edge, the other in the same
    ratio and even, then both within MAX_IMAGE_SIZE (the processor's two steps, in its arithmetic)."""
    most, aspect = pre["longest_edge"], width / height
    w, h = width, height
    if w >= h:
        w = most
        h = int(w / aspect)
        h += h % 2
    else:
        h = most
        w = int(h * aspect)
        w += w % 2
    h, w = max(h, 1), max(w, 1)
    aspect = w / h
    if w >= h and w > MAX_IMAGE_SIZE:
        w = MAX_IMAGE_SIZE
        h = int(w / aspect)
    elif h > w and h > MAX_IMAGE_SIZE:
        h = MAX_IMAGE_SIZE
        w = int(h * aspect)
    return max(w, 1), max(h, 1)


def split_size(width: int, height: int, tile: int) -> tuple[int, int]:
    """(width, height) of the resized image resized again to whole tiles a side (resize_for_vision_encoder)."""
    aspect = width / height
    if width >= height:
        width = math.ceil(width / tile) * tile
        height = math.ceil(int(width / aspect) / tile) * tile
    else:
        height = math.ceil(height / tile) * tile
        width = math.ceil(int(height * aspect) / tile) * tile
    return width, height


def grid(width: int, height: int, pre: dict) -> tuple[int, int]:
    """(rows, columns) of an image's tiles; (0, 0) where it is one tile (the processor's numbers)."""
    if not pre["splitting"]:
        return 0, 0
    tile = pre["tile"]
    w, h = split_size(*resized(width, height, pre), tile)
    if h > tile or w > tile:
        return (h - tile) // tile + 1, (w - tile) // tile + 1
    return 0, 0


def largest_side(pre: dict) -> int:
    """The most tiles an image's side can have (its longest edge resized to longest_edge, capped at
    MAX_IMAGE_SIZE); 0 without splitting. The row and column tags go this far."""
    return math.ceil(min(pre["longest_edge"], MAX_IMAGE_SIZE) / pre["tile"]) if pre["splitting"] else 0


def tile_count(width: int, height: int, pre: dict) -> int:
    rows, columns = grid(width, height, pre)
    return rows * columns + 1 if rows else 1


def pixel_values(image: Image, pre: dict) -> np.ndarray:
    """float32 [tiles, 3, tile, tile]: the tiles row by row, then the global one (or the one tile)."""
    image = to_rgb(image)
    tile, resample = pre["tile"], pre["resample"]
    image = image.resize(resized(image.width, image.height, pre), resample=resample)
    if pre["splitting"]:
        image = image.resize(split_size(image.width, image.height, tile), resample=resample)
    whole = np.asarray(image.resize((tile, tile), resample=resample))
    rows, columns = image.height // tile, image.width // tile  # (split: whole tiles a side)
    if not pre["splitting"] or (rows <= 1 and columns <= 1):
        tiles = whole[None]
    else:
        cut = np.asarray(image).reshape(rows, tile, columns, tile, 3).transpose(0, 2, 1, 3, 4)
        tiles = np.concatenate([cut.reshape(-1, tile, tile, 3), whole[None]])
    # transformers rescales in float64 and rounds to float32, then normalizes in float32
    x = (tiles.astype(np.float64) * pre["rescale_factor"]).astype(np.float32)
    x = (x - np.array(pre["image_mean"], np.float32)) / np.array(pre["image_std"], np.float32)
    return np.ascontiguousarray(x.transpose(0, 3, 1, 2))


def prompt_ids(rows: int, columns: int, section: dict) -> list[int]:
    """The ids an image of this grid stands for in the prompt (Idefics3Processor's text, tokenized)."""
    fake, image = section["start_token_id"], [section["image_token_id"]] * section["tokens_per_tile"]
    whole = [fake, *section["global_ids"], *image, fake]
    if not rows:
        return whole
    out = []
    for r in range(rows):
        for c in range(columns):
            out += [fake, *section["row_col_ids"][r][c], *image]
        if r < rows - 1:
            out += section["newline_ids"]
    return out + section["break_ids"] + whole  # (the last row's newline and the global's: one piece of text)


def preprocess_config(processor_config: dict, tile: int | None = None) -> dict:
    """A checkpoint's preprocessor_config.json -> `pre`; refuses a setting it does not reproduce.
    `tile`: the vision encoder's image size, which max_image_size must be."""
    def own(cfg: dict) -> list[tuple[str, bool, str]]:
        edges = [(key, cfg[key]) for key in ("size", "max_image_size")]
        return [(key, isinstance(v, dict) and set(v) == {"longest_edge"} and is_int(v["longest_edge"])
                 and v["longest_edge"] > 0, '{"longest_edge": int > 0}') for key, v in edges] + [
            ("max_image_size", tile is None or not isinstance(cfg["max_image_size"], dict)
             or cfg["max_image_size"].get("longest_edge") == tile, f"the vision encoder's image_size {tile}")]

    cfg, pixels = read_processor_config(processor_config, DEFAULTS, IGNORED, FLAGS, own)
    return {"longest_edge": cfg["size"]["longest_edge"], "tile": cfg["max_image_size"]["longest_edge"],
            "splitting": cfg["do_image_splitting"], **pixels}
