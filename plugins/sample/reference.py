"""trtllm::Sample in numpy: the single source of truth for the ONNX body and any GPU kernel.

Per row b (float32 but for the draw's sums; B rows, V vocabulary, M = max_top_k, K = min(50, M)
logprob columns):

  1. x  = logits + logit_bias
  2. logprobs = log_softmax(x) (temperature 1, after the bias, before the penalties);
     top_logprobs / top_logprob_ids = the K largest logprobs, descending, ties lower id first
     (what ONNX TopK sorted=1 does)
  3. penalties (vLLM / SGLang; r = repetition_penalty, 1 = off; seen = prompt + output tokens):
       y = where(seen, where(x > 0, x / r, x * r), x) + penalty_bias
     penalty_bias comes from the runtime: -(frequency_penalty * count + presence_penalty * (count > 0))
     over output tokens, and -inf for tokens banned this step (e.g. EOS before min_new_tokens)
  4. greedy = argmax(y), the first maximum (penalties apply to greedy decoding too)
  5. t = temperature, or 1 when temperature == 0 (the sampling branch is computed for every row)
     d = (y - max y) / t  (= z - max z for z = y / t; never NaN for a finite max y)
  6. sy = the M largest y, descending; sd = (sy - max y) / t; e = exp(sd)   (the top-M of z - max z)
  7. min-p, then top-k (vLLM's order; both only shorten the sorted prefix):
       m = count(sd >= log(min_p))  (prob >= min_p * max prob; >= 1 since sd[0] = 0; M when min_p = 0)
       k' = min(top_k if top_k > 0 else M, m); in_k = index < k'
       restricted = top_k > 0 or min_p > 0
  8. top-p over the distribution renormalised to the min-p and top-k survivors:
       D = sum(e[in_k]) if restricted else sum(exp(d)) over the whole vocabulary
       p = where(in_k, e, 0) / D;  excl = exclusive cumsum of p
       n = count(excl < top_p) (>= 1, since excl[0] = 0); n' = n if top_p < 1 else M
  9. threshold thr = sy[min(k', n') - 1], or -inf when not restricted and top_p == 1;
     keep = y >= thr (ties with the threshold are kept, as in HF's `scores < kth` masking)
 10. w = where(keep, exp(d), 0) (float32); c = cumsum(w) in vocabulary order, summed in float64;
     total = max c where w > 0; token = first index with w > 0 and (c > uniform * total or
     c >= total) (uniform * total in float64; the second clause only matters when it rounds up to
     total; it picks the last token with weight). float64 because a float32 running sum near 3
     takes nothing from a weight below 1.2e-7: with nothing restricted, the demo model's 36,700
     least likely tokens (2e-4 of the mass) could never be drawn. Summed in order, total = c[-1]
     and w > 0 changes nothing; a parallel scan (a GPU's CumSum, the Triton kernel's blocks)
     rounds c past the last weighted token apart from it, and without them could draw a token of
     weight 0 (a banned one), or none
 11. token_ids = where(temperature == 0, greedy, token)

Thresholds compare y with sy, which TopK returns bit-for-bit, instead of comparing z = y / t with
sy / t: a backend that divides with a different rounding (a fused or approximate GPU division)
then still keeps the k-th token. Mathematically it is the same set (y -> y / t is increasing).
The min-p and top-p decisions are counts along the sorted prefix, so they only choose the index.

Limits: min-p survivors and the nucleus are searched only among the top M; when more than M
tokens pass min_p or are needed to reach top_p (flat distributions) the set is capped at the top M.
With top_k = 0, min_p = 0 and top_p = 1 the whole vocabulary is sampled exactly. Every row needs a
finite max(x) and a finite max(y) (no NaN, no +inf, at least one token not banned).
"""
from __future__ import annotations

import numpy as np

from trtllm.plugins.sample import schema


def sample(logits, logit_bias, penalty_bias, seen, repetition_penalty, temperature, min_p, top_k, top_p,
           uniform, max_top_k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Run the op. Returns (token_ids int64 [B], top_logprobs f32 [B,K], top_logprob_ids int64 [B,K])."""
    x, y, t, m, k, p, u = _check(logits, logit_bias, penalty_bias, seen, repetition_penalty, temperature,
                                 min_p, top_k, top_p, uniform, max_top_k)
    logprobs = _log_softmax(x)                                          # [B, V]  step 2
    columns = schema.num_logprob_columns(max_top_k)
    top_logprob_ids = np.argsort(-logprobs, axis=1, kind="stable")[:, :columns]  # [B, K]
    top_logprobs = np.take_along_axis(logprobs, top_logprob_ids, axis=1)
    greedy = np.argmax(y, axis=1)                                       # first maximum, step 4
    keep, d = _keep_mask(y, t, m, k, p, max_top_k)
    w = np.where(keep, np.exp(d), np.float32(0))                        # [B, V]
    c = np.cumsum(w, axis=1, dtype=np.float64)                          # sequential, in float64
    weighted = w > 0
    total = np.where(weighted, c, 0.0).max(axis=1, keepdims=True)       # c[-1] when sequential
    target = u[:, None].astype(np.float64) * total
    token = np.argmax(((c > target) | (c >= total)) & weighted, axis=1)  # first True
    token_ids = np.where(t == 0, greedy, token).astype(np.int64)
    return token_ids, top_logprobs.astype(np.float32), top_logprob_ids.astype(np.int64)


def kept_probs(logits, logit_bias, penalty_bias, seen, repetition_penalty, temperature, min_p, top_k, top_p,
               max_top_k: int) -> np.ndarray:
    """The distribution each row is drawn from, f32 [B,V]: renormalised w, one-hot for greedy rows."""
    _, y, t, m, k, p, _ = _check(logits, logit_bias, penalty_bias, seen, repetition_penalty, temperature,
                                 min_p, top_k, top_p, None, max_top_k)
    keep, d = _keep_mask(y, t, m, k, p, max_top_k)
    w = np.where(keep, np.exp(d.astype(np.float64)), 0.0)
    probs = w / w.sum(axis=1, keepdims=True)
    greedy = np.zeros_like(probs)  # (one-hot rows: an identity matrix of V would take V * V * 8 bytes)
    np.put_along_axis(greedy, np.argmax(y, axis=1)[:, None], 1.0, axis=1)
    return np.where((t == 0)[:, None], greedy, probs).astype(np.float32)


def _penalize(x, penalty_bias, seen, repetition_penalty):
    """Step 3: y [B,V] from x [B,V] (float32, the body's exact op order)."""
    r = repetition_penalty[:, None]                                     # [B, 1]
    return np.where(seen, np.where(x > 0, x / r, x * r), x) + penalty_bias


def _keep_mask(y, t, min_p, top_k, top_p, max_top_k):
    """Steps 5-9: the bool mask [B,V] of tokens that survive min-p/top-k/top-p, and d = z - max z [B,V]."""
    f32 = np.float32
    t_eff = np.where(t == 0, f32(1), t)[:, None]                        # [B, 1]
    sy = -np.sort(-y, axis=1)[:, :max_top_k]                            # [B, M] descending
    ymax = sy[:, :1]
    d = (y - ymax) / t_eff                                              # [B, V]
    sd = (sy - ymax) / t_eff                                            # [B, M]
    e = np.exp(sd)
    m_on = (min_p > 0)[:, None]
    with np.errstate(divide="ignore"):                                  # log(0) = -inf: keeps all
        log_min_p = np.where(m_on, np.log(min_p[:, None]), f32(-np.inf))
    num_min_p = (sd >= log_min_p).sum(axis=1, keepdims=True)            # [B, 1], >= 1
    k_on = (top_k > 0)[:, None]
    k_eff = np.minimum(np.where(k_on, top_k[:, None], max_top_k), num_min_p)  # [B, 1]
    restricted = k_on | m_on
    in_k = np.arange(max_top_k)[None, :] < k_eff                        # [B, M]
    e_k = np.where(in_k, e, f32(0))
    # Top-p renormalises over the survivors of min-p and top-k. With top-k the survivors are the
    # first k_eff sorted values; with min-p alone they may be more than the M sorted ones, so their
    # mass is summed over the whole vocabulary (summing the first M would inflate every probability
    # and cut the nucleus short).
    sum_min_p = np.where(d >= log_min_p, np.exp(d), f32(0)).sum(axis=1, keepdims=True)
    denom = np.where(k_on, e_k.sum(axis=1, keepdims=True),
                     np.where(m_on, sum_min_p, np.exp(d).sum(axis=1, keepdims=True)))
    prob = e_k / denom
    incl = np.cumsum(prob, axis=1, dtype=f32)
    excl = np.concatenate([np.zeros_like(incl[:, :1]), incl[:, :-1]], axis=1)  # not incl - p: exact
    p_on = (top_p < 1)[:, None]
    # >= 1 (excl[0] = 0), also for a top_p that rounded to 0 in float32 (the runtime refuses those)
    n = np.maximum((excl < top_p[:, None]).sum(axis=1, keepdims=True), 1)
    n_eff = np.where(p_on, n, max_top_k)
    idx = np.minimum(k_eff, n_eff) - 1                                  # [B, 1]
    thr = np.take_along_axis(sy, idx, axis=1)
    thr = np.where(restricted | p_on, thr, f32(-np.inf))
    return y >= thr, d


def _log_softmax(x):
    """(x - max) - log(sum(exp(x - max))), the order ONNX Runtime's LogSoftmax uses."""
    shifted = x - x.max(axis=1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))


def _check(logits, logit_bias, penalty_bias, seen, repetition_penalty, temperature, min_p, top_k, top_p,
           uniform, max_top_k):
    """Validate the inputs against the schema; return x, y, temperature, min_p, top_k, top_p, uniform."""
    schema.check_max_top_k(max_top_k)
    logits = np.asarray(logits, np.float32)
    if logits.ndim != 2:
        raise ValueError(f"logits must be [batch, vocab], got shape {logits.shape}")
    num_rows, vocab_size = logits.shape
    if max_top_k > vocab_size:
        raise ValueError(f"max_top_k must be <= the vocabulary size {vocab_size}, got {max_top_k}")
    bias = _array("logit_bias", logit_bias, np.float32, logits.shape)
    pbias = _array("penalty_bias", penalty_bias, np.float32, logits.shape)
    seen = _array("seen", seen, np.bool_, logits.shape)
    r, t, m, p = (_array(name, value, np.float32, (num_rows,)) for name, value in (
        ("repetition_penalty", repetition_penalty), ("temperature", temperature), ("min_p", min_p),
        ("top_p", top_p)))
    k = _array("top_k", top_k, np.int64, (num_rows,))
    u = None if uniform is None else _array("uniform", uniform, np.float32, (num_rows,))
    x = logits + bias
    _require(_finite_max(x), "logits + logit_bias", "free of NaN and +inf with a finite maximum in every row", x)
    _require(~np.isnan(pbias) & (pbias < np.inf), "penalty_bias", "free of NaN and +inf", pbias)
    _require(np.isfinite(r) & (r > 0), "repetition_penalty", "finite and > 0", r)
    y = _penalize(x, pbias, seen, r)
    _require(_finite_max(y), "penalty_bias", "-inf on fewer than all tokens, so that the penalised logits "
             "have a finite maximum in every row (check repetition_penalty too)", y)
    _require(np.isfinite(t) & (t >= 0), "temperature", "finite and >= 0", t)
    _require((m >= 0) & (m <= 1), "min_p", "in [0, 1]", m)
    _require((k >= 0) & (k <= max_top_k), "top_k", f"in [0, max_top_k={max_top_k}]", k)
    _require((p > 0) & (p <= 1), "top_p", "in (0, 1]", p)
    if u is not None:
        _require((u >= 0) & (u < 1), "uniform", "in [0, 1)", u)
    return x, y, t, m, k, p, u


def _finite_max(x):
    """[B] True where the row has no NaN and a finite maximum."""
    return ~np.isnan(x).any(axis=1) & (x.max(axis=1) < np.inf) & (x.max(axis=1) > -np.inf)


def _array(name, value, dtype, shape):
    arr = np.asarray(value)
    if arr.shape != shape:
        raise ValueError(f"{name} must have shape {shape}, got {arr.shape}")
    if dtype is np.bool_ and arr.dtype != np.bool_:
        raise TypeError(f"{name} must be bool, got dtype {arr.dtype}")
    if np.issubdtype(dtype, np.integer) and arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"{name} must be integers, got dtype {arr.dtype}")
    return arr.astype(dtype)


def _require(ok, name, constraint, values):
    if not np.all(ok):
        row = int(np.flatnonzero(~np.asarray(ok).reshape(len(ok), -1).all(axis=1))[0])
        raise ValueError(f"{name} must be {constraint}, got {values[row]!r} in row {row}")
