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

A row that samples speculates too where the graph samples the checked positions (manifest
verify_sampler, as EAGLE's verification does): position j's token is drawn with the row's j-th next
random number, the one plain decoding would draw it with, and a guess is taken while it is the drawn
token. A seeded request gives the same tokens with or without lookup; the numbers after what a step
took are put back for the next. While min_new_tokens holds EOS back, a step checks no guess past the
ban's end (spec_rules.room): every position is drawn under the biases of the step's first.

Rows that speculate: greedy and sampled ones, also with penalties and guided decoding, whose biases
change with every token the step takes (the graph draws every position under the step's first): their
positions after the first are walked on the host, each the argmax (greedy) or the draw with the same
random number (sampled: the engine's own sampler code, sampling.host_draw, on engines on our kernels;
elsewhere such sampled rows take plain steps) under the penalties and the grammar's mask after the
tokens taken before it; the others take their one token from the same step (k = 0, last_index 0).
A row that asks for logprobs gets them from its checked positions' logits
(sampling.position_logprobs, as EAGLE's verification does). Engines: those whose graph gives
verify_logits (manifest prompt_logits: ONNX Runtime builds); sampled rows, those with
verify_sampler too (built since it came).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from trtllm.runtime import sampling
from trtllm.runtime.engine import StepInputs
from trtllm.runtime.generate import Scheduler
from trtllm.runtime.rows import RowState
from trtllm.runtime.spec_rules import changing, room
from trtllm.runtime.step_inputs import guess_ids, rope_deltas, write_position

MIN_NGRAM, MAX_NGRAM = 2, 4  # a match of one token proposes too much that is wrong
PROBE = 16  # steps of the faster kind before one of the other, measured again (doubling while it loses)
WEIGHT = 0.3  # of a step's tokens per second in its kind's running mean


@dataclass(frozen=True)
class Lookup:
    """trtllm-run --spec-ngram K: propose up to k tokens a step. `adaptive`: check guesses only while
    that gives more tokens per second than plain steps (Pace); else whenever there are some."""

    k: int
    adaptive: bool = True
    cost = 0.0  # what a lookup costs a step, for Pace: left out (tens of microseconds), as it always was
    timed = False  # (a draft model's guesses are: runtime/draft_model.py's DraftSlots)

    def propose(self, tokens: list[int]) -> list[int]:
        """What followed the most recent earlier occurrence of the text's last n tokens (longest n first).
        Where that runs into the text's end (a loop shorter than k), the copy goes on through the
        tokens it proposes, as the loop would: [.. a b c a b] proposes c a b c a b .. ."""
        seq = np.asarray(tokens, np.int64)
        end = len(seq)
        for n in range(min(MAX_NGRAM, end - 1), MIN_NGRAM - 1, -1):
            # windows starting before end - n: every occurrence but the last n tokens themselves
            hits = np.flatnonzero((sliding_window_view(seq[:end - 1], n) == seq[end - n:]).all(axis=1))
            if len(hits):
                start = int(hits[-1]) + n
                return np.resize(seq[start:], self.k).tolist()  # (resize repeats it to k)
        return []

    def proposer(self, num_slots: int, timing, capacity: int, vocab_size: int) -> Lookup:
        return self  # (no state of its own: a draft model's has its KV, runtime/draft_model.py)

    def guesses(self, rows: list, left: dict[int, int]) -> dict[int, list[int]]:
        """slot -> its guesses, at most left[slot], for each slot in `left` that has some."""
        out = {}
        for s, most in left.items():
            if d := self.propose(rows[s].prompt_ids + rows[s].output_ids)[:most]:
                out[s] = d
        return out


class Pace:
    """Whether a step checks guesses: each kind of step's tokens per second (all rows'), as a running
    mean that recent steps weigh most in (the batch changes in flight). A step over 1 + k tokens costs
    more than a plain one (41.6 ms against 28.9 ms for k = 6 on the demo model), and a batch's rows
    all compute its width: on chat answers, where few guesses hold, checking them every step decoded
    0.86x plain at batch 4, 0.52x at batch 8. Each kind is measured first; then the faster is taken,
    and the other again after `wait` steps of it: PROBE, doubled each time it is still the slower (a
    probe of the slower kind costs what it loses), and PROBE again once it is the faster."""

    def __init__(self):
        self.rate: dict[bool, float | None] = {True: None, False: None}
        self.since = {True: 0, False: 0}  # steps since each kind last ran
        self.wait = PROBE

    def faster(self) -> bool:
        return self.rate[True] >= self.rate[False]

    def guessing(self) -> bool:
        if self.rate[False] is None or self.rate[True] is None:
            return self.rate[False] is not None  # plain first, then guesses
        faster = self.faster()
        return not faster if self.since[not faster] >= self.wait else faster

    def record(self, guessing: bool, tokens: int, seconds: float) -> None:
        probe = None not in self.rate.values() and guessing != self.faster()
        rate, old = tokens / max(seconds, 1e-9), self.rate[guessing]
        self.rate[guessing] = rate if old is None else (1 - WEIGHT) * old + WEIGHT * rate
        self.since[guessing], self.since[not guessing] = 0, self.since[not guessing] + 1
        if probe:
            self.wait = PROBE if guessing == self.faster() else min(2 * self.wait, 16 * PROBE)


class NgramScheduler(Scheduler):
    def __init__(self, *args, lookup: Lookup, **kwargs):
        super().__init__(*args, **kwargs)
        self.lookup = lookup
        self.proposer = lookup.proposer(self.kv.num_slots, self.timing, self.kv.capacity,
                                        self.engine.manifest.model.vocab_size)
        self.pace = Pace() if lookup.adaptive else None
        self.samples = self.engine.manifest.samples_verified  # rows that sample speculate too
        # and those whose biases change within a step, drawn on the host by the engine's sampler code
        self.native = sampling.host_draws(self.engine.manifest)
        self.draws = self.samples and self.native

    def speculates(self, row: RowState | None) -> bool:
        return (row is not None and row.speculative and not row.finish_reason and not row.prefilling
                and (row.params.temperature == 0 or self.samples and (self.draws or not self.walked(row))))

    def walked(self, row: RowState) -> bool:
        """A row whose biases change within a step (penalties count each token taken, a grammar's mask
        follows it), so that its checked positions after the first are chosen on the host under them
        (the graph's sampler has the step's first at all of them): greedy rows by `sampling.greedy`,
        sampled ones by the engine's own sampler code (`sampling.host_draw`, where `draws`)."""
        return changing(row)

    def guesses(self, rows: list, starts: list[int]) -> dict[int, list[int]]:
        """slot -> its guesses: at most what it may still generate but one (a sampled row: none past
        min_new_tokens' ban), and no more than every slot of the step can write (each writes as many
        positions from its start: idle and parked ones pads) within the KV limit."""
        most = min(self.kv.limit - p for p in starts) - 1
        left = {}
        for s, r in enumerate(rows):
            if self.speculates(r):
                exact = r.params.temperature == 0 or self.walked(r)  # (else min_new_tokens' ban: `room`)
                if (n := min(most, r.max_new_tokens - len(r.output_ids) - 1 if exact else room(r))) > 0:
                    left[s] = n
        return self.proposer.guesses(rows, left)

    def decode(self):
        hi = max(self.decoding()) + 1
        rows = [self.active.get(s) for s in range(hi)]
        starts = [write_position(r) for r in rows]
        # (looked up only for a step that may check them: Pace takes plain steps where they lose)
        trying = self.pace is None or self.pace.guessing()
        drafts = self.guesses(rows, starts) if trying else {}
        # (a draft model's steps count against guessing, even where the draft was too unsure to guess)
        paced = self.proposer.cost if trying else 0.0
        if not drafts:
            before = self.timing.generated_tokens
            out, elapsed = super().decode()
            if self.pace is not None:
                # (a lookup that found nothing cost nothing: a plain step's figure; a draft model's did)
                self.pace.record(trying and self.proposer.timed, self.timing.generated_tokens - before,
                                 elapsed + paced)
            return out, elapsed
        width = 1 + max(map(len, drafts.values()))
        self.ensure(max(p + width for p in starts))
        ids = guess_ids(rows, drafts, width, self.engine.manifest.pad_token_id)
        # A sampled row's tokens are the graph's draws at its every position, each with its own next
        # random number (put back after what it took: verify_sampled); a greedy row's, the argmax of
        # its guesses' logits and the last position's (out.logits), so those steps check width - 1.
        drawn = {s: rows[s].uniforms(len(d) + 1) for s, d in drafts.items() if rows[s].params.temperature > 0}
        checked = width if drawn else width - 1
        uniform = np.zeros((hi, checked), np.float32) if self.samples else None
        for s, numbers in drawn.items():
            uniform[s, :len(numbers)] = numbers
        inputs = StepInputs(input_ids=ids, position_ids=np.array(starts, np.int64)[:, None] + np.arange(width),
                            write_index=np.array(starts, np.int64),
                            last_index=np.array([len(drafts.get(s, ())) for s in range(hi)], np.int64),
                            sampling=sampling.rows(self.batch, 0, hi), rope_delta=rope_deltas(rows[:hi]),
                            verify_index=np.tile(np.arange(checked, dtype=np.int64), (hi, 1)), verify_uniform=uniform)
        out, elapsed = self.step(0, hi, inputs, frozenset(drawn), want_logits=True)
        t = self.timing
        t.generation_runs += 1
        t.generation_seconds += elapsed
        t.verify_runs += 1
        t.record("spec_decode_base_verification", elapsed)
        emitted = 0
        for s, r in enumerate(rows):
            if r is None or r.finish_reason or r.prefilling:
                continue
            before = len(r.output_ids)
            if s in drawn:
                self.verify_sampled(s, r, drafts[s], drawn[s], out)
            elif s in drafts:
                self.verify(s, r, drafts[s], out)
            else:
                self.accept(s, out, s)
            emitted += len(r.output_ids) - before
        t.generated_tokens += emitted
        if self.pace is not None:
            self.pace.record(True, emitted, elapsed + paced)
        return out, elapsed

    def verify(self, s: int, row: RowState, drafts: list[int], out) -> None:
        """The guesses that are the greedy choice, then the first choice that differs, or if all
        hold the choice after the last. Each is chosen under the biases and penalties as they stand
        after the tokens before it (the graph's sampler chose its token under the step's first): a
        min_new_tokens ban (of EOS, stop tokens) that ended, the penalties of the tokens taken, and a
        guided row's mask, which its grammar gives anew after each token."""
        t = self.timing
        t.drafted_tokens += len(drafts)
        for j, (logits, guess) in enumerate(zip([*out.verify_logits[s, :len(drafts)], out.logits[s]], [*drafts, None])):
            # (the first is the graph's own token where its sampler checked the positions)
            choice = int(out.verify_ids[s, 0]) if j == 0 and self.samples else sampling.greedy(
                logits, self.batch, s, self.native)
            self.take(s, row, choice, logits)  # (its logits say whether it overflowed: the row fails alone)
            t.accepted_tokens += choice == guess
            if row.finish_reason or choice != guess or not self.next_mask(s, row):
                return

    def take(self, s: int, row: RowState, token: int, logits) -> None:
        """A checked position's token, with its logprobs where the row asks for them (from `logits`).
        -1 (greedy: the logits overflowed) or a draw past the vocabulary fails the row alone."""
        top, chosen, finite = sampling.position_logprobs(logits, self.batch.logit_bias[s], row.params.num_logprobs,
                                                         token)
        self.accept_token(s, token, top, finite=finite, chosen=chosen)

    def verify_sampled(self, s: int, row: RowState, drafts: list[int], numbers: list, out) -> None:
        """The graph's draws while they are the guesses, then the first that differs, or if all hold
        the draw after the last; the random numbers of the positions not taken go back to the row.
        A `walked` row's positions after the first are drawn on the host, with the same numbers,
        under the penalties and mask after the tokens before them."""
        t, taken, walked = self.timing, 0, self.walked(row)
        t.drafted_tokens += len(drafts)
        for j, guess in enumerate([*drafts, None]):
            if j and walked:
                token = sampling.host_draw(out.verify_logits[s, j], self.batch, s, numbers[j],
                                           self.engine.manifest.max_top_k)
            else:
                token = int(out.verify_ids[s, j])
            self.take(s, row, token, out.verify_logits[s, j])  # (NaN or +inf logits: the row fails alone)
            taken += 1
            t.accepted_tokens += token == guess
            if row.finish_reason or token != guess or not self.next_mask(s, row):
                break
        if not row.finish_reason:
            row.spare[:0] = numbers[taken:]
