"""runtime/images_qwen.py against transformers 5.24: Qwen2VLImageProcessorPil (Qwen2-VL's, Qwen2.5-VL's and
Qwen3-VL's image processor), the vision index helpers Qwen2.5-VL's and Qwen3-VL's vision forwards call
(Qwen3-VL's position-table interpolation included), and get_rope_index.

Each preprocessing case builds the processor and our `pre` from the same preprocessor_config dict, so
preprocess_config's reading of the file (defaults, legacy min/max_pixels, do_rescale/do_normalize) is
checked too. Both sides resize with Pillow and do the same float32 arithmetic: the pixels must be equal.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image
from transformers import AutoImageProcessor, Qwen2_5_VLConfig, Qwen3VLConfig
from transformers.models.auto.image_processing_auto import IMAGE_PROCESSOR_MAPPING_NAMES
from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLModel
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize as hf_smart_resize
from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLModel
from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLModel
from transformers.vision_utils import (
    get_vision_cu_seqlens,
    get_vision_interpolation_indices_and_weights,
    get_vision_position_ids,
    get_vision_window_index,
)

from tests.runtime.test_images import palette_image, random_image
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
# Qwen/Qwen3-VL-2B-Instruct's preprocessor_config.json ("...Fast" names the torchvision class; without
# torchvision, or with backend="pil", transformers loads Qwen2VLImageProcessorPil from it)
QWEN3 = {"size": {"longest_edge": 16777216, "shortest_edge": 65536}, "patch_size": 16, "temporal_patch_size": 2,
         "merge_size": 2, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
         "processor_class": "Qwen3VLProcessor", "image_processor_type": "Qwen2VLImageProcessorFast"}
SMALL = {"min_pixels": 28 * 28 * 4, "max_pixels": 28 * 28 * 64}  # keeps the big images' pixels few and fast
CONFIGS = {
    "qwen2.5-vl": QWEN,
    "qwen3-vl": QWEN3,
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


def test_qwen3_vl_uses_qwen2_vl_image_processor(tmp_path):
    """Qwen3-VL has no image processor of its own: its checkpoint's config loads Qwen2-VL's."""
    assert IMAGE_PROCESSOR_MAPPING_NAMES["qwen3_vl"] == {"torchvision": "Qwen2VLImageProcessor",
                                                         "pil": "Qwen2VLImageProcessorPil"}
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(QWEN3))
    processor = AutoImageProcessor.from_pretrained(tmp_path, backend="pil")
    assert type(processor) is Qwen2VLImageProcessorPil
    assert preprocess_config(QWEN3) == {
        "patch_size": 16, "temporal_patch_size": 2, "merge_size": 2, "min_pixels": 65536, "max_pixels": 16777216,
        "resample": 3, "rescale_factor": 1 / 255, "image_mean": [0.5] * 3, "image_std": [0.5] * 3}
    image = IMAGES["wide-900x150"]
    expected = processor(image, return_tensors="np")
    got, thw = pixel_values(image, preprocess_config(QWEN3))
    assert thw == tuple(expected["image_grid_thw"][0]) and np.array_equal(got, expected["pixel_values"])


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


POS_GRIDS = {
    "square": [(1, 16, 16)],
    "wide": [(1, 8, 40)],
    "tall": [(1, 36, 6)],
    "over-the-table": [(1, 120, 96)],  # more patches a side than the table has rows
    "several": [(1, 10, 22), (1, 16, 8), (1, 2, 30), (1, 36, 4)],
    "video": [(2, 6, 10), (1, 8, 8)],  # a two-frame entry: both frames read the same table rows
}


def interpolated_rows(table, side, grids, positions):
    """Each row's patch of the table resized by F.interpolate, what transformers' helper stands for."""
    rows, start = [], 0
    for t, h, w in grids:
        image = F.interpolate(table.T.reshape(1, -1, side, side), size=(h, w), mode="bilinear",
                              align_corners=True)[0]  # [C, h, w]
        y, x = torch.from_numpy(positions[start:start + t * h * w]).T
        rows.append(image[:, y, x].T)
        start += t * h * w
    return torch.cat(rows).numpy()


@pytest.mark.parametrize("grids_name", POS_GRIDS)
@pytest.mark.parametrize("side, merge_size", [(48, 2), (32, 2), (7, 3)])  # Qwen3-VL's tables are 48 x 48
def test_pos_embed_taps_match_transformers(grids_name, side, merge_size):
    grids = [(t, h // 2 * merge_size, w // 2 * merge_size) for t, h, w in POS_GRIDS[grids_name]]
    got = encoder_inputs(grids, merge_size, None, 16, num_grid_per_side=side)
    index, weights = get_vision_interpolation_indices_and_weights(
        torch.tensor(grids), side, mode="bilinear", align_corners=True, spatial_merge_size=merge_size)
    assert got["pos_index"].dtype == np.int64 and got["pos_weights"].dtype == np.float32
    assert got["pos_index"].shape == got["pos_weights"].shape == (len(got["order"]), 4)
    assert np.array_equal(got["pos_index"], index.numpy())
    assert np.array_equal(got["pos_weights"], weights.numpy())  # bit for bit: the same float32 operations
    # Qwen3VLVisionModel's pos_embeds, and the table resized: only the summation order differs
    table = torch.randn(side * side, 8, generator=torch.Generator().manual_seed(0))
    ours = (table.numpy()[got["pos_index"]] * got["pos_weights"][..., None]).sum(1)
    assert np.allclose(ours, (table[index] * weights[:, :, None]).sum(1).numpy(), rtol=0, atol=1e-6)
    # F.interpolate rounds the scale (side - 1) / (h - 1) before multiplying: source rows a few ulps apart
    assert np.allclose(ours, interpolated_rows(table, side, grids, got["patch_positions"]), rtol=0, atol=1e-4)


def test_pos_embed_taps_deliberately_wrong_variants_differ():
    """Parity-suite control: half-pixel centres (align_corners False) or rows in raster order instead of
    merge-window order must change what the test compares."""
    grids, hf_taps = [(1, 10, 22)], get_vision_interpolation_indices_and_weights
    got = encoder_inputs(grids, 2, None, 16, num_grid_per_side=48)
    _, half_pixel = hf_taps(torch.tensor(grids), 48, align_corners=False, spatial_merge_size=2)
    raster, _ = hf_taps(torch.tensor(grids), 48, align_corners=True, spatial_merge_size=1)
    assert not np.allclose(got["pos_weights"], half_pixel.numpy())
    assert not np.array_equal(got["pos_index"], raster.numpy())


def test_pos_embed_taps_only_when_asked_and_refuse_a_bad_side():
    assert "pos_index" not in encoder_inputs([(1, 4, 4)], 2, None, 16)
    for side in (0, 48.0):
        with pytest.raises(ValueError, match=r"^num_grid_per_side must be an int > 0, got"):
            encoder_inputs([(1, 4, 4)], 2, None, 16, num_grid_per_side=side)


class RopeStub:
    """`self` for get_rope_index, unbound: its config and the one method it calls."""

    def __init__(self, model_class):
        self.config = Qwen3VLConfig() if model_class is Qwen3VLModel else Qwen2_5_VLConfig()
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


@pytest.mark.parametrize("model_class", [Qwen2_5_VLModel, Qwen2VLModel, Qwen3VLModel])
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
