"""trtllm.cpu::Attention with look_ahead (Gemma 3's images: an image's tokens see each other both ways
in the prompt): against the float64 reference of test_cpu_attention.py, with windows, head norms, 16-bit
caches and keys split in parts, on every code path; zeros are the plain op bit for bit, the causal
reference is told apart, and a bad look_ahead fails with a message."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

pytest.importorskip("onnx")

from tests.plugins.cpu_ops import on_portable_path, relative_error, session  # noqa: E402
from tests.plugins.test_cpu_attention import (  # noqa: E402
    BF16, F16, F32, NAMES, case, op_model, reference, run_op)


def ahead_case(shape, blocks, seed=0):
    """case()'s feeds with look_ahead [B, S]: in each row, each (first, last) of `blocks` (new tokens of
    the step, within the row's) an image whose tokens see up to its last; 0 elsewhere."""
    b, s, h, hk, d, c, past = shape
    feeds = case(b, s, h, hk, d, c, past, seed=seed)
    ahead = np.zeros((b, s), np.int64)
    for row in range(b):
        for first, last in blocks:
            last = min(last, int(feeds["last_index"][row]))
            ahead[row, first:last + 1] = last - np.arange(first, last + 1)
    feeds["look_ahead"] = ahead
    return feeds


def check_ahead(shape, blocks, kv=F32, window=0, norms=False, seed=0, wrong=False) -> float:
    """The op against the reference: the largest error relative to its bound (relative_error). wrong: the reference without look_ahead (causal),
    the raw largest difference of y."""
    b, s, h, hk, d, c, past = shape
    feeds = ahead_case(shape, blocks, seed=seed + d)
    if norms:
        rng = np.random.default_rng(seed)
        feeds.update(q_norm=(1 + 0.3 * rng.standard_normal(d)).astype(np.float32),
                     k_norm=(1 + 0.3 * rng.standard_normal(d)).astype(np.float32))
    for name in ("past_key", "past_value"):
        feeds[name] = feeds[name].astype({F32: np.float32, F16: np.float16, BF16: ml_dtypes.bfloat16}[kv])
    y, key, value = run_op(session(op_model(h, hk, d, kv=kv, window=window, norms=norms, ahead=True)), feeds, kv,
                           h * d)
    ref_y, ref_k, ref_v = reference(*(feeds[n] for n in NAMES), h, hk, d ** -0.5, window=window,
                                    cache=None if kv == F32 else (key, value),
                                    norms=(feeds["q_norm"], feeds["k_norm"]) if norms else None,
                                    ahead=None if wrong else feeds["look_ahead"])
    if wrong:
        return float(np.abs(y - ref_y).max())
    return relative_error((y, key, value), (ref_y, ref_k, ref_v), kv)


# (shape as in test_cpu_attention.CASES, image blocks): head size 64 and 24 (the portable loop), two
# images in a step, one that starts the step, one past a query block of 8, and one ending a row that
# padding shortens (rows 1 and 2 of case() end 1 and 2 tokens early: the block is cut there)
AHEAD_CASES = [((2, 12, 4, 2, 64, 48, [5, 20]), [(1, 4), (6, 9)]), ((2, 12, 4, 2, 24, 48, [5, 20]), [(0, 3)]),
               ((3, 20, 8, 2, 32, 64, [0, 30, 7]), [(3, 18)]), ((1, 9, 4, 1, 16, 40, [0]), [(0, 8)])]
# (shape, blocks, window, norms): a window within an image (its first token sees past the window's
# far end, never before it) and wider than it, with q/k norms on one
AHEAD_WINDOW_CASES = [((2, 12, 4, 1, 64, 48, [10, 25]), [(2, 9)], 3, False),
                      ((1, 10, 4, 2, 40, 30, [4]), [(1, 6)], 16, True)]
# (shape, blocks): past 512 slots (parts, merged), an image across the part boundary at slot 1024
AHEAD_LONG_CASES = [((2, 14, 4, 1, 64, 1100, [1015, 600]), [(2, 12)]), ((1, 14, 4, 2, 40, 1100, [1015]), [(0, 13)])]


@pytest.mark.parametrize("kv", [F32, F16, BF16])
@pytest.mark.parametrize("shape, blocks", AHEAD_CASES)
def test_look_ahead_matches_the_reference(shape, blocks, kv):
    assert check_ahead(shape, blocks, kv) <= 1


@pytest.mark.parametrize("shape, blocks, window, norms", AHEAD_WINDOW_CASES)
def test_look_ahead_with_a_window_and_head_norms(shape, blocks, window, norms):
    assert check_ahead(shape, blocks, window=window, norms=norms) <= 1


@pytest.mark.parametrize("kv", [F32, F16])
@pytest.mark.parametrize("shape, blocks", AHEAD_LONG_CASES)
def test_look_ahead_in_a_long_context(shape, blocks, kv):
    assert check_ahead(shape, blocks, kv) <= 1


@pytest.mark.parametrize("shape, blocks", AHEAD_CASES)
def test_look_ahead_is_applied(shape, blocks):
    """The deliberately wrong variant: the causal reference (no look-ahead) disagrees."""
    assert check_ahead(shape, blocks, wrong=True) > 1e-3


def zeros_are_no_look_ahead(shape, window=0) -> bool:
    """look_ahead all 0: outputs and caches bit for bit those of the same call without the input."""
    b, s, h, hk, d, c, past = shape
    feeds = case(b, s, h, hk, d, c, past, seed=d)
    plain = [np.asarray(a) for a in session(op_model(h, hk, d, window=window)).run(None, feeds)]
    feeds["look_ahead"] = np.zeros((b, s), np.int64)
    ahead = session(op_model(h, hk, d, window=window, ahead=True)).run(None, feeds)
    return all(np.array_equal(x, y) for x, y in zip(plain, ahead))


ZERO_CASES = [((2, 7, 4, 2, 64, 48, [5, 20]), 0), ((2, 7, 4, 2, 24, 48, [5, 20]), 3),
              ((2, 9, 4, 1, 64, 1100, [1019, 600]), 40)]


@pytest.mark.parametrize("shape, window", ZERO_CASES)
def test_zero_look_ahead_changes_nothing(shape, window):
    assert zeros_are_no_look_ahead(shape, window)


@pytest.mark.parametrize("kernel", ["generic", "avx2"])
def test_look_ahead_on_the_portable_and_avx2_paths_too(kernel):
    cases = [f"check_ahead(*{c!r}, kv={kv})" for c in AHEAD_CASES for kv in (F32, F16, BF16)]
    cases += [f"check_ahead({c[0]!r}, {c[1]!r}, window={c[2]}, norms={c[3]})" for c in AHEAD_WINDOW_CASES]
    cases += [f"check_ahead(*{c!r})" for c in AHEAD_LONG_CASES]
    errors = on_portable_path("test_cpu_attention_ahead", "[" + ", ".join(cases) + "]", kernel=kernel)
    assert np.max(errors) <= 1
    assert on_portable_path("test_cpu_attention_ahead", "[zeros_are_no_look_ahead(*c) for c in ZERO_CASES]",
                            kernel=kernel) == [True] * 3


@pytest.mark.parametrize("ahead, tree, message", [
    (np.zeros((1, 3), np.int64), False, r"look_ahead must be \[batch, seq\]"),
    (np.array([[0, -1, 0, 0]]), False, r"look_ahead\[0, 1\] = -1"),
    (np.array([[0, 0, 3, 0]]), False, r"look_ahead\[0, 2\] = 3"),        # past the row's new tokens
    (np.array([[3, 1, 0, 0]]), False, r"look_ahead\[0, 1\] = 1"),        # its end before the token before's
    (np.array([[1, 0, 0, 0]]), True, r"look_ahead\[0, 0\] = 1: .* none in a tree step"),
])
def test_a_bad_look_ahead_fails_with_a_message(ahead, tree, message):
    feeds = case(1, 4, 2, 1, 16, 12, [1])
    feeds["look_ahead"] = ahead.astype(np.int64)
    if tree:
        feeds["tree_mask"] = np.ones((1, 4, 2), bool)
    model = op_model(2, 1, 16, tree=tree, ahead=True)
    with pytest.raises(Exception, match=message):
        session(model).run(None, feeds)
