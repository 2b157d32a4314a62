"""trtllm::Sample's draws: sampled frequencies on ONNX Runtime against the kept distribution, with two
deliberately wrong distributions the same check must reject."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from tests.plugins.sample_cases import assert_close, kept_of, make_case, naive_row, random_penalties, run_body  # noqa: E402

def _frequency_failures(tokens, probs, num_draws):
    """Tokens whose frequency is off by more than 4 sigma (a token of probability 0 must not occur)."""
    freq = np.bincount(tokens, minlength=len(probs)) / num_draws
    sigma = np.sqrt(probs * (1 - probs) / num_draws)
    return np.flatnonzero(np.abs(freq - probs) > 4 * sigma + 1e-12)


STAT_CASES = {  # temperature, top_k, top_p, min_p, penalised
    "full": (1.0, 0, 1.0, 0.0, False), "top_k": (0.7, 5, 1.0, 0.0, False), "top_p": (1.3, 0, 0.8, 0.0, False),
    "both": (0.8, 10, 0.7, 0.0, False), "cold": (0.5, 0, 1.0, 0.0, False), "min_p": (1.0, 0, 1.0, 0.1, False),
    "penalties_top_p": (0.9, 0, 0.8, 0.0, True), "min_p_top_k_top_p": (1.2, 12, 0.85, 0.04, True),
}


@pytest.fixture(scope="module")
def stat_logits():
    return np.random.default_rng(99).normal(size=50).astype(np.float32) * 1.5


def _stat_penalties(num_draws):
    """One fixed set of penalties (seen mask, -inf bans), the same for every draw."""
    one = random_penalties(np.random.default_rng(12), 1, 50)
    one["penalty_bias"][0, :3] = -np.inf
    one["repetition_penalty"][:] = 1.5
    return {"seen": np.repeat(one["seen"], num_draws, axis=0), "repetition_penalty": 1.5,
            "penalty_bias": np.repeat(one["penalty_bias"], num_draws, axis=0)}


def _draw_tokens(logits, temperature, top_k, top_p, min_p, penalised, num_draws=20000):
    uniform = np.random.default_rng(5).random(num_draws, dtype=np.float32)
    penalties = _stat_penalties(num_draws) if penalised else {}
    case = make_case(np.tile(logits, (num_draws, 1)), temperature, top_k, top_p, uniform, min_p=min_p, **penalties)
    return run_body(case, 1, len(logits))[0], case


@pytest.mark.parametrize("name", list(STAT_CASES))
def test_sampled_frequencies_match_kept_probs(name, stat_logits):
    tokens, case = _draw_tokens(stat_logits, *STAT_CASES[name])
    probs = kept_of(case, 50, slice(0, 1))[0].astype(np.float64)
    naive, margin = naive_row(case, 0)
    assert margin > 1e-4
    assert_close("kept_probs", probs, naive, atol=1e-6)
    assert 1 < np.count_nonzero(probs) < 50 or name in ("full", "cold")   # the filters really cut
    assert not len(_frequency_failures(tokens, probs, len(tokens)))


def test_frequency_check_rejects_a_wrong_distribution(stat_logits):
    """The deliberately wrong variant: the temperature ignored. The same check must fail."""
    tokens, case = _draw_tokens(stat_logits, *STAT_CASES["cold"])
    case = dict(case, temperature=np.ones_like(case["temperature"]))
    wrong = kept_of(case, 50, slice(0, 1))[0].astype(np.float64)
    assert len(_frequency_failures(tokens, wrong, len(tokens))) > 0


def test_frequency_check_rejects_ignored_penalties(stat_logits):
    """A second wrong variant: the same draws against the unpenalised distribution."""
    tokens, case = _draw_tokens(stat_logits, *STAT_CASES["penalties_top_p"])
    case = dict(case, penalty_bias=np.zeros_like(case["penalty_bias"]),
                repetition_penalty=np.ones_like(case["repetition_penalty"]))
    wrong = kept_of(case, 50, slice(0, 1))[0].astype(np.float64)
    assert len(_frequency_failures(tokens, wrong, len(tokens))) > 0
