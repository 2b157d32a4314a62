"""runtime/media.py's PromptImages: images encoded at the first prefill window that reaches them, and
let go once the prefill is past them; the windows a step feeds."""
from __future__ import annotations

import numpy as np

from trtllm.runtime.media import PromptImages


def images(calls: list) -> PromptImages:
    """Two images: tokens at prompt positions 3-6 and 10-11; embeddings numbered by position."""
    rows = {b"first": np.arange(4), b"second": np.arange(4, 6)}

    def encode(source: bytes) -> np.ndarray:
        calls.append(source)
        return np.repeat(rows[source][:, None], 2, axis=1).astype(np.float32)

    return PromptImages(np.array([3, 4, 5, 6, 10, 11]), [b"first", b"second"], [], encode)


def test_windows_encode_once_and_let_go_after_the_last_image_token():
    calls = []
    p = images(calls)
    assert p.window(0, 0, 3) is None and calls == []  # (a chunk before any image: nothing encoded)
    index, embeds = p.window(1, 3, 8)
    assert calls == [b"first", b"second"]
    assert index.tolist() == [[1, 0], [1, 1], [1, 2], [1, 3]] and embeds[:, 0].tolist() == [0, 1, 2, 3]
    index, embeds = p.window(1, 8, 12)  # (end past position 11: done with them)
    assert index.tolist() == [[1, 2], [1, 3]] and embeds[:, 0].tolist() == [4, 5]
    assert p.embeds is None and len(calls) == 2
    assert p.window(0, 12, 20) is None


def test_a_window_after_the_embeddings_went_encodes_them_again():
    calls = []
    p = images(calls)
    p.window(0, 0, 20)
    assert p.embeds is None
    index, embeds = p.window(0, 9, 11)
    assert index.tolist() == [[0, 1]] and embeds[:, 0].tolist() == [4] and len(calls) == 4


def test_each_images_tokens_are_keyed_by_its_own_bytes(tmp_path):
    """KV keys (step_inputs.key_ids): an image's tokens as an id of its bytes' own, the text as it is."""
    import io
    from types import SimpleNamespace

    from PIL import Image

    from trtllm.runtime import media
    from trtllm.runtime.messages import ContentItem

    for name, value in (("a.png", 10), ("b.png", 200)):
        buffer = io.BytesIO()
        Image.new("RGB", (8, 8), (value, value, value)).save(buffer, format="PNG")
        (tmp_path / name).write_bytes(buffer.getvalue())
    section = {"image_token_id": 9, "start_token_id": 7, "end_token_id": 8, "image_token": "<I>", "tokens_per_tile": 2,
               "preprocess": {"size": [8, 8], "crop_to_patches": False, "min_patches": 1, "max_patches": 1}}

    def keyed(*files):
        items = tuple(ContentItem("image", f) for f in files)
        req = SimpleNamespace(messages=[SimpleNamespace(content=items)])
        ids, placed = media.place([1, *([9, 2] * len(files))], req, 0, section, None, tmp_path)
        assert ids == [1, *[t for _ in files for t in (7, 9, 9, 8, 2)]]
        return placed.keyed

    a, b, ab = keyed("a.png"), keyed("b.png"), keyed("a.png", "b.png")
    assert a[:2] == [1, 7] and a[2] == a[3] < 0 and a[4:] == [8, 2]
    assert a[2] != b[2] and ab[:6] == a and ab[6:] == b[1:]


def test_a_warmed_image_is_taken_once_and_the_warmed_are_bounded(monkeypatch):
    from types import SimpleNamespace

    from trtllm.runtime import media

    runs = []
    encoder = media.ImageEncoder("/nowhere", SimpleNamespace(vision={}))
    monkeypatch.setattr(encoder, "encode", lambda source: runs.append(source) or np.full((1, 2), len(runs), np.float32))
    encoder.warm(b"a")
    assert encoder(b"a")[0, 0] == 1 and runs == [b"a"]  # (taken: not encoded again)
    assert encoder(b"a")[0, 0] == 2  # (taken once: the next is encoded)
    for i in range(media.WARM_IMAGES + 3):
        encoder.warm(bytes([i]))
    assert len(encoder.warmed) == media.WARM_IMAGES
