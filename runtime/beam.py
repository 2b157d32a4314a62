"""Beam search (a request's `num_beams` > 1): transformers' generate(num_beams=B, do_sample=False),
whose steps it follows one for one (GenerationMixin._beam_search, transformers 5), so the answers
are transformers' tokens and their scores.

Each step the B running beams' next-token log-probabilities (log_softmax of the logits, float32)
are added to the beams' sums, and of all B x V continuations the best K = max(2, 1 + EOS ids) x B
are kept. A kept one that ends (an EOS id, or the length limit) is a finished hypothesis if it is
among the best B: its score is its sum over its generated length ** length_penalty, and the best B
finished ones are kept. The others, best first, are the next step's B running beams, each from the
beam it extends (its KV: that beam's, copied into its slot). It stops when every kept continuation
ends, or when no running beam can beat the worst finished one (transformers' heuristic, per
`early_stopping`: False, the running beam's sum over the current length; "never", over the longest
allowed where length_penalty > 0; True, as soon as B hypotheses have finished).

The request's B beams take B slots side by side of an engine step, which several requests' searches
share (run_many); beam requests run before the others (runtime/beam_requests.py). min_new_tokens
holds the EOS ids back (-inf) for that many tokens, as transformers' MinNewTokensLengthLogitsProcessor
does; stop_token_ids end a hypothesis as EOS does (transformers' eos_token_id list), and stop strings
as its StopStringCriteria does; logit_bias and repetition_penalty shape the log-probabilities as its
processors do (shaped_candidates), and a guide's grammar, bad_words, allowed_token_ids and
no_repeat_ngram_size mask each beam's next tokens. A search
runs its request's LoRA adapter, restores its saved KV, and keeps its tokens' logprobs where asked.
What else a request may set does not apply (runtime/beam_rules.py refuses it).
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field

import numpy as np

from trtllm.runtime import bans, interrupt, kv_cache, prompt_scores, sampling
from trtllm.runtime.beam_candidates import BeamParams, best, shaped_candidates, top_candidates
from trtllm.runtime.engine import StepInputs
from trtllm.runtime.kv_cache import KVCacheManager
from trtllm.runtime.lora import StepAdapters
from trtllm.runtime.rows import overflow_causes
from trtllm.runtime.step_inputs import (RECURRENT_CHUNK, adapter_key, chunk_stop, image_inputs, restore_context_kv,
                                        restore_prefix_kv)

MASK = np.float32(-1.0e9)  # transformers' "very large negative value"


@dataclass(frozen=True)
class Hypothesis:
    tokens: tuple[int, ...]  # generated, an EOS id last where it ended with one
    score: float             # the sum of its tokens' log-probabilities / len(tokens) ** length_penalty
    finished: bool = True    # False: a placeholder no hypothesis replaced (transformers returns it too)
    # with num_logprobs: per token, (its step's best log-probabilities, their ids, its own)
    logprobs: tuple = field(default=(), compare=False)


class Stuck(ValueError):
    """No running beam of a search can take a token (its bans leave none), and none finished."""


class Interrupted(Exception):
    """A search that a Ctrl-C ended: `so_far`, its best hypotheses then (Search.so_far)."""

    def __init__(self, so_far: list):
        super().__init__("interrupted")
        self.so_far = so_far


class Hypotheses(list):
    """A search's hypotheses, best first (placeholders, `finished` False, where fewer finished);
    `stuck`: why it ended early, its running beams' bans leaving no token (None: it did not)."""

    def __init__(self, items=(), stuck: str | None = None):
        super().__init__(items)
        self.stuck = stuck


class Search:
    """One request's beams: `advance` takes each running beam's best next tokens and says which
    beam each next running beam extends (None: the search is over); `hypotheses` gives the answers."""

    def __init__(self, p: BeamParams, prompt_len: int):
        b = p.num_beams
        self.p, self.prompt_len, self.generated = p, prompt_len, 0
        self.keep = max(2, 1 + len(p.eos_ids)) * b
        # the continuations of a beam that can be among the best `keep`: its own best `keep`, and
        # while min_new_tokens holds the EOS ids back, as many more as there are of them
        self.width = self.keep + len(p.eos_ids) * (p.min_new_tokens > 0)
        # (a wider row changes nothing: what it adds is below each beam's best `width`, and the
        # beam-major order of what is kept stays, so ties break as before)
        self.width = max(self.width, p.num_logprobs)
        # num_logprobs: per running and finished beam, per token, (its step's best log-probabilities,
        # their ids, its own)
        self.trace, self.finished_trace = [()] * b, [()] * b
        self.texts = [p.text] * b if p.text is not None else None  # per running beam, its text so far
        self.guides = [p.guide] * b if p.guide is not None else None  # per running beam, its grammar's place
        self.running = [()] * b
        self.running_scores = np.full(b, MASK, np.float32)
        self.running_scores[0] = 0  # (the first step extends beam 0 alone: the others are its copies)
        self.finished = [()] * b
        self.finished_scores = np.full(b, MASK, np.float32)
        self.is_finished = np.zeros(b, bool)
        self.improvable = True  # transformers' is_early_stop_heuristic_unsatisfied
        self.stuck: str | None = None  # why it ended where every running beam's bans left no token

    def advance(self, scores: np.ndarray, ids: np.ndarray, reported=None) -> np.ndarray | None:
        """scores, ids [B, width]: each running beam's best next tokens' log-probabilities, largest
        first, ties lower id first (top_candidates; the graph's top_logprobs). `reported`, where the
        scores are shaped (shaped_candidates): what the answer's logprobs report, (top values [B, k],
        their ids, every token's [B, V]); else those are the scores themselves."""
        p, b, k = self.p, self.p.num_beams, self.p.num_logprobs
        first = scores[:, 0]
        if np.isnan(first).any() or np.isposinf(first).any():  # (NaN where a logit was NaN or +inf)
            raise FloatingPointError(f"the logits were not finite (NaN or infinite) at token {self.generated + 1}: "
                                     f"the model overflowed ({overflow_causes(p.adapter)})")
        if np.isneginf(first).all():  # (a beam its bans leave no token loses to the others, as in transformers)
            self.stuck = self.dead_end(self.generated + 1)
            if not self.is_finished.any():
                raise Stuck(self.stuck)
            return None  # (transformers' search ends there too: no running beam can beat a finished one)
        if k and reported is None:  # (before min_new_tokens; copied: the engine may write its next
            reported = scores[:, :k].copy(), ids[:, :k].copy(), None  # step's outputs over these)
            raw = scores.copy()
        if self.generated < p.min_new_tokens and p.eos_ids:
            scores = np.where(np.isin(ids, list(p.eos_ids)), np.float32(-np.inf), scores)
        width = scores.shape[1]
        summed = (scores + self.running_scores[:, None]).reshape(-1)  # (beam-major: transformers' order)
        top = best(summed, self.keep)
        top_scores, parents, tokens = summed[top], top // width, ids.reshape(-1)[top]
        length = self.generated + 1
        ends = np.array([int(t) in p.eos_ids for t in tokens]) | (length >= p.max_new_tokens)
        if self.texts is not None:  # stop strings: transformers' StopStringCriteria ends a continuation
            texts = [self.texts[beam].fork() for beam in parents]
            # (from token min_new_tokens + 1 on, as plain decoding counts them: runtime/rows.py)
            ends |= np.array([text.push(int(t), check_stops=length > p.min_new_tokens)
                              for text, t in zip(texts, tokens)])
        candidates = [self.running[beam] + (int(t),) for beam, t in zip(parents, tokens)]
        if k:  # per token: (its step's best log-probabilities, their ids, its own)
            values, top_ids, full = reported
            traces = [self.trace[beam] + ((values[beam], top_ids[beam],
                                           float(raw[beam, j] if full is None else full[beam, t])),)
                      for beam, j, t in zip(parents, top % width, tokens)]
        else:
            traces = [()] * len(top)
        # the running beams of the next step: the best that do not end
        open_scores = top_scores + ends.astype(np.float32) * MASK
        nxt = best(open_scores, b)
        self.running, self.running_scores = [candidates[i] for i in nxt], open_scores[nxt]
        self.trace = [traces[i] for i in nxt]
        if self.texts is not None:
            self.texts = [texts[i] for i in nxt]
        if self.guides is not None:  # a continuation that goes on: its parent's grammar past its token
            self.guides = [self.guided(parents[i], int(tokens[i]), open_scores[i]) for i in nxt]
        # finished: those of the best B that end, against the ones so far
        just = ends & (np.arange(self.keep) < b)
        final = (top_scores / np.float32(length ** p.length_penalty)).astype(np.float32)
        if self.is_finished.all() and p.early_stopping is True:
            final = final + MASK
        if not self.improvable:
            final = final + MASK
        final = final + (~just).astype(np.float32) * MASK
        merged_scores = np.concatenate([self.finished_scores, final])
        merged, merged_traces = self.finished + candidates, self.finished_trace + traces
        merged_done = np.concatenate([self.is_finished, just])
        kept = best(merged_scores, b)
        self.finished, self.finished_trace = [merged[i] for i in kept], [merged_traces[i] for i in kept]
        self.finished_scores, self.is_finished = merged_scores[kept], merged_done[kept]
        self.generated = length
        # can a running beam still beat the worst finished one?
        longest = p.max_new_tokens if p.early_stopping == "never" and p.length_penalty > 0 else length
        possible = self.running_scores[0] / np.float32(longest ** p.length_penalty)
        worst = np.where(self.is_finished, self.finished_scores.min(), MASK)
        self.improvable = self.improvable and bool(np.any(possible > worst))
        going = self.improvable and not (self.is_finished.all() and p.early_stopping is True) and not ends.all()
        if not going and not ends.all() and np.isneginf(top_scores[~ends]).all():
            self.stuck = self.dead_end(length, ending=True)  # (what ended it: every continuation that goes on is banned)
        return parents[nxt] if going else None

    def dead_end(self, token: int, ending: bool = False) -> str:
        """Why no running beam can go on at `token`: the settings whose bans leave it none (`ending`:
        none but tokens that end a hypothesis)."""
        p = self.p
        held = token <= p.min_new_tokens and bool(p.eos_ids)
        why = bans.banning(p, held, p.guide is not None)
        if ending:
            return f"no beam can go on at token {token}: {why} ban every token that does not end it"
        return f"no token can come at token {token} of any beam: {why} ban every one"

    def guided(self, parent: int, token: int, score: float):
        """The matcher of a continuation of `parent` by `token` (None where its score is -inf: a token
        its grammar does not allow, which transformers keeps as a beam that can never win)."""
        if self.guides[parent] is None or not np.isfinite(score):
            return None
        matcher = self.guides[parent].copy()
        why = matcher.consume(token)
        if why:
            raise ValueError(f"guided decoding: {why}")
        return matcher

    def so_far(self) -> list:
        """Where an interrupted search stands, best first: its finished hypotheses by score, then its
        running beams by score (each what it had generated)."""
        done = [Hypothesis(t, float(s), True, tr) for t, s, d, tr in
                zip(self.finished, self.finished_scores, self.is_finished, self.finished_trace) if d]
        going = sorted(zip(self.running_scores, range(len(self.running))), key=lambda x: -x[0])
        return sorted(done, key=lambda h: -h.score) + [Hypothesis(self.running[i], float(s), False, self.trace[i])
                                                         for s, i in going]

    def hypotheses(self) -> Hypotheses:
        return Hypotheses([Hypothesis(tokens, float(score), bool(done), trace)
                           for tokens, score, done, trace in zip(self.finished, self.finished_scores, self.is_finished,
                                                                 self.finished_trace)], stuck=self.stuck)


class Beams:
    """One request's search in slots base .. base + B - 1 of a KV cache it shares with others."""

    def __init__(self, prompt_ids: list[int], p: BeamParams, base: int):
        self.prompt, self.p, self.base = prompt_ids, p, base
        self.search = Search(p, len(prompt_ids))
        self.held: list[tuple | None] = [()] + [None] * (p.num_beams - 1)  # per slot: the tokens in its KV
        n = p.no_repeat_ngram_size  # (its prompt's n-grams, indexed once: each step looks up every beam's)
        self.repeats = bans.RepeatedNgrams(n, prompt_ids) if n else None
        self.found = None  # each running beam's best next tokens (scores, ids): what advance takes

    @property
    def slots(self) -> range:
        return range(self.base, self.base + self.p.num_beams)

    def advance(self, kv: KVCacheManager) -> bool:
        """One step of the search on `found`, each beam's KV then its parent's; False: it is over."""
        parents = self.search.advance(*self.found) if self.p.max_new_tokens > 0 else None
        if parents is None:
            return False
        n = len(self.prompt)
        reorder(kv, parents, self.held, n, n + self.search.generated - 1, self.base)
        self.held = list(self.search.running)  # (what the next step computes into each slot)
        return True


def restore(kv: KVCacheManager, slot: int, prompt: list[int], p: BeamParams, prefixes, contexts) -> int:
    """The saved KV the prompt starts from into `slot` (a saved system prompt's, then a longer
    --context-reuse hit's), as runtime/generate.py restores a row's: how many positions it holds.
    `prompt`: its ids as KV is keyed by them (each image's tokens its own: PromptImages.keyed)."""
    reused = restore_prefix_kv(prefixes, kv, slot, prompt, p.prefix_ids, adapter_key(p))
    return restore_context_kv(contexts, kv, slot, prompt, adapter_key(p), reused) if p.context_lookup else reused


def repeat(found, b: int):
    """The prompt step's candidates (arrays of one row, nested in tuples, None) for each of b beams."""
    if isinstance(found, (tuple, list)):
        return tuple(repeat(x, b) for x in found)
    return None if found is None else np.repeat(found, b, axis=0)


def run(engine, prompt_ids: list[int], p: BeamParams, timing=None) -> list[Hypothesis]:
    """Beam search on `engine` (its KV in a cache of its own); the hypotheses best first. `timing`
    (runtime/rows.py Timing) gets its steps."""
    found, _ = run_many(engine, [(prompt_ids, p)], timing, rows=p.num_beams)[0]
    if isinstance(found, Exception):
        raise found
    return found


def run_many(engine, jobs: list[tuple[list[int], BeamParams]], timing=None, done=None, rows: int | None = None,
             prefixes=None, contexts=None) -> list:
    """Several requests' beam searches, their beams sharing the engine's steps (up to `rows` rows,
    default max_batch_size; a search waits for its B slots side by side, and takes those a finished
    one frees): per job, (its hypotheses best first, or the exception that ended it; its first
    slot). A search's steps are its steps alone: a row is computed alike in any batch
    (tests/runtime/test_batch_invariance.py), and its candidates come the same way. `done(job,
    outcome, first slot)` is called as each search ends. A step that fails ends the searches in it
    alone. `prefixes` (runtime/prefix_cache.py), `contexts` (runtime/context_cache.py): the saved
    KV a search's prompt starts from, as plain decoding restores it (runtime/generate.py)."""
    m = engine.manifest
    if m.model.state_shapes:  # (recurrent layers: a state is restored from nothing saved, generate.py's Scheduler)
        prefixes = contexts = None
    # searches run side by side while their beams fit in `limit` rows; one of more beams runs alone
    # (trtllm-run refuses more beams than max_batch_size; ONNX Runtime's batch is not bounded by it)
    limit = rows or m.limits.max_batch_size
    # (no more slots than all the searches' beams: the KV is allocated for each, device memory on TensorRT)
    slots = max(min(limit, sum(p.num_beams for _, p in jobs)), max(p.num_beams for _, p in jobs))
    # (a search's last token is never fed back: its prompt and all its answer but that one)
    kv = kv_cache.for_engine(engine, slots, max(len(prompt) + max(p.max_new_tokens - 1, 0) for prompt, p in jobs))
    widths = [Search(p, len(prompt)).width for prompt, p in jobs]
    # the graph's sampler gives each row's best log-probabilities (log_softmax of the logits, as
    # transformers' beam search takes them) where its width holds them; else they come from the logits
    graph = [w <= m.logprob_width and not p.shaped for w, (_, p) in zip(widths, jobs)]
    params = sampling.SamplingParams(temperature=0.0, max_new_tokens=1,
                                     num_logprobs=max([w for w, g in zip(widths, graph) if g], default=0))
    batch = sampling.make_batch([params] * slots, m.model.vocab_size, m.max_top_k)
    results: list = [None] * len(jobs)
    owner: list[int | None] = [None] * slots  # per slot: the job whose beam it holds
    lora = StepAdapters(m, slots) if m.lora else None  # (each search's beams take its adapter)
    waiting, active = list(range(len(jobs))), {}

    def candidates(out, rows: slice, job: int):
        """The candidates of the search's running beams from the step's `rows` of them (the prompt
        step's one row: beam 0, whose tokens and grammar place all beams share until the first step)."""
        prompt, p = jobs[job]
        if graph[job]:
            return out.top_logprobs[rows, :widths[job]], out.top_logprob_ids[rows, :widths[job]]
        if p.shaped:
            search = active[job].search
            return shaped_candidates(out.logits[rows], p, prompt, search.running, widths[job], search.guides,
                                     active[job].repeats)
        return top_candidates(out.logits[rows], widths[job])

    def timed(kind: str, inputs: StepInputs, start: int, stop: int, logits: bool):
        if lora is not None:
            inputs = dataclasses.replace(inputs, lora=lora.feeds(start, [
                StepAdapters.IDLE if owner[s] is None else jobs[owner[s]][1].adapter for s in range(start, stop)]))
        interrupt.check()  # an interrupt a finalizer swallowed ends the search here (interrupt.py)
        t0 = time.perf_counter()
        out = engine.step(inputs, kv.view(start, stop), want_logits=logits)
        elapsed = time.perf_counter() - t0
        if timing is not None:
            if kind == "llm_prefill":
                timing.prefill_runs += 1
                timing.prefill_tokens += inputs.input_ids.shape[1]
                timing.prefill_seconds += elapsed
            else:
                timing.generation_runs += 1
                timing.generation_seconds += elapsed
            timing.kv_cache_bytes = max(timing.kv_cache_bytes, kv.nbytes)
            timing.record(kind, elapsed)
        return out

    def finish(job: int, outcome) -> None:
        beams = active.pop(job)
        results[job] = (outcome, beams.base)
        if done is not None:
            done(job, outcome, beams.base)
        for slot in beams.slots:
            owner[slot] = None
        if isinstance(outcome, Exception):  # (its KV may be NaN: kv_cache.py clear)
            kv.clear(beams.base, beams.slots.stop)
        elif contexts is not None and beams.p.context_commit:
            contexts.commit(tuple(keyed(beams.p, beams.prompt)), adapter_key(beams.p),
                            lambda length: kv.read(beams.base, length))

    try:
        while waiting or active:
            for job in list(waiting):  # admitted in order, each where its B slots are free side by side
                prompt, p = jobs[job]
                base = next((s for s in range(slots - p.num_beams + 1)
                             if all(o is None for o in owner[s:s + p.num_beams])), None)
                if active and sum(b.p.num_beams for b in active.values()) + p.num_beams > limit:
                    base = None
                if base is None:
                    break  # (it waits, and those after it too: answers keep the requests' order of starting)
                waiting.remove(job)
                beams = active[job] = Beams(prompt, p, base)
                for slot in beams.slots:
                    owner[slot] = job
                n = len(prompt)
                try:
                    # prompt_logprobs: the prompt computed whole (nothing restored), in steps that give
                    # its positions' logits (runtime/prompt_scores.py)
                    reused = 0 if p.scorer is not None else restore(kv, base, keyed(p, prompt), p, prefixes,
                                                                    contexts)
                    start = reused
                    while start < n:
                        chunk = prompt_scores.SCORE_CHUNK if p.scorer is not None else \
                            RECURRENT_CHUNK if m.model.state_shapes else 0  # (0: the prompt whole)
                        end = chunk_stop(n, start, chunk, p.images)
                        out = timed("llm_prefill", StepInputs(
                            input_ids=np.array([prompt[start:end]], np.int64), position_ids=np.arange(start, end)[None],
                            write_index=np.array([start], np.int64), last_index=np.array([end - start - 1], np.int64),
                            sampling=sampling.rows(batch, 0, 1), prompt=True,
                            verify_index=None if p.scorer is None else prompt_scores.index(p.scorer, start, end),
                            **image_inputs([(0, p.images, start, end)])),
                            base, base + 1, not graph[job] or p.scorer is not None)
                        why = None if p.scorer is None else prompt_scores.record(p.scorer, start, out.verify_logits[0])
                        if why:
                            raise FloatingPointError(why)
                        start = end
                    if timing is not None:
                        timing.reused_tokens += reused
                    if (p.save_prefix and prefixes and p.prefix_ids and len(p.prefix_ids) <= n
                            and not prefixes.has(p.prefix_ids, adapter_key(p))):  # (as generate.py's prefill)
                        prefixes.save(p.prefix_ids, kv.read(base, len(p.prefix_ids)), adapter_key(p))
                    # (beams 1.. are beam 0 until the first step)
                    beams.found = repeat(candidates(out, slice(0, 1), job), p.num_beams)
                except Exception as e:  # noqa: BLE001 - its own failure
                    finish(job, e)
            going = []
            for job, beams in list(active.items()):
                try:
                    if beams.advance(kv):
                        going.append(job)
                    else:
                        finish(job, beams.search.hypotheses())
                except Exception as e:  # noqa: BLE001 - its own failure (non-finite logits)
                    finish(job, e)
            if not going:
                continue
            lo, hi = min(active[j].base for j in going), max(active[j].slots.stop for j in going)
            span = hi - lo  # the slots between the searches' that are idle take a pad token at position 0
            ids, pos = np.full((span, 1), m.pad_token_id, np.int64), np.zeros(span, np.int64)
            shift = np.zeros(span, np.int64)  # (multimodal RoPE: each beam's prompt's shift past its images)
            for job in going:
                beams = active[job]
                at = slice(beams.base - lo, beams.slots.stop - lo)
                ids[at, 0] = [beam[-1] for beam in beams.search.running]
                pos[at] = len(beams.prompt) + beams.search.generated - 1  # where each running beam's last token goes
                shift[at] = beams.p.images.rope_delta if beams.p.images is not None else 0
            try:
                out = timed("llm_generation", StepInputs(input_ids=ids, position_ids=pos[:, None], write_index=pos,
                                                          last_index=np.zeros(span, np.int64),
                                                          sampling=sampling.rows(batch, 0, span),
                                                          rope_delta=shift if shift.any() else None), lo, hi,
                            not all(graph[j] for j in going))
            except Exception as e:  # noqa: BLE001 - the step's searches fail; those waiting still run
                for job in going:
                    finish(job, e)
                continue
            if timing is not None:  # (a token for each running beam, as generate.py counts each running row)
                timing.generated_tokens += sum(active[job].p.num_beams for job in going)
            for job in going:
                beams = active[job]
                beams.found = candidates(out, slice(beams.base - lo, beams.slots.stop - lo), job)
    except KeyboardInterrupt:  # Ctrl-C: each running search's answers so far, then on up (runner.py)
        for job, beams in list(active.items()):
            if done is not None:
                done(job, Interrupted(beams.search.so_far()), beams.base)
        raise
    return results


def keyed(p: BeamParams, prompt: list[int]) -> list[int]:
    """The prompt's ids as its KV is keyed (an image's tokens by the image's own id: runtime/media.py)."""
    return prompt if p.images is None else p.images.keyed


def reorder(kv: KVCacheManager, parents: np.ndarray, held: list, prompt_len: int, length: int, base: int = 0) -> list:
    """Each slot's KV up to `length` from the slot of the beam it extends, whose tokens it now
    holds (returned). Only from the first position where the two slots' tokens differ: the prompt
    and a common start are the same KV in both (it depends on the tokens before it alone, and the
    engine computes a row alike in any batch). One copy for all slots: its source is read first,
    as slots trade places. `base`: the search's first slot. A slot that holds nothing yet (None: the
    first step's copies of beam 0, whose prompt only beam 0's slot computed) is read as beam 0's: a
    continuation of a copy, which bans that leave beam 0 fewer tokens than beams let run, took another
    slot's KV, never computed (or a previous search's)."""
    parents = np.array([0 if held[parent] is None else parent for parent in parents], np.int64)
    starts = [0 if mine is None else prompt_len + common(mine, held[parent]) for mine, parent in zip(held, parents)]
    moved = np.array([i for i, start in enumerate(starts) if start < length], np.int64)
    if len(moved):
        kv.copy_positions(base + moved, base + parents[moved], min(starts[i] for i in moved), length)
    return [held[parent] for parent in parents]


def common(a: tuple, b: tuple) -> int:
    """The length of the two token sequences' common start."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
