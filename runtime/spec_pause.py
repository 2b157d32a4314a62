"""Paused speculation (runtime/speculative.py's SpecScheduler): with --spec-draft-step auto
(runtime/draft_policy.py), k changes from cycle to cycle, and k = 0 pauses: a plain step, no draft
run; each speculating row keeps its pair (h_p, emitted token) and the draft catches up on all kept
pairs in one run when drafting resumes, so its KV and proposals are then exactly those of a run that
never paused.
"""
from __future__ import annotations

import numpy as np

from trtllm.runtime.generate import runs, write_position

PAUSE_FLUSH = 256  # while paused, the draft catches up once a row has kept this many pairs


class SpecPause:
    """A mixin of SpecScheduler, which sets `kept` (slot -> pairs the draft has not seen), `flush_at`,
    `ready`, `policy` and `dkv`, and gives `speculates`, `catch_up` and `finish_paused`."""

    def paused(self, hi: int, rows: list) -> None:
        """A plain step (auto's k = 0, no row speculating, or nothing to draft): each speculating
        row keeps its (hidden state, token) pair for the draft, which catches up on them when
        drafting resumes (or once PAUSE_FLUSH are kept)."""
        pos = {s: write_position(r) for s, r in enumerate(rows) if self.speculates(r)}
        out, step_time = super().decode()
        if self.policy is not None:
            self.policy.record_step(hi, 1, step_time)
        for s, p in pos.items():
            self.ready.pop(s, None)  # proposed before the pause: stale
            if rows[s].finish_reason:
                self.timing.generation_seconds += self.finish_paused(s, rows[s], self.kept.pop(s, (p, [], [])), out)
                continue
            _, tokens, hidden = self.kept.setdefault(s, (p, [], []))
            tokens.append(rows[s].output_ids[-1])
            hidden.append(out.hidden[s, 0].copy())
        if any(len(t) >= self.flush_at for _, t, _ in self.kept.values()):
            self.timing.generation_seconds += self.resume(hi, rows)

    def resume(self, hi: int, rows: list) -> float:
        """The draft runs the pairs kept while paused (one call for all rows): its KV is then
        complete up to each row's position, and `ready` holds each row's next proposal."""
        slots = sorted(s for s in self.kept if s < hi and self.speculates(rows[s]))
        elapsed, width = 0.0, max((len(self.kept[s][1]) for s in slots), default=0)
        # Contiguous runs of slots that kept pairs: a slot without any (admitted since the pause)
        # must not ride along, as the draft would write its KV at positions it already holds; and
        # one at a time where right-padding would run past a row's buffer.
        fits = all(self.kept[s][0] + width <= self.dkv.capacity for s in slots)
        for start, stop in runs(slots) if fits else [(s, s + 1) for s in slots]:
            kept = [self.kept[s] for s in range(start, stop)]
            width = max(len(t) for _, t, _ in kept)
            hidden = np.zeros((stop - start, width, self.hidden_size), np.float32)
            for b, (_, _, h) in enumerate(kept):
                hidden[b, : len(h)] = np.stack(h)
            elapsed += self.catch_up(start, rows[start:stop], [t for _, t, _ in kept], hidden, [p for p, _, _ in kept])
        self.kept.clear()
        return elapsed
