"""prompt_logprobs (vLLM's): each prompt token's log-probability given the tokens before it, and the
k most likely tokens at its place, read from the prompt's own prefill steps.

An engine whose graph gives the logits of the positions `verify_index` names (manifest
prompt_logits: ONNX Runtime builds) computes them in the steps that prefill the prompt anyway: a
step over positions a..e-1 names those followed by a prompt token, and position p's logits score
token p + 1. A scored prompt is prefilled in steps of its own, SCORE_CHUNK positions at most, so
that the logits it takes out stay [SCORE_CHUNK, vocabulary]; none of its KV is restored (a saved
system prompt, --context-reuse, a neighbour's copy), whose positions would have no logits.

The measure is the model's: log_softmax of its raw logits at temperature 1, without the request's
logit_bias, penalties or grammar, which shape what is generated, not what the prompt was.
"""
from __future__ import annotations

import numpy as np

from trtllm.runtime import sampling
from trtllm.runtime.rows import RowState

# Prompt positions one prefill step scores: its logits come out as [SCORE_CHUNK, vocabulary] float32
# (48 MiB for the demo model's 49,152 tokens), where a whole 4,096-token prompt's would be 805 MiB.
SCORE_CHUNK = 256


def scored(row: RowState | None) -> bool:
    """The row asks for prompt_logprobs, and part of its prompt is still to prefill."""
    return row is not None and row.prompt_logprobs is not None and row.prefilling


def index(row: RowState, start: int, end: int) -> np.ndarray:
    """verify_index [1, T] for a step over the row's prompt positions start..end-1: the step's own
    positions (0 is `start`) that a prompt token follows; T is 0 for a step over the last one alone."""
    return np.arange(max(min(end, len(row.prompt_ids) - 1) - start, 0), dtype=np.int64)[None, :]


def record(row: RowState, start: int, logits: np.ndarray) -> str | None:
    """logits [T, V]: those of prompt positions start..start+T-1, which score prompt tokens
    start+1..start+T; each one's own log-probability and the row's top prompt_logprobs join its
    prompt_scores, in order. Why the row fails instead, where the logits overflowed (NaN or +inf:
    every score would be NaN, which the output could not tell from a token the model rules out)."""
    k, zero = row.prompt_logprobs, np.float32(0)
    assert len(row.prompt_scores) == start, "a scored prompt is computed whole, in order"
    if np.isnan(logits).any() or np.isposinf(logits).any():
        return (f"the request's logits were not finite (NaN or infinite) at its prompt token {start + 1} or after: "
                f"the model overflowed ({row.overflow_causes()})")
    for t in range(logits.shape[0]):
        logprobs = sampling.log_softmax(logits[t], zero)
        token = row.prompt_ids[start + t + 1]
        top = sampling.top_logprobs(logprobs, k) if k else (np.empty(0, np.float32), np.empty(0, np.int64))
        row.prompt_scores.append((float(logprobs[token]), *top))
    return None
