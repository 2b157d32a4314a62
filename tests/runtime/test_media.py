"""runtime/media.py's PromptImages: images encoded at the first prefill window that reaches them, and
let go once the prefill is past them; the windows a step feeds."""
from __future__ import annotations

import hashlib

import numpy as np

from trtllm.runtime.media import PromptImages


def images(calls: list) -> PromptImages:
    """Two images: tokens at prompt positions 3-6 and 10-11; embeddings numbered by position."""
    rows = {b"first": np.arange(4), b"second": np.arange(4, 6)}

    def encode(source: bytes) -> np.ndarray:
        calls.append(source)
        return np.repeat(rows[source][:, None], 2, axis=1).astype(np.float32)

    return PromptImages(np.array([3, 4, 5, 6, 10, 11]), [b"first", b"second"], [], encode)


def test_windows_encode_each_image_once_and_let_it_go_after_its_last_token():
    calls = []
    p = images(calls)
    assert p.window(0, 0, 3) is None and calls == []  # (a chunk before any image: nothing encoded)
    index, embeds = p.window(1, 3, 8)
    assert calls == [b"first"]  # (the second's tokens are not in this chunk)
    assert index.tolist() == [[1, 0], [1, 1], [1, 2], [1, 3]] and embeds[:, 0].tolist() == [0, 1, 2, 3]
    assert p.embeds[0] is None  # (past position 6: done with it)
    index, embeds = p.window(1, 8, 12)  # (end past position 11: done with them)
    assert index.tolist() == [[1, 2], [1, 3]] and embeds[:, 0].tolist() == [4, 5]
    assert p.embeds == [None, None] and calls == [b"first", b"second"]
    assert p.window(0, 12, 20) is None


def test_kv_restored_past_an_image_spares_its_encoding():
    calls = []
    p = images(calls)
    index, embeds = p.window(0, 8, 20)  # (KV restored for positions 0-7: the first image's)
    assert calls == [b"second"] and index.tolist() == [[0, 2], [0, 3]] and embeds[:, 0].tolist() == [4, 5]
    index, embeds = p.window(0, 5, 11)  # (a chunk that cuts both: the first's tail, the second's head)
    assert index.tolist() == [[0, 0], [0, 1], [0, 5]] and embeds[:, 0].tolist() == [2, 3, 4]


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
    section = {"architecture": "internvl", "image_token_id": 9, "start_token_id": 7, "end_token_id": 8,
               "image_token": "<I>", "tokens_per_tile": 2,
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


def test_embeddings_are_kept_by_the_images_bytes_within_a_bound(monkeypatch):
    """An image encoded once (ahead, by warm: trtllm-serve) is not encoded again while kept; the
    kept ones stay within KEPT_BYTES, the least recently used going first."""
    from types import SimpleNamespace

    from trtllm.runtime import media

    runs = []
    encoder = media.ImageEncoder("/nowhere", SimpleNamespace(vision={}, limits=SimpleNamespace(max_input_len=64)))
    monkeypatch.setattr(encoder, "fits", lambda source: True)
    monkeypatch.setattr(encoder, "encode", lambda source: runs.append(source) or np.zeros((4, 2), np.float32))
    monkeypatch.setattr(media, "KEPT_BYTES", 3 * 32)  # (three images' embeddings)
    encoder.warm(b"a")
    encoder.warm(b"a")
    encoder(b"a")
    assert runs == [b"a"]
    for name in (b"b", b"c", b"a", b"d"):  # (a used again: b, the least recent, goes for d)
        encoder(name)
    assert runs == [b"a", b"b", b"c", b"d"]
    assert list(encoder.kept) == [hashlib.sha256(x).hexdigest() for x in (b"c", b"a", b"d")]

    def failing(source):
        raise RuntimeError("the session failed")

    monkeypatch.setattr(encoder, "encode", failing)
    encoder.warm(b"e")  # (best effort: the loop's own call says why)


def test_a_warmed_image_outlasts_others_until_taken_and_encodings_run_one_at_a_time(monkeypatch):
    import threading
    import time
    from types import SimpleNamespace

    from trtllm.runtime import media

    runs, running, most = [], [0], [0]

    def encode(source):
        running[0] += 1
        most[0] = max(most[0], running[0])
        time.sleep(0.05)
        running[0] -= 1
        runs.append(source)
        return np.zeros((4, 2), np.float32)

    encoder = media.ImageEncoder("/nowhere", SimpleNamespace(vision={}, limits=SimpleNamespace(max_input_len=64)))
    monkeypatch.setattr(encoder, "fits", lambda source: True)
    monkeypatch.setattr(encoder, "encode", encode)
    monkeypatch.setattr(media, "KEPT_BYTES", 2 * 32)  # (two images' embeddings)
    encoder.warm(b"x")  # (a server's request thread, ahead of its prefill)
    encoder(b"p"), encoder(b"q")  # (others, later: over the bound, p goes, not the waiting x)
    encoder(b"x")
    assert runs == [b"x", b"p", b"q"]
    threads = [threading.Thread(target=encoder.warm, args=(b"y",)) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert most[0] == 1 and runs.count(b"y") == 1  # (one at a time; the others found it kept)


def test_a_window_after_the_embeddings_went_encodes_them_again():
    """(An EAGLE row restored up to an image token prefills from that token again: correct, if slower.)"""
    calls = []
    p = images(calls)
    p.window(0, 0, 20)
    assert p.embeds == [None, None]
    index, embeds = p.window(0, 9, 11)
    assert index.tolist() == [[0, 1]] and embeds[:, 0].tolist() == [4] and calls == [b"first", b"second", b"second"]


QWEN_PRE = {"patch_size": 14, "temporal_patch_size": 2, "merge_size": 2, "min_pixels": 56 * 56, "max_pixels": 28 * 28 * 64,
            "resample": 3, "rescale_factor": 1 / 255, "image_mean": [0.5] * 3, "image_std": [0.5] * 3}
QWEN = {"architecture": "qwen2_5_vl", "image_token_id": 9, "start_token_id": 7, "end_token_id": 8,
        "image_token": "<|image_pad|>", "window_size": 56, "mrope_section": [2, 3, 3], "preprocess": QWEN_PRE}


def qwen_placed(tmp_path, sizes: dict, ids: list[int]):
    """media.place on a Qwen section: images of `sizes` ({name: (width, height)}), prompt `ids`."""
    from types import SimpleNamespace

    from PIL import Image

    from trtllm.runtime import media
    from trtllm.runtime.messages import ContentItem

    for name, size in sizes.items():
        Image.new("RGB", size, (90, 30, 200)).save(tmp_path / name)
    req = SimpleNamespace(messages=[SimpleNamespace(content=tuple(ContentItem("image", f) for f in sizes))])
    return media.place(ids, req, 0, QWEN, None, tmp_path)


def test_qwen_images_fill_their_template_tokens_and_carry_their_three_positions(tmp_path):
    """Qwen's template writes start, image token, end: the image token becomes one token per 2 x 2
    patches (no start or end added), and the prompt's M-RoPE positions are runtime/images_qwen.py's,
    which each prefill chunk's rope_window gives back piece by piece."""
    from trtllm.runtime import images_qwen

    ids, placed = qwen_placed(tmp_path, {"a.png": (112, 56), "b.png": (56, 84)}, [1, 7, 9, 8, 2, 7, 9, 8, 3])
    # a: 56 x 112 px -> 4 x 8 patches, 8 tokens; b: 84 x 56 -> 6 x 4 patches, 6 tokens
    assert ids == [1, 7, *[9] * 8, 8, 2, 7, *[9] * 6, 8, 3]
    want, delta = images_qwen.rope_positions(len(ids), [(2, (1, 4, 8)), (13, (1, 6, 4))], 2)
    assert np.array_equal(placed.rope, want) and placed.rope_delta == delta < 0
    got = np.repeat(np.arange(len(ids))[None], 3, axis=0)
    for start in range(0, len(ids), 5):  # (chunks of 5: each window's tokens at their own positions)
        window = placed.rope_window(3, start, min(start + 5, len(ids)))
        if window is not None:
            index, values = window
            assert (index[:, 0] == 3).all()
            got[:, start + index[:, 1]] = values.T
    assert np.array_equal(got, want)
    assert placed.rope_window(0, 0, 2) is None  # (text before the first image: its slots)


def test_qwen_image_tokens_need_their_template_and_a_usable_shape(tmp_path):
    import pytest

    from trtllm.runtime.media import MediaError

    with pytest.raises(MediaError, match="without the image's start and end tokens"):
        qwen_placed(tmp_path, {"a.png": (56, 56)}, [1, 9, 2])
    with pytest.raises(MediaError, match=r"content\[0\]\.image`: image aspect ratio must be at most 200:1"):
        qwen_placed(tmp_path, {"thin.png": (1000, 4)}, [1, 7, 9, 8])


def test_decode_steps_shift_generating_rows_alone():
    """rope_delta: a generating row's shift; idle and parked rows (no token yet) none; a reused decode
    step's array follows the rows, and is dropped (fresh inputs) when no row has a shift."""
    from types import SimpleNamespace

    from trtllm.runtime.step_inputs import decode_inputs, rope_deltas

    shifted = SimpleNamespace(images=SimpleNamespace(rope_delta=-5), output_ids=[4], prompt_ids=[1] * 30, computed=30)
    parked = SimpleNamespace(images=SimpleNamespace(rope_delta=-7), output_ids=[], prompt_ids=[1] * 30, computed=16)
    text = SimpleNamespace(images=None, output_ids=[5], prompt_ids=[1] * 3, computed=3)
    assert rope_deltas([shifted, None, parked, text]).tolist() == [-5, 0, 0, 0]
    assert rope_deltas([text, None, parked]) is None
    first = decode_inputs([shifted, text], 0, None)
    assert first.rope_delta.tolist() == [-5, 0] and first.position_ids[:, 0].tolist() == [30, 3]
    again = decode_inputs([text, shifted], 0, None, first)
    assert again is first and first.rope_delta.tolist() == [0, -5]
    plain = decode_inputs([text, text], 0, None, first)
    assert plain is not first and plain.rope_delta is None
