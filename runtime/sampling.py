"""Sampling parameters: one validated dataclass per request, a pure function to batch them.

Stage order (applied in the graph by trtllm::Sample, see plugins/sample/reference.py):
  logit_bias -> logprobs (log_softmax, temperature 1) -> temperature -> top-k -> top-p -> draw.
temperature 0 is greedy (argmax of the biased logits). The random numbers the draw uses come from
a numpy Generator seeded per request, so a run can be replayed and any backend draws the same.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True, slots=True)
class SamplingParams:
    temperature: float = 1.0
    """>= 0; 0 = greedy."""
    top_k: int = 50
    """>= 0; 0 = disabled (a value >= the vocabulary size also keeps every token)."""
    top_p: float = 0.8
    """in (0, 1]; 1 = disabled."""
    logit_bias: dict[int, float] = field(default_factory=dict)
    """token id -> added to its logit before everything else; {} = none."""
    num_logprobs: int = 0
    """in [0, 50]; 0 = none. Top-K log_softmax of the biased logits, temperature 1."""

    def __post_init__(self):
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature!r}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k!r}")
        if not (0 < self.top_p <= 1):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not 0 <= self.num_logprobs <= 50:
            raise ValueError(f"num_logprobs must be in [0, 50], got {self.num_logprobs!r}")


@dataclass(frozen=True, slots=True)
class SamplingBatch:
    """Per-row arrays the graph takes; `uniform` is refilled every step by `draw`."""

    logit_bias: np.ndarray    # f32 [B, V]
    temperature: np.ndarray   # f32 [B]
    top_k: np.ndarray         # int64 [B]
    top_p: np.ndarray         # f32 [B]
    uniform: np.ndarray       # f32 [B]
    num_logprobs: int         # K for the whole batch (>= 1 in the graph; rows slice their own)


def make_batch(params: list[SamplingParams], vocab_size: int, max_top_k: int) -> SamplingBatch:
    """Batch the params. top_k >= vocab_size means 'all tokens' and becomes 0 (disabled)."""
    bias = np.zeros((len(params), vocab_size), np.float32)
    for row, p in enumerate(params):
        for token_id, value in p.logit_bias.items():
            bias[row, token_id] = value
    top_k = [0 if p.top_k >= vocab_size else p.top_k for p in params]
    too_big = [k for k in top_k if k > max_top_k]
    if too_big:
        raise ValueError(f"top_k must be <= {max_top_k} (the engine's max_top_k) or >= the vocabulary "
                         f"size {vocab_size}, got {too_big[0]}")
    return SamplingBatch(
        logit_bias=bias,
        temperature=np.array([p.temperature for p in params], np.float32),
        top_k=np.array(top_k, np.int64),
        top_p=np.array([p.top_p for p in params], np.float32),
        uniform=np.zeros(len(params), np.float32),
        # The graph takes its logprobs from the sampler's top-M, so K <= M (only a vocabulary
        # under 50 tokens has M < 50, and then there are no more tokens to list anyway).
        num_logprobs=min(max([p.num_logprobs for p in params] + [1]), max_top_k),
    )


def draw(batch: SamplingBatch, rngs: list[np.random.Generator]) -> None:
    """Fill batch.uniform in place with one draw in [0, 1) per row from that row's generator."""
    for row, rng in enumerate(rngs):
        batch.uniform[row] = rng.random(dtype=np.float32)
