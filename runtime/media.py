"""A request's images on a vision-language engine (manifest.vision): read, tiled (runtime/images.py),
encoded by the vision graph, and placed in its prompt.

The chat template writes one image token (InternVL's `<IMG_CONTEXT>`) where each image item is; as
transformers' InternVLProcessor does, each becomes `<img>`, tiles x tokens_per_tile image tokens and
`</img>`. The prompt's ids then hold the image tokens, and PromptImages their embeddings, which a
prefill step feeds the graph (image_embeds at image_index) in place of the token table's.
"""
from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trtllm.runtime import images


@dataclass(frozen=True)
class PromptImages:
    positions: np.ndarray  # int64 [N]: the prompt positions of the image tokens, ascending
    embeds: np.ndarray     # f32 [N, hidden]: what the graph takes there
    digest: str            # of the images' pixels: saved KV of a prompt with images is keyed by it too
    count: int             # images

    def window(self, row: int, start: int, end: int) -> tuple[np.ndarray, np.ndarray]:
        """The image tokens among prompt positions [start, end): their (row, position - start) and embeddings."""
        lo, hi = np.searchsorted(self.positions, [start, end])
        at = self.positions[lo:hi] - start
        return np.stack([np.full_like(at, row), at], axis=1), self.embeds[lo:hi]


class MediaError(ValueError):
    """One request's image that cannot be used; the message names its JSON path."""


class ImageEncoder:
    """The engine's vision graph (ONNX Runtime on the CPU), loaded at its first image. `timing`: gives
    the Timing its runs go to (the runner's, which a warm-up replaces)."""

    def __init__(self, engine_dir, manifest, timing=None, num_threads: int | None = None):
        self.dir, self.section, self.timing, self.threads = Path(engine_dir), manifest.vision, timing, num_threads
        self.session = None

    def encode(self, pixels: np.ndarray) -> np.ndarray:
        """[tiles, 3, H, W] -> [tiles * tokens_per_tile, hidden]."""
        if self.session is None:
            import onnxruntime as ort

            opts = ort.SessionOptions()
            opts.intra_op_num_threads = self.threads or 0
            opts.log_severity_level = 3
            self.session = ort.InferenceSession(str(self.dir / self.section["graph"]), opts,
                                                providers=["CPUExecutionProvider"])
        began = time.perf_counter()
        out = self.session.run(None, {"pixel_values": pixels})[0]
        if self.timing is not None:
            self.timing().record("vision_encoder", time.perf_counter() - began)
        return out


def image_items(req, index: int) -> list[tuple[str, object]]:
    """(JSON path, item) of each image content item, in prompt order."""
    out = []
    for j, message in enumerate(req.messages):
        if isinstance(message.content, str):
            continue
        for k, item in enumerate(message.content):
            if item.type == "image":
                out.append((f"requests[{index}].messages[{j}].content[{k}].image", item))
    return out


def place(ids: list[int], req, index: int, section: dict, encoder: ImageEncoder | None,
          media_dir: str | os.PathLike | None = ".") -> tuple[list[int], PromptImages | None]:
    """The prompt's ids with each image token expanded, and its images' embeddings (encoder None: only
    counted, as /tokenize wants). `media_dir`: where relative paths start; None: data: URLs only
    (trtllm-serve). Raises MediaError naming the item or field at fault."""
    items = image_items(req, index)
    context = section["image_token_id"]
    found = [i for i, t in enumerate(ids) if t == context]
    if len(found) != len(items):
        raise MediaError(f"`requests[{index}].messages`: {len(items)} image item(s), and the prompt the chat template "
                         f"wrote has {len(found)} {section['image_token']!r} token(s): the images need the engine's "
                         "chat template (apply_chat_template true), and the text must not write that token itself")
    pre, per_tile = section["preprocess"], section["tokens_per_tile"]
    out, positions, embeds, digest = [], [], [], hashlib.sha256()
    last = 0
    for (where, item), at in zip(items, found):
        if item.do_resize is False:
            raise MediaError(f"`{where.rsplit('.', 1)[0]}.do_resize`: false is not possible on this engine "
                             "(InternVL's tiles are always resized)")
        if media_dir is None and not item.value.startswith("data:"):
            raise MediaError(f"`{where}` must be a data: URL (data:image/png;base64,...): the server reads no file "
                             "and fetches nothing")
        try:
            source = item.value if item.value.startswith("data:") else os.path.join(media_dir, item.value)
            image = images.load_image(source)
            pixels = images.pixel_values(image, pre)
        except (ValueError, OSError) as e:
            raise MediaError(f"`{where}`: {e}") from None
        digest.update(np.ascontiguousarray(pixels).tobytes())
        out += ids[last:at] + [section["start_token_id"]]
        positions.append(np.arange(len(out), len(out) + len(pixels) * per_tile))
        out += [context] * (len(pixels) * per_tile) + [section["end_token_id"]]
        if encoder is not None:
            embeds.append(encoder.encode(pixels))
        last = at + 1
    out += ids[last:]
    if not items:
        return out, None
    hidden = section["hidden_size"]
    return out, PromptImages(np.concatenate(positions).astype(np.int64),
                             np.concatenate(embeds) if embeds else np.zeros((0, hidden), np.float32),
                             digest.hexdigest(), len(items))
