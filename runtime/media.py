"""A request's images on a vision-language engine (manifest.vision): read, tiled (runtime/images.py),
encoded by the vision graph, and placed in its prompt.

The chat template writes one image token where each image item is. As transformers' processors do,
InternVL's (`<IMG_CONTEXT>`) becomes `<img>`, tiles x tokens_per_tile image tokens and `</img>`;
Gemma 4's (`<|image|>`) becomes `<|image>`, one image token per k x k patches of the image resized to its
token budget (runtime/images_gemma4.py) and `<image|>`, its tokens seen both ways where the config says;
Qwen-VL's (`<|image_pad|>`, between the template's own start and end tokens) becomes one token per
2 x 2 patches of the image resized to its own grid (runtime/images_qwen.py); Idefics3's and SmolVLM's
(`<image>`) becomes each tile's tag and tokens, row by row, then the whole image's (runtime/images_idefics3.py:
an image's tokens are not contiguous there); Gemma 3's (`<start_of_image>`) becomes "\n\n", itself, its
image tokens, `<end_of_image>` and "\n\n" in the prompt's text, before it is tokenized (expanded_text), as
its processor writes it, and its image tokens see each other both ways. The prompt's ids then hold
the image tokens, and PromptImages their embeddings, which a prefill step feeds the graph (image_embeds
at image_index) in place of the token table's. Qwen's language model turns each token by three
positions (multimodal RoPE): an image's tokens by their row and column, the text after it from past
the image's larger side; PromptImages holds them (rope_window) and the shift the generated tokens take
(rope_delta).

An image is read and checked when its request is prepared (a bad one fails that request alone),
and kept as its file's bytes; it is encoded when its row's prefill first reaches it, and the row
lets its embeddings go once its prefill is past them. The encoder keeps the last KEPT_BYTES of
embeddings by the image's bytes (the same image again is not encoded again), one encoding at a time.
"""
from __future__ import annotations

import hashlib
import os
import threading
import time
from collections import OrderedDict
from pathlib import Path

import numpy as np

from trtllm.plugins import cpu as cpu_kernels
from trtllm.runtime import images, images_gemma3, images_gemma4, images_idefics3, images_qwen

TILES_A_RUN = 4  # tiles the vision graph encodes at once: its attention's memory grows with them
# embeddings kept by their image's bytes (ImageEncoder.kept): the same image in another request, or
# encoded ahead by trtllm-serve's request thread, is not encoded again
KEPT_BYTES = 256 * 2**20
QWEN = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")  # vision.architecture of Qwen's encoders (runtime/images_qwen.py)


class PromptImages:
    """A prompt's images: where their tokens are, and (each encoded when a window first reaches it)
    their embeddings."""

    def __init__(self, positions: np.ndarray, sources: list[bytes], keyed: list[int], encode,
                 rope: np.ndarray | None = None, rope_delta: int = 0, counts: list[int] | None = None,
                 bidirectional: bool = False):
        self.positions = positions  # int64 [N]: the prompt positions of the image tokens, ascending
        # multimodal RoPE engines: each prompt token's (temporal, height, width) position int64 [3, n],
        # and the shift from a slot past the prompt to its position (None, 0: positions are slots)
        self.rope, self.rope_delta = rope, rope_delta
        self.sources = sources      # each image's bytes, in prompt order
        # the prompt's ids, each image's tokens as an id of its own (negative: no token's), from its
        # bytes' SHA-256: what KV of the prompt is keyed by (step_inputs.key_ids)
        self.keyed = keyed
        self.count = len(sources)
        self._encode = encode       # bytes -> [its image tokens, hidden] (None: counted only)
        # each image's first and last index into positions, and embeddings. `counts`: each image's
        # tokens, which other tokens may part (Idefics3's tiles); None: each image's are contiguous
        starts = [0, *(np.flatnonzero(np.diff(positions) != 1) + 1).tolist()] if counts is None else \
            np.cumsum([0, *counts[:-1]]).tolist()
        self.spans = [(lo, hi) for lo, hi in zip(starts, [*starts[1:], len(positions)])]
        self.embeds: list[np.ndarray | None] = [None] * self.count
        # Gemma 3: in the prompt the tokens of an image (and of each of its crops: each a run of its own)
        # see each other both ways, so a step computes such a run whole (stop) and each of its tokens
        # sees up to the run's last (ahead)
        self.bidirectional = bidirectional
        cuts = (np.flatnonzero(np.diff(positions) != 1) + 1).tolist()
        self.runs = list(zip([0, *cuts], [*cuts, len(positions)]))

    def window(self, row: int, start: int, end: int) -> tuple[np.ndarray, np.ndarray] | None:
        """The image tokens among prompt positions [start, end): their (row, position - start) and
        embeddings, or None where there are none. An image is encoded at the first window that holds
        some of its tokens (none that KV restored past it), and let go once `end` is past its last."""
        lo, hi = np.searchsorted(self.positions, [start, end])
        if hi == lo:
            return None
        parts = []
        for k, (first, last) in enumerate(self.spans):
            if last <= lo or first >= hi:
                continue
            if self.embeds[k] is None:
                self.embeds[k] = self._encode(self.sources[k])
            parts.append(self.embeds[k][max(lo, first) - first:min(hi, last) - first])
            if end > self.positions[last - 1]:
                self.embeds[k] = None
        at = self.positions[lo:hi] - start
        return np.stack([np.full_like(at, row), at], axis=1), np.concatenate(parts)

    def ahead(self, start: int, end: int) -> np.ndarray | None:
        """Images seen both ways (bidirectional): for the image tokens among prompt positions [start, end),
        in window()'s order, how many slots past its own each also sees (to its image's last token, in
        the same step: stop()); None where there are none (or the images are seen causally)."""
        lo, hi = np.searchsorted(self.positions, [start, end])
        if not self.bidirectional or hi == lo:
            return None
        last = np.concatenate([np.full(b - a, self.positions[b - 1]) for a, b in self.runs])
        if last[hi - 1] >= end:
            raise ValueError(f"prompt positions [{start}, {end}) cut an image seen both ways (stop() says where "
                             "a step must end)")
        return last[lo:hi] - self.positions[lo:hi]

    def stop(self, start: int, end: int, least: int = 1) -> int:
        """Where a step from `start` that would end at `end` ends instead, images seen both ways whole:
        before an image that `end` cuts, or after it where it begins fewer than `least` tokens after
        `start` (or before: KV restored into it)."""
        if not self.bidirectional:
            return end
        for a, b in self.runs:
            first, last = int(self.positions[a]), int(self.positions[b - 1])
            if first < end <= last:
                return first if first - start >= least else last + 1
        return end

    def rope_window(self, row: int, start: int, end: int) -> tuple[np.ndarray, np.ndarray] | None:
        """Multimodal RoPE: the tokens among prompt positions [start, end) whose three positions are not
        their slot (an image's, and the text after one): their (row, position - start) and positions
        int64 [M, 3], or None where there are none."""
        if self.rope is None:
            return None
        part = self.rope[:, start:end]
        moved = np.flatnonzero((part != np.arange(start, start + part.shape[1])).any(axis=0))
        if not len(moved):
            return None
        return np.stack([np.full_like(moved, row), moved], axis=1), np.ascontiguousarray(part[:, moved].T)


class MediaError(ValueError):
    """One request's image that cannot be used; the message names its JSON path."""


class ImageEncoder:
    """The engine's vision graph (ONNX Runtime on the CPU), loaded at its first image. `timing`: gives
    the Timing its runs go to (the runner's, which a warm-up replaces)."""

    def __init__(self, engine_dir, manifest, timing=None, num_threads: int | None = None):
        self.dir, self.section, self.timing, self.threads = Path(engine_dir), manifest.vision, timing, num_threads
        self.manifest = manifest
        self.limit = manifest.limits.max_input_len  # (an image with more tokens is refused, not encoded ahead)
        self.session = None  # feeds -> the embeddings (load()'s: ONNX Runtime's session, or vision.plan's)
        self.graph: str | None = None  # the graph or plan it runs (load()'s choice)
        self.lock = threading.Lock()  # (warm runs in a server's request threads, __call__ in its generation loop)
        # one encoding at a time: each takes every core and its attention's memory, and a second caller
        # of the same image then finds it kept
        self.encoding = threading.Lock()
        # sha256 of an image's bytes -> its embeddings, the least recently used first, KEPT_BYTES in all
        self.kept: OrderedDict[str, np.ndarray] = OrderedDict()
        self.waiting: set[str] = set()  # warmed and not yet taken: evicted last

    def warm(self, source: bytes) -> None:
        """Encode an image ahead, in the caller's thread (trtllm-serve's request thread: the running
        streams go on meanwhile), unless it is kept already (a conversation's image, sent again each
        turn). Best effort: one that cannot be read, or fails, is left to __call__ to say so."""
        try:
            if not self.fits(source):
                return  # (its request is refused as too long: its encoding, and memory, are not spent)
            digest = hashlib.sha256(source).hexdigest()
            self.take(source, digest)  # (kept already: found there)
            with self.lock:
                if digest in self.kept:
                    self.waiting.add(digest)
        except Exception:  # noqa: BLE001 - the generation loop's call reports it, for that request alone
            pass

    def fits(self, source: bytes) -> bool:
        """Whether an image's tokens fit the engine's max_input_len (one that does not is not encoded
        ahead: Qwen's encoder memory grows with the square of an image's size)."""
        image = images.load_image(source)
        return image_tokens(image.width, image.height, self.section) <= self.limit

    def __call__(self, source: bytes) -> np.ndarray:
        """An image's bytes -> its embeddings [its image tokens, hidden], kept ones again."""
        digest = hashlib.sha256(source).hexdigest()
        out = self.take(source, digest)
        with self.lock:
            self.waiting.discard(digest)
        return out

    def take(self, source: bytes, digest: str) -> np.ndarray:
        """The kept embeddings, else encoded (after any encoding under way: it may be this image's) and kept."""
        with self.lock:
            out = self.kept.get(digest)
        if out is None:
            with self.encoding:
                with self.lock:
                    out = self.kept.get(digest)
                if out is None:
                    out = self.encode(source)
        with self.lock:
            self.kept[digest] = out
            self.kept.move_to_end(digest)
            while sum(a.nbytes for a in self.kept.values()) > KEPT_BYTES and len(self.kept) > 1:
                # (the least recently used that no request waits for, else the least recently used)
                old = next((k for k in self.kept if k not in self.waiting and k != digest), next(iter(self.kept)))
                self.kept.pop(old)
                self.waiting.discard(old)
        return out

    def encode(self, source: bytes) -> np.ndarray:
        image, pre, order = images.load_image(source), self.section["preprocess"], None
        if self.section["architecture"] in QWEN:  # the whole image in one run
            pixels, grid = images_qwen.pixel_values(image, pre)
            at = images_qwen.encoder_inputs([grid], pre["merge_size"], self.section["window_size"],
                                            pre["patch_size"], self.section["num_grid_per_side"])
            runs, order = [{"pixel_values": pixels[at["order"]], **{k: at[k] for k in (
                "patch_positions", "image_ids", "window_ids", "window_rows", "window_slots", "pos_index", "pos_weights")
                if k in at}}], at["reverse"]
        elif self.section["architecture"] == "gemma4":  # (an image's own patches, one run)
            pixels, positions = images_gemma4.pixel_values(image, pre)
            runs = [{"pixel_values": pixels, "pixel_position_ids": positions}]
        else:
            module = {"idefics3": images_idefics3, "gemma3": images_gemma3}.get(self.section["architecture"], images)
            pixels = module.pixel_values(image, pre)
            most = tiles_a_run(self.section)
            runs = [{"pixel_values": pixels[i:i + most]} for i in range(0, len(pixels), most)]
        with self.lock:
            if self.session is None:
                self.session = self.load()
        began = time.perf_counter()
        out = np.concatenate([self.session(feeds) for feeds in runs])
        if order is not None:  # (Qwen2.5-VL's encoder works in window order: back to the image's)
            out = out[order]
        if self.timing is not None:
            self.timing().record("vision_encoder", time.perf_counter() - began)
        return out

    def load(self):
        """The vision graph's runner (feeds -> embeddings): a TensorRT engine's vision.plan; else its
        ONNX Runtime session, on its ONNX Runtime form on our kernels where the build wrote one
        (vision.ort.onnx: attention as trtllm.cpu::SegmentAttention, memory linear in an image's
        patches) and the kernel's fast path runs on this CPU (AVX2), else vision.onnx (ONNX's
        Attention: faster than the kernel's portable path; its memory grows with the patches' square)."""
        if self.manifest.backend == "tensorrt":  # (vision.plan, on the device beside llm.plan)
            from trtllm.runtime.backends.tensorrt_vision import TensorRTVision

            self.graph = self.manifest.files["vision_plan"]
            return TensorRTVision(self.dir, self.manifest)
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = self.threads or 0
        opts.log_severity_level = 3
        compiled = self.section.get("compiled")
        if compiled and cpu_kernels.segment_attention_fast():
            opts.register_custom_ops_library(str(cpu_kernels.library()))
        else:
            compiled = None
        self.graph = compiled or self.section["graph"]
        session = ort.InferenceSession(str(self.dir / self.graph), opts, providers=["CPUExecutionProvider"])
        # (Qwen2-VL's graph has no windows; vision.ort.onnx takes window_ids, vision.onnx window_rows and _slots)
        takes = {i.name for i in session.get_inputs()}
        return lambda feeds: session.run(None, {k: v for k, v in feeds.items() if k in takes})[0]


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


def resized_image(item, where: str, media_dir) -> tuple[bytes, int, int]:
    """read() of an image item, which every family resizes (do_resize false is refused by name)."""
    if item.do_resize is False:
        raise MediaError(f"`{where.rsplit('.', 1)[0]}.do_resize`: false is not possible on this engine "
                         "(its images are always resized)")
    return read(item.value, where, media_dir)


def keyed_ids(ids: list[int], positions: list[np.ndarray], sources: list[bytes]) -> list[int]:
    """The prompt's ids with each image's tokens (`positions`, an array an image) as an id of its bytes'
    own (PromptImages.keyed): the first 60 bits of their SHA-256, below 0, within int64."""
    keyed = list(ids)
    for at, data in zip(positions, sources):
        key = -1 - int(hashlib.sha256(data).hexdigest()[:15], 16)
        for p in at.tolist():
            keyed[p] = key
    return keyed


def tiles_a_run(section: dict) -> int:
    """The most tiles the vision graph encodes in one run (TensorRT's vision profile is built for as
    many: builder/tensorrt.vision_profiles): TILES_A_RUN, and Gemma 3's one image (its 4,096 patches)."""
    return 1 if section["architecture"] == "gemma3" else TILES_A_RUN


def expanded_text(text: str, section: dict, crops: list[int] | None = None) -> str:
    """The prompt's text with each image's tokens written out where its processor writes them in the
    text itself (Gemma 3's: "\n\n", the start token, tokens_per_tile image tokens, the end token,
    "\n\n" for each start token the chat template wrote; with `crops`, each image's crop count from
    pan-and-scan: crop_counts, its crops' too), else the text as it is."""
    if section["architecture"] != "gemma3":
        return text
    full = f"\n\n{section['start_token']}{section['image_token'] * section['tokens_per_tile']}{section['end_token']}\n\n"
    pieces = text.split(section["start_token"])
    crops = list(crops or []) + [0] * len(pieces)
    return pieces[0] + "".join(images_gemma3.prompt_text(n, full) + piece for n, piece in zip(crops, pieces[1:]))


def crop_counts(req, index: int, section: dict, media_dir) -> list[int] | None:
    """Each image item's pan-and-scan crops (Gemma 3's, where the engine has it on), read from its file;
    None where there are none to count. Raises MediaError naming an item that cannot be read."""
    pas = section["preprocess"].get("pan_and_scan") if section["architecture"] == "gemma3" else None
    if not pas:
        return None
    return [len(images_gemma3.crop_boxes(*read(item.value, where, media_dir)[1:], pas))
            for where, item in image_items(req, index)]


def image_tokens(width: int, height: int, section: dict) -> int:
    """The tokens an image of this size takes in the prompt."""
    pre = section["preprocess"]
    if section["architecture"] in QWEN:
        return images_qwen.token_count(width, height, pre)
    if section["architecture"] == "idefics3":
        return images_idefics3.tile_count(width, height, pre) * section["tokens_per_tile"]
    if section["architecture"] == "gemma3":
        return images_gemma3.tile_count(width, height, pre) * section["tokens_per_tile"]
    if section["architecture"] == "gemma4":
        return images_gemma4.token_count(width, height, pre)
    return images.tile_count(width, height, pre) * section["tokens_per_tile"]


def place(ids: list[int], req, index: int, section: dict, encoder=None,
          media_dir: str | os.PathLike | None = None) -> tuple[list[int], PromptImages | None]:
    """The prompt's ids with each image token expanded, and its images (encoder None: counted only,
    as /tokenize wants). `media_dir`: where relative paths start; None: data: URLs only (trtllm-serve).
    Raises MediaError naming the item or field at fault."""
    items = image_items(req, index)
    context = section["image_token_id"]
    if section["architecture"] == "gemma3":  # (its image tokens are in the ids already: expanded_text)
        return place_expanded(ids, items, index, section, encoder, media_dir)
    found = [i for i, t in enumerate(ids) if t == context]
    if len(found) != len(items):
        raise MediaError(f"`requests[{index}].messages`: {len(items)} image item(s), and the prompt the chat template "
                         f"wrote has {len(found)} {section['image_token']!r} token(s): the images need the engine's "
                         "chat template (apply_chat_template true), and the text must not write that token itself")
    if not items:
        return ids, None
    pre, qwen, idefics3 = section["preprocess"], section["architecture"] in QWEN, section["architecture"] == "idefics3"
    out, positions, sources, grids, last = [], [], [], [], 0
    for (where, item), at in zip(items, found):
        data, width, height = resized_image(item, where, media_dir)
        sources.append(data)
        # InternVL's template writes the image token alone, and its processor wraps the image's tokens
        # in start and end tokens; Qwen's writes all three, and its processor repeats the middle one;
        # Idefics3's writes it alone, and its processor writes each tile's tokens after a row-and-column tag
        if qwen and not (0 < at < len(ids) - 1 and ids[at - 1] == section["start_token_id"]
                         and ids[at + 1] == section["end_token_id"]):
            raise MediaError(f"`requests[{index}].messages`: the chat template wrote {section['image_token']!r} for "
                             f"`{where}` without the image's start and end tokens around it, as Qwen's template "
                             "writes them: the engine's chat template is needed (apply_chat_template true)")
        out += ids[last:at]
        last = at + 1
        if idefics3:
            piece = np.array(images_idefics3.prompt_ids(*images_idefics3.grid(width, height, pre), section))
            positions.append(len(out) + np.flatnonzero(piece == context))
            out += piece.tolist()
            continue
        out += [section["start_token_id"]] * (not qwen)
        try:
            if qwen:
                grids.append(images_qwen.grid(width, height, pre))
            tokens = image_tokens(width, height, section)
        except ValueError as e:  # (a shape the processor refuses: 200:1 or narrower)
            raise MediaError(f"`{where}`: {e}") from None
        positions.append(np.arange(len(out), len(out) + tokens))
        out += [context] * tokens + [section["end_token_id"]] * (not qwen)
    out += ids[last:]
    keyed = keyed_ids(out, positions, sources)
    rope = images_qwen.rope_positions(len(out), [(int(at[0]), g) for at, g in zip(positions, grids)],
                                      pre["merge_size"]) if qwen else (None, 0)
    return out, PromptImages(np.concatenate(positions).astype(np.int64), sources, keyed, encoder, *rope,
                             counts=[len(at) for at in positions], bidirectional=bool(section.get("bidirectional")))


def place_expanded(ids: list[int], items: list, index: int, section: dict, encoder,
                   media_dir) -> tuple[list[int], PromptImages | None]:
    """place() where the prompt's text held each image's tokens already (expanded_text: Gemma 3's): the
    ids as they are, each image's tokens (and each of its pan-and-scan crops') the run after a start
    token, seen both ways."""
    start, context, n = section["start_token_id"], section["image_token_id"], section["tokens_per_tile"]
    sources, tiles = [], []
    for where, item in items:
        data, width, height = resized_image(item, where, media_dir)
        sources.append(data)
        tiles.append(images_gemma3.tile_count(width, height, section["preprocess"]))  # (itself and its crops)
    found = [i for i, t in enumerate(ids) if t == start]
    runs = [at for at in found if ids[at + 1:at + 2 + n] == [context] * n + [section["end_token_id"]]]
    if len(found) != sum(tiles) or len(runs) != len(found) or ids.count(context) != n * len(found):
        raise MediaError(f"`requests[{index}].messages`: {len(items)} image item(s) ({sum(tiles)} with their crops), "
                         f"and the prompt the chat template wrote has {len(found)} {section['start_token']!r} token(s) "
                         f"and {ids.count(context)} {section['image_token']!r} token(s): the images need the engine's "
                         "chat template (apply_chat_template true), and the text must not write those tokens itself")
    if not items:
        return ids, None
    firsts = np.cumsum([0, *tiles])
    positions = [np.concatenate([np.arange(at + 1, at + 1 + n) for at in found[lo:hi]])
                 for lo, hi in zip(firsts[:-1], firsts[1:])]
    keyed = keyed_ids(ids, positions, sources)
    return ids, PromptImages(np.concatenate(positions).astype(np.int64), sources, keyed, encoder,
                             counts=[len(at) for at in positions], bidirectional=True)
