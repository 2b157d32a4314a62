"""runtime/draft_tree.py on hand-made trees: the ancestor masks the model and the head run under,
the walk that accepts exactly what greedy decoding emits, the selection of the likeliest nodes
(never a node without its parent), and the policy's cost of a tree's step."""
from __future__ import annotations

import numpy as np
import pytest

from trtllm.runtime.draft_policy import DraftPolicy
from trtllm.runtime.draft_tree import Candidate, DraftTree, expansion_mask, grow, select

#        0 (root 10) ── 1 (11) ── 3 (13) ── 5 (15)
#                   └── 2 (12) ── 4 (14)
TREE = DraftTree([10, 11, 12, 13, 14, 15], [-1, 0, 0, 1, 2, 3], [0, 0, 1, 0, 0, 0])


def test_the_mask_is_each_nodes_ancestors_and_itself():
    want = np.array([[1, 0, 0, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0, 0], [1, 0, 1, 0, 0, 0, 0], [1, 1, 0, 1, 0, 0, 0],
                     [1, 0, 1, 0, 1, 0, 0], [1, 1, 0, 1, 0, 1, 0], [0, 0, 0, 0, 0, 0, 1]], np.bool_)
    np.testing.assert_array_equal(TREE.mask(7), want)  # (row 6: padding, itself)
    assert TREE.depths == [0, 1, 1, 2, 2, 3]


def test_the_walk_follows_the_models_tokens():
    # greedy[i] is the model's token after node i's path
    assert TREE.walk([12, 0, 14, 0, 99, 0]) == ([2, 4], [12, 14, 99])  # the second branch, then 99
    assert TREE.walk([11, 13, 0, 15, 0, 77]) == ([1, 3, 5], [11, 13, 15, 77])  # the whole chain, then 77
    assert TREE.walk([40, 13, 14, 15, 0, 0]) == ([], [40])  # no child holds 40
    assert TREE.tested([2, 4]) == 2 and TREE.tested([1, 3]) == 3 and TREE.tested([]) == 1


def cand(token, parent, score, depth):
    return Candidate(token, parent, score, depth, np.zeros(1))


def test_selection_keeps_the_best_nodes_with_their_ancestors():
    cands = [cand(1, -1, -0.1, 1), cand(2, -1, -2.0, 1), cand(3, 0, -0.3, 2), cand(4, 1, -2.1, 2),
             cand(5, 2, -0.3, 3), cand(6, 0, -0.9, 2)]
    tree = select(cands, 100, 4)  # the 3 best: 1, then 3 and 5 (a tie: the shallower first)
    assert tree.tokens == [100, 1, 3, 5] and tree.parents == [-1, 0, 1, 2]
    # a node whose parent is not in never is, however good its own score
    cands[5].score = -0.05
    cands[5].parent = 1  # under token 2 (score -2.0)
    tree = select(cands, 100, 3)
    assert tree.tokens == [100, 1, 3] and 6 not in tree.tokens


def test_expansions_see_their_expanded_ancestors():
    cands = [cand(1, -1, -0.1, 1), cand(2, -1, -0.5, 1), cand(3, 0, -0.2, 2), cand(4, 1, -0.6, 2)]
    cands[0].slot, cands[1].slot = 0, 1  # the first run expanded both, at the region's slots 0 and 1
    np.testing.assert_array_equal(expansion_mask(cands, [2, 3], 2, 3),
                                  [[1, 0, 1, 0, 0], [0, 1, 0, 1, 0], [0, 0, 0, 0, 1]])  # (row 2: padding)


def test_grow_expands_the_likeliest_nodes_depth_by_depth():
    """A fake head whose children of token t are t*10+1 .. (log-probs -1, -2): depth 3, width 2."""
    calls = []

    def run_head(ids, hidden, level, offset, mask):
        calls.append((level, offset, ids.tolist(), mask.shape))
        top = ids[:, :, None] * 10 + np.array([1, 2])
        return top, np.broadcast_to(np.array([-1.0, -2.0]), top.shape), hidden + 1

    roots = {0: (9, np.zeros(4, np.float32), np.array([1, 2]), np.array([-0.5, -1.5]))}
    tree = grow(run_head, roots, 1, 2, 3, {0: 7})[0]
    # depth 2's likeliest: 11 (-1.5), then 12 and 21 tie at -2.5 (the first made goes first)
    assert [c[:3] for c in calls] == [(1, 0, [[1, 2]]), (2, 2, [[11, 12]])]
    assert calls[1][3] == (1, 2, 4)  # the second run sees the first's two slots and its own two
    # the 6 best: 1 (-0.5), 2 (-1.5), 11 (-1.5), then at -2.5 the shallower 12 and 21, and 111
    assert tree.tokens == [9, 1, 2, 11, 12, 21, 111] and tree.parents == [-1, 0, 0, 1, 1, 2, 3]
    assert tree.depths == [0, 1, 1, 2, 2, 2, 3] and tree.ranks == [0, 0, 1, 0, 1, 0, 0]


def test_the_policy_weighs_a_trees_step_width():
    chain, tree = DraftPolicy(4, 2), DraftPolicy(4, 2, widths=[1, 5, 9, 13, 17])
    for p in (chain, tree):
        p.record_step(1, 1, 1.0)
        p.record_step(1, 3, 1.6)  # 0.3 per extra token
    assert chain.cost(1, 2) == pytest.approx(1.6) and tree.cost(1, 2) == pytest.approx(1.0 + 0.3 * 8)


def test_a_rows_guess_comes_first_and_its_path_is_verified_whole():
    """With guesses (a sampled row's drafts: runtime/speculative.py), each node's guessed child is
    among its children even where the head ranks it below `width`, scores as certain, and so the
    guessed path is in the tree to its full depth before any other node."""
    def run_head(ids, hidden, level, offset, mask):
        top = ids[:, :, None] * 10 + np.array([1, 2, 3])
        return top, np.broadcast_to(np.array([-0.1, -2.0, -4.0]), top.shape), hidden + 1

    roots = {0: (9, np.zeros(4, np.float32), np.array([1, 2, 3]), np.array([-0.2, -1.5, -3.0]))}
    guess = lambda s, depth, ids, lps: int(ids[2]) if depth == 1 else int(ids[1])  # noqa: E731
    tree = grow(run_head, roots, 1, 2, 3, {0: 4}, guess)[0]
    # 3 (the head's third at depth 1), its second child 32, and that one's second, 322
    assert tree.tokens == [9, 3, 32, 322] and tree.parents == [-1, 0, 1, 2] and tree.ranks == [0, 2, 1, 1]
    # then the next best scores: 31 (-0.1, the head's best after 3) and 321 (-0.1, the same depth as 312
    # but made first); 1 (-0.2) is left out
    tree = grow(run_head, roots, 1, 2, 3, {0: 6}, guess)[0]
    assert tree.tokens == [9, 3, 32, 31, 322, 321] and tree.parents == [-1, 0, 1, 1, 2, 2]
