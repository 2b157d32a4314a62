"""runtime/draft_policy.py: `--spec-draft-step auto` picks the k with the most tokens per second
from the rates and costs it has measured, pauses (k = 0) when drafting does not pay, and keeps
trying a neighbour of its choice."""
from __future__ import annotations

import numpy as np
import pytest

from trtllm.runtime.draft_policy import EXPLORE_FIRST, EXPLORE_MAX_GAP, DraftPolicy


def simulate(rate: float, cost, cycles: int = 400, max_step: int = 4, batch: int = 1, seed: int = 0):
    """Drafts accepted with probability `rate` each; cost(width) seconds per step, 0.1 per draft call.
    Returns how often each k was chosen and the tokens per second the run got."""
    rng, policy, chosen = np.random.default_rng(seed), DraftPolicy(max_step, start=2), {}
    tokens = seconds = 0.0
    for _ in range(cycles):
        k = policy.choose(batch, batch, 0)
        chosen[k] = chosen.get(k, 0) + 1
        policy.record_step(batch, k + 1, cost(k + 1))
        seconds += cost(k + 1) + 0.1 * k
        if k:
            policy.record_draft(batch, 0.1)
        for _ in range(batch):
            accepted = 0
            while accepted < k and rng.random() < rate:
                accepted += 1
            policy.record_row(k, accepted)
            tokens += 1 + accepted
    return chosen, tokens / seconds


def value(rate: float, cost, k: int) -> float:
    """Expected tokens per second of drafting k every cycle."""
    return (1 + sum(rate ** i for i in range(1, k + 1))) / (cost(k + 1) + 0.1 * k)


def best_k(rate: float, cost, max_step: int = 4) -> int:
    return max(range(max_step + 1), key=lambda k: value(rate, cost, k))


def cpu(width):  # a CPU step: each extra token costs 30% of a one-token step
    return 1.0 + 0.3 * (width - 1)


def gpu(width):  # a GPU step: the width is almost free
    return 1.0 + 0.02 * (width - 1)


@pytest.mark.parametrize("rate, cost", [(0.0, cpu), (0.3, cpu), (0.5, cpu), (0.8, cpu), (0.95, cpu),
                                        (0.3, gpu), (0.8, gpu)])
def test_gets_close_to_the_best_fixed_k(rate, cost):
    """Within 7% of the best fixed k's tokens per second (exploring and noisy rates cost a little),
    and ahead of every fixed k more than 10% below it."""
    best = value(rate, cost, best_k(rate, cost))
    chosen, got = simulate(rate, cost)
    assert got >= 0.93 * best, (chosen, got, best)
    for k in range(5):
        if value(rate, cost, k) < 0.9 * best:
            assert got > value(rate, cost, k), (k, chosen)


def test_a_bad_head_pauses_and_a_good_one_drafts_deep():
    assert best_k(0.0, cpu) == 0 and best_k(0.95, gpu) == 4
    chosen, _ = simulate(0.95, gpu)
    assert chosen[4] >= 0.8 * sum(chosen.values())
    chosen, _ = simulate(0.0, cpu)
    assert chosen[0] >= 360 and set(chosen) <= {0, 1, 2}   # k = 1 only to look again (and k = 2 at the start)


def test_explores_a_neighbour_at_doubling_gaps():
    """A best choice that stays put is questioned after 8 cycles, then after gaps doubling to 256."""
    policy = DraftPolicy(4, start=0)
    picks = []
    for _ in range(1200):
        picks.append((policy.cycles, policy.choose(1, 1, 0)))
        k = picks[-1][1]
        policy.record_step(1, k + 1, 1.0 if k == 0 else 9.0)
        if k:
            policy.record_row(k, 0)
    explored = [c for c, k in picks if k != 0]
    # cycle 1 tries k = 1 on the prior rate (0.5) and slope, which moves the best choice once
    want, gap, at = [], EXPLORE_FIRST, EXPLORE_FIRST
    while at < 1200:
        want.append(at)
        gap = min(2 * gap, EXPLORE_MAX_GAP)
        at += gap
    assert explored == [1] + want
    assert want[:6] == [8, 24, 56, 120, 248, 504] and want[6] - want[5] == 256


def test_rates_of_depths_never_drafted_follow_the_one_before():
    policy = DraftPolicy(4, start=1)
    for _ in range(50):
        policy.record_row(1, 1)
    rates = policy.rates()
    assert rates[1] > 0.95 and rates[2] == rates[1] == rates[4]
    for _ in range(50):
        policy.record_row(2, 1)  # the first taken, the second never
    rates = policy.rates()
    assert rates[1] > 0.95 and rates[2] < 0.05 and rates[3] == rates[2]


def test_costs_are_kept_per_batch_width_and_interpolated():
    policy = DraftPolicy(4, start=2)
    policy.record_step(4, 1, 1.0)
    policy.record_step(4, 3, 2.0)
    policy.record_draft(4, 0.1)
    assert policy.cost(4, 0) == 1.0 and policy.cost(4, 2) == pytest.approx(2.2)
    assert policy.cost(4, 1) == pytest.approx(1.5 + 0.1) and policy.cost(4, 4) == pytest.approx(3.0 + 0.4)
    assert policy.cost(2, 2) == pytest.approx(2.2)  # an unmeasured batch width borrows the nearest one's
    policy.record_step(2, 3, 1.0)
    assert policy.cost(2, 2) == pytest.approx(1.2) and policy.cost(2, 0) == pytest.approx(1.0 / 1.6)
