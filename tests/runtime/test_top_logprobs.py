"""sampling.top_logprobs, the top logprobs of EAGLE verification's other positions, against the
sampler's reference (plugins/sample/reference.py: log_softmax of the biased logits, the K largest,
ties to the lower id) on random rows: flat and peaked, ties, -inf and large biases, fewer finite
tokens than asked for. The wrong variant, ties to the higher id, must disagree."""
from __future__ import annotations

import numpy as np

from trtllm.plugins.sample import reference
from trtllm.runtime.sampling import log_softmax, top_logprobs


def rows(n: int = 400):
    rng = np.random.default_rng(7)
    for trial in range(n):
        vocab = int(rng.integers(2, 3000))
        x = (rng.standard_normal(vocab) * rng.choice([0.01, 1.0, 3.0, 30.0])).astype(np.float32)
        if trial % 4 == 0:
            x = np.round(x)  # ties
        bias = np.zeros(vocab, np.float32)
        if trial % 3 == 0:
            bias[rng.integers(0, vocab, 5)] = rng.choice([-np.inf, -100.0, 5.0, 100.0])
        if trial % 50 == 1:
            bias[:] = -np.inf
            bias[: min(3, vocab)] = 0.0  # three finite tokens
        yield x, bias, int(rng.integers(1, min(vocab, 50) + 1))


def expected(x, bias, k, stable=True):
    logprobs = reference._log_softmax((x + bias)[None])[0]
    ids = np.argsort(-logprobs, kind="stable")[:k] if stable else np.argsort(-logprobs[::-1], kind="stable")[:k]
    ids = ids if stable else len(x) - 1 - ids  # (the wrong variant: ties to the higher id)
    return logprobs[ids], ids


def test_the_sampler_s_top_logprobs():
    for x, bias, k in rows():
        values, ids = top_logprobs(log_softmax(x, bias), k)
        want_values, want_ids = expected(x, bias, k)
        assert ids.dtype == np.int64 and values.dtype == np.float32
        assert ids.tolist() == want_ids.tolist()
        np.testing.assert_allclose(values, want_values, atol=1e-5)


def test_wrong_variant_ties_to_the_higher_id_disagrees():
    differs = 0
    for x, bias, k in rows():
        _, ids = top_logprobs(log_softmax(x, bias), k)
        differs += ids.tolist() != expected(x, bias, k, stable=False)[1].tolist()
    assert differs > 20
