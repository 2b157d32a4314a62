"""sampling.propose: a draft head's guess at the token the sampler will draw with a given random
number. Over a vocabulary small enough that the head's candidates are all of it, the guess must be
the sampler's own draw (plugins/sample/reference.py) with the same number, whatever the
temperature, min-p, top-k, top-p and logit bias: that is what lets a sampled request's drafts be
kept as often as the head's distribution matches the model's."""
from __future__ import annotations

import numpy as np

from tests.plugins.sample_cases import ambiguous, make_case, run_reference
from trtllm.runtime.sampling import SamplingParams, propose

V = 10  # the head's candidates: all of the vocabulary


def cases(seed: int, n: int):
    rng = np.random.default_rng(seed)
    logits = (rng.standard_normal((n, V)) * rng.choice([0.5, 2.0, 4.0], (n, 1))).astype(np.float32)
    ties = rng.random(n) < 0.5  # integer logits: many ties, at the top-k, top-p and min-p cuts too
    logits[ties] = rng.integers(-4, 3, (int(ties.sum()), V))
    bias = np.where(rng.random((n, V)) < 0.2, rng.choice([-3.0, 1.5, -np.inf], (n, V)), 0).astype(np.float32)
    bias[np.isinf(bias).all(axis=1), 0] = 0  # at least one token allowed
    case = make_case(logits, rng.choice([0.0, 0.3, 0.7, 1.0, 1.6], n), rng.choice([0, 1, 3, 10], n),
                     rng.choice([1.0, 0.9, 0.5], n), rng.random(n, dtype=np.float32), bias,
                     min_p=rng.choice([0.0, 0.0, 0.1, 0.5], n))
    return case


def guesses(case):
    out = []
    for b in range(len(case["logits"])):
        x = case["logits"][b].astype(np.float64)
        lp = x - x.max() - np.log(np.exp(x - x.max()).sum())          # the head's log-softmax, no bias
        order = np.argsort(-lp, kind="stable")                        # best first, as the head gives them
        bias = {int(t): float(v) for t, v in enumerate(case["logit_bias"][b]) if v}
        p = SamplingParams(temperature=float(case["temperature"][b]), top_k=int(case["top_k"][b]),
                           top_p=float(case["top_p"][b]), min_p=float(case["min_p"][b]), logit_bias=bias)
        out.append(propose(p, order, lp[order], float(case["uniform"][b])))
    return np.array(out)


def test_a_guess_over_the_whole_vocabulary_is_the_samplers_draw():
    case = cases(0, 1000)
    want, _, _ = run_reference(case, 1, V)
    got = guesses(case)
    checked = [b for b in range(len(got)) if not ambiguous(case, b)]
    assert len(checked) > 900  # (a row whose number sits within rounding of a boundary may go either way)
    bad = [b for b in checked if got[b] != want[b]]
    assert not bad, [(b, got[b], want[b]) for b in bad[:5]]


def test_wrong_variant_drawing_in_order_of_probability_disagrees():
    """The sampler walks the kept tokens in vocabulary order; a guess that walked them best first
    would agree only where the two orders happen to meet (the check above must see the difference)."""
    case = cases(1, 300)
    case["top_k"][:], case["min_p"][:], case["top_p"][:], case["temperature"][:] = 0, 0, 1, 1
    want, _, _ = run_reference(case, 1, V)
    ranked = case["logits"].copy()
    order = np.argsort(-(ranked + case["logit_bias"]), axis=1, kind="stable")
    sorted_case = dict(case, logits=np.take_along_axis(ranked, order, 1),
                       logit_bias=np.take_along_axis(case["logit_bias"], order, 1))
    best_first = np.take_along_axis(order, guesses(sorted_case)[:, None], 1)[:, 0]
    assert (guesses(case) == want).mean() > 0.98 and (best_first == want).mean() < 0.8


def test_greedy_guesses_take_the_bias_and_never_a_banned_token():
    ids, lps = np.array([7, 3, 9]), np.array([-0.1, -2.0, -3.0])
    assert propose(SamplingParams(temperature=0), ids, lps, 0.5) == 7
    assert propose(SamplingParams(temperature=0, logit_bias={3: 5.0}), ids, lps, 0.5) == 3
    for u in (0.0, 0.5, 0.999):
        assert propose(SamplingParams(temperature=1.0, top_k=0, top_p=1.0, logit_bias={7: -np.inf}), ids, lps, u) != 7
    # every candidate banned: the head's best (verification draws the real token)
    assert propose(SamplingParams(logit_bias={7: -np.inf, 3: -np.inf, 9: -np.inf}), ids, lps, 0.3) == 7


def test_a_temperature_below_float32s_smallest_is_greedy_as_in_the_sampler():
    ids, lps = np.array([4, 2]), np.array([-0.69314718, -0.69314718])  # tied: greedy takes the lower id
    assert propose(SamplingParams(temperature=1e-50), ids, lps, 0.9) == 2
    assert propose(SamplingParams(temperature=1.0, top_k=0, top_p=1.0), ids, lps, 0.9) == 4
