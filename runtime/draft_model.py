"""Draft-model speculative decoding (trtllm-run --spec-draft-engine DIR): vLLM's draft model,
llama.cpp's --model-draft.

A second engine, smaller or more quantized, of the model's vocabulary, proposes each row's next k
tokens; the model checks them in one step, as prompt lookup's guesses are checked (runtime/ngram.py's
NgramScheduler: the answer is plain decoding's, greedy and sampled, whatever the draft proposes).

The draft keeps a KV slot per row, holding a prefix of the row's text (`held`). A step first catches
the draft up on what the row took since (its prompt, in chunks, the first time; then the tokens the
model accepted and its own last one), which gives the first guess, then runs one-token steps for the
rest, all rows of the step together. A greedy row's guess is the draft's argmax; a sampled row's, the
draw its next random number would make from the draft's best candidates (sampling.propose, as an
EAGLE head guesses), so that guess and draw agree as often as the two models' distributions do. A
row stops drafting where the draft's best token is less likely than P_MIN (llama.cpp's --draft-p-min):
a guess the draft is unsure of is seldom the model's, and widens the step for nothing.

A slot keeps its KV when its row leaves: a new row takes the free slot whose KV begins as its text
does, or copies another slot's where that holds more of it, or, started with others, copies what one
of them computes (a common system prompt, as the model's own rows share theirs), and catches up on
the rest.

What the draft wrote for guesses the model did not take lies past its row's held prefix, where the
next catch-up writes before anything reads it. A row whose text no longer fits the draft's KV
capacity, that holds an id the draft has not (a padded one), or beyond the draft's batch size,
decodes plainly.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

from trtllm.runtime import kv_cache, sampling
from trtllm.runtime.engine import Engine, StepInputs
from trtllm.runtime.manifest import Manifest
from trtllm.runtime.rows import RowState, Timing
from trtllm.runtime.step_inputs import rounded

DRAFTS = 8  # --spec-draft-step auto: guesses a step at most (fewer where the draft is unsure)
CANDIDATES = 8  # a sampled row's guess is drawn among the draft's best 8 tokens (sampling.propose)
CHUNK = 256  # the most tokens of a row's text the draft catches up on in one step
SHARED_MIN = 16  # a new row copies another slot's KV of its text's beginning from this many tokens on
P_MIN = 0.1  # a row stops drafting at a guess the draft gives less than this probability


def shared(a: list[int], b: list[int]) -> int:
    """How many tokens a and b begin with alike."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    return int(np.argmin(np.equal(a[:n], b[:n])))  # (the first that differs)


class DraftError(ValueError):
    """A draft engine that cannot draft for this one (trtllm-run says so and exits 2)."""


def check_pair(draft: Manifest, draft_dir, model: Manifest, model_dir, draft_vocab: dict[str, int],
               vocab: dict[str, int]) -> None:
    """The draft (its manifest and its tokenizer's vocabulary) must be an ONNX Runtime engine without
    an EAGLE head that speaks the model's vocabulary: each token the same id in both tokenizers (an
    embedding padded past the tokenizer's ids, as Qwen2.5's sizes differ, is fine)."""
    if draft.eagle:
        raise DraftError(f"{draft_dir} has an EAGLE draft head: build the draft engine without --eagle")
    if draft.backend != "onnxruntime":
        raise DraftError(f"{draft_dir} is a {draft.backend} engine: a draft engine is an ONNX Runtime one")
    if draft_vocab != vocab:
        differ = sorted(set(draft_vocab.items()) ^ set(vocab.items()), key=lambda kv: (kv[1], kv[0]))
        token, _ = differ[0]
        raise DraftError(f"{draft_dir}'s tokenizer is not {model_dir}'s ({len(draft_vocab)} and {len(vocab)} "
                         f"tokens; {token!r} is id {draft_vocab.get(token)} there, {vocab.get(token)} here): a "
                         "draft model must share the model's vocabulary")
    if draft.model.vocab_size < (least := min(model.model.vocab_size, len(vocab))):
        raise DraftError(f"{draft_dir}'s embedding has {draft.model.vocab_size} ids, fewer than the model's "
                         f"{least}: a draft model must share the model's vocabulary")


def check(draft_dir, model: Manifest, model_dir, vocab: dict[str, int]) -> None:
    """check_pair for the engine directory `draft_dir`, from its manifest and tokenizer alone (before
    any engine loads). A broken engine directory raises manifest.ManifestError."""
    from trtllm.runtime import manifest as mf
    from trtllm.runtime.tokenizer import Tokenizer

    draft = mf.load(draft_dir)
    try:
        draft_vocab = Tokenizer.from_engine_dir(draft_dir, draft.files).vocab()
    except Exception as e:  # noqa: BLE001 - a missing or broken tokenizer file: the engine dir is incomplete
        raise DraftError(f"{draft_dir}: its tokenizer cannot be loaded ({type(e).__name__}: {e}); rebuild it "
                         "with trtllm-build") from e
    check_pair(draft, draft_dir, model, model_dir, draft_vocab, vocab)


def load(draft_dir, draft_step: int | str, **options) -> DraftModel | None:
    """The draft engine in `draft_dir` (checked with `check`), drafting --spec-draft-step tokens
    (auto: up to DRAFTS, while that pays; 0: None, no drafting). `options`: load_engine's."""
    from trtllm.runtime.engine import load_engine

    if draft_step == 0:
        return None
    return DraftModel(load_engine(draft_dir, **options), DRAFTS if draft_step == "auto" else draft_step,
                      adaptive=draft_step == "auto")


@dataclass
class DraftModel:
    """trtllm-run --spec-draft-engine: up to k guesses a step from `engine`, the draft (checked with
    `check`). `adaptive`: check guesses only while that gives more tokens per second than plain
    steps (ngram.Pace, which counts the draft's time). The two engines take turns: loaded with
    shared_threads=True (backends/onnxruntime.py session_options) they share one pool of workers."""

    engine: Engine
    k: int
    adaptive: bool = True
    p_min: float = P_MIN

    def __post_init__(self):
        # A session's first step takes its memory and sets up its kernels (390 ms for the demo's int4
        # draft, against 7 ms after): here, not in the first step whose guesses Pace measures.
        m = self.engine.manifest
        kv = kv_cache.for_engine(self.engine, 1, 16)
        self.engine.step(StepInputs(input_ids=np.full((1, 1), m.pad_token_id, np.int64),
                                    position_ids=np.zeros((1, 1), np.int64), write_index=np.zeros(1, np.int64),
                                    last_index=np.zeros(1, np.int64),
                                    sampling=sampling.empty_batch(1, m.model.vocab_size, 1, m.max_top_k)),
                         kv.view(0, 1))

    def proposer(self, num_slots: int, timing: Timing, capacity: int, vocab_size: int) -> DraftSlots:
        """A run's draft KV: `num_slots` rows, starting at `capacity` positions (the model's start);
        `vocab_size`: the model's ids (a guess past them is no token of its)."""
        return DraftSlots(self, num_slots, timing, capacity, vocab_size)


@dataclass
class DraftSlots:
    """One run's draft KV: a slot per row (by identity: the scheduler moves rows between its slots)."""

    model: DraftModel
    num_slots: int
    timing: Timing
    capacity: int
    vocab_size: int
    # What the last `guesses` cost a step, for the scheduler's Pace: the draft's time but for its
    # catch-ups on new rows' prompts (its prefill, in timing.prefill_seconds) and on rows behind by more
    # than a step's tokens (plain steps were taken meanwhile: what a probe of guessing costs once)
    cost: float = 0.0
    timed = True  # (its guesses' time counts against guessing: ngram.Lookup's does not)
    left_out: list = field(default_factory=lambda: [0.0, 0.0])  # this call's (prefill, behind) seconds
    owner: list = field(init=False)  # draft slot -> its row, or None
    # draft slot -> the tokens whose KV it holds (positions 0..), kept when its row leaves
    held: list = field(init=False)
    fresh: set = field(init=False)   # slots given to a new row since the last catch-up

    def __post_init__(self):
        m = self.model.engine.manifest
        n = max(1, min(self.num_slots, m.limits.max_batch_size))
        self.owner, self.held, self.fresh = [None] * n, [[] for _ in range(n)], set()
        self.kv = kv_cache.for_engine(self.model.engine, n, min(self.capacity, m.limits.max_kv_cache_capacity))
        self.kv.limit = m.limits.max_kv_cache_capacity
        self.batch = sampling.empty_batch(n, m.model.vocab_size, min(CANDIDATES, m.logprob_width), m.max_top_k)
        self.pad = m.pad_token_id
        self.ids = min(self.vocab_size, m.model.vocab_size)  # ids both models have

    def guesses(self, rows: list[RowState | None], left: dict[int, int]) -> dict[int, list[int]]:
        """slot -> its guesses, at most left[slot] (and the draft's k) for each slot in `left`. Their
        time is the decode step's (timing.generation_seconds, the draft_proposal stage) where the
        draft ran, but for its prefill (catch_up); `cost` says what Pace counts of it."""
        t0, runs, self.left_out[:] = time.perf_counter(), self.timing.draft_runs, [0.0, 0.0]
        out = self.draft(rows, left)
        prefill, behind = self.left_out
        drafting = time.perf_counter() - t0 - prefill
        if self.timing.draft_runs > runs:
            t = self.timing
            t.draft_seconds += drafting
            t.generation_seconds += drafting
            t.record("spec_decode_draft_proposal", drafting)
        self.cost = drafting - behind
        return out

    def draft(self, rows: list[RowState | None], left: dict[int, int]) -> dict[int, list[int]]:
        live = {id(r) for r in rows if r is not None and not r.finish_reason}
        for d, r in enumerate(self.owner):
            if r is not None and id(r) not in live:
                self.owner[d] = None  # (its KV kept: a later row's prompt may begin the same way)
        want = {}  # draft slot -> (scheduler slot, row, text, most guesses)
        for s, most in left.items():
            r, most = rows[s], min(most, self.model.k)
            text = r.prompt_ids + r.output_ids
            if len(text) + most > self.kv.limit or max(text) >= self.ids:
                # past the draft's KV, or holding an id it has not (a padded one a logit_bias chose):
                # its text only grows, so its slot goes to others
                self.release(r)
                continue
            if (d := self.slot_of(r, text)) is not None:
                want[d] = (s, r, text, most)
        if not want:
            return {}
        tops = self.catch_up({d: text for d, (_, _, text, _) in want.items()})
        numbers = {d: r.peek(most) for d, (_, r, _, most) in want.items() if r.params.temperature > 0}
        drafts = {d: [] for d in want}
        going = set(want)
        while going:
            for d in sorted(going):
                _, r, _, most = want[d]
                guess = self.choose(*tops[d], r, numbers.get(d, ()), len(drafts[d]))
                if guess is None:
                    going.discard(d)
                    continue
                drafts[d].append(guess)
                if len(drafts[d]) == most:
                    going.discard(d)
            if going:
                tops = self.step({d: [drafts[d][-1]] for d in going})
        return {want[d][0]: g for d, g in drafts.items() if g}

    def choose(self, top_lp, top_ids, row: RowState, numbers, j: int) -> int | None:
        """A row's j-th guess from the draft's best tokens (`top_ids`, with their log-probabilities),
        or None where the draft is unsure (P_MIN) or the guess is not a token of the model's."""
        if not top_ids.size or not math.exp(float(top_lp[0])) >= self.model.p_min:  # (NaN logits: no guess)
            return None
        if numbers:
            guess = sampling.propose(row.params, top_ids, top_lp, float(numbers[j]))
        else:
            guess = int(top_ids[0])
        return guess if 0 <= guess < self.ids else None

    def slot_of(self, row: RowState, text: list[int]) -> int | None:
        """The row's draft slot; for a new row, the free one whose KV begins as its text does
        longest (a common system prompt), else the first free one."""
        for d, r in enumerate(self.owner):
            if r is row:
                return d
        free = [d for d, r in enumerate(self.owner) if r is None]
        if not free:
            return None
        d = max(free, key=lambda d: (shared(self.held[d], text), -d))
        self.owner[d] = row
        self.fresh.add(d)
        return d

    def release(self, row: RowState) -> None:
        for d, r in enumerate(self.owner):
            if r is row:
                self.owner[d] = None

    def catch_up(self, texts: dict[int, list[int]]) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        """Feed each draft slot the tokens of its text it does not hold (at least the last), in
        chunks of CHUNK: slot -> the draft's best tokens after its text (log-probabilities, ids)."""
        t0, prompts = time.perf_counter(), bool(self.fresh & set(texts))
        self.fresh.clear()
        for d, text in texts.items():
            held, n = self.held[d], len(self.held[d])
            if text[:n] != held:  # (list comparisons, in C: a long text's prefix, every step)
                # it holds the row's text before the last step and that step's guesses past it (or
                # another row's text: a slot freed and taken again)
                n = max(0, n - self.model.k - 1)
                n = n if text[:n] == held[:n] else shared(held, text)
            self.held[d] = text[:min(n, len(text) - 1)]
        # A row far behind (a new one) copies what another slot holds of its text where that is more
        # (rows with one system prompt, one after another), or, where another row of this catch-up
        # will compute more of it (rows started together), waits for it and copies that
        followers = {}  # slot -> (the slot it copies after the others' catch-up, how many positions)
        for d in sorted(texts):  # (a leader is a lower slot, decided before)
            text = texts[d]
            if len(text) - len(self.held[d]) > self.model.k + 1:
                e = max(range(len(self.held)), key=lambda e: shared(self.held[e], text) if e != d else -1)
                n = min(shared(self.held[e], text), len(text) - 1)
                if e != d and n >= len(self.held[d]) + SHARED_MIN:
                    self.kv.copy_slot(e, d, n)
                    self.held[d] = text[:n]
                leads = [(min(shared(texts[f], text), len(text) - 1), f) for f in texts if f < d and f not in followers]
                if leads and (lead := max(leads))[0] >= len(self.held[d]) + SHARED_MIN:
                    followers[d] = lead[1], lead[0]
        behind = max(len(t) - len(self.held[d]) for d, t in texts.items()) > self.model.k + 1
        done = self.feed({d: text[len(self.held[d]):] for d, text in texts.items() if d not in followers})
        for d, (f, n) in followers.items():  # (f holds its whole text now)
            self.kv.copy_slot(f, d, n)
            self.held[d] = texts[d][:n]
        done.update(self.feed({d: texts[d][len(self.held[d]):] for d in followers}))
        elapsed = time.perf_counter() - t0
        if prompts:  # a new row's prompt: the draft's prefill
            self.left_out[0] += elapsed
            self.timing.prefill_seconds += elapsed
            self.timing.record("spec_decode_draft_prefill", elapsed)
        elif behind:
            self.left_out[1] += elapsed
        return done

    def feed(self, pending: dict[int, list[int]]) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        """catch_up's steps: each slot's pending tokens after what it holds."""
        done = {}
        while pending:
            # Every slot a step covers writes its width from where it is, which must stay within the
            # draft's KV: each text fits it, but not every one padded to the longest catch-up's
            # chunk (a row near the limit beside a new prompt). Then each slot catches up alone.
            width = min(CHUNK, max(map(len, pending.values())))
            if self.fits(min(pending), max(pending) + 1, width):
                feeds = [{d: p[:width] for d, p in pending.items()}]
            else:
                feeds = [{d: p[:min(CHUNK, self.kv.limit - len(self.held[d]))]} for d, p in pending.items()]
            for feed in feeds:
                tops = self.step(feed)
                for d, p in feed.items():
                    pending[d] = pending[d][len(p):]
                    if not pending[d]:
                        done[d] = tops[d]
                        del pending[d]
        return done

    def fits(self, lo: int, hi: int, width: int) -> bool:
        """Whether a step over draft slots lo..hi-1, `width` tokens each, stays within the draft's KV."""
        return all(len(self.held[d]) + width <= self.kv.limit for d in range(lo, hi))

    def step(self, feed: dict[int, list[int]]) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        """One draft step over the slots from the least to the greatest in `feed`: each of those
        writes its tokens after what it holds (and holds them after); the others write pads past
        their held prefix (or at 0, forgetting it where that would pass the limit: catch-ups never
        let it, `fits`), which later steps overwrite before reading. Slot -> the draft's best tokens
        after its feed (log-probabilities, ids)."""
        lo, hi = min(feed), max(feed) + 1
        width = max(map(len, feed.values()))
        starts = np.zeros(hi - lo, np.int64)
        ids = np.full((hi - lo, width), self.pad, np.int64)
        last = np.zeros(hi - lo, np.int64)
        for b, d in enumerate(range(lo, hi)):
            start = len(self.held[d])
            if d not in feed and start + width > self.kv.limit:
                self.held[d], start = [], 0
            starts[b] = start
            if d in feed:
                ids[b, :len(feed[d])] = feed[d]
                last[b] = len(feed[d]) - 1
        if (need := int(starts.max()) + width) > self.kv.capacity:  # (doubling: a few copies a run)
            self.kv.grow(max(rounded(need), 2 * self.kv.capacity))
        self.timing.draft_kv_bytes = max(self.timing.draft_kv_bytes, self.kv.nbytes)
        inputs = StepInputs(input_ids=ids, position_ids=starts[:, None] + np.arange(width),
                            write_index=starts, last_index=last, sampling=sampling.rows(self.batch, lo, hi))
        out = self.model.engine.step(inputs, self.kv.view(lo, hi))
        for d, tokens in feed.items():
            self.held[d] = self.held[d] + tokens
        self.timing.draft_runs += 1
        return {d: (out.top_logprobs[d - lo], out.top_logprob_ids[d - lo]) for d in feed}

