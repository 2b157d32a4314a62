"""Qwen2-VL, Qwen2.5-VL and Qwen3-VL's image input: an image -> pixel_values, the vision tower's index
inputs and the language model's M-RoPE positions.

Reproduces transformers 5.24's `Qwen2VLImageProcessorPil` (Qwen2.5-VL and Qwen3-VL use the same one), the
index helpers of `transformers.vision_utils` that Qwen2.5-VL's and Qwen3-VL's vision forwards call, and
`Qwen2_5_VLModel.get_rope_index` for still images (Qwen3VLModel's gives the same positions for them), with
numpy and Pillow; PIL is imported only when an image is touched.

    image -> RGB (alpha over white) -> resize to (h, w), both multiples of patch * merge (smart_resize)
          -> uint8 * rescale_factor (in float64, then float32) -> (x - mean) / std in float32
          -> patches of [C, T, P, P] (the frame repeated T times), one row per patch, merge window
             by merge window: row-major over the (h/P/M, w/P/M) windows, row-major inside each

`pre`, written by the builder into the manifest (see preprocess_config):
    patch_size           int: P, a patch's side in pixels (14; 16 for Qwen3-VL)
    temporal_patch_size  int: T, the frames a patch spans (2; a still image is repeated)
    merge_size           int: M, the merger turns M x M patches into one token (2)
    min_pixels           int: the fewest pixels an image is resized to
    max_pixels           int: the most pixels an image is resized to
    resample             int: PIL's filter number (3 = bicubic)
    rescale_factor       float: uint8 -> [0, 1] (1.0 where the checkpoint has do_rescale false)
    image_mean           3 floats (0s where the checkpoint has do_normalize false)
    image_std            3 floats (1s where the checkpoint has do_normalize false)
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

# the processor's convert_to_rgb is the same as InternVL's (alpha or a transparent colour over white)
from trtllm.runtime import images
from trtllm.runtime.images import is_int, to_rgb

if TYPE_CHECKING:
    from PIL.Image import Image

# Qwen2VLImageProcessorPil's class attributes: what a key missing from (or null in) the config means
DEFAULTS = {
    "size": {"shortest_edge": 56 * 56, "longest_edge": 28 * 28 * 1280}, "min_pixels": None, "max_pixels": None,
    "patch_size": 14, "temporal_patch_size": 2, "merge_size": 2, "resample": 3, "rescale_factor": 1 / 255,
    "image_mean": [0.48145466, 0.4578275, 0.40821073], "image_std": [0.26862954, 0.26130258, 0.27577711],
    "do_rescale": True, "do_normalize": True, "do_resize": True, "do_convert_rgb": True,
}
# Keys that do not change Qwen2-VL's pixels: bookkeeping, output form, or steps its _preprocess never
# runs (GotOcr2's, and an older config's feature_extractor_type)
IGNORED = images.IGNORED | {"feature_extractor_type"}
FLAGS = ("do_rescale", "do_normalize", "do_resize", "do_convert_rgb")


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """(height, width), both multiples of `factor`, near the image's aspect ratio and area, with the area
    clamped to [min_pixels, max_pixels] (transformers' smart_resize, float for float)."""
    if height < 1 or width < 1:
        raise ValueError(f"image must be at least 1 x 1 pixels, got {width} x {height}")
    if max(height, width) / min(height, width) > 200:
        raise ValueError(f"image aspect ratio must be at most 200:1, got {width} x {height} "
                         f"({max(height, width) / min(height, width):.1f}:1); crop or pad it first")
    # round() is Python's: halves go to the even multiple, as in transformers
    h_bar, w_bar = round(height / factor) * factor, round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def grid(width: int, height: int, pre: dict) -> tuple[int, int, int]:
    """(t, h, w) in patches: the processor's image_grid_thw (t is 1 for a still image, whatever T is)."""
    patch = pre["patch_size"]
    h, w = smart_resize(height, width, patch * pre["merge_size"], pre["min_pixels"], pre["max_pixels"])
    return 1, h // patch, w // patch


def token_count(width: int, height: int, pre: dict) -> int:
    """The image's <|image_pad|> tokens in the prompt: one per merged M x M patches."""
    t, h, w = grid(width, height, pre)
    return t * h * w // pre["merge_size"] ** 2


def pixel_values(image: Image, pre: dict) -> tuple[np.ndarray, tuple[int, int, int]]:
    """(float32 [t*h*w, C*T*P*P] in merge-window order, (t, h, w)): the processor's pixel_values and
    image_grid_thw for one image."""
    image = to_rgb(image)  # as the processor does to every image: load_image's are RGB already
    patch, merge, frames = pre["patch_size"], pre["merge_size"], pre["temporal_patch_size"]
    thw = grid(image.width, image.height, pre)
    _, h, w = thw
    x = np.asarray(image.resize((w * patch, h * patch), resample=pre["resample"]))  # [H, W, C] uint8
    # transformers rescales in float64 and rounds to float32, then normalizes in float32
    x = (x.astype(np.float64) * pre["rescale_factor"]).astype(np.float32)
    x = (x - np.array(pre["image_mean"], np.float32)) / np.array(pre["image_std"], np.float32)
    channels = x.shape[-1]
    x = x.reshape(h // merge, merge, patch, w // merge, merge, patch, channels)
    x = x.transpose(0, 3, 1, 4, 6, 2, 5)  # [h/M, w/M, M, M, C, P, P]: windows, then patches inside
    x = np.broadcast_to(x[:, :, :, :, :, None], (*x.shape[:5], frames, patch, patch))  # a still = T frames
    return np.ascontiguousarray(x.reshape(h * w, channels * frames * patch * patch)), thw


def encoder_inputs(grids: list[tuple[int, int, int]], merge_size: int, window_size: int | None,
                   patch_size: int, num_grid_per_side: int | None = None) -> dict:
    """The vision tower's index inputs for images whose pixel_values rows are concatenated (P rows).

    Qwen2.5-VL reorders merge units (M*M consecutive rows) so each window of W x W units (W =
    window_size / M / P, the image's edge windows smaller) is contiguous: window by window, row-major,
    frame by frame. Windowed layers attend within a window, full layers within a frame; the merged
    output goes back to the original order. Qwen2-VL (window_size None) keeps the order and has no
    windows: its window_ids are its image_ids.

    Returns int64 arrays:
        order            [P]     pixel_values rows in the tower's order (x[order])
        patch_positions  [P, 2]  each reordered row's (h, w) rotary position in its image's patch grid
        window_ids       [P]     rows with equal ids attend to each other in windowed layers
        window_rows      [windows, widest], window_slots [P]: the windows as a padded batch (window_layout)
        image_ids        [P]     rows with equal ids attend to each other in full-attention layers
        reverse          [P / M^2]  merged tokens back to the original order (merged[reverse])
    and, with num_grid_per_side S (Qwen3-VL's learned S x S position table, resampled to each image):
        pos_index        [P, 4]  each reordered row's 4 rows of the flattened table (pos_embed_taps)
        pos_weights      [P, 4]  float32, their weights: sum(table[pos_index] * pos_weights[..., None], 1)
    """
    unit = merge_size ** 2
    if window_size is not None:
        side = window_size // merge_size // patch_size  # in merge units
        if side < 1:
            raise ValueError(f"window_size must be at least merge_size * patch_size = {merge_size * patch_size}, "
                             f"got {window_size!r}")
    if num_grid_per_side is not None and not (is_int(num_grid_per_side) and num_grid_per_side > 0):
        raise ValueError(f"num_grid_per_side must be an int > 0, got {num_grid_per_side!r}")
    positions, sizes, window_of_unit, image_ids = [], [], [], []
    num_windows = num_frames = 0
    for t, h, w in grids:
        if h % merge_size or w % merge_size or min(t, h, w) < 1:
            raise ValueError(f"grid (t, h, w) must be positive with h and w multiples of merge_size "
                             f"{merge_size}, got {(t, h, w)!r}")
        rows, cols = h // merge_size, w // merge_size
        # a patch's (h, w), merge window by merge window as the processor lays the rows out, each frame alike
        ys, xs = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
        block = (rows, merge_size, cols, merge_size)
        hw = np.stack([ys.reshape(block).transpose(0, 2, 1, 3).ravel(),
                       xs.reshape(block).transpose(0, 2, 1, 3).ravel()], axis=-1)
        positions.append(np.tile(hw, (t, 1)))
        sizes.append(np.tile([h, w], (t * h * w, 1)))
        image_ids.append(np.repeat(np.arange(num_frames, num_frames + t), h * w))
        num_frames += t
        if window_size is not None:
            # each merge unit's window, numbered frame by frame, row-major; ceil: the edge windows are partial
            per_row, per_col = -(-rows // side), -(-cols // side)
            f, y, x = np.meshgrid(np.arange(t), np.arange(rows), np.arange(cols), indexing="ij")
            window_of_unit.append(num_windows + ((f * per_row + y // side) * per_col + x // side).ravel())
            num_windows += t * per_row * per_col
    positions, image_ids = np.concatenate(positions), np.concatenate(image_ids)
    num_units = len(positions) // unit
    if window_size is None:
        window_index = np.arange(num_units)
        window_ids = image_ids
    else:
        window_of_unit = np.concatenate(window_of_unit)
        # stable: inside a window, units keep their original (row-major) order, as transformers' padded
        # reshape leaves them; no window is empty, so the ids are transformers' windows counted in order
        window_index = np.argsort(window_of_unit, kind="stable")
        window_ids = np.repeat(window_of_unit[window_index], unit)
    order = (window_index[:, None] * unit + np.arange(unit)).ravel()
    # windows never cross a frame, so a frame's rows stay where they were: image_ids need no reordering
    rows, slots = window_layout(window_ids)
    out = {"order": order.astype(np.int64), "patch_positions": positions[order].astype(np.int64),
           "window_ids": window_ids.astype(np.int64), "image_ids": image_ids.astype(np.int64),
           "window_rows": rows, "window_slots": slots, "reverse": np.argsort(window_index).astype(np.int64)}
    if num_grid_per_side is not None:
        out["pos_index"], out["pos_weights"] = pos_embed_taps(
            out["patch_positions"], np.concatenate(sizes)[order], num_grid_per_side)
    return out


def pos_embed_taps(positions: np.ndarray, sizes: np.ndarray, side: int) -> tuple[np.ndarray, np.ndarray]:
    """(int64 [P, 4], float32 [P, 4]): the learned side x side position table bilinearly resampled, with
    corners aligned, to each row's (h, w) grid at its (y, x) position (positions, sizes [P, 2]), as
    transformers' get_vision_interpolation_indices_and_weights(mode="bilinear", align_corners=True).

        source row   sy = y * (side - 1) / max(h - 1, 1)     y0 = floor(sy), y1 = min(y0 + 1, side - 1)
        weights      wy0 = 1 - (sy - y0), wy1 = max(1 - |sy - y0 - 1|, 0)         (x likewise)
        pos_index    [y0*side + x0,  y0*side + x1,  y1*side + x0,  y1*side + x1]
        pos_weights  [wy0 * wx0,     wy0 * wx1,     wy1 * wx0,     wy1 * wx1]

    Computed in float32 op for op as transformers does, so the weights are bit-equal to its."""
    src = positions.astype(np.float32) * np.float32(side - 1) / np.maximum(sizes - 1, 1).astype(np.float32)
    floor = np.floor(src)  # [P, 2]
    offsets = np.arange(2)  # the tap below (floor) and above (floor + 1)
    taps = np.clip(floor.astype(np.int64)[..., None] + offsets, 0, side - 1)  # [P, 2 axes, 2 taps]
    distance = np.abs(src[..., None] - floor[..., None] - offsets.astype(np.float32))
    weights = np.maximum(np.float32(1) - distance, np.float32(0))  # the hat kernel; 0 for a clamped edge tap
    index = taps[:, 0, :, None] * side + taps[:, 1, None, :]  # [P, y tap, x tap]
    return index.reshape(-1, 4), (weights[:, 0, :, None] * weights[:, 1, None, :]).reshape(-1, 4)


def window_layout(window_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The windows as a padded batch, which the vision graph's windowed layers attend over (each window
    alone: a window's work, not the image's, and no [P, P] scores): rows int64 [windows, widest], each
    window's rows (contiguous ids, in order) and -1 after them; slots int64 [P], each row's place in
    rows.ravel()."""
    starts = np.flatnonzero(np.r_[True, window_ids[1:] != window_ids[:-1]])
    sizes = np.diff(np.r_[starts, len(window_ids)])
    which = np.repeat(np.arange(len(starts)), sizes)  # each row's window
    slots = which * int(sizes.max()) + np.arange(len(window_ids)) - starts[which]
    rows = np.full(len(starts) * int(sizes.max()), -1, np.int64)
    rows[slots] = np.arange(len(window_ids))
    return rows.reshape(len(starts), -1), slots.astype(np.int64)


def rope_positions(n: int, images: list[tuple[int, tuple[int, int, int]]],
                   merge_size: int) -> tuple[np.ndarray, int]:
    """(int64 [3, n] (temporal, height, width) positions, delta): the language model's M-RoPE positions
    of a prompt of n tokens whose images' tokens start at the given indices. Text counts on from the last
    position in all three rows; an image's tokens get (start + t, start + row, start + column) and the
    text after it starts at start + max(rows, columns). delta = max position + 1 - n: a generated token
    at index i has position i + delta in all three rows."""
    positions = np.empty((3, n), np.int64)
    cursor = end = 0  # the next position; the index after the previous image
    for start, (t, h, w) in images:
        if start < end or (start == end and end > 0):
            # transformers groups adjacent image tokens into one image: a text token must part them
            raise ValueError(f"images must be in order and apart, got one at {start} after index {end}")
        positions[:, end:start] = np.arange(cursor, cursor + start - end)
        cursor += start - end
        rows, cols = h // merge_size, w // merge_size
        end = start + t * rows * cols
        if end > n:
            raise ValueError(f"an image's {t * rows * cols} tokens at {start} must fit in the {n}-token prompt")
        f, y, x = np.meshgrid(np.arange(t), np.arange(rows), np.arange(cols), indexing="ij")
        positions[:, start:end] = cursor + np.stack([f.ravel(), y.ravel(), x.ravel()])
        cursor += max(rows, cols)  # transformers': t is not counted, which for still images (t = 1) is moot
    positions[:, end:] = np.arange(cursor, cursor + n - end)
    delta = int(positions.max()) + 1 - n if n else 0
    return positions, delta


def preprocess_config(processor_config: dict) -> dict:
    """A checkpoint's preprocessor_config.json -> `pre`; refuses a setting it does not reproduce."""
    def own(cfg: dict) -> list[tuple[str, bool, str]]:
        size = cfg["size"]
        if isinstance(size, dict):
            # the legacy top-level keys win over size's, as in Qwen2VLImageProcessorPil.__init__
            size = dict(size)
            for legacy, key in (("min_pixels", "shortest_edge"), ("max_pixels", "longest_edge")):
                if cfg[legacy] is not None:
                    size[key] = cfg[legacy]
                    size.pop(legacy, None)
        cfg["size"] = size
        return [*((k, cfg[k] is None or (is_int(cfg[k]) and cfg[k] > 0), "an int > 0")
                  for k in ("min_pixels", "max_pixels")),
                ("size", isinstance(size, dict) and set(size) == {"shortest_edge", "longest_edge"}
                 and all(is_int(v) and v > 0 for v in size.values()),
                 '{"shortest_edge": int > 0, "longest_edge": int > 0} (min and max pixels), '
                 "or top-level min_pixels and max_pixels"),
                *((k, is_int(cfg[k]) and cfg[k] > 0, "an int > 0") for k in ("patch_size", "temporal_patch_size",
                                                                              "merge_size"))]

    cfg, pixels = images.read_processor_config(processor_config, DEFAULTS, IGNORED, FLAGS, own)
    return {
        "patch_size": cfg["patch_size"], "temporal_patch_size": cfg["temporal_patch_size"],
        "merge_size": cfg["merge_size"], "min_pixels": cfg["size"]["shortest_edge"],
        "max_pixels": cfg["size"]["longest_edge"], **pixels,
    }
