"""runtime/images_qwen.py against transformers 5.24: Qwen2VLImageProcessorPil (Qwen2-VL's and Qwen2.5-VL's
image processor), the vision index helpers Qwen2.5-VL's vision forward calls, and get_rope_index.

Each preprocessing case builds the processor and our `pre` from the same preprocessor_config dict, so
preprocess_config's reading of the file (defaults, legacy min/max_pixels, do_rescale/do_normalize) is
checked too. Both sides resize with Pillow and do the same float32 arithmetic: the pixels must be equal.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import Qwen2_5_VLConfig
from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLModel
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize as hf_smart_resize
from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLModel
from transformers.vision_utils import get_vision_cu_seqlens, get_vision_position_ids, get_vision_window_index

from trtllm.runtime.images_qwen import (
    encoder_inputs,
    pixel_values,
    preprocess_config,
    rope_positions,
    smart_resize,
    token_count,
)

pytestmark = pytest.mark.hf

QWEN = {"min_pixels": 3136, "max_pixels": 12845056, "patch_size": 14, "temporal_patch_size": 2, "merge_size": 2,
        "image_mean": [0.48145466, 0.4578275, 0.40821073], "image_std": [0.26862954, 0.26130258, 0.27577711],
        "image_processor_type": "Qwen2VLImageProcessor", "processor_class": "Qwen2_5_VLProcessor"}
SMALL = {"min_pixels": 28 * 28 * 4, "max_pixels": 28 * 28 * 64}  # keeps the big images' pixels few and fast
CONFIGS = {
    "qwen2.5-vl": QWEN,
    "defaults": {},  # class defaults: max 28*28*1280 pixels, CLIP's mean and std
    "size-dict": {"size": {"shortest_edge": 28 * 28 * 4, "longest_edge": 28 * 28 * 64}},
    "legacy-wins": {"size": {"shortest_edge": 28 * 28 * 100, "longest_edge": 28 * 28 * 200}, **SMALL},
    "patch-16-merge-3-t-3": {"patch_size": 16, "merge_size": 3, "temporal_patch_size": 3,
                             "min_pixels": 48 * 48 * 2, "max_pixels": 48 * 48 * 30},
    "bilinear": {**SMALL, "resample": 2, "rescale_factor": 1 / 127.5, "image_mean": 0.5, "image_std": 0.5},
    "no-rescale": {**SMALL, "do_rescale": False},
    "no-normalize": {**SMALL, "do_normalize": False},
    "neither": {**SMALL, "do_rescale": False, "do_normalize": False},
}


def random_image(width: int, height: int, mode: str = "RGB", seed: int = 0) -> Image.Image:
    channels = {"L": 1, "RGB": 3, "RGBA": 4}[mode]
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, channels), dtype=np.uint8)
    return Image.fromarray(pixels.squeeze(-1) if channels == 1 else pixels, mode)


def palette_image(width: int, height: int, seed: int) -> Image.Image:
    """A "P" image whose colour 0 is transparent: no alpha band, yet composited over white."""
    image = random_image(width, height, seed=seed).quantize(16)
    image.info["transparency"] = 0
    return image


IMAGES = {
    "tiny-5x7": random_image(5, 7, seed=1),  # scaled up to min_pixels
    "wide-900x150": random_image(900, 150, seed=2),
    "tall-130x701": random_image(130, 701, seed=3),
    "square-56x56": random_image(56, 56, seed=4),
    "large-1500x1100": random_image(1500, 1100, seed=5),  # over SMALL's max_pixels
    "gray-333x222": random_image(333, 222, "L", seed=6),
    "rgba-241x183": random_image(241, 183, "RGBA", seed=7),
    "palette-transparent-150x450": palette_image(150, 450, seed=8),
}


def reference(image: Image.Image, config: dict) -> tuple[np.ndarray, tuple[int, int, int]]:
    out = Qwen2VLImageProcessorPil(**config)(image, return_tensors="np")
    assert out["image_grid_thw"].shape == (1, 3)
    return out["pixel_values"], tuple(int(v) for v in out["image_grid_thw"][0])


@pytest.mark.parametrize("config_name", CONFIGS)
@pytest.mark.parametrize("image_name", IMAGES)
def test_pixel_values_match_transformers(config_name, image_name):
    config, image = CONFIGS[config_name], IMAGES[image_name]
    pre = preprocess_config(config)
    expected, expected_grid = reference(image, dict(config))
    got, got_grid = pixel_values(image, pre)
    assert got_grid == expected_grid
    assert got.dtype == np.float32 and got.shape == expected.shape
    assert np.array_equal(got, expected)
    t, h, w = got_grid
    assert token_count(image.width, image.height, pre) == t * h * w // pre["merge_size"] ** 2
    processor = Qwen2VLImageProcessorPil(**config)
    assert t * h * w == processor.get_number_of_image_patches(image.height, image.width)


def test_preprocess_config_reads_the_keys_transformers_reads():
    assert preprocess_config({}) == {
        "patch_size": 14, "temporal_patch_size": 2, "merge_size": 2, "min_pixels": 3136, "max_pixels": 1003520,
        "resample": 3, "rescale_factor": 1 / 255, "image_mean": [0.48145466, 0.4578275, 0.40821073],
        "image_std": [0.26862954, 0.26130258, 0.27577711]}
    for config in CONFIGS.values():
        size = Qwen2VLImageProcessorPil(**config).size
        pre = preprocess_config(config)
        assert (pre["min_pixels"], pre["max_pixels"]) == (size.shortest_edge, size.longest_edge)
    # the legacy keys win over size's; one of them leaves size's other edge
    assert preprocess_config(CONFIGS["legacy-wins"])["min_pixels"] == 28 * 28 * 4
    one = preprocess_config({"size": {"shortest_edge": 100, "longest_edge": 9000}, "max_pixels": 5000})
    assert (one["min_pixels"], one["max_pixels"]) == (100, 5000)
    # transformers' old size form works only with the top-level keys beside it
    old = {"size": {"min_pixels": 1, "max_pixels": 2}, "min_pixels": 3000, "max_pixels": 4000}
    assert (preprocess_config(old)["min_pixels"], preprocess_config(old)["max_pixels"]) == (3000, 4000)
    assert preprocess_config({"do_rescale": False, "do_normalize": False})["rescale_factor"] == 1.0
    assert preprocess_config({"image_mean": None})["image_mean"] == [0.48145466, 0.4578275, 0.40821073]


@pytest.mark.parametrize("config, field", [
    ({"min_pixels": 100, "shortest_edge": 5}, "shortest_edge"),  # a misspelt size key
    ({"do_resize": False}, "do_resize"),
    ({"do_convert_rgb": False}, "do_convert_rgb"),
    ({"size": {"min_pixels": 100, "max_pixels": 1000}}, "size"),  # transformers fails on it too
    ({"size": {"shortest_edge": 100}}, "size"),
    ({"size": 448}, "size"),
    ({"min_pixels": "3136"}, "min_pixels"),
    ({"merge_size": 0}, "merge_size"),
    ({"patch_size": 14.0}, "patch_size"),
    ({"resample": 7}, "resample"),
    ({"image_std": [1, 0, 1]}, "image_std"),
    ({"image_mean": [0.5, 0.5]}, "image_mean"),
])
def test_preprocess_config_names_the_bad_field(config, field):
    with pytest.raises(ValueError, match=rf"^preprocessor_config\.{field} "):
        preprocess_config(config)


@pytest.mark.parametrize("height, width", [(1, 1), (7, 5), (27, 29), (42, 70), (14, 2800), (3000, 17),
                                           (1080, 1920), (4000, 3000), (28, 28 * 200)])
def test_smart_resize_matches_transformers(height, width):
    for factor, lo, hi in ((28, 3136, 12845056), (28, 3136, 28 * 28 * 64), (48, 48 * 48, 48 * 48 * 9)):
        assert smart_resize(height, width, factor, lo, hi) == hf_smart_resize(height, width, factor, lo, hi)


def test_smart_resize_refuses_what_transformers_refuses():
    with pytest.raises(ValueError):
        hf_smart_resize(10, 2010, 28, 3136, 12845056)
    with pytest.raises(ValueError, match=r"aspect ratio must be at most 200:1, got 2010 x 10"):
        smart_resize(10, 2010, 28, 3136, 12845056)
    with pytest.raises(ValueError, match=r"at least 1 x 1 pixels"):
        smart_resize(0, 10, 28, 3136, 12845056)


def test_deliberately_wrong_variants_give_other_pixels():
    """Parity-suite control: a wrong resample filter, or rows in plain raster order instead of merge-window
    order, must change the pixels the test compares."""
    image, pre = IMAGES["rgba-241x183"], preprocess_config(SMALL)
    expected, (_, h, w) = reference(image, SMALL)
    assert not np.array_equal(pixel_values(image, {**pre, "resample": 2})[0], expected)
    raster = expected.reshape(h // 2, w // 2, 2, 2, -1).transpose(0, 2, 1, 3, 4).reshape(h * w, -1)
    assert not np.array_equal(raster, expected)
    assert not np.array_equal(pixel_values(image, {**pre, "merge_size": 1, "min_pixels": 14 * 14})[0], expected)


GRIDS = {
    "one": [(1, 16, 16)],  # 8 x 8 merge units: two whole 4 x 4 windows a side
    "not-multiples": [(1, 10, 22)],  # 5 x 11 units: partial windows at the bottom and right
    "small": [(1, 2, 2)],  # one unit, one window
    "several": [(1, 10, 22), (1, 16, 8), (1, 2, 30), (1, 36, 4)],
    "frames": [(2, 6, 10), (1, 8, 8)],  # a two-frame entry: one full-attention sequence per frame
}


def hf_encoder_inputs(grids, merge_size, window_size, patch_size):
    """Qwen2.5-VL's vision forward's own helpers, and what it does with them."""
    thw = torch.tensor(grids)
    positions = get_vision_position_ids(thw, merge_size)  # [P, 2]
    cu_seqlens = get_vision_cu_seqlens(thw)
    window_index, cu_window = get_vision_window_index(thw, merge_size, window_size, patch_size)
    unit = merge_size ** 2
    # permute_input_for_window_attn on the row numbers
    rows = torch.arange(len(positions)).reshape(-1, unit)[window_index].reshape(-1)
    index = torch.arange(len(positions))
    return {"order": rows.numpy(), "patch_positions": positions[rows].numpy(),
            "window_ids": (torch.searchsorted(cu_window, index.int(), right=True) - 1).numpy(),
            "image_ids": (torch.searchsorted(cu_seqlens, index.int(), right=True) - 1).numpy(),
            "reverse": torch.argsort(window_index).numpy()}


@pytest.mark.parametrize("grids_name", GRIDS)
@pytest.mark.parametrize("merge_size, window_size, patch_size", [(2, 112, 14), (2, 56, 14), (3, 96, 16)])
def test_encoder_inputs_match_transformers(grids_name, merge_size, window_size, patch_size):
    grids = [(t, h // 2 * merge_size, w // 2 * merge_size) for t, h, w in GRIDS[grids_name]]
    got = encoder_inputs(grids, merge_size, window_size, patch_size)
    expected = hf_encoder_inputs(grids, merge_size, window_size, patch_size)
    for key, value in expected.items():
        assert got[key].dtype == np.int64, key
        assert np.array_equal(got[key], value), key
    # merged tokens come out in window order (one per unit); reverse puts them back
    assert np.array_equal((got["order"][::merge_size ** 2] // merge_size ** 2)[got["reverse"]],
                          np.arange(len(got["reverse"])))


def test_encoder_inputs_without_windows_are_qwen2_vl():
    grids = GRIDS["several"]
    got = encoder_inputs(grids, 2, None, 14)
    thw = torch.tensor(grids)
    index = torch.arange(int(thw.prod(-1).sum()))
    image_ids = (torch.searchsorted(get_vision_cu_seqlens(thw), index.int(), right=True) - 1).numpy()
    assert np.array_equal(got["order"], index.numpy())
    assert np.array_equal(got["patch_positions"], get_vision_position_ids(thw, 2).numpy())
    assert np.array_equal(got["image_ids"], image_ids) and np.array_equal(got["window_ids"], image_ids)
    assert np.array_equal(got["reverse"], np.arange(len(index) // 4))


def test_encoder_inputs_refuse_bad_grids():
    with pytest.raises(ValueError, match=r"grid \(t, h, w\) must be positive"):
        encoder_inputs([(1, 3, 4)], 2, 112, 14)
    with pytest.raises(ValueError, match=r"window_size must be at least"):
        encoder_inputs([(1, 4, 4)], 2, 20, 14)


class RopeStub:
    """`self` for get_rope_index, unbound: its config and the one method it calls."""

    def __init__(self, model_class):
        self.config = Qwen2_5_VLConfig()
        self.get_vision_position_ids = model_class.get_vision_position_ids.__get__(self)
        self.get_rope_index = model_class.get_rope_index.__get__(self)


PROMPTS = {  # (n, [(start, grid)])
    "text": (7, []),
    "one": (20, [(3, (1, 4, 6))]),
    "ends-with-image": (3 + 4 * 2, [(3, (1, 4, 8))]),  # wider than tall: text after goes on by columns
    "starts-with-image": (12, [(0, (1, 6, 2))]),
    "several": (60, [(2, (1, 4, 4)), (8, (1, 10, 2)), (14, (1, 2, 2)), (16, (1, 8, 10))]),
    "video-like": (30, [(5, (2, 4, 4))]),
}


@pytest.mark.parametrize("model_class", [Qwen2_5_VLModel, Qwen2VLModel])
@pytest.mark.parametrize("prompt_name", PROMPTS)
def test_rope_positions_match_get_rope_index(model_class, prompt_name):
    n, images = PROMPTS[prompt_name]
    types = torch.zeros(1, n, dtype=torch.int)
    for start, (t, h, w) in images:
        types[0, start:start + t * h * w // 4] = 1
    grids = torch.tensor([grid for _, grid in images]) if images else None
    expected, delta = RopeStub(model_class).get_rope_index(torch.zeros(1, n, dtype=torch.long), types, grids)
    got, got_delta = rope_positions(n, images, 2)
    assert got.dtype == np.int64 and np.array_equal(got, expected[:, 0].numpy())
    assert got_delta == int(delta[0, 0])


def test_rope_positions_refuse_touching_or_overflowing_images():
    with pytest.raises(ValueError, match="in order and apart"):
        rope_positions(20, [(2, (1, 4, 4)), (6, (1, 2, 2))], 2)
    with pytest.raises(ValueError, match="must fit in the 10-token prompt"):
        rope_positions(10, [(8, (1, 4, 4))], 2)
