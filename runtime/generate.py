"""Generate for one static batch: prefill all prompts in one step, then decode token by token.

Works on token ids only. Each row owns KV slots 0..capacity-1 of its batch buffers; a token at
position p sits in slot p, so prompts of different lengths are right-padded in the prefill step
and every row stays exactly what it would be alone.

    row 0: [p p p p p . . . . . ]   p prompt, g generated, . free / masked
    row 1: [p p p g g g . . . . ]   write_index[b] = next free slot = next position
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from trtllm.runtime import sampling
from trtllm.runtime.engine import Engine, StepInputs
from trtllm.runtime.text import TextStream

CAPACITY_ROUNDING = 64  # KV buffers grow in steps of this many slots


@dataclass
class RowState:
    """One request sample's progress; `text` (stop strings, streaming) is optional."""

    prompt_ids: list[int]
    params: sampling.SamplingParams
    rng: np.random.Generator
    eos_ids: frozenset[int]
    text: TextStream | None = None
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)
    counts: dict[int, int] = field(default_factory=dict)
    finish_reason: str | None = None
    max_new_tokens: int = -1  # params.max_new_tokens, capped by the batch's KV capacity

    def __post_init__(self):
        if self.max_new_tokens < 0:
            self.max_new_tokens = self.params.max_new_tokens

    @property
    def banned(self) -> frozenset[int]:
        """What min_new_tokens holds back: EOS (unless ignored) and the stop token ids."""
        eos = frozenset() if self.params.ignore_eos else self.eos_ids
        return eos | frozenset(self.params.stop_token_ids)

    def accept(self, token_id: int, top: tuple[np.ndarray, np.ndarray] | None) -> None:
        self.output_ids.append(token_id)
        self.counts[token_id] = self.counts.get(token_id, 0) + 1
        if top is not None:
            self.logprobs.append(top)
        n, p = len(self.output_ids), self.params
        if token_id in self.eos_ids and not p.ignore_eos:
            self.finish_reason = "end-of-sequence"
        elif token_id in p.stop_token_ids:
            self.finish_reason = "stop-words"
        elif self.text is not None and self.text.push(token_id, check_stops=n >= p.min_new_tokens):
            self.finish_reason = "stop-words"
        elif n >= self.max_new_tokens:
            self.finish_reason = "max-length"
        if self.finish_reason and self.text is not None:
            self.text.finish()

    def visible_ids(self) -> list[int]:
        """The output without a final EOS or stop token (they are not part of output_text)."""
        if self.finish_reason == "end-of-sequence" or (
                self.finish_reason == "stop-words" and self.output_ids and self.output_ids[-1] in self.params.stop_token_ids):
            return self.output_ids[:-1]
        return self.output_ids


@dataclass
class Timing:
    prefill_runs: int = 0
    prefill_tokens: int = 0
    prefill_seconds: float = 0.0
    generation_runs: int = 0
    generated_tokens: int = 0
    generation_seconds: float = 0.0


def capacity_for(rows: list[RowState], max_capacity: int) -> int:
    need = max(len(r.prompt_ids) + r.max_new_tokens for r in rows)
    return min(max_capacity, -(-need // CAPACITY_ROUNDING) * CAPACITY_ROUNDING)


def prefill_inputs(rows: list[RowState], pad_id: int, batch: sampling.SamplingBatch) -> StepInputs:
    lens = [len(r.prompt_ids) for r in rows]
    width = max(lens)
    ids = np.full((len(rows), width), pad_id, np.int64)
    for b, r in enumerate(rows):
        ids[b, : lens[b]] = r.prompt_ids
    positions = np.broadcast_to(np.arange(width, dtype=np.int64), ids.shape).copy()
    return StepInputs(input_ids=ids, position_ids=positions, write_index=np.zeros(len(rows), np.int64),
                      last_index=np.array(lens, np.int64) - 1, sampling=batch)


def decode_inputs(rows: list[RowState], batch: sampling.SamplingBatch) -> StepInputs:
    """A finished row re-feeds its last token at its last slot: harmless, its result is ignored."""
    last = [(r.output_ids or r.prompt_ids)[-1] for r in rows]
    pos = [len(r.prompt_ids) + len(r.output_ids) - 1 for r in rows]
    return StepInputs(input_ids=np.array(last, np.int64)[:, None], position_ids=np.array(pos, np.int64)[:, None],
                      write_index=np.array(pos, np.int64), last_index=np.zeros(len(rows), np.int64),
                      sampling=batch)


def run_batch(engine: Engine, rows: list[RowState], timing: Timing | None = None, on_token=None) -> None:
    """Generate until every row has a finish_reason. `on_token(row_index)` is called after each
    accepted token (for streaming)."""
    m = engine.manifest
    timing = timing or Timing()
    capacity = capacity_for(rows, m.limits.max_kv_cache_capacity)
    for r in rows:  # the KV buffer bounds what any row can generate
        r.max_new_tokens = min(r.max_new_tokens, capacity - len(r.prompt_ids))
        if r.max_new_tokens <= 0:
            r.finish_reason = "max-length"
    if all(r.finish_reason for r in rows):
        return
    params = [r.params for r in rows]
    batch = sampling.make_batch(params, m.model.vocab_size, m.max_top_k, prompts=[r.prompt_ids for r in rows],
                                banned=[r.banned for r in rows])
    engine.allocate(len(rows), capacity)
    want_top = any(p.num_logprobs > 0 for p in params)
    inputs = prefill_inputs(rows, m.pad_token_id, batch)
    first = True
    while not all(r.finish_reason for r in rows):
        sampling.draw(batch, [r.rng for r in rows])
        t0 = time.perf_counter()
        out = engine.step(inputs)
        elapsed = time.perf_counter() - t0
        live = [b for b, r in enumerate(rows) if not r.finish_reason]
        if first:
            timing.prefill_runs += 1
            timing.prefill_tokens += sum(len(r.prompt_ids) for r in rows)
            timing.prefill_seconds += elapsed
        else:
            timing.generation_runs += 1
            timing.generation_seconds += elapsed
            timing.generated_tokens += len(live)
        for b in live:
            row, token = rows[b], int(out.token_ids[b])
            row.accept(token, (out.top_logprobs[b].copy(), out.top_logprob_ids[b].copy()) if want_top else None)
            sampling.penalize(batch, b, row.params, row.counts, token, len(row.output_ids), row.banned)
            if on_token is not None:
                on_token(b)
        first = False
        inputs = decode_inputs(rows, batch)
