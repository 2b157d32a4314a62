"""trtllm.cpu::Attention with an int8 KV cache (--kv-cache-dtype int8): each key and value row written
as documented (round(x / s), s = max|x| / 127, the scale's 4 bytes after the row's values), the old
rows untouched, and attention over what the cache holds, against test_cpu_attention.py's float64
reference, on both code paths."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnx")

from tests.plugins.cpu_ops import on_portable_path, session  # noqa: E402
from tests.plugins.test_cpu_attention import CASES, I8, LONG_CASES, case, op_model, reference  # noqa: E402


def int8_rows(cache: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """An int8 cache [..., D + 4] as (its values [..., D] int8, each row's float32 scale [...])."""
    return cache[..., :-4], np.ascontiguousarray(cache[..., -4:]).view(np.float32)[..., 0]


def dequantized(cache: np.ndarray) -> np.ndarray:
    values, scale = int8_rows(cache)
    return values.astype(np.float64) * scale[..., None]


def quantize_rows(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The documented int8 rows: s = max|x| / 127, round(x / s) (half to even), per row."""
    top = np.abs(x).max(-1).astype(np.float32)
    s = top / np.float32(127)
    inv = np.where(top > 0, np.float32(127) / np.maximum(top, np.float32(1e-30)), np.float32(0))
    return np.clip(np.rint(x.astype(np.float32) * inv[..., None]), -127, 127).astype(np.int8), s


def steps_off(got: np.ndarray, want_q: np.ndarray, x: np.ndarray) -> float:
    """How far the stored int8 values are from round(x / s), relative to what is allowed: one step
    where x / s lies within 1e-3 of a tie (the kernel's float32 projection may land either side of
    it), none elsewhere (a one-step tolerance everywhere let truncation pass)."""
    top = np.abs(x).max(-1, keepdims=True).astype(np.float32)
    ratio = np.abs(x.astype(np.float32) * (np.float32(127) / np.maximum(top, np.float32(1e-30))))
    tie = np.abs(ratio - np.floor(ratio) - 0.5) < 1e-3
    off = np.abs(got.astype(int) - want_q.astype(int))
    return float(np.where(tie, off, 2 * off).max())


def int8_case(b, s, h, hk, d, c, past, seed=0) -> dict:
    """case()'s feeds with the past cache quantized to int8 rows (D values, then their scale's 4 bytes)."""
    feeds = case(b, s, h, hk, d, c, past, seed=seed)
    for name in ("past_key", "past_value"):
        q, scale = quantize_rows(feeds[name])
        feeds[name] = np.concatenate([q, scale[..., None].view(np.int8).reshape(*scale.shape, 4)], -1)
    return feeds


def check_int8_cache(b, s, h, hk, d, c, past, softcap: float = 0.0) -> float:
    """An int8 cache: each new key and value row is the reference's (float32-rounded) row quantized as
    documented (one step of 127 where float32 lands a value by a tie; its scale within 1e-6), the old
    rows are untouched, and the attention is over what the cache holds (1e-5). Returns the largest
    error relative to its bound (pass: <= 1)."""
    feeds = int8_case(b, s, h, hk, d, c, past, seed=b + s + d)
    before = {n: feeds[n].copy() for n in ("past_key", "past_value")}
    y, key, value = session(op_model(h, hk, d, kv=I8, softcap=softcap)).run(None, feeds)
    assert key.dtype == value.dtype == np.int8 and key.shape[-1] == d + 4
    cache = tuple(dequantized(x) for x in (key, value))
    floats = {**feeds, "past_key": dequantized(feeds["past_key"]), "past_value": dequantized(feeds["past_value"])}
    ref_y, ref_k, ref_v = reference(*floats.values(), h, hk, d ** -0.5, cache=cache, softcap=softcap)
    worst = 0.0
    for got, want, old in ((key, ref_k, before["past_key"]), (value, ref_v, before["past_value"])):
        q, scale = int8_rows(got)
        for bi in range(b):
            new = slice(feeds["write_index"][bi], feeds["write_index"][bi] + feeds["last_index"][bi] + 1)
            want_q, want_s = quantize_rows(want[bi, :, new])
            worst = max(worst, steps_off(q[bi, :, new], want_q, want[bi, :, new]),
                        float((np.abs(scale[bi, :, new] - want_s) / np.maximum(want_s, 1e-30)).max()) / 1e-6)
            kept = np.ones(c, bool)
            kept[new] = False
            assert np.array_equal(got[bi, :, kept], old[bi, :, kept])
    return float(np.max([worst, np.abs(y - ref_y).max() / 1e-5]))


@pytest.mark.parametrize("shape", CASES + [c[0] for c in LONG_CASES[:2]] + [(2, 20, 4, 1, 256, 64, [3, 30])])
def test_an_int8_cache_matches_the_reference(shape):
    assert check_int8_cache(*shape) <= 1


def test_an_int8_cache_with_soft_capped_scores():
    assert check_int8_cache(2, 11, 4, 1, 16, 64, [0, 9], softcap=2.0) <= 1


@pytest.mark.parametrize("kernel", ["generic", "avx2"])
def test_an_int8_cache_on_the_portable_and_avx2_paths_too(kernel):
    errors = on_portable_path("test_cpu_attention_int8",
                              "[check_int8_cache(*c) for c in CASES + [c[0] for c in LONG_CASES[:2]]]",
                              kernel=kernel)
    assert np.max(errors) <= 1


def test_an_int8_cache_without_its_scales_fails():
    """The deliberately wrong variant: attention over the int8 values alone (every scale read as 1)
    must miss the reference over what the cache holds."""
    b, s, h, hk, d, c, past = CASES[0]
    feeds = int8_case(b, s, h, hk, d, c, past, seed=b + s + d)
    y, key, value = session(op_model(h, hk, d, kv=I8)).run(None, feeds)
    unscaled = tuple(int8_rows(x)[0].astype(np.float64) for x in (key, value))
    floats = {**feeds, "past_key": dequantized(feeds["past_key"]), "past_value": dequantized(feeds["past_value"])}
    assert np.abs(y - reference(*floats.values(), h, hk, d ** -0.5, cache=unscaled)[0]).max() > 1e-2


def test_a_nan_or_infinite_value_in_an_int8_row_is_not_hidden():
    """A float cache passes a NaN or inf on to what reads it; an int8 row must too (its scale NaN or
    inf), not store it as the row's largest value and answer finite numbers (the build's check and
    check_finite rely on it)."""
    for bad in (np.nan, -np.inf):
        b, s, h, hk, d, c, past = CASES[0]
        feeds = int8_case(b, s, h, hk, d, c, past, seed=3)
        feeds["qkv"][0, 0, (h + hk) * d + 5] = bad  # a new value row's sixth value
        y, _, value = session(op_model(h, hk, d, kv=I8)).run(None, feeds)
        assert not np.isfinite(int8_rows(value)[1][0, 0, past[0]]) and not np.isfinite(y).all()
