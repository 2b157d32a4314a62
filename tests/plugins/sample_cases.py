"""Shared by the trtllm::Sample tests: sessions of the ONNX body, cases, the reference, and an
independent float64 statement of the distribution."""
from __future__ import annotations

import functools

import numpy as np
import onnxruntime as ort

from trtllm.plugins.sample import body, reference, schema

ARGS = schema.INPUT_NAMES
KEPT_ARGS = tuple(name for name in ARGS if name != "uniform")  # kept_probs' inputs


@functools.lru_cache(maxsize=None)
def sample_session(max_top_k: int):
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(body.make_model(max_top_k).SerializeToString(), options,
                                providers=["CPUExecutionProvider"])


def run_body(case: dict, num_logprobs: int, max_top_k: int):
    """The body's outputs, logprob columns cut to the first num_logprobs (as the runtime keeps them)."""
    tokens, values, ids = sample_session(max_top_k).run(None, {name: case[name] for name in ARGS})
    assert values.shape[1] == ids.shape[1] == schema.num_logprob_columns(max_top_k)  # static width
    return tokens, values[:, :num_logprobs], ids[:, :num_logprobs]


def run_reference(case: dict, num_logprobs: int, max_top_k: int):
    tokens, values, ids = reference.sample(*(case[name] for name in ARGS), max_top_k)
    return tokens, values[:, :num_logprobs], ids[:, :num_logprobs]


def make_case(logits, temperature, top_k, top_p, uniform, bias=None, *, penalty_bias=None, seen=None,
          repetition_penalty=1.0, min_p=0.0) -> dict:
    logits = np.asarray(logits, np.float32)
    rows = logits.shape[0]
    full = lambda v, dtype: np.broadcast_to(np.asarray(v, dtype), (rows,)).copy()  # noqa: E731
    dense = lambda v: np.zeros_like(logits) if v is None else np.asarray(v, np.float32)  # noqa: E731
    return {"logits": logits, "logit_bias": dense(bias), "penalty_bias": dense(penalty_bias),
            "seen": np.zeros(logits.shape, bool) if seen is None else np.asarray(seen, bool),
            "repetition_penalty": full(repetition_penalty, np.float32),
            "temperature": full(temperature, np.float32), "min_p": full(min_p, np.float32),
            "top_k": full(top_k, np.int64), "top_p": full(top_p, np.float32), "uniform": full(uniform, np.float32)}


def kept_of(case, max_top_k, rows=slice(None)):
    return reference.kept_probs(*(case[name][rows] for name in KEPT_ARGS), max_top_k=max_top_k)


def assert_close(name, got, want, atol, eps=1e-6):
    """atol + |want| * eps, reporting the first bad indices and the largest errors."""
    assert got.shape == want.shape and got.dtype == want.dtype, (name, got.shape, got.dtype, want.shape, want.dtype)
    err = np.where(got == want, 0.0, np.abs(got.astype(np.float64) - want))  # (-inf and -inf: equal, not NaN)
    bad = np.argwhere(~(err <= atol + np.abs(want) * eps))
    assert not len(bad), (f"{name}: {len(bad)} bad, first at {bad[:5].tolist()}; max abs err {err.max():.3g}, "
                          f"max rel err {(err / np.maximum(np.abs(want), 1e-30)).max():.3g}")


# --- an independent float64 statement of the distribution, for kept_probs and ambiguity -------

def naive_penalized(x, seen, repetition_penalty, penalty_bias):
    """vLLM's apply_penalties shape in float64: divide positive / multiply others, then subtract."""
    y = np.array(x, np.float64)
    rep = np.where(seen, float(repetition_penalty), 1.0)
    positive = y > 0
    y[positive] /= rep[positive]
    y[~positive] *= rep[~positive]
    return y + penalty_bias


def naive_kept(y, temperature, top_k, top_p, min_p=0.0):
    """softmax(y / t) restricted to min-p, top-k, then nucleus, renormalised (one row, float64).

    Returns (probs, margin): margin is how close a min-p or top-p cut is to flipping."""
    y = y.astype(np.float64)
    if temperature == 0:
        return np.eye(len(y))[np.argmax(y)], np.inf
    z = y / temperature - np.max(y / temperature)
    probs = np.exp(z) / np.exp(z).sum()
    order = np.argsort(-y, kind="stable")
    kept, margin = order, np.inf
    if min_p > 0:                                    # prob >= min_p * max prob, in log space
        margin = np.min(np.abs(z - np.log(min_p)))
        kept = kept[z[kept] >= np.log(min_p)]
    kept = kept[:top_k] if top_k > 0 else kept
    q = probs[kept] / probs[kept].sum()
    if top_p < 1:                                    # distance of the nucleus cut from top_p
        excl = np.concatenate([[0.0], np.cumsum(q)[:-1]])
        margin = min(margin, np.min(np.abs(excl - top_p)))
        kept = kept[excl < top_p]
    out = np.zeros(len(y))
    out[kept] = probs[kept] / probs[kept].sum()
    return out, margin


def naive_row(case, row):
    x = case["logits"][row].astype(np.float64) + case["logit_bias"][row]
    y = naive_penalized(x, case["seen"][row], case["repetition_penalty"][row], case["penalty_bias"][row])
    return naive_kept(y, case["temperature"][row], case["top_k"][row], case["top_p"][row], case["min_p"][row])


def ambiguous(case, row, tol=1e-5):
    """True when float rounding may legitimately change this row's token."""
    probs, margin = naive_row(case, row)
    cdf = np.cumsum(probs)
    return margin < tol or np.min(np.abs(cdf - case["uniform"][row])) < tol


def random_penalties(rng, rows, vocab_size):
    """Per row: none, or a seen mask, a repetition penalty and a penalty_bias with some -inf."""
    on = rng.random(rows) < 0.7
    seen = (rng.random((rows, vocab_size)) < rng.choice([0.05, 0.3], (rows, 1))) & on[:, None]
    repetition_penalty = np.where(on, rng.choice([1.0, 0.8, 1.3, 2.0], rows), 1.0)
    counts = rng.poisson(0.5, (rows, vocab_size)) * seen
    frequency, presence = rng.choice([0.0, 0.5], (2, rows, 1))
    penalty_bias = -(frequency * counts + presence * (counts > 0))
    banned = rng.random((rows, vocab_size)) < rng.choice([0.0, 0.05, 0.5], (rows, 1))
    banned[np.arange(rows), rng.integers(0, vocab_size, rows)] = False   # at least one allowed
    penalty_bias = np.where(banned & on[:, None], -np.inf, penalty_bias)
    return {"seen": seen, "repetition_penalty": repetition_penalty, "penalty_bias": penalty_bias}


def random_case(rng):
    vocab_size = int(rng.choice([7, 50, 300, 2000]))
    max_top_k = min(schema.DEFAULT_MAX_TOP_K, vocab_size)
    rows = int(rng.integers(1, 9))
    logits = rng.normal(size=(rows, vocab_size)) * rng.choice([0.5, 2.0, 8.0])
    bias = np.where(rng.random((rows, vocab_size)) < 0.1, rng.uniform(-100, 100, (rows, vocab_size)), 0)
    case = make_case(logits, rng.choice([0.0, 0.5, 1.0, 2.0], rows),
                 rng.choice([k for k in (0, 1, 5, max_top_k) if k <= max_top_k], rows),
                 rng.choice([0.3, 0.9, 1.0], rows), rng.random(rows, dtype=np.float32), bias,
                 min_p=rng.choice([0.0, 0.0, 0.05, 0.3, 1.0], rows), **random_penalties(rng, rows, vocab_size))
    # a guided row's grammar: -inf on most of the vocabulary, in logit_bias; one token left to each row
    masked = rng.random((rows, vocab_size)) < rng.choice([0.0, 0.0, 0.9], (rows, 1))
    keep = rng.integers(0, vocab_size, rows)
    masked[np.arange(rows), keep] = False
    case["logit_bias"] = np.where(masked, np.float32(-np.inf), case["logit_bias"])
    case["penalty_bias"][np.arange(rows), keep] = np.maximum(case["penalty_bias"][np.arange(rows), keep], -1)
    return case, int(rng.integers(1, min(5, max_top_k) + 1)), max_top_k


def tail_case(vocab_size: int = 4096):
    """(case, want): one likely token and vocab_size - 1 at logit -17, each exp(-17) = 4.1e-8 of
    it, below what a float32 running sum near 1 can add: sampled at temperature 1 with nothing
    restricted, the rows whose uniform passes 1 / total must draw in the tail (rows 2-5 here, at
    0.8, 0.5, 0.2 and 0.01 of the tail's mass from its end; rows 0 and 1 draw token 0). `want`: the
    exact draws, from the CDF 1 + i * w in closed form; a float32 CDF gives token 0 for every row."""
    w = float(np.exp(np.float32(-17.0)))  # each tail weight as the sampler computes it, in float32
    total = 1.0 + (vocab_size - 1) * w
    tail = 1.0 - 1.0 / total  # the tail's share of the mass
    uniforms = np.array([0.5, 1.0 - 1.5 * tail] + [1.0 - f * tail for f in (0.8, 0.5, 0.2, 0.01)], np.float32)
    logits = np.full((len(uniforms), vocab_size), -17.0, np.float32)
    logits[:, 0] = 0.0
    want = [0 if float(u) * total < 1.0 else int((float(u) * total - 1.0) // w) + 1 for u in uniforms]
    return make_case(logits, 1.0, 0, 1.0, uniforms), np.array(want, np.int64)
