"""EAGLE-3 speculative decoding: a draft head proposes k tokens, the base model checks them in one step.

The draft head (ENGINE_DIR/eagle/, builder/eagle.py) is one decoder layer with its own KV cache,
slot for slot beside the base model's. At position q it takes the pair (hidden state h_q, token
x_{q+1}) and proposes x_{q+2}; the hidden state is the base graph's `eagle_hidden` at q, or, while
drafting ahead, the draft's own output at q-1. One decode cycle of a row at position p (x_p is
its last token, not yet in the base KV):

    draft:   d1 is ready (from the last catch-up); d2..dk from k-1 single-token draft steps
    verify:  the base model runs [x_p, d1 .. dk] at positions p .. p+k; verify_ids v0 .. vk are the
             sampler's tokens there, v_i drawn with the row's i-th next random number (greedy: the
             argmax). Emitted: d1 .. dj (each equal to v_{i-1}) and v_j, the first disagreement's
             token (or the token after dk): j+1 tokens, exactly what plain decoding would emit one
             step at a time with the same numbers; the row puts back its numbers after the j+1st.
    catch-up: the draft runs the pairs (h_{p+i}, emitted_i), i = 0..j, at positions p .. p+j (its
             KV for the rejected drafts is overwritten), which gives d1 for the next cycle.

A sampled row's drafts are guesses at its draws, not the head's argmax: d_i is drawn from the head's
10 best candidates, as the sampler draws from the model's distribution, with the number v_{i-1} will
be drawn with (sampling.propose). Where the head's argmax is kept only when the model draws its own
top token, a guess is kept as often as the two distributions agree on where that number falls.

A row with min_new_tokens speculates too: its ban (EOS and stop_token_ids) is one bias at every
position of a cycle, so while the ban lasts a cycle drafts, and emits, no further than its end.

Rows that ask for logprobs speculate where the engine's graph gives the verified positions' logits
(eagle.logprobs): each emitted token's top logprobs come from the logits at its position, as the
sampler computes them in a plain step.

Rows with a grammar (whose mask changes with every token) or penalties (whose counts do)
speculate on an engine with eagle.logprobs and sampled verification: the graph's sampler draws the
first position under the row's biases, and the rest are walked on the host (`walk`), each the
argmax of its logits under the mask and penalties after the tokens emitted before it, or for a
sampled row the draw with its number by the engine's own sampler code (sampling.host_draw: engines
on our CPU kernels; elsewhere sampled ones with either take plain steps). On other
engines a greedy row with penalties that only lower what was generated speculates as far as a cycle
emits no token it has already emitted (whose penalty verification did not have yet; nothing else
moves the argmax), and a guided row does not.

Rows that do not speculate (disable_spec_decode; on engines whose sampler is not our kernel's,
penalties on sampled rows and guided rows that sample; on engines without eagle.logprobs,
logprobs, guided rows and raising penalties; on engines built before sampled verification, also
sampled rows, logit_bias, min_new_tokens and penalties) share the step: they feed one token and
take the sampler's, as in plain decoding. A slot's draft KV past a row's position is never read
before it is written again, as in the base cache.

With --spec-draft-step auto (runtime/draft_policy.py), k changes from cycle to cycle, and k = 0
pauses (runtime/spec_pause.py).

Saved system prompts (runtime/prefix_cache.py) keep the draft's KV beside the base's, under their
own key. The draft's pair at the prefix's last position holds the token after the prefix, which
differs per request, so a restored prefix recomputes its last position in the base model and the
draft KV of the positions before it is restored: the proposals are then exactly those of an
uncached run.
"""
from __future__ import annotations

import functools
import time

import numpy as np

from trtllm.runtime import kv_cache, sampling
from trtllm.runtime.draft_policy import DraftPolicy
from trtllm.runtime.draft_tree import TreeDecoding
from trtllm.runtime.drafter import Drafter
from trtllm.runtime.engine import StepInputs
from trtllm.runtime.generate import RowState, Scheduler, adapter_key, write_position
from trtllm.runtime.step_inputs import guess_ids, rope_deltas
from trtllm.runtime.spec_context import SpecContext, draft_key
from trtllm.runtime.spec_pause import PAUSE_FLUSH, SpecPause
from trtllm.runtime.spec_rules import changing, exact, greedy, held, lowering, room, sampled

# (Drafter and the rules lived here once: callers import them from here still)
__all__ = ["Drafter", "SpecScheduler", "draft_key", "exact", "greedy", "held", "lowering", "sampled"]




class SpecScheduler(SpecContext, SpecPause, TreeDecoding, Scheduler):
    def __init__(self, engine, rows: list[RowState], num_slots: int, timing, on_token, prefixes, drafter: Drafter,
                 prefill_chunk: int = 0, feed=None):
        super().__init__(engine, rows, num_slots, timing, on_token, prefixes, prefill_chunk, feed)
        self.drafter, self.k = drafter.engine, drafter.step
        self.top_k, self.verify_size = drafter.top_k, drafter.verify_size  # draft trees when top_k > 1
        self.dkv = kv_cache.for_engine(self.drafter, self.kv.num_slots, self.kv.capacity)  # (device KV on TensorRT)
        self.dkv.limit = max(self.dkv.capacity, self.kv.limit)  # it grows with the base's (grow)
        self.timing.draft_kv_bytes = max(self.timing.draft_kv_bytes, self.dkv.nbytes)
        self.hidden_size = self.drafter.manifest.model.hidden_size
        # sampled requests speculate too where verification samples (engines since it did)
        self.samples = engine.manifest.samples_verified
        # and rows that ask for logprobs, where the graph gives the verified positions' logits
        logprobs = bool(engine.manifest.eagle.get("logprobs"))
        self.verifiable = functools.partial(sampled, logprobs=logprobs) if self.samples else greedy
        self.logits = logprobs  # (guided and penalized rows verify on the host from them: `walked`)
        # sampled ones too where the host draws as the engine's sampler does (the same code)
        self.native = sampling.host_draws(engine.manifest)
        self.draws = self.samples and self.native
        # a sampled row's drafts guess at its draws, from the head's best candidates (older heads give none)
        self.guesses = drafter.guess and self.samples and self.drafter.top_k > 0
        self.pad = engine.manifest.pad_token_id
        # slot -> (d1, the draft's hidden state it came with, and for draft trees and guesses the
        # head's best candidates for d1 and their log-probabilities)
        self.ready: dict[int, tuple] = {}
        widths = [1] + [1 + self.tree_nodes(k) for k in range(1, drafter.step + 1)] if self.top_k > 1 else None
        self.policy = DraftPolicy(drafter.step, drafter.start, widths) if drafter.auto else None
        # slot -> (position of its first pair, tokens, hidden states): pairs the draft has not seen
        # because speculation was paused (auto's k = 0)
        self.kept: dict[int, tuple[int, list[int], list[np.ndarray]]] = {}
        self.flush_at = min(PAUSE_FLUSH, engine.manifest.limits.max_input_len)
        self.save_head: set[int] = set()  # id() of rows whose prefill saves the head's prefix KV
        self.drafted: set[int] = set()  # (SpecContext)
        self.caught: set[int] = set()

    def grow(self, capacity: int) -> None:
        """The draft's KV has as many positions as the base's: both grow together."""
        super().grow(capacity)
        self.dkv.grow(self.kv.capacity)
        self.timing.draft_kv_bytes = max(self.timing.draft_kv_bytes, self.dkv.nbytes)

    def shared(self, admitted: list[int]) -> dict[int, tuple[int, int]]:
        """Prompt sharing, with the draft's KV: a speculating follower copies it too, but one
        position less than the model's (the draft's pair at the last shared position holds the
        token after it, which may be the follower's own), and so computes that position again, as
        a restored prefix does. It needs a speculating leader (the draft ran over its prompt);
        otherwise it computes its prompt whole."""
        out = {}
        for slot, (leader, n) in super().shared(admitted).items():
            row, lead = self.active[slot], self.active[leader]
            if not self.follows(row):
                out[slot] = (leader, n)
            elif self.follows(lead) and n > 1:
                out[slot] = (leader, n - 1)
                if id(row) in self.save_head:  # the leader computes the prompt: it saves the head's KV
                    self.save_head.add(id(lead))
        return out

    def copy_prompt(self, leader: int, slot: int, n: int) -> None:
        super().copy_prompt(leader, slot, n)
        if self.follows(self.active[slot]):
            self.dkv.copy_slot(leader, slot, n)

    def moved(self, src: int, dst: int, row: RowState) -> None:
        """The draft's KV (filled as far as the model's, or less while paused), its next proposal
        and the pairs it has not seen move with the row."""
        self.dkv.copy_slot(src, dst, row.filled())
        for state in (self.ready, self.kept):
            if src in state:
                state[dst] = state.pop(src)

    def follows(self, row: RowState | None) -> bool:
        """The draft runs over this row's text (its prompt too, chunk by chunk): a row that may
        speculate (`verifiable`) and has not finished."""
        return (row is not None and not row.finish_reason and row.speculative
                and (self.walked(row) or row.guide is None and self.verifiable(row.params)))

    def walked(self, row: RowState) -> bool:
        """A row with a grammar or penalties, whose verification is done on the host, position by
        position, each under the grammar's mask and the penalties after the tokens before it (the
        graph's sampler has one bias per row, the first position's): greedy, or sampled where the
        host draws with the engine's own sampler code (`draws`: engines on our kernels), on an engine
        that gives the verified positions' logits (eagle.logprobs) and whose verification applies
        the row's biases (sampled verification: the greedy one takes the raw argmax). Where it is
        not, a guided row does not speculate, and a penalized one only as far as `exact` allows."""
        return self.logits and self.samples and changing(row) and (row.params.temperature == 0 or self.draws)

    def speculates(self, row: RowState | None) -> bool:
        """It drafts and verifies in decode steps: it follows, and its prompt is all in (not parked in chunks)."""
        return self.follows(row) and not row.prefilling

    def tree_nodes(self, depth: int) -> int:
        """The drafted nodes a tree of this depth verifies: --spec-verify-size - 1, else top_k x depth,
        and never more than the tree has (top_k + (depth - 1) top_k^2)."""
        k = self.top_k
        return min(self.verify_size - 1 if self.verify_size else k * depth, k + (depth - 1) * k * k)

    def draft_step(self, start: int, ids, hidden, positions, last_index, prompt: bool = False, top: bool = False,
                   write_index=None, **tree):
        """One run of the head: (proposals [B], its hidden states [B,H], with `top` (ids, log-probs,
        node hidden states) as the engine's draft() gives them (else None), seconds)."""
        t0 = time.perf_counter()
        write_index = positions[:, 0].copy() if write_index is None else write_index
        d, h, *best = self.drafter.draft(ids, hidden, positions, write_index, last_index,
                                         self.dkv.view(start, start + ids.shape[0]), prompt=prompt, top=top, **tree)
        elapsed = time.perf_counter() - t0
        self.timing.draft_runs += 1
        self.timing.draft_seconds += elapsed
        self.timing.record("spec_decode_draft_prefill" if prompt else "spec_decode_draft_proposal", elapsed)
        return d, h, (best or None), elapsed

    def catch_up(self, start: int, rows: list, tokens: list[list[int] | None], hidden: np.ndarray,
                 positions: list[int], prompt: bool = False) -> float:
        """The draft runs (hidden[b, i], tokens[b][i]) at positions[b] + i for every speculating row
        (None: not), and keeps each one's next proposal in `ready`. `prompt`: over a prompt's pairs."""
        width = max(len(t) for t in tokens if t)
        ids = np.full((len(rows), width), self.pad, np.int64)
        hid = np.zeros((len(rows), width, self.hidden_size), np.float32)
        pos = np.zeros((len(rows), width), np.int64)
        last = np.zeros(len(rows), np.int64)
        for b, t in enumerate(tokens):
            # a row without pairs writes a pad at its own position, which its next pairs overwrite
            # (position 0 would overwrite a parked prompt's first pair)
            pos[b] = positions[b] + np.arange(width)
            if t:
                ids[b, : len(t)], hid[b, : len(t)], last[b] = t, hidden[b, : len(t)], len(t) - 1
        d, h, best, elapsed = self.draft_step(start, ids, hid, pos, last, prompt, top=self.top_k > 1 or self.guesses)
        for b, t in enumerate(tokens):
            if t and self.speculates(rows[b]):
                self.ready[start + b] = (int(d[b]), h[b]) + ((best[0][b, 0], best[1][b, 0]) if best else ())
        return elapsed

    def prefilled(self, start: int, rows: list[RowState], inputs: StepInputs, out) -> None:
        """The prompt's pairs: hidden state at q with the token at q+1 (the last one is the first
        output, or, after a chunk, the next chunk's first token)."""
        # a leader that finished at its first token (EOS, max_generate_length 1) has followers that
        # copy the draft's KV of its prompt: the draft runs over it all the same
        leading = {leader for s, (leader, _) in self.waiting.items() if self.follows(self.active[s])}
        tokens = []
        for b, r in enumerate(rows):
            n = int(inputs.last_index[b]) + 1
            after = r.prompt_ids[r.computed] if r.prefilling else r.output_ids[-1] if r.output_ids else None
            runs_draft = self.follows(r) or (start + b in leading and after is not None)
            tokens.append([*inputs.input_ids[b, 1:n].tolist(), after] if runs_draft else None)
        if any(tokens):
            self.timing.prefill_seconds += self.catch_up(start, rows, tokens, out.hidden, inputs.write_index.tolist(),
                                                         prompt=True)
        for b, r in enumerate(rows):
            if (tokens[b] and id(r) in self.save_head and self.prefixes and r.num_reused == 0 and not r.prefilling
                    and 1 < len(r.prefix_ids) < len(r.prompt_ids)):
                self.prefixes.save(r.prefix_ids, self.dkv.read(start + b, len(r.prefix_ids) - 1), draft_key(r))

    def restore_prefix(self, row: RowState) -> None:
        speculating = self.follows(row)  # (not finished: it is being admitted)
        draft = None
        if speculating and self.prefixes and row.prefix_ids:
            draft = self.prefixes.load(row.prefix_ids, draft_key(row), self.dkv.layout(len(row.prefix_ids) - 1))
            if draft is None:
                # No head KV (the model's was saved by a request that did not speculate, or nothing
                # was): the whole prompt is computed, so the draft proposes as in an uncached run,
                # and the head's KV is saved next to the model's so that later requests restore both.
                if row.save_prefix or self.prefixes.has(row.prefix_ids, adapter_key(row)):
                    self.save_head.add(id(row))
                return
        super().restore_prefix(row)
        if row.num_reused and speculating:
            row.num_reused -= 1  # the last position's pair needs its hidden state: recomputed
            if draft is not None and draft.shape[2] >= row.num_reused:
                self.dkv.write(row.slot, draft[:, :, : row.num_reused])

    def decode(self) -> None:
        hi = max(self.decoding()) + 1  # (parked rows below it ride along, as in plain decoding)
        rows = [self.active.get(s) for s in range(hi)]
        spec = sum(self.speculates(r) for r in rows)
        k = self.k if spec else 0  # no row speculates (penalties, disable_spec_decode, ...): a plain step
        if self.policy is not None and spec:
            live = sum(r is not None and not r.finish_reason and not r.prefilling for r in rows)
            k = self.policy.choose(hi, spec, live - spec)
        if k == 0:
            self.timing.draft_steps[0] = self.timing.draft_steps.get(0, 0) + 1
            return self.paused(hi, rows)
        elapsed = self.resume(hi, rows)
        if self.top_k > 1:
            return self.decode_tree(hi, rows, k, elapsed)
        pos = [write_position(r) for r in rows]  # (a parked row's pad where its next chunk writes)
        self.ensure(max(pos) + k + 1)  # (the step and the draft write up to k + 1 positions from there)
        # padding stays inside every slot, and a step is never wider than the engine's inputs go
        # (max_input_len: TensorRT's prefill profile ends there; a larger --spec-draft-step is capped)
        width = min(k + 1, self.engine.manifest.limits.max_input_len, min(self.kv.capacity - p for p in pos))
        ks = [min(width - 1, room(r)) if s in self.ready and self.speculates(r) else 0 for s, r in enumerate(rows)]
        drafted = max(ks)  # what the step drafts: less than k for rows near their end or the KV's
        self.timing.draft_steps[drafted] = self.timing.draft_steps.get(drafted, 0) + 1
        if drafted == 0:  # nothing to verify (each row at its last token, or no room): a plain step
            self.timing.generation_seconds += elapsed
            return self.paused(hi, rows)
        numbers = {s: rows[s].peek(ks[s]) for s in range(hi) if ks[s] > 0 and self.guessing(rows[s])}
        drafts = {s: [self.guess(rows[s], *self.ready[s][2:], numbers[s][0]) if s in numbers else self.ready[s][0]]
                  for s in range(hi) if ks[s] > 0}
        ahead = self.draft_ahead(hi, rows, pos, ks, drafts, numbers)
        w = 1 + max(ks)
        ids = guess_ids(rows, {s: d[: ks[s]] for s, d in drafts.items()}, w, self.pad)
        start = np.array(pos, np.int64)
        depths = {s: list(range(ks[s] + 1)) for s, r in enumerate(rows) if self.speculates(r)}
        out, step_time, drawn = self.verify_step(ids, start[:, None] + np.arange(w), start, np.array(ks, np.int64),
                                                 depths=depths)
        emitted: list[list[int] | None] = [None] * hi
        for s, r in enumerate(rows):
            if self.plain_or_failed(s, r, out):
                continue
            emitted[s] = self.verify(s, r, [int(v) for v in out.verify_ids[s, : ks[s] + 1]], drafts.get(s, []), out,
                                     drawn.get(s))
            self.timing.drafted_tokens += ks[s]
            self.timing.accepted_tokens += len(emitted[s]) - 1
            if self.policy is not None:
                self.policy.record_row(ks[s], len(emitted[s]) - 1)
        self.finish_cycle(hi, rows, emitted, drawn, out, pos, w, step_time, elapsed, ahead, max(0, max(ks) - 1))

    def verify_step(self, ids, positions, start, last, tree_mask=None, depths: dict | None = None):
        """One model step over every row's tokens from its write position `start`, giving the
        sampler's token at each (verify_ids; greedy engines: the argmax). depths[slot]: each of a
        speculating row's positions' depth (0: its last token); where verification samples, the
        token at depth d is drawn with the row's d-th next random number, the number plain decoding
        would draw it with. (outputs, seconds, the numbers drawn per slot: a row puts back those
        after what it emitted.)"""
        hi, w = ids.shape
        uniform, drawn = None, {}
        if self.samples:
            uniform = np.zeros((hi, w), np.float32)
            for s, d in (depths or {}).items():
                drawn[s] = self.active[s].uniforms(max(d) + 1)
                uniform[s, : len(d)] = [drawn[s][j] for j in d]
        inputs = StepInputs(input_ids=ids, position_ids=positions, write_index=start, last_index=last,
                            sampling=sampling.rows(self.batch, 0, hi), tree_mask=tree_mask,
                            rope_delta=rope_deltas([self.active.get(s) for s in range(hi)]),
                            verify_index=np.tile(np.arange(w, dtype=np.int64), (hi, 1)), verify_uniform=uniform)
        # (the verified positions' logits, where the graph gives them: free to read, and what says
        # which position overflowed, `emit`)
        out, step_time = self.step(0, hi, inputs, frozenset(drawn), want_logits=self.logits)
        self.timing.generation_runs += 1
        self.timing.verify_runs += 1
        self.timing.row_iterations += len(depths or ())
        self.timing.verify_seconds += step_time
        self.timing.record("spec_decode_base_verification", step_time)
        return out, step_time, drawn

    def plain_or_failed(self, s: int, r: RowState | None, out) -> bool:
        """A verify step's row that is not verified: none, finished or parked (nothing), one that does
        not speculate (the sampler's token), or one whose logits overflowed (it fails alone)."""
        if r is None or r.finish_reason or r.prefilling:
            return True
        if not self.speculates(r):
            self.accept(s, out, s)
            self.timing.generated_tokens += 1
            return True
        if self.overflowed(s, out):
            self.accept_token(s, int(out.token_ids[s]), finite=False)
            return True
        return False

    @staticmethod
    def overflowed(s: int, out) -> bool:
        """Whether the verify step's overflow fails row `s` here. The top logprob is the last verified
        position's: it fails the row only where no position's logits say more (else `emit` fails it
        at the first token drawn from overflowed logits, as plain decoding would, and a draft past
        the accepted ones fails nothing)."""
        return out.verify_logits is None and not np.isfinite(out.top_logprobs[s, 0])

    def finish_cycle(self, hi: int, rows: list, emitted: list, drawn: dict, out, pos: list[int], w: int,
                     step_time: float, elapsed: float, ahead: float, ahead_calls: int) -> None:
        """After a verification: each unfinished row puts back the random numbers after what it
        emitted (`drawn`: verify_step's), the head catches up on what it emitted, and the policy and
        the profile get the cycle's times."""
        for s, r in enumerate(rows):
            if emitted[s] is not None and r.finish_reason and not self.keeps_answer(r):
                emitted[s] = None
            elif emitted[s] is not None and r.finish_reason:  # (the head's KV of its answer is kept)
                self.caught.add(id(r))
            elif emitted[s] is not None:
                r.spare[:0] = drawn.get(s, [])[len(emitted[s]):]
        catch = self.catch_up(0, rows, emitted, out.hidden, pos) if any(emitted) else 0.0
        if self.policy is not None:
            self.policy.record_step(hi, w, step_time)
            calls = ahead_calls + (1 if any(emitted) else 0)
            if calls:
                self.policy.record_draft(hi, (ahead + catch) / calls)
        self.timing.generation_seconds += step_time + elapsed + ahead + catch

    def guessing(self, row: RowState) -> bool:
        """Its drafts guess at the sampler's draws (`guess`) instead of taking the head's argmax: a row
        that samples, or a greedy one with a logit bias or under min_new_tokens' ban, on an engine
        whose verification samples; unless its spec_proposal_sampling is "greedy"."""
        return self.guesses and row.guesses and (row.params.temperature > 0 or bool(row.params.logit_bias)
                                                 or held(row) > 0)

    @staticmethod
    def guess(row: RowState, ids, logprobs, uniform: float) -> int:
        """The draft for a position whose token the row's sampler draws with `uniform`: the head's
        candidates (ids, logprobs) drawn from as the sampler draws from the model's distribution.
        Where the head's argmax is kept only as often as the model draws its own top token, a guess
        with the same number is kept as often as the two distributions agree."""
        if held(row):  # what the ban keeps verification from drawing is no guess
            keep = [i for i, t in enumerate(ids) if int(t) not in row.banned]
            if keep:
                ids, logprobs = np.asarray(ids)[keep], np.asarray(logprobs)[keep]
        return sampling.propose(row.params, ids, logprobs, uniform)

    def draft_ahead(self, hi: int, rows: list, pos: list[int], ks: list[int], drafts: dict,
                    numbers: dict) -> float:
        """d2 .. dk: single-token draft steps from each drafting row's last proposal (numbers[s]: a
        guessing row's next random numbers, d_j's the j-th)."""
        elapsed, hidden = 0.0, {s: self.ready[s][1] for s in drafts}
        for j in range(1, max(ks, default=0)):
            ids = np.full((hi, 1), self.pad, np.int64)
            hid = np.zeros((hi, 1, self.hidden_size), np.float32)
            positions = np.array(pos, np.int64)[:, None]  # (the others' pad at their own position: see catch_up)
            for s, d in drafts.items():
                ids[s, 0], hid[s, 0], positions[s, 0] = d[-1], hidden[s], pos[s] + j - 1
            d, h, best, t = self.draft_step(0, ids, hid, positions, np.zeros(hi, np.int64), top=bool(numbers))
            elapsed += t
            for s in drafts:
                if ks[s] > j:
                    drafts[s].append(self.guess(rows[s], best[0][s, 0], best[1][s, 0], numbers[s][j]) if s in numbers
                                     else int(d[s]))
                    hidden[s] = h[s]
        return elapsed

    def verify(self, slot: int, row: RowState, greedy_ids: list[int], drafts: list[int], out,
               numbers: list | None = None) -> list[int]:
        """Emit the verified tokens (the sampler's at each position) while the drafts agree with
        them; returns what was emitted. `numbers`: a sampled row's, by depth (verify_step's)."""
        if self.walked(row):
            return self.walk(slot, row, lambda node, token: node + 1 if node < len(drafts) and
                             drafts[node] == token else None, greedy_ids[0], out, numbers)[1]
        n = next((i + 1 for i, token in enumerate(greedy_ids) if i >= len(drafts) or drafts[i] != token),
                 len(greedy_ids))
        return self.emit(slot, row, greedy_ids[:n], out, range(n))

    def walk(self, slot: int, row: RowState, child, root_token: int, out, numbers: list | None = None,
             depth=lambda node: node) -> tuple[list[int], list[int]]:
        """A `walked` row's verification: from the root (the graph's token, drawn under the first
        biases), each token emitted (so the penalties count it, the matcher moves on and the row's
        bias becomes the next mask), then the next position's token under them (the argmax, or a
        sampled row's draw with its number for that depth, numbers[depth(node)]), while
        `child(node, token)` (the drafted position holding that token, or None) goes on.
        (accepted nodes, emitted tokens)"""
        path, emitted, node, token = [], [], 0, root_token
        sampled = row.params.temperature > 0
        while True:  # (a token from overflowed logits fails the row in `emit`, the root's too)
            emitted += self.emit(slot, row, [token], out, [node])
            node = None if row.finish_reason else child(node, token)
            if node is None:
                return path, emitted
            if not self.next_mask(slot, row):
                return path, emitted
            path.append(node)
            token = self.walked_token(slot, node, out, numbers[depth(node)] if sampled else None)

    def walked_token(self, slot: int, node: int, out, uniform: float | None = None) -> int:
        """A `walked` row's token at a verified position, as the graph's sampler takes it under the
        row's biases and penalties as they now stand (the grammar's mask there with the request's
        logit_bias, the penalties and min_new_tokens' ban after the tokens emitted before it): the
        argmax, or with `uniform` the draw (sampling.host_draw); -1 where the logits overflowed (NaN
        or +inf), which fails the row alone, as in a plain step."""
        logits = out.verify_logits[slot, node]
        if uniform is None:
            return sampling.greedy(logits, self.batch, slot, self.native)
        return sampling.host_draw(logits, self.batch, slot, uniform, self.engine.manifest.max_top_k)

    def emit(self, slot: int, row: RowState, tokens: list[int], out, sources) -> list[int]:
        """Verified tokens, up to the row's end and as far as they are exact (`exact`: the end of
        min_new_tokens' ban, a token repeated under penalties); returns what was emitted.
        sources[i]: the verified position token i was drawn at, whose logits (out.verify_logits)
        give its top logprobs where the row asks for them, and say whether they overflowed (the row
        then fails there, as in a plain step)."""
        tokens = tokens[: exact(row, tokens)]
        emitted, k = [], row.params.num_logprobs
        for token, source in zip(tokens, sources):
            emitted.append(token)
            logits = None if out.verify_logits is None else out.verify_logits[slot, source]  # (k = 0: finite?)
            top, chosen, finite = sampling.position_logprobs(logits, self.batch.logit_bias[slot], k, token)
            self.accept_token(slot, token, top, finite=finite, chosen=chosen)
            if row.finish_reason:
                break
        self.timing.generated_tokens += len(emitted)
        self.timing.speculative_tokens += len(emitted)
        self.timing.speculative_rows += not row.verified
        row.verified = True
        return emitted

    def release_finished(self) -> None:
        for slot in [s for s, r in self.active.items() if r.finish_reason]:
            self.ready.pop(slot, None)
            self.kept.pop(slot, None)
        super().release_finished()
