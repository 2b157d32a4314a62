"""Gemma 3's image input: the whole image at one tile's size (runtime/images.py's one-tile form) and, with
pan-and-scan, crops of a wide or tall image, each at that size too, as transformers'
`Gemma3ImageProcessorPil` makes them with do_pan_and_scan, bit for bit.

`pre` is runtime/images.py's (crop_to_patches false) and `pan_and_scan`: null (off) or
    min_crop_size          int: no crop narrower than this (else no crops at all)
    max_num_crops          int: at most this many crops
    min_ratio_to_activate  float: crops only where the longer side is at least this times the shorter

An image with k crops takes k + 1 images' tokens in the prompt, in Gemma3Processor's words (prompt_text).
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from trtllm.runtime import images

if TYPE_CHECKING:
    from PIL.Image import Image


def crop_boxes(width: int, height: int, pas: dict | None) -> list[tuple[int, int, int, int]]:
    """The crops' (left, top, right, bottom), as Gemma3ImageProcessorPil.pan_and_scan cuts them (numpy
    slices: a last crop past the image's edge stops at it); [] where it makes none."""
    if not pas:
        return []
    long, short = (width, height) if width >= height else (height, width)
    if long / short < pas["min_ratio_to_activate"]:
        return []
    n = int(math.floor(long / short + 0.5))  # (half rounds up)
    n = max(2, min(int(math.floor(long / pas["min_crop_size"])), n))
    n = min(pas["max_num_crops"], n)
    columns, rows = (n, 1) if width >= height else (1, n)
    crop_w, crop_h = int(math.ceil(width / columns)), int(math.ceil(height / rows))
    if min(crop_w, crop_h) < pas["min_crop_size"]:
        return []
    return [(x, y, min(x + crop_w, width), min(y + crop_h, height))
            for y in range(0, crop_h * rows, crop_h) for x in range(0, crop_w * columns, crop_w)]


def tile_count(width: int, height: int, pre: dict) -> int:
    """The images' worth of tokens an image takes: itself and its crops."""
    return 1 + len(crop_boxes(width, height, pre.get("pan_and_scan")))


def pixel_values(image: Image, pre: dict) -> np.ndarray:
    """float32 [1 + crops, 3, H, W]: the whole image, then its crops row by row."""
    image = images.to_rgb(image)
    parts = [image, *(image.crop(box) for box in crop_boxes(image.width, image.height, pre.get("pan_and_scan")))]
    return np.concatenate([images.pixel_values(part, pre) for part in parts])


def prompt_text(crops: int, full: str) -> str:
    """What Gemma3Processor writes for an image with `crops` crops, `full` an image's own text."""
    if not crops:
        return full
    return (f"Here is the original image {full} and here are some crops to help you see better "
            + " ".join([full] * crops))
