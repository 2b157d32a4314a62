"""InternVL's image input (and Gemma 3's: one tile, the whole image resized): a file or bytes -> the
vision tower's pixel_values.

Reproduces transformers 5.24's `GotOcr2ImageProcessorPil` (what `InternVLProcessor` runs, with
crop_to_patches=True) with numpy and Pillow; PIL is imported only when an image is touched.

    image -> RGB (alpha over white) -> resize to a (columns x rows) grid of tiles -> crop, row-major
          -> + a thumbnail (the whole image at one tile's size) when the grid has more than one tile
          -> uint8 * rescale_factor (in float64, then float32) -> (x - mean) / std in float32

`pre`, written by the builder into the manifest (see preprocess_config):
    size             [height, width] of one tile, e.g. [448, 448]
    crop_to_patches  bool: tile the image; False gives one tile, the whole image resized
    min_patches      int: the fewest tiles a grid may have
    max_patches      int: the most tiles a grid may have (<= 1 turns tiling off, as in transformers)
    resample         int: PIL's filter number (3 = bicubic)
    rescale_factor   float: uint8 -> [0, 1] (1.0 where the checkpoint has do_rescale false)
    image_mean       3 floats (0s where the checkpoint has do_normalize false)
    image_std        3 floats (1s where the checkpoint has do_normalize false)
"""
from __future__ import annotations

import base64
import io
import os
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from PIL.Image import Image

# GotOcr2ImageProcessorPil's class attributes: what a key missing from (or null in) the config means.
DEFAULTS = {
    "size": {"height": 384, "width": 384}, "crop_to_patches": False, "min_patches": 1,
    "max_patches": 12, "resample": 3, "rescale_factor": 1 / 255,
    "image_mean": [0.48145466, 0.4578275, 0.40821073], "image_std": [0.26862954, 0.26130258, 0.27577711],
    "do_rescale": True, "do_normalize": True, "do_resize": True, "do_convert_rgb": True,
}
# Keys that do not change GotOcr2's pixels: bookkeeping, output form, or steps its _preprocess never runs.
IGNORED = {"image_processor_type", "processor_class", "auto_map", "default_to_square", "data_format",
           "input_data_format", "device", "return_tensors", "disable_grouping", "image_seq_length",
           "do_center_crop", "crop_size", "do_pad", "pad_size"}
FLAGS = ("crop_to_patches", "do_rescale", "do_normalize", "do_resize", "do_convert_rgb")
# What an image may be: the common raster formats only (Pillow would also open EPS through Ghostscript,
# and others no client needs), and at most this many pixels, checked before it is decoded (a 16 MB
# request can hold a PNG of a billion pixels)
FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP", "TIFF")
MAX_PIXELS = 64 * 2**20


def load_image(source: str | bytes | os.PathLike, name: str | None = None) -> Image:
    """A file path, encoded bytes or a `data:image/...;base64,` URL -> a loaded RGB image. `name`:
    what an error calls bytes (the file they were read from)."""
    from PIL import Image, ImageOps, UnidentifiedImageError

    if isinstance(source, bytes):
        name, data = name or f"<{len(source)} bytes>", source
    elif isinstance(source, str) and source.startswith("data:"):
        name, data = f"{source[:40]}...", data_url(source)
    else:
        name = data = os.fspath(source)
        if not os.path.exists(data):
            raise ValueError(f"image {name!r}: no such file")
        if os.path.isdir(data):
            raise ValueError(f"image {name!r}: is a directory")
    try:
        with Image.open(io.BytesIO(data) if isinstance(data, bytes) else data, formats=FORMATS) as image:
            if image.width * image.height > MAX_PIXELS:
                raise ValueError(f"image {name!r}: {image.width} x {image.height} pixels, more than the "
                                 f"{MAX_PIXELS:,} an image may have")
            image.load()
            # transformers' load_image turns a path upright by its EXIF orientation; so do we
            return to_rgb(ImageOps.exif_transpose(image))
    except ValueError as e:
        if str(e).startswith(f"image {name!r}"):
            raise
        raise ValueError(f"image {name!r}: not an image Pillow can read ({e})") from None
    except UnidentifiedImageError:
        raise ValueError(f"image {name!r}: not an image Pillow can read (none of {', '.join(FORMATS)})") from None
    except Exception as e:  # noqa: BLE001 - Pillow's decoders raise many kinds (OSError, SyntaxError, ...)
        raise ValueError(f"image {name!r}: not an image Pillow can read ({type(e).__name__}: {e})") from None


def data_url(url: str) -> bytes:
    head, comma, payload = url.partition(",")
    if not comma or not head.endswith(";base64"):
        raise ValueError(f"image data URL {url[:40]!r}: must be data:<type>;base64,<data>")
    try:
        return base64.b64decode("".join(payload.split()), validate=True)
    except ValueError as e:  # binascii.Error
        raise ValueError(f"image data URL {url[:40]!r}: bad base64 ({e})") from None


def to_rgb(image: Image) -> Image:
    """transformers' convert_to_rgb: an image with alpha (or a transparent colour) over white."""
    from PIL import Image

    if "A" in image.getbands() or image.info.get("transparency") is not None:
        rgba = image.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    return image.convert("RGB")


def tile_grid(width: int, height: int, pre: dict) -> tuple[int, int]:
    """(columns, rows): the grid whose aspect ratio is closest to the image's."""
    lo, hi = pre["min_patches"], pre["max_patches"]
    if not pre["crop_to_patches"] or hi <= 1:
        return 1, 1
    tile_height, tile_width = pre["size"]
    # fewest tiles first; sorted() is stable, so equal counts stay in (columns, rows) order
    grids = sorted(((c, r) for c in range(1, hi + 1) for r in range(1, hi + 1) if lo <= c * r <= hi),
                   key=lambda g: g[0] * g[1])
    aspect = width / height
    best, best_diff = (1, 1), float("inf")  # (1, 1) also when min_patches > max_patches leaves none
    for columns, rows in grids:
        diff = abs(aspect - columns / rows)
        if diff < best_diff:
            best, best_diff = (columns, rows), diff
        # an exact tie goes to the later (larger) grid while its tiles' area is under twice the image's
        elif diff == best_diff and width * height > 0.5 * tile_height * tile_width * columns * rows:
            best = (columns, rows)
    return best


def tile_count(width: int, height: int, pre: dict) -> int:
    """The tiles an image gives: the grid's, plus the thumbnail when the grid has more than one."""
    columns, rows = tile_grid(width, height, pre)
    return 1 if columns * rows == 1 else columns * rows + 1


def pixel_values(image: Image, pre: dict) -> np.ndarray:
    """float32 [tiles, 3, H, W]: the grid's tiles row by row, then the thumbnail."""
    image = to_rgb(image)  # as the processor does to every image: load_image's are RGB already
    tile_height, tile_width = pre["size"]
    columns, rows = tile_grid(image.width, image.height, pre)
    thumbnail = np.asarray(image.resize((tile_width, tile_height), resample=pre["resample"]))
    if columns * rows == 1:
        tiles = thumbnail[None]  # [1, H, W, 3]
    else:
        canvas = image.resize((tile_width * columns, tile_height * rows), resample=pre["resample"])
        grid = np.asarray(canvas).reshape(rows, tile_height, columns, tile_width, 3)
        tiles = np.concatenate([grid.transpose(0, 2, 1, 3, 4).reshape(-1, tile_height, tile_width, 3),
                                thumbnail[None]])  # [columns*rows + 1, H, W, 3]
    # transformers rescales in float64 and rounds to float32, then normalizes in float32
    x = (tiles.astype(np.float64) * pre["rescale_factor"]).astype(np.float32)
    x = (x - np.array(pre["image_mean"], np.float32)) / np.array(pre["image_std"], np.float32)
    return np.ascontiguousarray(x.transpose(0, 3, 1, 2))


def preprocess_config(processor_config: dict, *, crop_to_patches: bool | None = None,
                      defaults: dict = DEFAULTS) -> dict:
    """A checkpoint's preprocessor_config.json -> `pre`; refuses a setting it does not reproduce.

    crop_to_patches: None keeps the file's; InternVLProcessor passes True whatever the file says.
    defaults: what a key missing from (or null in) the file means: GotOcr2's; Gemma 3's processor
    (builder/vision_gemma3.py) has its own, and never tiles.
    """
    def own(cfg: dict) -> list[tuple[str, bool, str]]:
        size, lo, hi = cfg["size"], cfg["min_patches"], cfg["max_patches"]
        return [("size", isinstance(size, dict) and set(size) == {"height", "width"}
                 and all(is_int(v) and v > 0 for v in size.values()), '{"height": int > 0, "width": int > 0}'),
                ("min_patches", is_int(lo) and lo >= 1, "an int >= 1"),
                ("max_patches", is_int(hi) and hi >= 1, "an int >= 1"),
                ("min_patches", not (is_int(lo) and is_int(hi)) or lo <= hi, "<= max_patches")]

    cfg, pixels = read_processor_config(processor_config, defaults, IGNORED, FLAGS, own)
    return {
        "size": [cfg["size"]["height"], cfg["size"]["width"]],
        "crop_to_patches": cfg["crop_to_patches"] if crop_to_patches is None else crop_to_patches,
        "min_patches": cfg["min_patches"], "max_patches": cfg["max_patches"], **pixels,
    }


def read_processor_config(processor_config: dict, defaults: dict, ignored: set, flags: tuple, own) -> tuple[dict, dict]:
    """What every image processor port reads alike (here and runtime/images_qwen.py): unknown keys refused,
    null as the class default (transformers' _set_attributes), the flags, resampling, rescaling and
    normalization checked, and the processor's own checks, `own(cfg)` -> [(key, ok, constraint)] (it may
    normalize its keys in cfg first). A setting that fails raises ValueError naming it. Returns (cfg,
    the pixel settings: resample, rescale_factor, image_mean, image_std, with rescaling or normalization
    off as 1.0 and 0s and 1s)."""
    unknown = sorted(set(processor_config) - set(defaults) - ignored)
    if unknown:
        raise ValueError(f"preprocessor_config.{unknown[0]} is not a setting trtllm reproduces")
    cfg = {k: defaults[k] if processor_config.get(k) is None else processor_config[k] for k in defaults}
    checks = [(k, isinstance(cfg[k], bool), "true or false") for k in flags] + [
        # without these two transformers gives other sizes or channels
        ("do_resize", cfg["do_resize"] is True, "true"),
        ("do_convert_rgb", cfg["do_convert_rgb"] is True, "true"),
        *own(cfg),
        ("resample", cfg["resample"] in range(6) and is_int(cfg["resample"]), "a PIL filter number 0..5"),
        ("rescale_factor", is_number(cfg["rescale_factor"]), "a number"),
    ]
    if cfg["do_normalize"]:
        for key in ("image_mean", "image_std"):  # one number stands for all three channels
            cfg[key] = [cfg[key]] * 3 if is_number(cfg[key]) else cfg[key]
            ok = isinstance(cfg[key], list) and len(cfg[key]) == 3 and all(map(is_number, cfg[key]))
            checks.append((key, ok, "a number or 3 numbers"))
        checks.append(("image_std", not isinstance(cfg["image_std"], list) or 0 not in cfg["image_std"],
                       "non-zero"))
    for key, ok, constraint in checks:
        if not ok:
            value = processor_config.get(key)
            raise ValueError(f"preprocessor_config.{key} must be {constraint}, got {value!r}")
    return cfg, {
        "resample": cfg["resample"],
        "rescale_factor": float(cfg["rescale_factor"]) if cfg["do_rescale"] else 1.0,
        "image_mean": [float(v) for v in cfg["image_mean"]] if cfg["do_normalize"] else [0.0] * 3,
        "image_std": [float(v) for v in cfg["image_std"]] if cfg["do_normalize"] else [1.0] * 3,
    }


def is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
