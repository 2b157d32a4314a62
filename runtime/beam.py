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

The request's B beams take B slots of an engine step, for the request alone: beam requests run
one after another, before the others (runtime/runner.py). min_new_tokens holds the EOS ids back
(-inf) for that many tokens, as transformers' MinNewTokensLengthLogitsProcessor does; stop_token_ids
end a hypothesis as EOS does (transformers' eos_token_id list). Nothing else of the sampling
settings applies (runtime/beam_rules.py refuses them).
"""
from __future__ import annotations

import itertools
import time
from dataclasses import dataclass

import numpy as np

from trtllm.runtime import sampling
from trtllm.runtime.engine import StepInputs
from trtllm.runtime.kv_cache import KVCacheManager

MASK = np.float32(-1.0e9)  # transformers' "very large negative value"


@dataclass(frozen=True)
class Hypothesis:
    tokens: tuple[int, ...]  # generated, an EOS id last where it ended with one
    score: float             # the sum of its tokens' log-probabilities / len(tokens) ** length_penalty
    finished: bool = True    # False: a placeholder no hypothesis replaced (transformers returns it too)


@dataclass(frozen=True)
class BeamParams:
    num_beams: int
    max_new_tokens: int
    eos_ids: frozenset[int]
    min_new_tokens: int = 0
    length_penalty: float = 1.0
    early_stopping: bool | str = False  # False, True or "never"


def best(values: np.ndarray, k: int) -> np.ndarray:
    """The indices of the k largest, largest first, ties to the lower index (a partition first:
    B x V scores a step, where a sort of them all would cost more than the rest of the search)."""
    if len(values) > 4 * k:
        kth = values[np.argpartition(values, len(values) - k)[len(values) - k]]
        at_least = np.flatnonzero(values >= kth)  # (every tie with the k-th too)
        return at_least[np.argsort(-values[at_least], kind="stable")[:k]]
    return np.argsort(-values, kind="stable")[:k]


def top_candidates(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Each row's k best log-probabilities and their ids, largest first, ties lower id first: what
    the graph's top_logprobs give, computed on the host as the sampler's twin does (sampling.py),
    for a width the graph has not got."""
    rows = [sampling.top_logprobs(sampling.log_softmax(row, np.float32(0)), k) for row in logits]
    return np.stack([values for values, _ in rows]), np.stack([ids for _, ids in rows])


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
        self.running = [()] * b
        self.running_scores = np.full(b, MASK, np.float32)
        self.running_scores[0] = 0  # (the first step extends beam 0 alone: the others are its copies)
        self.finished = [()] * b
        self.finished_scores = np.full(b, MASK, np.float32)
        self.is_finished = np.zeros(b, bool)
        self.improvable = True  # transformers' is_early_stop_heuristic_unsatisfied

    def advance(self, scores: np.ndarray, ids: np.ndarray) -> np.ndarray | None:
        """scores, ids [B, width]: each running beam's best next tokens' log-probabilities, largest
        first, ties lower id first (top_candidates; the graph's top_logprobs)."""
        p, b = self.p, self.p.num_beams
        if not np.isfinite(scores[:, 0]).all():  # (NaN where a logit was NaN or +inf)
            raise FloatingPointError(f"the logits were not finite (NaN or infinite) at token {self.generated + 1}: "
                                     "the model overflowed")
        if self.generated < p.min_new_tokens and p.eos_ids:
            scores = np.where(np.isin(ids, list(p.eos_ids)), np.float32(-np.inf), scores)
        width = scores.shape[1]
        summed = (scores + self.running_scores[:, None]).reshape(-1)  # (beam-major: transformers' order)
        top = best(summed, self.keep)
        top_scores, parents, tokens = summed[top], top // width, ids.reshape(-1)[top]
        length = self.generated + 1
        ends = np.array([int(t) in p.eos_ids for t in tokens]) | (length >= p.max_new_tokens)
        candidates = [self.running[beam] + (int(t),) for beam, t in zip(parents, tokens)]
        # the running beams of the next step: the best that do not end
        open_scores = top_scores + ends.astype(np.float32) * MASK
        nxt = best(open_scores, b)
        self.running, self.running_scores = [candidates[i] for i in nxt], open_scores[nxt]
        # finished: those of the best B that end, against the ones so far
        just = ends & (np.arange(self.keep) < b)
        final = (top_scores / np.float32(length ** p.length_penalty)).astype(np.float32)
        if self.is_finished.all() and p.early_stopping is True:
            final = final + MASK
        if not self.improvable:
            final = final + MASK
        final = final + (~just).astype(np.float32) * MASK
        merged_scores = np.concatenate([self.finished_scores, final])
        merged = self.finished + candidates
        merged_done = np.concatenate([self.is_finished, just])
        kept = best(merged_scores, b)
        self.finished = [merged[i] for i in kept]
        self.finished_scores, self.is_finished = merged_scores[kept], merged_done[kept]
        self.generated = length
        # can a running beam still beat the worst finished one?
        longest = p.max_new_tokens if p.early_stopping == "never" and p.length_penalty > 0 else length
        possible = self.running_scores[0] / np.float32(longest ** p.length_penalty)
        worst = np.where(self.is_finished, self.finished_scores.min(), MASK)
        self.improvable = self.improvable and bool(np.any(possible > worst))
        going = self.improvable and not (self.is_finished.all() and p.early_stopping is True) and not ends.all()
        return parents[nxt] if going else None

    def hypotheses(self) -> list[Hypothesis]:
        return [Hypothesis(tokens, float(score), bool(done))
                for tokens, score, done in zip(self.finished, self.finished_scores, self.is_finished)]


def run(engine, prompt_ids: list[int], p: BeamParams, timing=None) -> list[Hypothesis]:
    """Beam search on `engine` (its KV in a cache of its own: B slots, prompt + max_new_tokens
    positions); the hypotheses best first. `timing` (runtime/rows.py Timing) gets its steps."""
    m, b, n = engine.manifest, p.num_beams, len(prompt_ids)
    search = Search(p, n)
    # the graph's sampler gives each row's best log-probabilities (log_softmax of the logits, as
    # transformers' beam search takes them) where its width holds them; else they come from the logits
    graph = search.width <= m.logprob_width
    params = sampling.SamplingParams(temperature=0.0, max_new_tokens=max(p.max_new_tokens, 1),
                                     num_logprobs=search.width if graph else 0)
    batch = sampling.make_batch([params] * b, m.model.vocab_size, m.max_top_k)
    kv = KVCacheManager(m.model, b, n + p.max_new_tokens)

    def candidates(out, rows: int):
        if graph:
            return out.top_logprobs[:rows], out.top_logprob_ids[:rows]
        return top_candidates(out.logits[:rows], search.width)

    t0 = time.perf_counter()
    prompt = StepInputs(input_ids=np.array([prompt_ids], np.int64), position_ids=np.arange(n)[None],
                        write_index=np.zeros(1, np.int64), last_index=np.array([n - 1], np.int64),
                        sampling=sampling.rows(batch, 0, 1), prompt=True)
    out = engine.step(prompt, kv.view(0, 1), want_logits=not graph)
    elapsed = time.perf_counter() - t0
    if timing is not None:
        timing.prefill_runs, timing.prefill_tokens = timing.prefill_runs + 1, timing.prefill_tokens + n
        timing.prefill_seconds += elapsed
        timing.kv_cache_bytes = max(timing.kv_cache_bytes, kv.nbytes)
        timing.record("llm_prefill", elapsed)
    found = [np.repeat(x, b, axis=0) for x in candidates(out, 1)]  # (beams 1.. are beam 0 until the first step)
    held: list[tuple | None] = [()] + [None] * (b - 1)  # per slot: the generated tokens in its KV (None: no prompt)
    while p.max_new_tokens > 0 and (parents := search.advance(*found)) is not None:
        pos = n + search.generated - 1  # where each running beam's last token goes
        held = reorder(kv, parents, held, n, pos)
        last = np.array([[beam[-1]] for beam in search.running], np.int64)
        t0 = time.perf_counter()
        out = engine.step(StepInputs(input_ids=last, position_ids=np.full((b, 1), pos, np.int64),
                                     write_index=np.full(b, pos, np.int64), last_index=np.zeros(b, np.int64),
                                     sampling=sampling.rows(batch, 0, b)), kv.view(0, b), want_logits=not graph)
        elapsed = time.perf_counter() - t0
        if timing is not None:
            timing.generation_runs, timing.generation_seconds = timing.generation_runs + 1, \
                timing.generation_seconds + elapsed
            timing.record("llm_generation", elapsed)
        found = candidates(out, b)
        held = list(search.running)
    if timing is not None:
        timing.generated_tokens += search.generated
    return search.hypotheses()


def reorder(kv: KVCacheManager, parents: np.ndarray, held: list, prompt_len: int, length: int) -> list:
    """Each slot's KV up to `length` from the slot of the beam it extends, whose tokens it now
    holds (returned). Only from the first position where the two slots' tokens differ: the prompt
    and a common start are the same KV in both (it depends on the tokens before it alone, and the
    engine computes a row alike in any batch). One copy for all slots: its source is read first,
    as slots trade places."""
    starts = [0 if mine is None else prompt_len + common(mine, held[parent]) for mine, parent in zip(held, parents)]
    moved = np.array([i for i, start in enumerate(starts) if start < length], np.int64)
    if len(moved):
        start = min(starts[i] for i in moved)
        for buf in kv.buffers:
            buf[moved, :, start:length] = buf[parents[moved], :, start:length]
    return [held[parent] for parent in parents]


def common(a: tuple, b: tuple) -> int:
    """The length of the two token sequences' common start."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def unrunnable(req, index: int, manifest) -> str | None:
    """Why this engine cannot run a request's beam search (it fails alone), or None."""
    where = f"requests[{index}].num_beams" if "num_beams" in req.own_fields else "num_beams"
    if req.num_beams <= 1:
        return None
    if manifest.backend != "onnxruntime":
        return f"`{where}` {req.num_beams}: beam search runs on ONNX Runtime engines (its KV copies are host arrays)"
    if req.num_beams > manifest.limits.max_batch_size:
        return (f"`{where}` {req.num_beams}: more beams than the engine's max_batch_size "
                f"{manifest.limits.max_batch_size} (each beam is a batch row); rebuild with a larger --max-batch-size")
    if req.lora_name is not None:
        return f"`{where}` {req.num_beams}: beam search runs the base model, and `requests[{index}].lora_name` is set"
    return None


def params_for(req, row, capacity: int) -> BeamParams:
    """A request's beam search as its first sample's row has it: the EOS ids it stops at (none with
    ignore_eos) and its stop_token_ids, min_new_tokens, and max_generate_length within the KV
    capacity (as plain decoding caps it)."""
    return BeamParams(num_beams=req.num_beams, max_new_tokens=max(0, min(row.max_new_tokens,
                                                                           capacity + 1 - len(row.prompt_ids))),
                      eos_ids=row.banned, min_new_tokens=req.min_new_tokens, length_penalty=req.length_penalty,
                      early_stopping=req.early_stopping)


def replay(row, tokens: tuple[int, ...], max_new_tokens: int) -> None:
    """A hypothesis into a sample's row, token by token as plain decoding takes them (its text,
    its finish reason: an EOS id, a stop token, the length)."""
    row.max_new_tokens = max_new_tokens
    for token in tokens:
        row.accept(token, None)
        if row.finish_reason:
            return
    row.finish_reason = row.finish_reason or "max-length"  # (max_generate_length 0: no token)


class Unfinished(RuntimeError):
    """Fewer hypotheses finished than the request's n."""


def answer(engine, samples: list, timing, on_token=None) -> None:
    """trtllm-run's requests with num_beams > 1 (runtime/runner.py Samples, a request's n adjacent),
    one after another: sample i gets the i-th best hypothesis, its score `beam_score`. A failure of
    one fails that request alone."""
    capacity = engine.manifest.limits.max_kv_cache_capacity
    for p, group in itertools.groupby(samples, key=lambda smp: smp.prepared):
        group = list(group)
        params = params_for(p.request, group[0].row, capacity)
        try:
            found = run(engine, p.prompt_ids, params, timing)
            if params.max_new_tokens and not all(h.finished for h in found[:len(group)]):  # (0: empty answers)
                raise Unfinished(f"it ended with {sum(h.finished for h in found)} finished hypotheses, fewer than "
                                 f"the request's n {len(group)}: no running beam could beat an empty placeholder's "
                                 f"score under length_penalty {params.length_penalty} (transformers gives up there "
                                 "too, and answers with the placeholders); use a length_penalty nearer 0 or a "
                                 "smaller n")
        except Exception as e:  # noqa: BLE001 - its own failure, not its neighbours'
            found = []
            why = str(e) if isinstance(e, Unfinished) else f"{type(e).__name__}: {e}"
            for smp in group:
                smp.row.fail(f"beam search failed ({why})")
        for smp, hypothesis in zip(group, found):
            smp.beam_score, smp.row.batch_idx = hypothesis.score, 0  # (its beams took slots 0 .. B - 1)
            replay(smp.row, hypothesis.tokens, params.max_new_tokens)
        for smp in group:
            if on_token is not None:
                on_token(smp.row)
