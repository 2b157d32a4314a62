"""trtllm.cpu::Attention with an EAGLE tree mask (a draft tree verified in one step): against the
float64 reference of test_cpu_attention.py, in long contexts, with windows and head norms, on both
code paths; a causal tree is no tree, and a bad mask fails with a message."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

pytest.importorskip("onnx")

from tests.plugins.cpu_ops import on_portable_path, relative_error, session  # noqa: E402
from tests.plugins.test_cpu_attention import (  # noqa: E402
    BF16, F16, F32, NAMES, case, op_model, reference, run_op)


def tree_case(shape, t, seed=0, star=False):
    """case()'s feeds with tree_mask [B, S, t]: each row its own tree over its step's last t slots,
    parents before children (star: all children of the root), the root first; a node sees its
    ancestors and itself and sits at the root's position + its depth (siblings share a position).
    The mask's rows before the tree are random: the op must not read them."""
    b, s, h, hk, d, c, past = shape
    feeds = case(b, s, h, hk, d, c, past, seed=seed)
    rng = np.random.default_rng(seed + 1)
    mask = rng.random((b, s, t)) < 0.5
    for row in range(b):
        parent = [-1] + [0 if star else int(rng.integers(0, i)) for i in range(1, t)]
        depth = np.zeros(t, np.int64)
        for i in range(t):
            depth[i] = depth[parent[i]] + 1 if i else 0
            mask[row, s - t + i] = False
            j = i
            while j >= 0:
                mask[row, s - t + i, j], j = True, parent[j]
        feeds["position_ids"][row, s - t:] = feeds["write_index"][row] + s - t + depth
    feeds["tree_mask"] = mask
    return feeds


def check_tree(shape, t, kv=F32, window=0, norms=False, seed=0, star=False, wrong=None) -> float:
    """The op with a tree mask against the reference: the largest error relative to its bound (pass:
    <= 1; y 1e-5, a 16-bit cache's new keys and values half a step, as check_half_cache). wrong:
    "causal" (the reference without the mask) or "slot" (its window counted from the slot): the
    raw largest difference of y."""
    b, s, h, hk, d, c, past = shape
    feeds = tree_case(shape, t, seed=seed + t + d, star=star)
    if norms:
        rng = np.random.default_rng(seed)
        feeds.update(q_norm=(1 + 0.3 * rng.standard_normal(d)).astype(np.float32),
                     k_norm=(1 + 0.3 * rng.standard_normal(d)).astype(np.float32))
    for name in ("past_key", "past_value"):
        feeds[name] = feeds[name].astype({F32: np.float32, F16: np.float16, BF16: ml_dtypes.bfloat16}[kv])
    sess = session(op_model(h, hk, d, kv=kv, window=window, norms=norms, tree=True))
    y, key, value = run_op(sess, feeds, kv, h * d)
    for row in range(b):  # padding tokens are zero
        assert not y[row, feeds["last_index"][row] + 1:].any()
    ref_y, ref_k, ref_v = reference(*(feeds[n] for n in NAMES), h, hk, d ** -0.5, window=window,
                                    cache=None if kv == F32 else (key, value),
                                    norms=(feeds["q_norm"], feeds["k_norm"]) if norms else None,
                                    tree=None if wrong == "causal" else feeds["tree_mask"],
                                    window_from_slot=wrong == "slot")
    if wrong:
        return float(np.abs(y - ref_y).max())
    return relative_error((y, key, value), (ref_y, ref_k, ref_v), kv)


# (shape as in CASES, tree size T): head size 64 (the AVX-512 path) and 24 (the portable path) with
# one token before the tree, and a step that is all tree (S = T = 9: two query blocks, write_index 0)
TREE_CASES = [((2, 7, 4, 2, 64, 48, [5, 20]), 6), ((2, 7, 4, 2, 24, 48, [5, 20]), 6),
              ((2, 9, 8, 2, 32, 64, [0, 30]), 9)]
# (shape, T, window, norms): windows that count from the position, with q/k norms on one (inputs 8,
# 9 and 10 all given) and head size 40 (the portable path)
TREE_WINDOW_CASES = [((2, 8, 4, 1, 64, 48, [10, 25]), 7, 3, False), ((1, 6, 4, 2, 40, 30, [4]), 6, 2, True)]
# (shape, T, window, star) past 512 slots (parts, merged): a tree across the part boundary at slot
# 1024; with a star tree and a window of 1 a child there sees only itself, so part 0 holds none of its
# slots but hidden ones (weights 0, merged as empty: no NaN)
TREE_LONG_CASES = [((2, 9, 4, 1, 64, 1100, [1019, 600]), 8, 0, False), ((1, 9, 4, 2, 64, 1100, [1019]), 8, 1, True),
                   ((1, 9, 4, 2, 40, 1100, [1019]), 8, 1, True), ((2, 9, 4, 1, 40, 1100, [1019, 300]), 8, 40, False)]


@pytest.mark.parametrize("kv", [F32, F16, BF16])
@pytest.mark.parametrize("shape, t", TREE_CASES)
def test_a_tree_mask_matches_the_reference(shape, t, kv):
    assert check_tree(shape, t, kv) <= 1


@pytest.mark.parametrize("shape, t, window, norms", TREE_WINDOW_CASES)
def test_a_tree_window_counts_from_the_position(shape, t, window, norms):
    """The wrong variant, a window counted from the slot, hides a deep node's nearest ancestors."""
    assert check_tree(shape, t, window=window, norms=norms) <= 1
    assert check_tree(shape, t, window=window, norms=norms, wrong="slot") > 1e-3


@pytest.mark.parametrize("kv", [F32, F16])
@pytest.mark.parametrize("shape, t, window, star", TREE_LONG_CASES)
def test_a_tree_in_a_long_context_matches_the_reference(shape, t, window, star, kv):
    assert check_tree(shape, t, kv, window=window, star=star) <= 1


@pytest.mark.parametrize("shape, t", TREE_CASES)
def test_a_tree_mask_is_applied(shape, t):
    """The deliberately wrong variant: the reference without the mask (plain causal) disagrees."""
    assert check_tree(shape, t, wrong="causal") > 1e-3


def causal_tree_is_no_tree(shape, t, window=0) -> bool:
    """A lower-triangular tree_mask (every node sees all before it), or one of T = 0: outputs and
    caches bit for bit those of the same call without the input (positions are the slots here)."""
    b, s, h, hk, d, c, past = shape
    feeds = case(b, s, h, hk, d, c, past, seed=t + d)
    plain = [np.asarray(a) for a in session(op_model(h, hk, d, window=window)).run(None, feeds)]
    feeds["tree_mask"] = np.broadcast_to(np.tril(np.ones((s, s), bool))[:, s - t:], (b, s, t)).copy()
    tree = session(op_model(h, hk, d, window=window, tree=True)).run(None, feeds)
    return all(np.array_equal(x, y) for x, y in zip(plain, tree))


# (shape, T, window): the AVX-512 and portable paths, a window, parts, and an empty tree
TRIL_CASES = [((2, 7, 4, 2, 64, 48, [5, 20]), 6, 0), ((2, 7, 4, 2, 24, 48, [5, 20]), 6, 3),
              ((2, 9, 4, 1, 64, 1100, [1019, 600]), 9, 40), ((2, 7, 4, 2, 64, 48, [5, 20]), 0, 2)]


@pytest.mark.parametrize("shape, t, window", TRIL_CASES)
def test_a_causal_tree_mask_changes_nothing(shape, t, window):
    assert causal_tree_is_no_tree(shape, t, window)


@pytest.mark.parametrize("kernel", ["generic", "avx2"])
def test_tree_masks_on_the_portable_and_avx2_paths_too(kernel):
    cases = [f"check_tree(*{c!r}, kv={kv})" for c in TREE_CASES for kv in (F32, F16, BF16)]
    cases += [f"check_tree({c[0]!r}, {c[1]}, window={c[2]}, norms={c[3]})" for c in TREE_WINDOW_CASES]
    cases += [f"check_tree({c[0]!r}, {c[1]}, window={c[2]}, star={c[3]})" for c in TREE_LONG_CASES]
    errors = on_portable_path("test_cpu_attention_tree", "[" + ", ".join(cases) + "]", kernel=kernel)
    assert np.max(errors) <= 1
    assert on_portable_path("test_cpu_attention_tree", "[causal_tree_is_no_tree(*c) for c in TRIL_CASES]") == [True] * 4


@pytest.mark.parametrize("mask, window, message", [
    (np.ones((1, 4), bool), 0, r"tree_mask must be \[batch, seq, T\]"),
    (np.ones((2, 4, 2), bool), 0, r"tree_mask must be \[batch, seq, T\]"),
    (np.ones((1, 3, 2), bool), 0, r"tree_mask must be \[batch, seq, T\]"),
    # position 9 > slot 4 + window 2 - 1: its window would hold no slot
    (np.ones((1, 4, 2), bool), 2, "position 9 with a window of 2 does not reach its slot 4"),
])
def test_a_bad_tree_mask_fails_with_a_message(mask, window, message):
    feeds = case(1, 4, 2, 1, 16, 12, [1])
    feeds["position_ids"][0, 3] = 9
    feeds["tree_mask"] = mask
    with pytest.raises(Exception, match=message):
        session(op_model(2, 1, 16, window=window, tree=True)).run(None, feeds)


@pytest.mark.parametrize("d", [64, 24])  # the AVX-512 path and the portable one
def test_a_hidden_nodes_nan_value_reaches_no_one_it_is_hidden_from(d):
    """A draft node whose model overflowed (its value NaN: a token whose embedding is NaN) weighs
    exactly 0 for the nodes that do not see it, and its value is not read there (0 x NaN is NaN:
    its siblings failed with it, where plain decoding never feeds that token). Those nodes give the
    reference's outputs with that value finite; the node itself and its descendants are NaN."""
    shape, t = (1, 6, 4, 2, d, 48, [5]), 5
    h, hk = shape[2], shape[3]
    feeds = tree_case(shape, t, seed=3, star=True)  # every node a child of the root
    bad = shape[1] - t + 2  # the tree's third node: its siblings do not see it
    feeds["qkv"][0, bad, (h + hk) * d:] = np.nan  # its values (all kv heads)
    y, _, _ = run_op(session(op_model(h, hk, d, tree=True)), feeds, F32, h * d)
    clean = {**feeds, "qkv": feeds["qkv"].copy()}
    clean["qkv"][0, bad, (h + hk) * d:] = 0.0
    want, _, _ = reference(*(clean[n] for n in NAMES), h, hk, d ** -0.5, tree=feeds["tree_mask"])
    sees = feeds["tree_mask"][0, :, bad - (shape[1] - t)]
    for s in range(shape[1] - t, shape[1]):
        if sees[s]:
            assert np.isnan(y[0, s]).all()
        else:
            np.testing.assert_allclose(y[0, s], want[0, s], atol=1e-5)


def node_as_plain_step(shape, t, seed=0):
    """Each node of row 0's tree (a tree step, float32 cache) against a plain one-token step at its
    position over the KV its path would hold once accepted (the tree step's own keys and values of
    its ancestors, moved to the slots after the tree's start): how many nodes' outputs differ at all."""
    b, s, h, hk, d, c, past = shape
    feeds = tree_case(shape, t, seed=seed)
    y, key, value = run_op(session(op_model(h, hk, d, tree=True)), feeds, F32, h * d)
    plain = session(op_model(h, hk, d))
    start = int(feeds["write_index"][0]) + s - t
    mask = feeds["tree_mask"][0, s - t:]
    differ = 0
    for node in range(t):
        path = [j for j in range(node) if mask[node, j]]  # its ancestors, in depth order
        at = start + len(path)
        k, v = np.zeros((1, hk, c, d), np.float32), np.zeros((1, hk, c, d), np.float32)
        k[0, :, :start], v[0, :, :start] = key[0, :, :start], value[0, :, :start]
        k[0, :, start:at], v[0, :, start:at] = key[0, :, [start + j for j in path]].transpose(1, 0, 2), \
            value[0, :, [start + j for j in path]].transpose(1, 0, 2)
        one = {"qkv": feeds["qkv"][:1, s - t + node:s - t + node + 1], "past_key": k, "past_value": v,
               "write_index": np.array([at]), "last_index": np.array([0]), "position_ids": np.array([[at]]),
               "cos": feeds["cos"], "sin": feeds["sin"]}
        assert int(feeds["position_ids"][0, s - t + node]) == at
        differ += not np.array_equal(plain.run(None, one)[0][0, 0], y[0, s - t + node])
    return differ


@pytest.mark.parametrize("shape, t", [((1, 9, 4, 2, 64, 80, [21]), 9), ((1, 7, 4, 1, 64, 64, [30]), 6),
                                      ((1, 7, 4, 2, 24, 48, [5]), 6),
                                      # past 512 slots (parts): the tree within the second part
                                      ((1, 9, 4, 1, 64, 1100, [700]), 8)])
def test_a_tree_node_is_a_plain_step_to_the_bit(shape, t):
    """What speculation's promise rests on (its tokens are plain decoding's, near-ties too): a
    node's output is a plain step's at its position bit for bit, its exponentials summed in the lanes
    a plain step sums them in (they summed by the tree's slots: a review's near-tie flipped a greedy
    token at 1e-6). Head size 64 (the AVX-512 path) and 24 (the portable one)."""
    assert node_as_plain_step(shape, t) == 0
    assert node_as_plain_step(shape, t, seed=5) == 0
