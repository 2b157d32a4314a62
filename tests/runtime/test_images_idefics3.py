"""runtime/images_idefics3.py against transformers' Idefics3ImageProcessorPil (SmolVLM's is the same).

Each case builds the processor and our `pre` from the same preprocessor_config dict, so
preprocess_config's reading of the file is checked too. Both sides resize with Pillow, so the pixels
must agree to float32 rounding (atol 1e-6), and the grids exactly.
"""
from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from trtllm.runtime.images_idefics3 import grid, pixel_values, preprocess_config, prompt_ids, tile_count

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.hf

from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil  # noqa: E402

SMOLVLM = {"size": {"longest_edge": 2048}, "max_image_size": {"longest_edge": 512}, "resample": 1,
           "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}
TINY = {"size": {"longest_edge": 96}, "max_image_size": {"longest_edge": 32}}
CONFIGS = {
    "smolvlm": SMOLVLM,
    "defaults": {},  # 1456 longest edge, 364 tiles, Lanczos
    "tiny": TINY,
    "tiny-no-splitting": {**TINY, "do_image_splitting": False},
    "tiny-one-tile": {**TINY, "size": {"longest_edge": 32}},
    "tiny-bicubic-imagenet": {**TINY, "resample": 3, "image_mean": [0.485, 0.456, 0.406],
                              "image_std": [0.229, 0.224, 0.225]},
    "tiny-no-normalize": {**TINY, "do_normalize": False},
}


def random_image(width: int, height: int, mode: str = "RGB", seed: int = 0) -> Image.Image:
    channels = {"RGB": 3, "RGBA": 4}[mode]
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (height, width, channels), dtype=np.uint8), mode)


IMAGES = {
    "wide-900x300": random_image(900, 300, seed=1),
    "tall-241x700": random_image(241, 700, seed=2),  # (odd: the resize makes the short edge even)
    "small-60x60": random_image(60, 60, seed=3),  # (enlarged to the longest edge)
    "rgba-640x479": random_image(640, 479, "RGBA", seed=4),
    "thin-1000x20": random_image(1000, 20, seed=5),
}


def reference(image: Image.Image, config: dict) -> tuple[np.ndarray, int, int]:
    """transformers' pixel_values [tiles, 3, S, S] and (rows, columns), called as Idefics3Processor calls it."""
    out = Idefics3ImageProcessorPil(**config)(image, return_row_col_info=True)
    return out["pixel_values"][0].astype(np.float32), out["rows"][0][0], out["cols"][0][0]


# every image on the tiny configs; one at full size (a second each) on the real ones
CASES = [(c, i) for c in CONFIGS for i in IMAGES if c.startswith("tiny") or i == "rgba-640x479"]


@pytest.mark.parametrize("config_name, image_name", CASES)
def test_pixel_values_and_grid_match_transformers(config_name, image_name):
    config, image = CONFIGS[config_name], IMAGES[image_name]
    pre = preprocess_config(config)
    expected, rows, columns = reference(image, config)
    ours = pixel_values(image, pre)
    assert ours.dtype == np.float32 and ours.flags.c_contiguous
    assert ours.shape == expected.shape
    assert grid(*image.size, pre) == (rows, columns)
    assert tile_count(*image.size, pre) == len(ours)
    np.testing.assert_allclose(ours, expected, rtol=0, atol=1e-6)


def test_a_wrong_resize_must_fail():
    """Deliberately wrong variant: cutting the tiles from the image resized once (not to whole tiles
    again) gives other pixels, and the comparison above would see it."""
    image, pre = IMAGES["tall-241x700"], preprocess_config(TINY)
    expected, _, _ = reference(image, TINY)
    wrong = pixel_values(image.resize((64, 96), Image.Resampling.LANCZOS), {**pre, "longest_edge": 96})
    assert wrong.shape == expected.shape
    with pytest.raises(AssertionError):
        np.testing.assert_allclose(wrong, expected, rtol=0, atol=1e-6)


@pytest.mark.parametrize("size", [(w, h) for w in (1, 7, 31, 33, 95, 96, 97, 300, 5000) for h in (1, 8, 32, 64, 97, 4097)])
def test_grid_matches_transformers_on_a_lattice(size):
    """The processor's rows and columns for sizes at and around the tile's multiples (and past 4096)."""
    processor = Idefics3ImageProcessorPil(**TINY)
    h1, w1 = processor.resize(np.zeros((3, size[1], size[0]), np.uint8), transformers.image_utils.SizeDict(
        longest_edge=96), resample=1).shape[-2:]
    h2, w2 = processor.resize_for_vision_encoder(np.zeros((3, h1, w1), np.uint8), 32, resample=1).shape[-2:]
    expected = ((h2 - 32) // 32 + 1, (w2 - 32) // 32 + 1) if h2 > 32 or w2 > 32 else (0, 0)
    assert grid(*size, preprocess_config(TINY)) == expected


def test_prompt_ids_lay_out_the_processors_text():
    section = {"start_token_id": 1, "image_token_id": 2, "tokens_per_tile": 2, "global_ids": [3],
               "row_col_ids": [[[10], [11]], [[12], [13]]], "newline_ids": [4], "break_ids": [5]}
    assert prompt_ids(0, 0, section) == [1, 3, 2, 2, 1]
    assert prompt_ids(2, 2, section) == [1, 10, 2, 2, 1, 11, 2, 2, 4, 1, 12, 2, 2, 1, 13, 2, 2, 5, 1, 3, 2, 2, 1]


@pytest.mark.parametrize("key, value, message", [
    ("size", {"height": 96, "width": 96}, "preprocessor_config.size must be"),
    ("max_image_size", {"longest_edge": 0}, "preprocessor_config.max_image_size must be"),
    ("do_resize", False, "preprocessor_config.do_resize must be true"),
    ("do_image_splitting", "yes", "preprocessor_config.do_image_splitting must be true or false"),
    ("resample", 9, "preprocessor_config.resample must be a PIL filter number"),
    ("crop_to_patches", True, "preprocessor_config.crop_to_patches is not a setting"),
])
def test_preprocess_config_refusals_name_the_key(key, value, message):
    with pytest.raises(ValueError, match=message):
        preprocess_config({**TINY, key: value})


def test_preprocess_config_wants_the_encoders_tile():
    assert preprocess_config(TINY, tile=32)["tile"] == 32
    with pytest.raises(ValueError, match="max_image_size must be the vision encoder's image_size 64"):
        preprocess_config(TINY, tile=64)
