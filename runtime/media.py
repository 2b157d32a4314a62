"""A request's images on a vision-language engine (manifest.vision): read, tiled (runtime/images.py),
encoded by the vision graph, and placed in its prompt.

The chat template writes one image token (InternVL's `<IMG_CONTEXT>`) where each image item is; as
transformers' InternVLProcessor does, each becomes `<img>`, tiles x tokens_per_tile image tokens and
`</img>`. The prompt's ids then hold the image tokens, and PromptImages their embeddings, which a
prefill step feeds the graph (image_embeds at image_index) in place of the token table's.

An image is read and checked when its request is prepared (a bad one fails that request alone),
and kept as its file's bytes; it is encoded when its row's prefill first reaches it, and the
embeddings are let go once the prefill is past them: a run of many requests holds the embeddings of
the rows being prefilled only.
"""
from __future__ import annotations

import hashlib
import os
import threading
import time
from collections import OrderedDict
from pathlib import Path

import numpy as np

from trtllm.runtime import images

TILES_A_RUN = 4  # tiles the vision graph encodes at once: its attention's memory grows with them
WARM_IMAGES = 16  # images encoded ahead (ImageEncoder.warm) and not yet taken, at most


class PromptImages:
    """A prompt's images: where their tokens are, and (encoded when first asked for) their embeddings."""

    def __init__(self, positions: np.ndarray, sources: list[bytes], keyed: list[int], encode):
        self.positions = positions  # int64 [N]: the prompt positions of the image tokens, ascending
        self.sources = sources      # each image's bytes, in prompt order
        # the prompt's ids, each image's tokens as an id of its own (negative: no token's), from its
        # bytes' SHA-256: what KV of the prompt is keyed by (step_inputs.key_ids)
        self.keyed = keyed
        self.count = len(sources)
        self._encode = encode       # bytes -> [tiles * tokens_per_tile, hidden] (None: counted only)
        self.embeds: np.ndarray | None = None

    def window(self, row: int, start: int, end: int) -> tuple[np.ndarray, np.ndarray] | None:
        """The image tokens among prompt positions [start, end): their (row, position - start) and
        embeddings, or None where there are none. The embeddings are made at the first window with
        some, and go once `end` is past the last image token (the prefill is done with them)."""
        lo, hi = np.searchsorted(self.positions, [start, end])
        if hi == lo:
            return None
        if self.embeds is None:
            self.embeds = np.concatenate([self._encode(source) for source in self.sources])
        embeds = self.embeds[lo:hi]
        if end > self.positions[-1]:
            self.embeds = None
        at = self.positions[lo:hi] - start
        return np.stack([np.full_like(at, row), at], axis=1), embeds


class MediaError(ValueError):
    """One request's image that cannot be used; the message names its JSON path."""


class ImageEncoder:
    """The engine's vision graph (ONNX Runtime on the CPU), loaded at its first image. `timing`: gives
    the Timing its runs go to (the runner's, which a warm-up replaces)."""

    def __init__(self, engine_dir, manifest, timing=None, num_threads: int | None = None):
        self.dir, self.section, self.timing, self.threads = Path(engine_dir), manifest.vision, timing, num_threads
        self.session = None
        self.lock = threading.Lock()  # (warm runs in a server's request threads, __call__ in its generation loop)
        self.warmed: OrderedDict[str, np.ndarray] = OrderedDict()  # sha256 of an image's bytes -> its embeddings

    def warm(self, source: bytes) -> None:
        """Encode an image ahead, in the caller's thread (trtllm-serve's request thread: the running
        streams go on meanwhile), for the __call__ that takes it; one that cannot be read is left to
        that call to say so, naming its item."""
        try:
            out = self.encode(source)
        except (ValueError, OSError):
            return
        with self.lock:
            self.warmed[hashlib.sha256(source).hexdigest()] = out
            while len(self.warmed) > WARM_IMAGES:  # (a request that failed before its prefill never takes its own)
                self.warmed.popitem(last=False)

    def __call__(self, source: bytes) -> np.ndarray:
        """An image's bytes -> its embeddings [tiles * tokens_per_tile, hidden]: warmed ones taken."""
        with self.lock:
            out = self.warmed.pop(hashlib.sha256(source).hexdigest(), None) if self.warmed else None
        return self.encode(source) if out is None else out

    def encode(self, source: bytes) -> np.ndarray:
        pixels = images.pixel_values(images.load_image(source), self.section["preprocess"])
        with self.lock:
            if self.session is None:
                import onnxruntime as ort

                opts = ort.SessionOptions()
                opts.intra_op_num_threads = self.threads or 0
                opts.log_severity_level = 3
                self.session = ort.InferenceSession(str(self.dir / self.section["graph"]), opts,
                                                    providers=["CPUExecutionProvider"])
        began = time.perf_counter()
        out = np.concatenate([self.session.run(None, {"pixel_values": pixels[i:i + TILES_A_RUN]})[0]
                              for i in range(0, len(pixels), TILES_A_RUN)])
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


def read(value: str, where: str, media_dir: str | os.PathLike | None) -> tuple[bytes, int, int]:
    """An image item's bytes, checked to be an image: (bytes, width, height)."""
    if media_dir is None and not value.startswith("data:"):
        raise MediaError(f"`{where}` must be a data: URL (data:image/png;base64,...): the server reads no file "
                         "and fetches nothing")
    try:
        if value.startswith("data:"):
            data, name = images.data_url(value), f"{value[:40]}..."
        else:
            path = os.path.join(media_dir, value)
            if not os.path.isfile(path):
                raise ValueError(f"image {value!r}: no such file" + (f" (read as {path})" if path != value else ""))
            with open(path, "rb") as f:
                data, name = f.read(), value
        image = images.load_image(data, name)
    except (ValueError, OSError) as e:
        raise MediaError(f"`{where}`: {e}") from None
    return data, image.width, image.height


def place(ids: list[int], req, index: int, section: dict, encoder=None,
          media_dir: str | os.PathLike | None = None) -> tuple[list[int], PromptImages | None]:
    """The prompt's ids with each image token expanded, and its images (encoder None: counted only,
    as /tokenize wants). `media_dir`: where relative paths start; None: data: URLs only (trtllm-serve).
    Raises MediaError naming the item or field at fault."""
    items = image_items(req, index)
    context = section["image_token_id"]
    found = [i for i, t in enumerate(ids) if t == context]
    if len(found) != len(items):
        raise MediaError(f"`requests[{index}].messages`: {len(items)} image item(s), and the prompt the chat template "
                         f"wrote has {len(found)} {section['image_token']!r} token(s): the images need the engine's "
                         "chat template (apply_chat_template true), and the text must not write that token itself")
    if not items:
        return ids, None
    pre, per_tile = section["preprocess"], section["tokens_per_tile"]
    out, positions, sources, keyed, last = [], [], [], [], 0
    for (where, item), at in zip(items, found):
        if item.do_resize is False:
            raise MediaError(f"`{where.rsplit('.', 1)[0]}.do_resize`: false is not possible on this engine "
                             "(InternVL's tiles are always resized)")
        data, width, height = read(item.value, where, media_dir)
        sources.append(data)
        tokens = images.tile_count(width, height, pre) * per_tile
        own = -1 - int(hashlib.sha256(data).hexdigest()[:15], 16)  # (60 bits: below 0, within int64)
        keyed += ids[last:at] + [section["start_token_id"]] + [own] * tokens + [section["end_token_id"]]
        out += ids[last:at] + [section["start_token_id"]]
        positions.append(np.arange(len(out), len(out) + tokens))
        out += [context] * tokens + [section["end_token_id"]]
        last = at + 1
    out += ids[last:]
    keyed += ids[last:]
    return out, PromptImages(np.concatenate(positions).astype(np.int64), sources, keyed, encoder)
