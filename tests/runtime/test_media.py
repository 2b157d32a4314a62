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

    return PromptImages(np.array([3, 4, 5, 6, 10, 11]), [b"first", b"second"], "digest", encode)


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
