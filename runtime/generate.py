"""Generate for a list of requests on token ids: in-flight batching over KV slots.

Up to `num_slots` requests run at once, each in its own slot of the KV cache manager. A new
request takes a free slot, optionally restores a saved system-prompt prefix there, and is
prefilled (requests admitted together share one prefill step, right-padded); then every active
slot advances one token per decode step. A finished request frees its slot for the next one.
A token at position p sits in KV position p of its slot, so every request computes exactly what
it would alone, whatever its neighbours.

    step:     prefill(0,1,2)  decode  decode  prefill(1)  decode ...
    slot 0:   [p p p p]       g       g       .           g
    slot 1:   [p p]           g       EOS ->  [p p p]     g        (freed, then reused)
    slot 2:   [p p p]         g       g       .           g

A long prompt admitted while others decode is prefilled in chunks of `prefill_chunk` tokens, one
chunk between two decode steps, so the others keep streaming (chunked prefill); in the decode
steps between its chunks its slot is parked (it writes a pad where its next chunk will write).
"""
from __future__ import annotations

import dataclasses
import time
from collections import deque

import numpy as np

from trtllm.runtime import interrupt, kv_cache, prompt_scores, sampling
from trtllm.runtime.engine import Engine, StepInputs
from trtllm.runtime.input_fields import MAX_NUM_LOGPROBS as MAX_LOGPROBS
from trtllm.runtime.lora import StepAdapters
from trtllm.runtime.rows import PrefixSource, RowState, Timing
from trtllm.runtime.step_inputs import (GENERATION_HEADROOM, MIN_COMPUTED, RECURRENT_CHUNK, adapter_key, by_width,
                                        key_ids, capacity_for, chunk_end, decode_inputs, kv_need, prefill_inputs,
                                        restore_context_kv, restore_prefix_kv, rounded, runs, runs_to_length,
                                        write_position)

# (RowState, Timing and the step inputs lived here once: callers import them from here still)
__all__ = ["PrefixSource", "RowState", "Timing", "Scheduler", "run_rows", "run_batch", "adapter_key", "chunk_end",
           "decode_inputs", "prefill_inputs", "runs", "write_position"]


class Scheduler:
    """`feed` (trtllm-serve): rows arriving while it runs. `feed(wait)` returns the rows that came
    since its last call, waiting for one when `wait` (nothing else to do), and None once no more
    will come; the scheduler then sizes for any row the engine takes (every slot, the whole KV
    capacity, the most logprobs), since it cannot know them up front."""

    def __init__(self, engine: Engine, rows: list[RowState], num_slots: int, timing: Timing | None,
                 on_token=None, prefixes: PrefixSource | None = None, prefill_chunk: int = 0, feed=None):
        m = engine.manifest
        # Recurrent layers (Mamba-2) keep one state per sequence, not KV per position: nothing restores a
        # prefix's state (saved system prompts, context reuse, a neighbour's shared prompt), and a parked
        # row rides along in decode steps with last_index -1, which leaves its state as it was
        self.recurrent = bool(m.model.state_shapes)
        prefixes = None if self.recurrent else prefixes
        self.engine, self.timing, self.on_token, self.prefixes = engine, timing or Timing(), on_token, prefixes
        self.feed = feed
        # (a chunk of one token would take ONNX Runtime's decode attention: see chunk_end)
        self.prefill_chunk = max(prefill_chunk, MIN_COMPUTED) if prefill_chunk > 0 else 0
        self.capacity = capacity = (m.limits.max_kv_cache_capacity if feed is not None
                                    else capacity_for(rows, m.limits.max_kv_cache_capacity))
        self.pending: deque[RowState] = deque()
        self.add(rows)
        if feed is None:
            num_slots = max(1, min(num_slots, len(self.pending)))
        # A backend with device memory (TensorRT) supplies its own KV storage (at its plan's static
        # capacity, so it never grows); the books are the same. Every prompt fits from the start.
        start = capacity
        if self.grow_kv:
            # a row that cannot stop early fills its whole length: its KV from the start (growing copies
            # the buffers and faults the new pages in mid-run: a 0.5 s step at batch 8, 512 tokens)
            need = [len(r.prompt_ids) + GENERATION_HEADROOM for r in self.pending]
            need += [kv_need(r) for r in self.pending if runs_to_length(r)]
            start = min(capacity, rounded(max(need + [1])))
        self.kv = kv_cache.for_engine(engine, num_slots, start)
        self.kv.limit = max(self.kv.capacity, capacity)
        self.timing.kv_cache_bytes = max(self.timing.kv_cache_bytes, self.kv.nbytes)
        most_logprobs = MAX_LOGPROBS if feed is not None else max([r.params.num_logprobs for r in rows] + [1])
        self.batch = sampling.empty_batch(num_slots, m.model.vocab_size, most_logprobs, m.max_top_k)
        self.active: dict[int, RowState] = {}
        self.lora = StepAdapters(m, num_slots) if m.lora else None
        self.decode_feeds: dict[int, StepInputs] = {}  # per batch width: reused step after step
        self.waiting: dict[int, tuple[int, int]] = {}  # slot -> (leader slot, positions): shared(), to copy

    grow_kv = True  # the KV buffers start small and grow as generation needs (ensure); False: whole
    contexts = None  # --context-reuse: runtime/context_cache.py's ContextCache (run_rows sets it)

    def add(self, rows: list[RowState]) -> None:
        """Rows to run, after those given before."""
        for r in rows:  # the KV buffer bounds what any row can generate (see kv_need)
            r.max_new_tokens = min(r.max_new_tokens, self.capacity + 1 - len(r.prompt_ids))
            # max_generate_length 0: done without a step (nor a slot), unless its prompt is to be scored
            if r.max_new_tokens <= 0 and r.prompt_logprobs is None:
                r.finish_reason = "max-length"
                if self.on_token is not None:  # its stream still ends, with an empty line
                    self.on_token(r)
        self.pending.extend(r for r in rows if not r.finish_reason)

    def fed(self) -> bool:
        """Take what the feed has (waiting for it when idle); False once it is closed and all is done."""
        while self.feed is not None:
            rows = self.feed(not (self.pending or self.active))
            if rows is None:
                self.feed = None
            else:
                self.add(rows)
            # a row ended while it waited (its client went away, the server closes): it takes no slot
            self.pending = deque(r for r in self.pending if not r.finish_reason)
            if self.pending or self.active:
                return True
        return bool(self.pending or self.active)

    def run(self) -> None:
        while self.fed():
            admitted = self.admit()
            self.waiting.update(self.shared(admitted))
            # every prompt not complete: the wave just admitted, and the next chunk of chunked ones
            self.prefill_all([s for s, r in sorted(self.active.items()) if r.prefilling and s not in self.waiting])
            # a follower copies once its leader has computed what it shares (a system prompt: the
            # first chunk of a long leader may hold it)
            ready = sorted(s for s, (leader, n) in self.waiting.items() if self.active[leader].computed >= n)
            for slot in ready:  # what they share of their leader's KV is there now
                leader, n = self.waiting.pop(slot)
                self.copy_prompt(leader, slot, n)
                self.active[slot].num_reused = self.active[slot].computed = n
            self.prefill_all(ready)
            self.fill_masks()  # (the guided rows' next masks, together: after the tokens they took)
            self.release_finished()
            if self.decoding():
                self.decode()
                self.release_finished()
                self.compact()

    def decoding(self) -> list[int]:
        """Slots whose row is generating (its prompt all in its KV, not finished)."""
        return [s for s, r in self.active.items() if not r.prefilling and not r.finish_reason]

    def prefill_all(self, slots: list[int]) -> None:
        for start, stop in runs(slots):
            self.prefill(start, stop)

    def admit(self) -> list[int]:
        m, admitted = self.engine.manifest, []
        while self.pending:
            row = self.pending[0]
            slot = self.kv.acquire(row, kv_need(row))
            if slot is None:
                break
            self.pending.popleft()
            if self.grow_kv:  # (sized for every row up front, unless it came from the feed)
                self.ensure(min(self.kv.limit, kv_need(row) if runs_to_length(row)
                                else len(row.prompt_ids) + GENERATION_HEADROOM))
            row.slot = row.batch_idx = slot
            self.active[slot] = row
            sampling.set_row(self.batch, slot, row.params, m.max_top_k, row.prompt_ids, row.banned, row.repeats)
            self.guide(slot, row)
            if row.prompt_logprobs is None:  # (a scored prompt is computed whole: runtime/prompt_scores.py)
                self.restore_prefix(row)
                self.restore_context(row)
            row.computed = row.num_reused
            admitted.append(slot)
        return admitted

    def shared(self, admitted: list[int]) -> dict[int, tuple[int, int]]:
        """Rows admitted together that share prompt tokens with an earlier one (a request's n
        samples: the whole prompt; a common system prompt: its prefix) copy that row's KV after it is
        prefilled instead of computing it again: slot -> (leader slot, positions to copy). As with a
        saved prefix, MIN_COMPUTED prompt tokens are left to compute, and the logits are the same."""
        leaders: dict[tuple, int] = {}
        followers: dict[int, tuple[int, int]] = {}
        for slot in admitted if not self.recurrent else ():
            row = self.active[slot]
            most = len(row.prompt_ids) - MIN_COMPUTED
            keys = [((adapter_key(row), "prompt", tuple(key_ids(row))), most)]
            if row.prefix_ids and not row.num_reused:  # (restored from the store: its prefix is there already)
                keys.append(((adapter_key(row), "prefix", row.prefix_ids), min(len(row.prefix_ids), most)))
            # (a scored prompt leads, never follows: runtime/prompt_scores.py). A row that restored part
            # of its prompt still follows a leader of the same prompt for the rest (n samples after a
            # saved system prompt: each computed the rest of the prompt itself, twice the time of none)
            found = None if row.prompt_logprobs is not None else \
                next(((leaders[k], n) for k, n in keys if k in leaders and n > row.num_reused), None)
            if found is None:
                for k, _ in keys:
                    leaders.setdefault(k, slot)
                continue
            followers[slot] = found
            leader = self.active[found[0]]
            if row.save_prefix and row.prefix_ids and leader.prefix_ids == row.prefix_ids:
                leader.save_prefix = True  # the same entry: the leader, which computes it, saves it
        return followers

    def copy_prompt(self, leader: int, slot: int, n: int) -> None:
        """A follower's first n positions from its leader (shared)."""
        self.kv.copy_slot(leader, slot, n)

    def restore_prefix(self, row: RowState) -> None:
        """A reused prefix leaves at least MIN_COMPUTED prompt tokens to compute."""
        n = restore_prefix_kv(self.prefixes, self.kv, row.slot, row.prompt_ids, row.prefix_ids, adapter_key(row))
        if n:
            row.num_reused = n

    def restore_context(self, row: RowState) -> None:
        """--context-reuse: the longest prefix of the prompt that an earlier request's KV holds,
        where it is longer than a saved system prompt's; MIN_COMPUTED tokens are left to compute."""
        if row.context_lookup:
            row.num_reused = restore_context_kv(self.contexts, self.kv, row.slot, key_ids(row), adapter_key(row),
                                                row.num_reused)

    def commit_context(self, slot: int, row: RowState) -> bool:
        """--context-reuse: a finished row's KV for later prompts: its prompt's, and (Edge-LLM's
        default policy) its answer's but for the last token, which was never fed back. Whether it
        was kept (a failed or cancelled row, or one whose policy keeps nothing, is not)."""
        if self.contexts is None or row.context_commit is None or row.finish_reason in ("error", "cancelled"):
            return False
        n = row.filled() if row.context_commit == "including_generated_tokens" else min(row.computed, row.filled())
        tokens = tuple([*key_ids(row), *row.output_ids][:n])
        self.contexts.commit(tokens, adapter_key(row), lambda length: self.kv.read(slot, length))
        return True

    def step(self, start: int, stop: int, inputs: StepInputs, drawn: frozenset = frozenset(), want_logits=False):
        """A row draws its random number only when the step's token is its own: not while it is
        prefilling (a chunk, a parked slot), so chunking leaves a seeded row's draws as they were;
        nor in a verification that draws its numbers itself (slots in `drawn`)."""
        interrupt.check()  # an interrupt a finalizer swallowed ends generation here (interrupt.py)
        rows = [self.active.get(s) for s in range(start, stop)]
        sampling.draw(inputs.sampling, [r.uniforms if r is not None and not r.finish_reason and not r.prefilling
                                        and start + b not in drawn else None for b, r in enumerate(rows)])
        if self.lora is not None:
            inputs = dataclasses.replace(inputs, lora=self.lora.feeds(
                start, [StepAdapters.IDLE if r is None else r.adapter for r in rows]))
        t0 = time.perf_counter()
        # a step with a row that asks for logprobs: the logits too, for a drawn token outside the
        # top ones (`accept`), and on EAGLE engines the verified positions' (`emit`)
        want = want_logits or any(r is not None and r.params.num_logprobs and not r.finish_reason for r in rows)
        out = self.engine.step(inputs, self.kv.view(start, stop), want)
        return out, time.perf_counter() - t0

    def accept(self, slot: int, out, b: int) -> None:
        token, top, chosen = int(out.token_ids[b]), None, None
        k = self.active[slot].params.num_logprobs
        if k:  # (so the step gave the logits: `step`)
            # the row's own K of the step's (the largest any row of the run asks for): a token past it
            # takes its value from the logits below whatever the neighbours ask, as it does alone
            top = (out.top_logprobs[b, :k].copy(), out.top_logprob_ids[b, :k].copy())
            at = np.flatnonzero(top[1] == token)
            if len(at):
                chosen = float(top[0][at[0]])
            elif 0 <= token < out.logits.shape[1]:  # drawn outside the top ones (sampled; a penalty, a ban)
                chosen = float(sampling.log_softmax(out.logits[b], self.batch.logit_bias[slot])[token])
        self.accept_token(slot, token, top, finite=bool(np.isfinite(out.top_logprobs[b, 0])), chosen=chosen)

    def accept_token(self, slot: int, token: int, top=None, finite: bool = True, chosen: float | None = None) -> None:
        """`finite`: the row's top log-probability is a number. It is NaN when any logit is NaN or
        +inf (an overflow: a float16 engine, a LoRA adapter with huge weights), and the sampler then
        answers token 0 or a token past the vocabulary: either way that row alone fails."""
        row = self.active[slot]
        if self.banned_all(slot, token):  # (our sampler answers -1 there, the standard-op one 0; before the
            # overflow check: ours reports no logprobs for such a row)
            row.fail(row.dead_end())
            if self.on_token is not None:
                self.on_token(row)
            return
        if not finite or not 0 <= token < self.batch.logit_bias.shape[1]:
            row.fail(f"the request's logits were not finite (NaN or infinite) at its token {len(row.output_ids) + 1}: "
                     f"the model overflowed ({row.overflow_causes()})")
            if self.on_token is not None:
                self.on_token(row)
            return
        try:
            row.accept(token, top, chosen)
        except Exception as e:  # noqa: BLE001 - its text (a tokenizer that cannot take the token): it fails alone
            why = f"taking its token {token} failed ({type(e).__name__}: {e})"
            try:
                row.fail(why)
            except Exception:  # noqa: BLE001 - nor can its text be finished
                row.finish_reason, row.error = "error", why
            if self.on_token is not None:
                self.on_token(row)
            return
        sampling.penalize(self.batch, slot, row.params, row.counts, token, len(row.output_ids), row.banned,
                          row.output_ids, row.repeats)
        if row.guide is not None and not row.finish_reason:
            self.guarded(row, lambda: row.guide.consume(token))  # (its next mask: fill_masks, with the others)
        if row.finish_reason:
            row.guide = None  # (its matcher and mask: a vocabulary's bytes per finished row otherwise)
        if self.on_token is not None:
            self.on_token(row)

    def banned_all(self, slot: int, token: int) -> bool:
        """The row's biases ban every token, so its sampler's answer is none the row may take: the token
        is out of range or banned itself (looked at whole only then: a [V] pass)."""
        bias, penalty = self.batch.logit_bias[slot], self.batch.penalty_bias[slot]
        if 0 <= token < len(bias) and bias[token] != -np.inf and penalty[token] != -np.inf:  # (np.isneginf on
            return False                                                                   # a scalar: 20 us a row)
        return bool(np.isneginf(bias + penalty).all())

    def next_mask(self, slot: int, row: RowState) -> bool:
        """A row whose verified positions are walked one by one (speculation): a guided one's grammar
        mask after the token it just took, the next position's; whether the row goes on (its grammar
        may allow nothing more, or fail)."""
        if row.guide is not None:
            self.fill_masks([slot])
        return not row.finish_reason

    def fill_masks(self, slots=None) -> None:
        """The guided rows' biases for their next tokens (of `slots`, default all), the masks computed
        together (grammar.fill); a row whose grammar allows nothing, or fails, fails alone."""
        rows = {s: r for s, r in self.active.items() if (slots is None or s in slots) and r.guide is not None
                and not r.finish_reason and r.guide.stale}
        if not rows:
            return
        from trtllm.runtime import grammar

        try:
            grammar.fill([r.guide for r in rows.values()])
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException:  # noqa: BLE001 - one at a time below, each row's error its own
            pass
        for s, r in rows.items():
            if not self.guarded(r, lambda: self.guide(s, r)):
                r.guide = None
                if self.on_token is not None:
                    self.on_token(r)

    @staticmethod
    def guarded(row: RowState, call) -> bool:
        """A guided row's matcher call (consume a token, or make its next mask): the reason it gives,
        or anything it raises, fails that row alone. Whether the row goes on."""
        try:
            why = call()
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as e:  # noqa: BLE001 - llguidance's (a Rust panic is a BaseException)
            why = f"`{row.guide.path}`: {type(e).__name__}: {e}"
        if why:
            row.fail(f"guided decoding: {why}")
        return not why

    def guide(self, slot: int, row: RowState) -> str | None:
        """A guided row's logit_bias for its next token: its own, -inf on what the grammar forbids;
        or why no token can come (runner.Runner.check_guide rules that out for the first one)."""
        if row.guide is None:
            return None
        self.batch.version[slot] += 1
        return row.guide.bias(self.batch.logit_bias[slot], row.params.logit_bias)

    def chunk_now(self) -> int:
        """Chunk prompts (0: do not) only while another row is generating: with no stream to keep
        going, a prompt is one step (one graph run; on TensorRT one profile switch). An engine with
        recurrent layers chunks them at RECURRENT_CHUNK at most whatever runs."""
        chunk = self.prefill_chunk if self.prefill_chunk and self.decoding() else 0
        return min(chunk or RECURRENT_CHUNK, RECURRENT_CHUNK) if self.recurrent else chunk

    def prefill(self, start: int, stop: int) -> None:
        rows = [self.active[s] for s in range(start, stop)]
        scoring = [start + b for b, r in enumerate(rows) if prompt_scores.scored(r)]
        if scoring and stop - start > 1:  # a scored prompt runs alone: its logits are [positions, vocabulary]
            for lo, hi in runs([s for s in range(start, stop) if s not in scoring]) + [(s, s + 1) for s in scoring]:
                self.prefill(lo, hi)
            return
        chunk = self.chunk_now()
        if scoring:
            chunk = min(chunk or prompt_scores.SCORE_CHUNK, prompt_scores.SCORE_CHUNK)
        ends = [chunk_end(r, chunk) for r in rows]
        widths = [e - r.computed for r, e in zip(rows, ends)]  # what this step computes of each
        steps = by_width(widths, start)
        if len(steps) > 1:
            # narrowest first: short prompts start generating, and the long ones' chunks interleave
            for lo, hi in sorted(steps, key=lambda st: max(widths[st[0] - start:st[1] - start])):
                self.prefill(lo, hi)
            return
        width = max(widths)
        if stop - start > 1 and max(r.computed for r in rows) + width > self.kv.capacity:
            for s in range(start, stop):  # right-padding would run past a row's buffer: one at a time
                self.prefill(s, s + 1)
            return
        view = sampling.rows(self.batch, start, stop)
        inputs = prefill_inputs(rows, self.engine.manifest.pad_token_id, view, ends)
        first = rows[0].computed
        if scoring:
            inputs = dataclasses.replace(inputs, verify_index=prompt_scores.index(rows[0], first, ends[0]))
        t = self.timing
        t.prefill_tokens += sum(widths)
        for r, e in zip(rows, ends):
            r.computed = e  # (before the step: a row whose prompt is not done yet draws nothing)
        out, elapsed = self.step(start, stop, inputs, want_logits=bool(scoring))
        if scoring and (why := prompt_scores.record(rows[0], first, out.verify_logits[0])):
            rows[0].fail(why)
            if self.on_token is not None:
                self.on_token(rows[0])
        t.prefill_runs += 1
        t.prefill_seconds += elapsed
        t.record("llm_prefill", elapsed)
        for b, r in enumerate(rows):
            if r.prefilling or r.finish_reason:  # a chunk: its token is not the prompt's next one
                continue
            t.reused_tokens += r.num_reused
            if r.max_new_tokens > 0:
                self.accept(start + b, out, b)
            else:  # a prompt scored, nothing to generate (prompt_logprobs, max_generate_length 0)
                r.finish_reason = "max-length"
                if self.on_token is not None:
                    self.on_token(r)
            # (its slot holds the prefix's KV whether computed, copied or restored by --context-reuse:
            # saved unless the store has it, where it came from; no system prompt: nothing to save)
            if (r.save_prefix and self.prefixes and r.prefix_ids and len(r.prefix_ids) <= len(r.prompt_ids)
                    and not self.prefixes.has(r.prefix_ids, adapter_key(r))):
                self.prefixes.save(r.prefix_ids, self.kv.read(r.slot, len(r.prefix_ids)), adapter_key(r))
        self.prefilled(start, rows, inputs, out)

    def prefilled(self, start: int, rows: list[RowState], inputs: StepInputs, out) -> None:
        """After a prefill step's tokens are accepted (the speculative scheduler drafts from here)."""

    def decode(self):
        """One token for every generating row; returns the step's outputs and its time."""
        hi = max(self.decoding()) + 1  # idle and parked slots below it ride along; above it are not computed
        rows = [self.active.get(s) for s in range(hi)]
        self.ensure(max(r.filled() + 1 for r in rows if r is not None and not r.prefilling))  # (parked rows write below)
        reuse = self.decode_feeds.get(hi)
        feeds = decode_inputs(rows, self.engine.manifest.pad_token_id,
                              reuse.sampling if reuse else sampling.rows(self.batch, 0, hi), reuse, self.recurrent)
        self.decode_feeds[hi] = feeds
        out, elapsed = self.step(0, hi, feeds)
        live = [s for s, r in enumerate(rows) if r is not None and not r.finish_reason and not r.prefilling]
        self.timing.generation_runs += 1
        self.timing.generation_seconds += elapsed
        self.timing.record("llm_generation", elapsed)
        self.timing.generated_tokens += len(live)
        for s in live:
            self.accept(s, out, s)
        return out, elapsed

    def ensure(self, need: int) -> None:
        """KV positions 0..need-1 in every slot (as far as the limit goes): the buffers double, at
        least, when they must grow, so the copies cost a few of them in a run."""
        if need > self.kv.capacity:
            self.grow(max(rounded(need), 2 * self.kv.capacity))

    def grow(self, capacity: int) -> None:
        self.kv.grow(capacity)
        self.timing.kv_cache_bytes = max(self.timing.kv_cache_bytes, self.kv.nbytes)

    def compact(self) -> None:
        """With no request waiting for a slot, move the highest live row down into the lowest free
        slot until the live rows are slots 0..n-1. A decode step computes every slot up to the
        highest live one: a long request left in slot 7 of 8 made the run's tail compute 8 rows
        per step for its one (2.6x the time per step on the demo model). A move copies the row's
        KV so far and its sampler rows (about 1 ms for 200 tokens of the demo model)."""
        if self.pending or self.waiting:  # (a waiting row's leader is named by its slot)
            return
        while self.active:
            top = max(self.active)
            free = next((s for s in range(top) if s not in self.active), None)
            if free is None:
                return
            row = self.active.pop(top)
            self.kv.move(top, free, row.filled())
            sampling.move_row(self.batch, top, free)
            self.moved(top, free, row)
            row.slot, self.active[free] = free, row

    def moved(self, src: int, dst: int, row: RowState) -> None:
        """After compact() moved a row's KV and sampler rows (the speculative scheduler's state too)."""

    def release_finished(self) -> None:
        for slot in [s for s, r in self.active.items() if r.finish_reason]:
            row = self.active.pop(slot)
            # a leader that ended before computing what its followers share (it failed mid-chunk): they
            # compute their own prompt (they waited on its slot, which the next row may take)
            for follower in [f for f, (leader, _) in self.waiting.items() if leader == slot]:
                del self.waiting[follower]
            self.waiting.pop(slot, None)  # a follower that ended first (its client went away): nothing to copy
            self.commit_context(slot, row)
            if row.finish_reason == "error":  # (its KV may be NaN: kv_cache.py clear)
                self.kv.clear(slot, slot + 1)
            self.kv.release(slot)


def run_rows(engine: Engine, rows: list[RowState], num_slots: int | None = None, timing: Timing | None = None,
             on_token=None, prefixes: PrefixSource | None = None, drafter=None, prefill_chunk: int = 0,
             contexts=None, lookup=None, feed=None) -> None:
    """Generate until every row has a finish_reason, `num_slots` at a time (default: all at once).
    `on_token(row)` is called after each accepted token (for streaming). `drafter`: an EAGLE
    engine's draft head (runtime/speculative.py), which rows then decode with (those it can
    verify exactly: speculative.py's docstring). `prefill_chunk`: prefill prompts at most this many
    tokens per step while other rows generate (0: whole). `contexts`: --context-reuse's
    ContextCache. `lookup`: --spec-ngram's runtime/ngram.py Lookup, which rows then decode with
    (engines without a drafter; ngram.py's docstring says which rows). `feed`: rows that arrive
    while it runs (Scheduler's docstring); it returns once the feed is closed and all are done."""
    if not rows and feed is None:
        return
    if drafter is not None:
        from trtllm.runtime.speculative import SpecScheduler

        scheduler = SpecScheduler(engine, rows, num_slots or len(rows), timing, on_token, prefixes, drafter,
                                  prefill_chunk, feed=feed)
    elif lookup is not None:
        from trtllm.runtime.ngram import NgramScheduler

        scheduler = NgramScheduler(engine, rows, num_slots or len(rows), timing, on_token, prefixes, prefill_chunk,
                                   lookup=lookup, feed=feed)
    else:
        scheduler = Scheduler(engine, rows, num_slots or len(rows), timing, on_token, prefixes, prefill_chunk, feed)
    scheduler.contexts = None if scheduler.recurrent else contexts
    scheduler.run()


def run_batch(engine: Engine, rows: list[RowState], timing: Timing | None = None, on_token=None) -> None:
    """All rows at once, as one static batch."""
    run_rows(engine, rows, len(rows), timing, on_token)
