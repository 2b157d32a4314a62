"""How many tokens an EAGLE cycle drafts (`--spec-draft-step auto`), chosen cycle by cycle from
what drafting has been worth so far in this run.

A cycle that drafts k tokens for each speculating row costs one base step of width k + 1 and k
draft steps (k - 1 ahead, one catch-up), and gives each such row 1 + a1 + a1*a2 + ... + a1*..*ak
tokens on average, where ai is the rate at which the i-th draft is accepted once the ones before
it were. A draft tree of depth k (--spec-draft-top-k > 1) is the same with the tree's rates (any
node at depth i accepted) and its own step width. k = 0 pauses speculation: plain one-token steps
and no draft runs at all (the scheduler keeps the rows' (hidden state, token) pairs, and the
draft catches up on them in one call when drafting resumes). Whether drafting pays depends on the
head and the text (the rates) and on the hardware and batch (the costs): a GPU verifies 5 tokens
for about the price of one, a CPU step of 5 tokens costs 1.3x-2.3x a one-token step, and a head
accepted 30% of the time loses there.

Rates and costs are running averages that forget the past geometrically, so they follow the text
and the batch; costs are kept per batch width. The policy takes the k with the most tokens per
second, and now and then tries a neighbour of it, which keeps the estimates it would otherwise stop
measuring fresh: first after 8 cycles, then after gaps that double up to 256 cycles while the
choice stays the same and the neighbour looks more than 10% worse (a try costs a cycle at a worse
k, and resuming after a pause costs a catch-up); a near tie keeps being tried every 8 cycles.
It never changes a token: verification emits what plain decoding would, whatever k is.
"""
from __future__ import annotations

import numpy as np

RATE_DECAY = 0.97    # per verified row: the rates follow roughly the last 30 rows' drafts
PAUSE_DECAY = 0.99   # per paused cycle: an old verdict fades (a text's predictable stretches come back)
COST_DECAY = 0.8     # per measurement: a cost follows its last few steps
PRIOR_RATE = 0.5     # a depth never drafted takes the rate of the one before it (this one for depth 1)
PRIOR_SLOPE = 0.3    # before two widths are measured, each extra token in a step costs 30% of a
                     # one-token step (measured on the CPU at batch 1: 1.3x for 2 tokens)
EXPLORE_FIRST = 8    # the first try of a neighbour, at this cycle; the gap to the next one doubles
EXPLORE_MAX_GAP = 256  # each time, up to this, and goes back to EXPLORE_FIRST when the choice changes
NEAR_TIE = 0.9       # or when the neighbour tried is estimated within 10% of the choice


def average(table: dict, key: int, seconds: float) -> None:
    """The running cost average of table[key] (the first measurement as it is)."""
    old = table.get(key)
    table[key] = seconds if old is None else COST_DECAY * old + (1 - COST_DECAY) * seconds


class DraftPolicy:
    """One run's choice of k in 0..max_step (k = 0: speculation paused), starting at `start`."""

    def __init__(self, max_step: int, start: int, widths: list[int] | None = None):
        self.max_step, self.k = max_step, min(start, max_step)
        self.widths = widths  # draft trees: the model step's width at each depth k (a chain's: k + 1)
        self.offered = np.zeros(max_step + 1)   # decayed counts per depth (index 0 unused)
        self.accepted = np.zeros(max_step + 1)
        self.step_cost: dict[int, dict[int, float]] = {}   # batch width -> step width -> seconds
        self.draft_cost: dict[int, float] = {}              # batch width -> seconds per draft call
        self.cycles = 0
        self.explore_flip = 1
        self.next_explore, self.gap = EXPLORE_FIRST, EXPLORE_FIRST
        self.best = self.k

    # -- what the scheduler reports ------------------------------------------------------------
    def record_row(self, drafted: int, accepted: int) -> None:
        """One speculating row of a verify step: `drafted` drafts offered, the first `accepted` taken."""
        if drafted <= 0:
            return
        self.offered *= RATE_DECAY
        self.accepted *= RATE_DECAY
        depths = min(accepted + 1, drafted)  # depths past the first rejection were not tested
        self.offered[1: depths + 1] += 1
        self.accepted[1: accepted + 1] += 1

    def record_step(self, batch: int, width: int, seconds: float) -> None:
        average(self.step_cost.setdefault(batch, {}), width, seconds)
        self.cycles += 1

    def record_draft(self, batch: int, seconds: float) -> None:
        average(self.draft_cost, batch, seconds)

    # -- the estimates -------------------------------------------------------------------------
    def rates(self) -> np.ndarray:
        """a1 .. a_max (index 0 is 1): Laplace-smoothed, an unmeasured depth inheriting the one before."""
        out = np.ones(self.max_step + 1)
        for i in range(1, self.max_step + 1):
            prior = PRIOR_RATE if i == 1 else out[i - 1]
            out[i] = (self.accepted[i] + prior) / (self.offered[i] + 1)
        return out

    def tokens(self, k: int) -> float:
        """Expected tokens a speculating row gets from a cycle drafting k."""
        return float(np.cumprod(self.rates()[1: k + 1]).sum()) + 1.0

    def cost(self, batch: int, k: int) -> float | None:
        """Seconds of a cycle drafting k at this batch width; None while nothing is measured."""
        costs = self.step_cost.get(batch) or self.nearest(self.step_cost, batch)
        if not costs:
            return None
        width, known = (self.widths[k] if self.widths else k + 1), sorted(costs)
        if width in costs:
            step = costs[width]
        elif len(known) >= 2:  # a straight line through the two measured widths nearest to it
            a, b = sorted(known, key=lambda w: (abs(w - width), w))[:2]
            slope = max(0.0, (costs[b] - costs[a]) / (b - a))
            step = max(costs[a] + slope * (width - a), 1e-9)
        else:
            w0 = known[0]
            step = costs[w0] * (1 + PRIOR_SLOPE * (width - 1)) / (1 + PRIOR_SLOPE * (w0 - 1))
        draft = self.draft_cost.get(batch, self.nearest(self.draft_cost, batch) or 0.0)
        return step + k * draft

    @staticmethod
    def nearest(table: dict, batch: int):
        return table[min(table, key=lambda b: abs(b - batch))] if table else None

    # -- the choice ----------------------------------------------------------------------------
    def choose(self, batch: int, speculating: int, others: int) -> int:
        """k for this cycle: `speculating` rows draft, `others` (rows that do not speculate) take one
        token each."""
        def rate(k: int) -> float:
            cost = self.cost(batch, k)
            return (speculating * self.tokens(k) + others) / cost if cost else 0.0

        if not (self.cycles and self.step_cost):
            return self.k
        best = max(range(self.max_step + 1), key=lambda k: (rate(k), -k))
        if best != self.best:  # the estimates moved: look around again soon
            self.best, self.gap = best, EXPLORE_FIRST
            self.next_explore = min(self.next_explore, self.cycles + self.gap)
        self.k = best
        if best == 0:  # paused, nothing is measured: the rates drift back towards the prior
            self.offered *= PAUSE_DECAY
            self.accepted *= PAUSE_DECAY
        if self.cycles >= self.next_explore:
            self.explore_flip = -self.explore_flip
            near = best + self.explore_flip
            self.k = near if 0 <= near <= self.max_step else best - self.explore_flip
            # A try costs what the neighbour is worse by: tries of a clearly worse one thin out,
            # a near tie (which a few unlucky rows can decide either way) keeps being looked at.
            close = rate(self.k) >= NEAR_TIE * rate(best)
            self.gap = EXPLORE_FIRST if close else min(2 * self.gap, EXPLORE_MAX_GAP)
            self.next_explore = self.cycles + self.gap
        return self.k
