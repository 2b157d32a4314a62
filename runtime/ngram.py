"""Prompt lookup (n-gram) speculative decoding: vLLM's "ngram" method, llama.cpp's lookup decoding.

A greedy row's next tokens are guessed from its own text: its last n tokens (n from MAX_NGRAM down
to MIN_NGRAM) are looked up in its prompt and what it has generated, the most recent match first,
and the tokens that followed there are proposed, k at most. One step runs the row's last token and
its k guesses at positions p..p+k, written into its KV as a prompt chunk's would be; verify_index
names positions 0..k-1 and last_index k, so position j's logits say what follows guess j. A guess is
taken while it is the greedy choice there (the argmax of the logits plus the row's biases, ties to
the lower id, as the sampler chooses), the first that is not is replaced by that choice, and if every
guess holds, the sampler's token at k comes too. What a rejected guess wrote into the KV lies past the
row's tokens, where its next step writes before anything reads it.

It needs no draft model, and pays where an answer repeats its input (summaries, edits of code or
text, extraction, retrieval): on a CPU a decode step is bound by reading the weights, so a step over
1 + k tokens costs little more than one.

Rows that speculate: greedy, without penalties (whose counts the graph applies once a step), guided
decoding or logprobs; the others take their one token from the same step (k = 0, last_index 0).
Engines: those whose graph gives verify_logits (manifest prompt_logits: ONNX Runtime builds).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from trtllm.runtime import sampling
from trtllm.runtime.engine import StepInputs
from trtllm.runtime.generate import Scheduler
from trtllm.runtime.rows import RowState
from trtllm.runtime.step_inputs import write_position

MIN_NGRAM, MAX_NGRAM = 2, 4  # a match of one token proposes too much that is wrong


@dataclass(frozen=True)
class Lookup:
    """trtllm-run --spec-ngram K: propose up to k tokens a step."""

    k: int

    def propose(self, tokens: list[int]) -> list[int]:
        """What followed the most recent earlier occurrence of the text's last n tokens (longest n first)."""
        seq = np.asarray(tokens, np.int64)
        end = len(seq)
        for n in range(min(MAX_NGRAM, end - 1), MIN_NGRAM - 1, -1):
            # windows starting before end - n: every occurrence but the last n tokens themselves
            hits = np.flatnonzero((sliding_window_view(seq[:end - 1], n) == seq[end - n:]).all(axis=1))
            if len(hits):
                start = int(hits[-1]) + n
                return seq[start:start + self.k].tolist()
        return []


class NgramScheduler(Scheduler):
    lookup: Lookup

    def speculates(self, row: RowState | None) -> bool:
        p = None if row is None else row.params
        return (row is not None and row.speculative and not row.finish_reason and not row.prefilling
                and p.temperature == 0 and not p.penalized and row.guide is None and not p.num_logprobs)

    def guesses(self, rows: list, starts: list[int]) -> dict[int, list[int]]:
        """slot -> its guesses: at most what it may still generate but one, and no more than every
        slot of the step can write (each writes as many positions from its start: idle and parked
        ones pads) within the KV limit."""
        most = min(self.kv.limit - p for p in starts) - 1
        out = {}
        for s, r in enumerate(rows):
            if self.speculates(r):
                room = min(r.max_new_tokens - len(r.output_ids) - 1, most)
                if room > 0 and (d := self.lookup.propose(r.prompt_ids + r.output_ids)[:room]):
                    out[s] = d
        return out

    def decode(self):
        hi = max(self.decoding()) + 1
        rows = [self.active.get(s) for s in range(hi)]
        starts = [write_position(r) for r in rows]
        drafts = self.guesses(rows, starts)
        if not drafts:
            return super().decode()
        width = 1 + max(map(len, drafts.values()))
        pad = self.engine.manifest.pad_token_id
        self.ensure(max(p + width for p in starts))
        ids = np.full((hi, width), pad, np.int64)
        for s, r in enumerate(rows):
            if r is not None and r.output_ids:
                ids[s, 0] = r.output_ids[-1]
            ids[s, 1:1 + len(drafts.get(s, ()))] = drafts.get(s, ())
        inputs = StepInputs(input_ids=ids, position_ids=np.array(starts, np.int64)[:, None] + np.arange(width),
                            write_index=np.array(starts, np.int64),
                            last_index=np.array([len(drafts.get(s, ())) for s in range(hi)], np.int64),
                            sampling=sampling.rows(self.batch, 0, hi),
                            verify_index=np.tile(np.arange(width - 1, dtype=np.int64), (hi, 1)))
        out, elapsed = self.step(0, hi, inputs, want_logits=True)
        t = self.timing
        t.generation_runs += 1
        t.generation_seconds += elapsed
        t.verify_runs += 1
        t.record("spec_decode_base_verification", elapsed)
        for s, r in enumerate(rows):
            if r is None or r.finish_reason or r.prefilling:
                continue
            before = len(r.output_ids)
            if s in drafts:
                self.verify(s, r, drafts[s], out)
            else:
                self.accept(s, out, s)
            t.generated_tokens += len(r.output_ids) - before
        return out, elapsed

    def verify(self, s: int, row: RowState, drafts: list[int], out) -> None:
        """The guesses that are the greedy choice, then the first choice that differs, or if all
        hold the choice after the last. Each is chosen under the biases as they stand after the
        tokens before it: a min_new_tokens ban (of EOS, stop tokens) that ends inside the step no
        longer holds (the graph's sampler chose its token under the step's first biases)."""
        t = self.timing
        t.drafted_tokens += len(drafts)
        for logits, guess in zip([*out.verify_logits[s, :len(drafts)], out.logits[s]], [*drafts, None]):
            scores = logits + self.batch.logit_bias[s] + self.batch.penalty_bias[s]
            choice = int(np.argmax(scores))
            # (a NaN or +inf logit is where argmax lands: that row fails, as the sampler's check makes it)
            self.accept_token(s, choice, finite=bool(np.isfinite(scores[choice])))
            t.accepted_tokens += choice == guess
            if row.finish_reason or choice != guess:
                return

