"""runtime/images.py against transformers' GotOcr2ImageProcessorPil (InternVL's image processor).

Each case builds the processor and our `pre` from the same preprocessor_config dict, so
preprocess_config's reading of the file (defaults, do_rescale/do_normalize) is checked too.
Both sides resize with Pillow, so the pixels must agree to float32 rounding (atol 1e-6).
"""
from __future__ import annotations

import base64
import io
import json
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from trtllm.runtime.images import load_image, pixel_values, preprocess_config, tile_count, tile_grid

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.hf

from transformers.image_utils import load_image as hf_load_image  # noqa: E402
from transformers.models.got_ocr2.image_processing_pil_got_ocr2 import (  # noqa: E402
    GotOcr2ImageProcessorPil,
    get_optimal_tiled_canvas,
)

IMAGENET = {"image_mean": [0.485, 0.456, 0.406], "image_std": [0.229, 0.224, 0.225]}
INTERNVL = {"size": {"height": 448, "width": 448}, "crop_to_patches": True, "resample": 3, **IMAGENET}
TINY = {"size": {"height": 28, "width": 28}, "crop_to_patches": True, **IMAGENET}
CONFIGS = {
    "internvl": INTERNVL,
    "internvl-no-crop": {**INTERNVL, "crop_to_patches": False},
    "defaults": {},  # 384x384, no tiling, CLIP's mean and std
    "tiny": TINY,
    "tiny-2-to-6": {**TINY, "min_patches": 2, "max_patches": 6},
    "tiny-max-1": {**TINY, "max_patches": 1},  # transformers tiles only when max_patches > 1
    "tiny-bilinear": {**TINY, "resample": 2, "rescale_factor": 1 / 127.5},
    "tiny-no-rescale": {**TINY, "do_rescale": False},
    "tiny-no-normalize": {**TINY, "do_normalize": False},
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
    "wide-900x300": random_image(900, 300, seed=1),
    "tall-240x700": random_image(240, 700, seed=2),
    "small-100x80": random_image(100, 80, seed=3),
    "square-500x500": random_image(500, 500, seed=4),
    "gray-333x222": random_image(333, 222, "L", seed=5),
    "rgba-640x480": random_image(640, 480, "RGBA", seed=6),
    "palette-transparent-150x450": palette_image(150, 450, seed=7),
}


def reference(image: Image.Image, config: dict) -> tuple[np.ndarray, int]:
    """transformers' pixel_values [tiles, 3, H, W] and tile count, called as InternVLProcessor calls it."""
    out = GotOcr2ImageProcessorPil(**config)(image)
    return np.stack(out["pixel_values"]).astype(np.float32), out["num_patches"][0]


@pytest.mark.parametrize("config_name", CONFIGS)
@pytest.mark.parametrize("image_name", IMAGES)
def test_pixel_values_match_transformers(config_name, image_name):
    config, image = CONFIGS[config_name], IMAGES[image_name]
    pre = preprocess_config(config)
    expected, num_tiles = reference(image, config)
    ours = pixel_values(image, pre)
    assert ours.dtype == np.float32 and ours.flags.c_contiguous
    assert ours.shape == expected.shape
    assert tile_count(*image.size, pre) == num_tiles == len(ours)
    np.testing.assert_allclose(ours, expected, rtol=0, atol=1e-6)


def test_swapped_mean_and_std_must_fail():
    """Deliberately wrong variant: the comparison above can fail."""
    image, pre = IMAGES["wide-900x300"], preprocess_config(INTERNVL)
    expected, _ = reference(image, INTERNVL)
    wrong = pixel_values(image, {**pre, "image_mean": pre["image_std"], "image_std": pre["image_mean"]})
    with pytest.raises(AssertionError):
        np.testing.assert_allclose(wrong, expected, rtol=0, atol=1e-6)


@pytest.mark.parametrize("limits", [(1, 12), (2, 6), (1, 4), (3, 9), (4, 4)])
def test_tile_grid_and_count_match_transformers(limits):
    """Every size on a lattice, exact ratio ties (600x400 ties 1x1 with 2x1) included."""
    min_patches, max_patches = limits
    config = {**INTERNVL, "min_patches": min_patches, "max_patches": max_patches}
    pre, processor = preprocess_config(config), GotOcr2ImageProcessorPil(**config)
    for width in range(8, 2400, 97):
        for height in [*range(8, 2400, 89), 400, width, 2 * width, width * 3 // 2]:
            grid = get_optimal_tiled_canvas((height, width), (448, 448), min_patches, max_patches)
            assert tile_grid(width, height, pre) == grid, (width, height)
            expected = processor.get_number_of_image_patches(height, width, {"crop_to_patches": True})
            assert tile_count(width, height, pre) == expected, (width, height)


def test_tile_grid_tie_break():
    """A square image ties 1x1 with 2x2 (and 3x3): the larger grid wins while its area is under twice
    the image's, so only a big enough image is tiled, and the thumbnail comes with it."""
    pre = preprocess_config(INTERNVL)
    assert tile_grid(448, 448, pre) == (1, 1) and tile_count(448, 448, pre) == 1
    assert tile_grid(900, 900, pre) == (2, 2) and tile_count(900, 900, pre) == 5
    assert tile_grid(600, 400, pre) == (3, 2)
    assert tile_count(900, 300, {**pre, "crop_to_patches": False}) == 1


def png_bytes(image: Image.Image, **save) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, "PNG", **save)
    return buffer.getvalue()


def test_load_image_from_a_file_bytes_and_a_data_url(tmp_path):
    image = IMAGES["rgba-640x480"]
    path = tmp_path / "picture.png"
    path.write_bytes(png_bytes(image))
    data = path.read_bytes()
    url = "data:image/png;base64," + base64.b64encode(data).decode()
    # transparency over white, as the processor's do_convert_rgb does
    expected = transformers.image_transforms.convert_to_rgb(image, return_numpy=True)
    for source in (str(path), path, data, url):
        loaded = load_image(source)
        assert loaded.mode == "RGB" and loaded.size == (640, 480)
        np.testing.assert_array_equal(np.asarray(loaded), expected)


def test_load_image_turns_the_image_upright_like_transformers(tmp_path):
    exif = Image.Exif()
    exif[0x0112] = 6  # Orientation: rotate 90 degrees clockwise to view
    path = tmp_path / "rotated.png"
    path.write_bytes(png_bytes(IMAGES["small-100x80"], exif=exif))
    loaded = load_image(str(path))
    assert loaded.size == (80, 100)
    np.testing.assert_array_equal(np.asarray(loaded), np.asarray(hf_load_image(str(path))))


def test_load_image_errors_name_the_source_and_why(tmp_path):
    missing = tmp_path / "nope.png"
    with pytest.raises(ValueError, match=f"image '{missing}': no such file"):
        load_image(str(missing))
    with pytest.raises(ValueError, match="is a directory"):
        load_image(str(tmp_path))
    text = tmp_path / "notes.png"
    text.write_text("not a picture\n")
    with pytest.raises(ValueError, match=f"image '{text}': not an image Pillow can read"):
        load_image(str(text))
    with pytest.raises(ValueError, match=r"image '<4 bytes>': not an image Pillow can read"):
        load_image(b"junk")
    truncated = png_bytes(IMAGES["small-100x80"])[:200]
    with pytest.raises(ValueError, match="not an image Pillow can read"):
        load_image(truncated)
    with pytest.raises(ValueError, match="must be data:<type>;base64,<data>"):
        load_image("data:image/png,abc")
    with pytest.raises(ValueError, match="bad base64"):
        load_image("data:image/png;base64,@@@")
    ppm = io.BytesIO()  # a format Pillow reads, and a client never needs: not opened
    IMAGES["small-100x80"].save(ppm, format="PPM")
    with pytest.raises(ValueError, match=r"not an image Pillow can read \(none of PNG, JPEG"):
        load_image(ppm.getvalue())
    for source in (str(missing), str(text), b"junk", truncated):  # one line each
        with pytest.raises(ValueError) as error:
            load_image(source)
        assert "\n" not in str(error.value)


def test_preprocess_config_reads_a_saved_processor(tmp_path):
    """The file transformers writes, plus nulls as older checkpoints carry, reads back as written."""
    GotOcr2ImageProcessorPil(**INTERNVL).save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "preprocessor_config.json").read_text())
    saved.update(do_center_crop=None, crop_size=None, data_format="channels_first", return_tensors=None)
    assert preprocess_config(saved) == {
        "size": [448, 448], "crop_to_patches": True, "min_patches": 1, "max_patches": 12, "resample": 3,
        "rescale_factor": 1 / 255, **IMAGENET,
    }
    assert preprocess_config({**saved, "crop_to_patches": False}, crop_to_patches=True)["crop_to_patches"]


@pytest.mark.parametrize("key, value, message", [
    ("shortest_edge", 448, "preprocessor_config.shortest_edge is not a setting"),
    ("size", {"shortest_edge": 448}, "preprocessor_config.size must be"),
    ("size", 448, "preprocessor_config.size must be"),
    ("do_resize", False, "preprocessor_config.do_resize must be true"),
    ("do_convert_rgb", False, "preprocessor_config.do_convert_rgb must be true"),
    ("crop_to_patches", "yes", "preprocessor_config.crop_to_patches must be true or false"),
    ("min_patches", 13, "preprocessor_config.min_patches must be <= max_patches"),
    ("max_patches", 0, "preprocessor_config.max_patches must be an int >= 1"),
    ("resample", 9, "preprocessor_config.resample must be a PIL filter number"),
    ("image_mean", [0.5, 0.5], "preprocessor_config.image_mean must be a number or 3 numbers"),
    ("image_std", [1, 0, 1], "preprocessor_config.image_std must be non-zero"),
])
def test_preprocess_config_refusals_name_the_key(key, value, message):
    with pytest.raises(ValueError, match=message):
        preprocess_config({**INTERNVL, key: value})


def test_importing_the_module_loads_no_pil():
    code = "import sys, trtllm.runtime.images; print(sorted(m for m in sys.modules if m.startswith('PIL')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_an_image_of_too_many_pixels_is_refused_before_it_is_decoded(monkeypatch):
    from trtllm.runtime import images

    monkeypatch.setattr(images, "MAX_PIXELS", 100 * 80 - 1)
    with pytest.raises(ValueError, match="100 x 80 pixels, more than the 7,999"):
        load_image(png_bytes(IMAGES["small-100x80"]))
