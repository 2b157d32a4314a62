"""trtllm.cpu::Attention (plugins/cpu/attention.cc): rotary + in-place KV write + grouped-query
attention (with a sliding window, q/k head norms, and an EAGLE tree mask), against a float64 numpy
reference of the same semantics, on both code paths."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import onnxruntime as ort
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402

from trtllm.plugins import cpu  # noqa: E402

from tests.plugins.cpu_ops import on_portable_path, one_node_model, relative_error, session  # noqa: E402

F32, F16, BF16, I64 = TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.INT64
I8 = TensorProto.INT8
BOOL = TensorProto.BOOL
NAMES = ["qkv", "past_key", "past_value", "write_index", "last_index", "position_ids", "cos", "sin"]


def op_model(h: int, hk: int, d: int, scale: float | None = None, kv: int = F32, window: int = 0,
             norms: bool = False, epsilon: float | None = None, tree: bool = False, softcap: float = 0.0,
             norm_after: bool = False, ahead: bool = False) -> bytes:
    """tree: input 10 tree_mask; ahead: input 11 look_ahead (those before left empty where not given,
    as the builder wires them)."""
    names = NAMES + (["q_norm", "k_norm"] if norms else ["", ""] if tree or ahead else [])
    names += ["tree_mask"] if tree else [""] if ahead else []
    names += ["look_ahead"] if ahead else []
    types = [F32, kv, kv, I64, I64, I64, F32, F32, F32, F32, BOOL, I64]
    inputs = [helper.make_tensor_value_info(n, t, None) for n, t in zip(names, types) if n]
    outputs = [helper.make_tensor_value_info(n, t, None) for n, t in (("y", F32), ("present_key", kv), ("present_value", kv))]
    attrs = {"num_heads": h, "kv_num_heads": hk, **({"scale": scale} if scale else {}),
             **({"window": window} if window else {}), **({"epsilon": epsilon} if epsilon else {}),
             **({"softcap": softcap} if softcap else {}), **({"norm_after_rotary": 1} if norm_after else {})}
    node = helper.make_node("Attention", names, [o.name for o in outputs], domain=cpu.DOMAIN, **attrs)
    return one_node_model(node, inputs, outputs)


def rope(x, cos, sin):
    """rotate_half on the first 2 * len(cos) dimensions (all of them, or a partial rotary's), the rest kept."""
    half = cos.shape[-1]
    r = 2 * half
    return np.concatenate([x[..., :half] * cos - x[..., half:r] * sin, x[..., half:r] * cos + x[..., :half] * sin,
                           x[..., r:]], -1)


def head_norm(x, w, epsilon):
    return x / np.sqrt((x * x).mean() + epsilon) * w


def qk(x, norm, cos, sin, epsilon, after):
    """A q or k head with its rotary and its norm (None: none), the norm first or (`after`) last."""
    if norm is None:
        return rope(x, cos, sin)
    return head_norm(rope(x, cos, sin), norm, epsilon) if after else rope(head_norm(x, norm, epsilon), cos, sin)


def reference(qkv, key, value, write_index, last_index, position_ids, cos, sin, h, hk, scale, cache=None, window=0,
              norms=None, epsilon=1e-6, tree=None, window_from_slot=False, softcap=0.0, norm_after=False,
              ahead=None):
    """float64: the op's documented semantics, token by token. `cache` (key, value): attend over
    these instead of the reference's own writes (a float16 cache's contents, checked apart);
    `window`: slots [t - window, t) only; `norms` (q_norm, k_norm): each head normed before rotary;
    `tree` [B, S, T] (tree_mask): slot j >= start = write_index + S - T is seen iff tree[b, s, j - start],
    and a window counts from the position, [p + 1 - window, t) (`window_from_slot`: the wrong variant);
    `softcap` c: each scaled score x becomes c tanh(x / c) (Gemma 2); `norm_after`: the norms after
    the rotary (Hunyuan); `ahead` [B, S] (look_ahead): token s also sees the ahead[b, s] slots after
    its own, its window still counted back from its own slot."""
    b_, s_, _ = qkv.shape
    d = key.shape[-1]
    qn, kn = (None, None) if norms is None else (n.astype(np.float64) for n in norms)
    key, value = key.astype(np.float64).copy(), value.astype(np.float64).copy()
    y = np.zeros((b_, s_, h * d))
    for b in range(b_):
        for s in range(last_index[b] + 1):
            p, slot = position_ids[b, s], write_index[b] + s
            row = qkv[b, s].astype(np.float64)
            for g in range(hk):
                k = row[(h + g) * d:(h + g + 1) * d]
                key[b, g, slot] = qk(k, kn, cos[p], sin[p], epsilon, norm_after)
                value[b, g, slot] = row[(h + hk + g) * d:(h + hk + g + 1) * d]
    written = key, value
    if cache is not None:
        key, value = (c.astype(np.float64) for c in cache)
    for b in range(b_):
        start = write_index[b] + s_ - (0 if tree is None else tree.shape[2])
        for s in range(last_index[b] + 1):
            p, own = position_ids[b, s], write_index[b] + s + 1
            t = own + (0 if ahead is None else ahead[b, s])
            end = p + 1 if tree is not None and not window_from_slot else own
            lo = max(0, end - window) if window else 0
            seen = np.array([tree is None or j < start or tree[b, s, j - start] for j in range(lo, t)])
            for head in range(h):
                g = head // (h // hk)
                q = qk(qkv[b, s, head * d:(head + 1) * d].astype(np.float64), qn, cos[p], sin[p], epsilon, norm_after)
                scores = key[b, g, lo:t] @ q * scale
                if softcap:
                    scores = softcap * np.tanh(scores / softcap)
                scores = np.where(seen, scores, -np.inf)
                w = np.exp(scores - scores.max())
                y[b, s, head * d:(head + 1) * d] = (w / w.sum()) @ value[b, g, lo:t]
    return (y, *written)


def case(b, s, h, hk, d, c, past, seed=0):
    rng = np.random.default_rng(seed)
    write_index = np.array([past[i % len(past)] for i in range(b)], np.int64)
    last_index = np.array([max(0, s - 1 - (i % 3)) for i in range(b)], np.int64)  # some rows padded
    position_ids = write_index[:, None] + np.arange(s)[None, :]
    inv = 1.0 / (10000 ** (np.arange(0, d, 2) / d))
    angles = np.arange(c + s)[:, None] * inv[None, :]
    feeds = {"qkv": rng.standard_normal((b, s, (h + 2 * hk) * d)).astype(np.float32),
             "past_key": rng.standard_normal((b, hk, c, d)).astype(np.float32),
             "past_value": rng.standard_normal((b, hk, c, d)).astype(np.float32),
             "write_index": write_index, "last_index": last_index, "position_ids": position_ids.astype(np.int64),
             "cos": np.cos(angles).astype(np.float32), "sin": np.sin(angles).astype(np.float32)}
    return feeds


# (batch, new tokens, heads, kv heads, head size, capacity, past lengths): decode, prefill after a
# prefix, odd head sizes (the portable path), multi-query, a query block tail, a batch-8 decode, a
# prefill of several blocks; most let a task take all the heads of a kv head, the last two not (one
# task in all; 16 heads per kv head, more rows than a task holds)
CASES = [(1, 1, 9, 3, 64, 40, [17]), (3, 1, 4, 2, 32, 50, [0, 5, 44]), (2, 11, 4, 1, 16, 64, [0, 9]),
         (2, 5, 6, 3, 24, 30, [3, 20]), (1, 20, 2, 2, 128, 48, [7]), (4, 3, 2, 1, 8, 16, [1, 2, 3, 12]),
         (8, 1, 9, 3, 64, 40, [17, 0, 39, 5]), (2, 37, 8, 2, 32, 64, [0, 20]), (1, 1, 4, 1, 32, 40, [9]),
         (1, 3, 16, 1, 16, 32, [4])]


def check(b, s, h, hk, d, c, past) -> float:
    feeds = case(b, s, h, hk, d, c, past, seed=b + s + d)
    scale = d ** -0.5
    y, key, value = session(op_model(h, hk, d)).run(None, feeds)
    ref_y, ref_k, ref_v = reference(*feeds.values(), h, hk, scale)
    for row in range(b):  # padding tokens are zero
        assert not y[row, feeds["last_index"][row] + 1:].any()
    err = max(np.abs(y - ref_y).max(), np.abs(key - ref_k).max(), np.abs(value - ref_v).max())
    return float(err)


def check_half_cache(b, s, h, hk, d, c, past) -> float:
    """A float16 cache: each new key and value is the float64 reference's rounded to the nearest
    float16 (half a float16 step; a hair more where the op's float32 rotary lands by a tie), the old
    slots are untouched, and the attention is over what the cache holds (1e-5). Returns the largest
    error relative to its bound (pass: <= 1; truncating instead of rounding gives up to 2)."""
    feeds = case(b, s, h, hk, d, c, past, seed=b + s + d)
    for name in ("past_key", "past_value"):
        feeds[name] = feeds[name].astype(np.float16)
    y, key, value = session(op_model(h, hk, d, kv=F16)).run(None, feeds)
    assert key.dtype == value.dtype == np.float16
    return relative_error((y, key, value), reference(*feeds.values(), h, hk, d ** -0.5, cache=(key, value)), F16)


def check_bf16_cache(b, s, h, hk, d, c, past) -> float:
    """A bfloat16 cache (a bfloat16 engine's), bound in place as the runtime binds it (numpy has no
    bfloat16: the buffers are its bits, typed by the OrtValue): each new key and value is the float64
    reference's rounded to the nearest bfloat16 (half a step), the old slots are untouched, and the
    attention is over what the cache holds (1e-5). Returns the largest error relative to its bound
    (pass: <= 1; truncating instead of rounding gives up to 2)."""
    feeds = case(b, s, h, hk, d, c, past, seed=b + s + d)
    feeds.update((name, feeds[name].astype(ml_dtypes.bfloat16)) for name in ("past_key", "past_value"))
    y, key, value = run_op(session(op_model(h, hk, d, kv=BF16)), feeds, BF16, h * d)  # (feeds' caches untouched)
    return relative_error((y, key, value), reference(*feeds.values(), h, hk, d ** -0.5, cache=(key, value)), BF16)


@pytest.mark.parametrize("shape", CASES)
def test_matches_the_reference(shape):
    assert check(*shape) < 1e-5


# (shape as in CASES, window, q/k norms): decode past the window, a prefill chunk whose window
# starts inside a block of 16 slots, several query blocks, a window of one slot, head size 256
# (Gemma 3) with and without a window, and head size 40 (the portable path)
WINDOW_CASES = [((1, 1, 9, 3, 64, 40, [17]), 8, True), ((2, 11, 4, 1, 16, 64, [0, 9]), 5, False),
                ((2, 37, 8, 2, 32, 64, [0, 20]), 16, True), ((3, 1, 4, 2, 32, 50, [0, 5, 44]), 1, False),
                ((1, 3, 4, 1, 256, 40, [9]), 0, True), ((2, 20, 4, 1, 256, 64, [3, 30]), 7, True),
                ((1, 5, 4, 2, 40, 30, [3]), 3, True)]


# Keys past 512 slots are split into parts of 512 (merged after): decode rows of a long context, a
# prefill chunk across a part boundary, a window across one, head size 256 (Gemma 3's one kv head)
LONG_CASES = [((1, 1, 4, 1, 64, 1600, [1400]), 0, False), ((2, 1, 9, 3, 64, 1200, [1100, 300]), 0, True),
              ((1, 20, 4, 2, 32, 1100, [500]), 0, False), ((2, 9, 4, 1, 16, 1100, [505, 1030]), 40, True),
              ((1, 1, 4, 1, 256, 1300, [1200]), 0, True), ((1, 3, 4, 2, 40, 1100, [1024]), 600, False)]


def check_window(shape, window, norms, reference_window=None, epsilon=1e-6, norm_after=False,
                 reference_after=None) -> float:
    b, s, h, hk, d, c, past = shape
    feeds = case(b, s, h, hk, d, c, past, seed=b + s + d + window)
    rng = np.random.default_rng(window)
    weights = tuple((1 + 0.3 * rng.standard_normal(d)).astype(np.float32) for _ in range(2)) if norms else None
    if norms:
        feeds.update(q_norm=weights[0], k_norm=weights[1])
    y, key, value = session(op_model(h, hk, d, window=window, norms=norms, epsilon=epsilon,
                                     norm_after=norm_after)).run(None, feeds)
    ref_y, ref_k, ref_v = reference(*list(feeds.values())[:8], h, hk, d ** -0.5, norms=weights, epsilon=epsilon,
                                    window=window if reference_window is None else reference_window,
                                    norm_after=norm_after if reference_after is None else reference_after)
    return float(max(np.abs(y - ref_y).max(), np.abs(key - ref_k).max(), np.abs(value - ref_v).max()))


@pytest.mark.parametrize("shape, window, norms", WINDOW_CASES)
def test_a_window_and_head_norms_match_the_reference(shape, window, norms):
    assert check_window(shape, window, norms) < 1e-5


@pytest.mark.parametrize("shape, rotary", [((2, 11, 4, 2, 32, 40, [0, 9]), 16), ((1, 3, 4, 1, 96, 30, [5]), 72),
                                           ((1, 2, 2, 1, 16, 8, [1]), 2)])
def test_a_partial_rotary_matches_the_reference(shape, rotary):
    """cos/sin of R / 2 columns (R < D, Phi-4-mini's partial_rotary_factor): the first R dimensions
    of each q and k head are rotated, the rest kept. The wrong variant: rotating them all."""
    b, s, h, hk, d, c, past = shape
    feeds = case(b, s, h, hk, d, c, past, seed=rotary)
    feeds.update(cos=feeds["cos"][:, :rotary // 2].copy(), sin=feeds["sin"][:, :rotary // 2].copy())
    got = session(op_model(h, hk, d)).run(None, feeds)
    want = reference(*feeds.values(), h, hk, d ** -0.5)
    assert max(np.abs(g - w).max() for g, w in zip(got, want)) < 1e-5
    full = case(b, s, h, hk, d, c, past, seed=rotary)
    assert np.abs(got[0] - reference(*full.values(), h, hk, d ** -0.5)[0]).max() > 1e-3


@pytest.mark.parametrize("shape, window, norms", LONG_CASES)
def test_keys_split_in_parts_match_the_reference(shape, window, norms):
    assert check_window(shape, window, norms) < 1e-5


@pytest.mark.parametrize("shape", [c[0] for c in LONG_CASES[:3]])
def test_keys_split_in_parts_with_a_float16_cache(shape):
    assert check_half_cache(*shape) <= 1


def test_a_row_is_the_same_alone_and_beside_a_longer_one():
    """Rows of one part and rows of several, alone and together: bit for bit the same (the parts
    are fixed slot ranges, and a one-part row is never merged otherwise than unsplit)."""
    h, hk, d, c = 4, 1, 64, 1400
    both = case(2, 1, h, hk, d, c, [100, 1300], seed=5)
    y_both = session(op_model(h, hk, d)).run(None, both)[0]
    for row in range(2):
        alone = {k: v[row:row + 1] if k not in ("cos", "sin") else v for k, v in both.items()}
        assert np.array_equal(session(op_model(h, hk, d)).run(None, alone)[0][0], y_both[row])


@pytest.mark.parametrize("shape, window, norms", [c for c in WINDOW_CASES + LONG_CASES if c[2]])
def test_norms_after_the_rotary_match_the_reference(shape, window, norms):
    """Hunyuan's q and k norms, after the rotary; the wrong variant, the reference's before it, must miss."""
    assert check_window(shape, window, norms, norm_after=True) < 1e-5
    assert check_window(shape, window, norms, norm_after=True, reference_after=False) > 1e-3


@pytest.mark.parametrize("kernel", ["generic", "avx2"])
def test_norms_after_the_rotary_on_the_portable_and_avx2_paths_too(kernel):
    errors = on_portable_path("test_cpu_attention", "[check_window(*c, norm_after=True) for c in WINDOW_CASES if c[2]]",
                              kernel=kernel)
    assert np.max(errors) < 1e-5


@pytest.mark.parametrize("kernel", ["generic", "avx2"])
def test_window_and_norms_on_the_portable_and_avx2_paths_too(kernel):
    errors = on_portable_path("test_cpu_attention", "[check_window(*c) for c in WINDOW_CASES + LONG_CASES]",
                              kernel=kernel)
    assert np.max(errors) < 1e-5  # builtin max() skips a NaN after the first item


NONFINITE = ["nan key", "inf key", "nan q", "nan key, softcap", "float16 key overflows"]


def nonfinite_output(what: str) -> bool:
    """Whether a NaN or inf in a key the query reads (or in its q) makes the query's output NaN, as
    it does in the float64 reference and in ONNX Runtime's standard ops (the sampler then fails the
    row: a finite answer would hide the overflow). The vector exp once clamped NaN to e^88, which
    gave that key the whole weight."""
    h, hk, d, softcap = 4, 2, 64, 50.0 if "softcap" in what else 0.0
    kv = F16 if "float16" in what else F32
    feeds = case(1, 1, h, hk, d, 40, [17], seed=5)
    feeds["last_index"] = np.array([0], np.int64)
    if "key" in what and kv == F32:
        feeds["past_key"][0, :, 5, 3] = np.inf if "inf" in what else np.nan
    if kv == F16:  # a finite float32 key the float16 cache stores as inf
        feeds["past_key"] = feeds["past_key"].astype(np.float16)
        feeds["past_value"] = feeds["past_value"].astype(np.float16)
        feeds["qkv"][0, 0, h * d + 3] = 1e5  # the new token's key, kv head 0
    if "q" in what:
        feeds["qkv"][0, 0, 3] = np.nan  # head 0
    y = session(op_model(h, hk, d, kv=kv, softcap=softcap)).run(None, feeds)[0]
    return bool(np.isnan(y[0, 0, :d]).all())


@pytest.mark.parametrize("what", NONFINITE)
def test_a_nan_or_inf_key_or_q_makes_the_output_nan(what):
    assert nonfinite_output(what)


@pytest.mark.parametrize("kernel", ["generic", "avx2"])
def test_a_nan_or_inf_key_or_q_makes_the_output_nan_on_the_portable_and_avx2_paths_too(kernel):
    assert on_portable_path("test_cpu_attention", "[nonfinite_output(w) for w in NONFINITE]",
                            kernel=kernel) == [True] * len(NONFINITE)


# (shape as in CASES, window, softcap c): Gemma 2's soft-capped scores (c = 50 in its configs; small
# ones here, so that most scores are bent), on decode rows, prefill chunks, a window, head size 256,
# keys split in parts, and head size 40 (the portable path)
SOFTCAP_CASES = [((1, 1, 9, 3, 64, 40, [17]), 0, 0.7), ((2, 11, 4, 1, 16, 64, [0, 9]), 5, 2.0),
                 ((2, 37, 8, 2, 32, 64, [0, 20]), 16, 3.0), ((2, 20, 4, 1, 256, 64, [3, 30]), 7, 50.0),
                 ((2, 1, 9, 3, 64, 1200, [1100, 300]), 0, 1.5), ((1, 5, 4, 2, 40, 30, [3]), 3, 0.9)]


def check_softcap(shape, window, softcap, reference_softcap=None) -> float:
    """The largest error against the reference; q is scaled up 4x so that scores reach c and past it."""
    b, s, h, hk, d, c, past = shape
    feeds = case(b, s, h, hk, d, c, past, seed=b + s + d + window)
    feeds["qkv"][..., :h * d] *= 4.0
    y, key, value = session(op_model(h, hk, d, window=window, softcap=softcap)).run(None, feeds)
    ref_y, ref_k, ref_v = reference(*feeds.values(), h, hk, d ** -0.5, window=window,
                                    softcap=softcap if reference_softcap is None else reference_softcap)
    return float(max(np.abs(y - ref_y).max(), np.abs(key - ref_k).max(), np.abs(value - ref_v).max()))


@pytest.mark.parametrize("shape, window, softcap", SOFTCAP_CASES)
def test_soft_capped_scores_match_the_reference(shape, window, softcap):
    assert check_softcap(shape, window, softcap) < 1e-5


@pytest.mark.parametrize("kernel", ["generic", "avx2"])
def test_soft_capped_scores_on_the_portable_and_avx2_paths_too(kernel):
    errors = on_portable_path("test_cpu_attention", "[check_softcap(*c) for c in SOFTCAP_CASES]", kernel=kernel)
    assert np.max(errors) < 1e-5


def test_the_wrong_softcap_fails():
    """The deliberately wrong variants: scores not capped, and capped at another c."""
    assert check_softcap(*SOFTCAP_CASES[0][:2], 0.7, reference_softcap=0.0) > 1e-2
    assert check_softcap(*SOFTCAP_CASES[3][:2], 50.0, reference_softcap=45.0) > 1e-4


def test_the_wrong_window_or_epsilon_fails():
    """The deliberately wrong variants: a window one slot wider, and the norms' epsilon ignored."""
    assert check_window(*WINDOW_CASES[2], reference_window=17) > 1e-3
    assert check_window((1, 4, 2, 1, 16, 20, [3]), 0, True, epsilon=0.5) < 1e-5
    feeds = case(1, 4, 2, 1, 16, 20, [3])
    feeds.update(q_norm=np.ones(16, np.float32), k_norm=np.ones(16, np.float32))
    y = session(op_model(2, 1, 16, norms=True, epsilon=0.5)).run(None, feeds)[0]
    ref_y = reference(*list(feeds.values())[:8], 2, 1, 16 ** -0.5, norms=(feeds["q_norm"], feeds["k_norm"]))[0]
    assert np.abs(y - ref_y).max() > 1e-3


@pytest.mark.parametrize("shape", CASES)
def test_a_float16_cache_matches_the_reference(shape):
    assert check_half_cache(*shape) <= 1


@pytest.mark.parametrize("shape", CASES + [c[0] for c in LONG_CASES[:2]])
def test_a_bfloat16_cache_matches_the_reference(shape):
    assert check_bf16_cache(*shape) <= 1


SPECIAL = np.array([1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8), 3.4e38, -3.4e38, np.inf, -np.inf, np.nan, -0.0, 1e-40,
                    2**-133 * 3, 65504.0, 1.00390625, 0.1, -7.123456], np.float32)  # 15 values


@pytest.mark.parametrize("kernel", ["generic", "avx2"])
def test_a_bfloat16_cache_rounds_as_ml_dtypes_bit_for_bit(kernel):
    """Values (written without rotary) at ties (1 + 2^-8 rounds to even, 1 + 3 * 2^-8 up), past the
    largest bfloat16 (to inf), inf, NaN, -0 and subnormals: the cache holds ml_dtypes' bfloat16 bits,
    on both code paths. A kernel that truncated would keep 1 + 3 * 2^-8 one step low."""
    assert on_portable_path("test_cpu_attention", "bf16_written_values()", kernel=kernel) == bf16_written_values()
    got, want = (np.array(v, np.uint16) for v in bf16_written_values())
    nan = np.isnan(SPECIAL)
    assert np.array_equal(got[~nan], want[~nan])
    assert np.isnan(got[nan].view(ml_dtypes.bfloat16).astype(np.float32)).all()


def bf16_written_values() -> list[list[int]]:
    """[the bits the kernel wrote for SPECIAL as one value head, ml_dtypes' rounding of SPECIAL]."""
    d = len(SPECIAL) + 1  # 16: one head of values
    feeds = case(1, 1, 1, 1, d, 4, [0])
    feeds["qkv"][0, 0, 2 * d:3 * d - 1] = SPECIAL
    past = np.zeros((1, 1, 4, d), np.uint16)
    values = {n: ort.OrtValue.ortvalue_from_numpy_with_onnx_type(past if n == "past_value" else past.copy(), BF16)
              for n in ("past_key", "past_value")}
    sess = session(op_model(1, 1, d, kv=BF16))
    binding = sess.io_binding()
    for name, array in feeds.items():
        binding.bind_ortvalue_input(name, values[name] if name in values else ort.OrtValue.ortvalue_from_numpy(array))
    for name, value in values.items():
        binding.bind_ortvalue_output(name.replace("past", "present"), value)
    binding.bind_ortvalue_output("y", ort.OrtValue.ortvalue_from_numpy(np.zeros((1, 1, d), np.float32)))
    sess.run_with_iobinding(binding)
    return [past[0, 0, 0, :-1].tolist(), SPECIAL.astype(ml_dtypes.bfloat16).view(np.uint16).tolist()]


@pytest.mark.parametrize("kernel", ["generic", "avx2"])
def test_portable_and_avx2_paths_match_too(kernel):
    errors = np.array(on_portable_path("test_cpu_attention",
                                       "[[check(*c), check_half_cache(*c), check_bf16_cache(*c)] for c in CASES]",
                                       kernel=kernel))
    assert errors[:, 0].max() < 1e-5 and errors[:, 1].max() <= 1 and errors[:, 2].max() <= 1


def test_writes_in_place_when_bound_so():
    """The runtime binds present_* to the past_* buffers: the op writes the new slots there."""
    feeds = case(2, 3, 4, 2, 16, 12, [2, 5])
    sess = session(op_model(4, 2, 16))
    binding = sess.io_binding()
    values = {}
    for name, array in feeds.items():
        values[name] = ort.OrtValue.ortvalue_from_numpy(array)
        binding.bind_ortvalue_input(name, values[name])
    binding.bind_ortvalue_output("present_key", values["past_key"])
    binding.bind_ortvalue_output("present_value", values["past_value"])
    binding.bind_output("y")
    before = feeds["past_key"].copy()
    sess.run_with_iobinding(binding)
    _, ref_k, _ = reference(*case(2, 3, 4, 2, 16, 12, [2, 5]).values(), 4, 2, 16 ** -0.5)
    assert not np.array_equal(before, feeds["past_key"])
    np.testing.assert_allclose(feeds["past_key"], ref_k, atol=1e-5)


def test_the_wrong_rotary_fails():
    """The deliberately wrong variant: a reference whose cos table pairs the dimensions as an
    interleaved rotary would ([c0, c0, c2, c2, ...]) must disagree with the kernel."""
    feeds = case(1, 4, 2, 1, 16, 8, [1])
    y = session(op_model(2, 1, 16)).run(None, feeds)[0]
    wrong = dict(feeds)
    wrong["cos"] = np.repeat(feeds["cos"][:, ::2], 2, axis=1)
    ref_y, _, _ = reference(*wrong.values(), 2, 1, 16 ** -0.5)
    assert np.abs(y - ref_y).max() > 1e-2


@pytest.mark.parametrize("change, message", [
    ({"write_index": np.array([10], np.int64)}, "row 0 writes 4 slots from slot 10 of a KV cache of 12"),
    ({"last_index": np.array([4], np.int64)}, r"last_index\[0\] is outside the chunk"),
    # write_index + last_index would overflow int64 and pass a bounds check written as a sum
    # (and the message must not compute that sum either)
    ({"write_index": np.array([np.iinfo(np.int64).max], np.int64), "last_index": np.array([1], np.int64)},
     "row 0 writes 2 slots from slot 9223372036854775807 of a KV cache of 12"),
    # per-row inputs of the wrong shape would be read past their end
    ({"write_index": np.array([1, 1], np.int64)}, r"write_index and last_index must be \[batch\]"),
    ({"position_ids": np.zeros((1, 1), np.int64)}, r"position_ids must be \[batch, seq\]"),
    (lambda f: {"sin": f["sin"][:1].copy()}, "sin must have cos's shape"),
    ({"q_norm": np.ones(8, np.float32), "k_norm": np.ones(16, np.float32)}, r"q_norm and k_norm must be \[head_size\]"),
])
def test_bad_inputs_fail_with_a_message(change, message):
    feeds = case(1, 4, 2, 1, 16, 12, [1])
    feeds.update(change(feeds) if callable(change) else change)
    with pytest.raises(Exception, match=message):
        session(op_model(2, 1, 16, norms="q_norm" in feeds)).run(None, feeds)


def test_a_negative_softcap_fails_with_a_message():
    with pytest.raises(Exception, match="softcap must be a finite number >= 0"):
        session(op_model(2, 1, 16, softcap=-1.0))


def test_head_size_0_fails_with_a_message():
    feeds = case(1, 2, 2, 1, 2, 8, [1])
    feeds.update(qkv=np.zeros((1, 2, 0), np.float32), past_key=np.zeros((1, 1, 8, 0), np.float32),
                 past_value=np.zeros((1, 1, 8, 0), np.float32), cos=np.zeros((10, 0), np.float32),
                 sin=np.zeros((10, 0), np.float32))
    with pytest.raises(Exception, match="cos/sin must be"):
        session(op_model(2, 1, 0)).run(None, feeds)


# EAGLE tree verification (input 10, tree_mask): a step whose last T tokens are a token tree.


def run_op(sess, feeds, kv, width):
    """y [B, S, width], present_key, present_value; a bfloat16 cache (feeds hold ml_dtypes arrays)
    bound in place, as the runtime binds it, and returned as float64."""
    if kv != BF16:
        return sess.run(None, feeds)
    bits = {n: feeds[n].view(np.uint16).copy() for n in ("past_key", "past_value")}
    binding = sess.io_binding()
    for name, array in feeds.items():
        value = ort.OrtValue.ortvalue_from_numpy_with_onnx_type(bits[name], BF16) if name in bits \
            else ort.OrtValue.ortvalue_from_numpy(array)
        binding.bind_ortvalue_input(name, value)
        if name in bits:
            binding.bind_ortvalue_output(name.replace("past", "present"), value)
    y = np.zeros((*feeds["qkv"].shape[:2], width), np.float32)
    binding.bind_ortvalue_output("y", ort.OrtValue.ortvalue_from_numpy(y))
    sess.run_with_iobinding(binding)
    return y, *(bits[n].view(ml_dtypes.bfloat16).astype(np.float64) for n in ("past_key", "past_value"))
