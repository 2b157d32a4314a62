"""trtllm::Sample: the ONNX body on ONNX Runtime against the numpy reference, plus statistics."""
from __future__ import annotations

import functools

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from trtllm.plugins.sample import body, reference, schema  # noqa: E402

ARGS = ("logits", "logit_bias", "temperature", "top_k", "top_p", "uniform")


@functools.lru_cache(maxsize=None)
def _session(max_top_k: int):
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(body.make_model(max_top_k).SerializeToString(), options,
                                providers=["CPUExecutionProvider"])


def _run(case: dict, num_logprobs: int, max_top_k: int):
    feeds = {name: case[name] for name in ARGS}
    feeds["num_logprobs"] = np.array([num_logprobs], np.int64)
    return _session(max_top_k).run(None, feeds)


def _case(logits, temperature, top_k, top_p, uniform, bias=None) -> dict:
    logits = np.asarray(logits, np.float32)
    rows = logits.shape[0]
    full = lambda v, dtype: np.broadcast_to(np.asarray(v, dtype), (rows,)).copy()  # noqa: E731
    return {"logits": logits,
            "logit_bias": np.zeros_like(logits) if bias is None else np.asarray(bias, np.float32),
            "temperature": full(temperature, np.float32), "top_k": full(top_k, np.int64),
            "top_p": full(top_p, np.float32), "uniform": full(uniform, np.float32)}


def _assert_close(name, got, want, atol, eps=1e-6):
    """atol + |want| * eps, reporting the first bad indices and the largest errors."""
    assert got.shape == want.shape and got.dtype == want.dtype, (name, got.shape, got.dtype, want.shape, want.dtype)
    err = np.abs(got.astype(np.float64) - want)
    bad = np.argwhere(~(err <= atol + np.abs(want) * eps))
    assert not len(bad), (f"{name}: {len(bad)} bad, first at {bad[:5].tolist()}; max abs err {err.max():.3g}, "
                          f"max rel err {(err / np.maximum(np.abs(want), 1e-30)).max():.3g}")


# --- an independent float64 statement of the distribution, for kept_probs and ambiguity -------

def _naive_kept(x, temperature, top_k, top_p):
    """softmax(x / t) restricted to the top-k then nucleus set, renormalised (one row, float64)."""
    x = x.astype(np.float64)
    if temperature == 0:
        return np.eye(len(x))[np.argmax(x)], np.inf
    probs = np.exp(x / temperature - np.max(x / temperature))
    probs /= probs.sum()
    order = np.argsort(-x, kind="stable")
    kept = order[:top_k] if top_k > 0 else order
    q = probs[kept] / probs[kept].sum()
    margin = np.inf                                  # distance of the nucleus cut from top_p
    if top_p < 1:
        excl = np.concatenate([[0.0], np.cumsum(q)[:-1]])
        margin = np.min(np.abs(excl - top_p))
        kept = kept[excl < top_p]
    out = np.zeros(len(x))
    out[kept] = probs[kept] / probs[kept].sum()
    return out, margin


def _ambiguous(case, row, tol=1e-5):
    """True when float rounding may legitimately change this row's token."""
    x = case["logits"][row].astype(np.float64) + case["logit_bias"][row]
    probs, margin = _naive_kept(x, case["temperature"][row], case["top_k"][row], case["top_p"][row])
    cdf = np.cumsum(probs)
    return margin < tol or np.min(np.abs(cdf - case["uniform"][row])) < tol


def _random_case(rng):
    vocab_size = int(rng.choice([7, 50, 300, 2000]))
    max_top_k = min(schema.DEFAULT_MAX_TOP_K, vocab_size)
    rows = int(rng.integers(1, 9))
    logits = rng.normal(size=(rows, vocab_size)) * rng.choice([0.5, 2.0, 8.0])
    bias = np.where(rng.random((rows, vocab_size)) < 0.1, rng.uniform(-100, 100, (rows, vocab_size)), 0)
    case = _case(logits, rng.choice([0.0, 0.5, 1.0, 2.0], rows),
                 rng.choice([k for k in (0, 1, 5, max_top_k) if k <= max_top_k], rows),
                 rng.choice([0.3, 0.9, 1.0], rows), rng.random(rows, dtype=np.float32), bias)
    return case, int(rng.integers(1, min(5, max_top_k) + 1)), max_top_k


def test_body_matches_reference_on_random_cases():
    rng = np.random.default_rng(1234)
    num_rows = num_skipped = 0
    for _ in range(150):
        case, num_logprobs, max_top_k = _random_case(rng)
        got = _run(case, num_logprobs, max_top_k)
        want = reference.sample(*(case[name] for name in ARGS), num_logprobs, max_top_k)
        for g, w, name in zip(got, want, schema.OUTPUT_NAMES):
            assert g.shape == w.shape and g.dtype == w.dtype, (name, g.shape, g.dtype, w.shape, w.dtype)
        _assert_close("top_logprobs", got[1], want[1], atol=1e-5)
        logprobs = np.sort(reference._log_softmax(case["logits"] + case["logit_bias"]), axis=1)[:, ::-1]
        gaps = np.diff(logprobs[:, :num_logprobs + 1], axis=1) if logprobs.shape[1] > num_logprobs else None
        for row in range(len(got[0])):
            num_rows += 1
            tied = gaps is not None and np.min(np.abs(gaps[row])) < 1e-5
            if not tied:
                assert (got[2][row] == want[2][row]).all(), (row, got[2][row], want[2][row])
            if got[0][row] != want[0][row]:
                assert _ambiguous(case, row), (row, got[0][row], want[0][row], {k: v[row] for k, v in case.items()})
                num_skipped += 1
    assert num_rows > 500 and num_skipped <= num_rows // 100, (num_rows, num_skipped)


def test_reference_kept_probs_matches_naive_statement():
    rng = np.random.default_rng(7)
    for temperature, top_k, top_p in [(1.0, 0, 1.0), (0.7, 5, 1.0), (1.3, 0, 0.8), (0.8, 10, 0.7), (0.0, 3, 0.5)]:
        case = _case(rng.normal(size=(3, 50)) * 2, temperature, top_k, top_p, 0.5)
        got = reference.kept_probs(*(case[name] for name in ARGS[:5]), max_top_k=50)
        for row in range(3):
            naive, _ = _naive_kept(case["logits"][row], temperature, top_k, top_p)
            _assert_close("kept_probs", got[row].astype(np.float64), naive, atol=1e-6)


# --- statistics: ORT frequencies against kept_probs --------------------------------------------

def _frequency_failures(tokens, probs, num_draws):
    """Tokens whose frequency is off by more than 4 sigma (a token of probability 0 must not occur)."""
    freq = np.bincount(tokens, minlength=len(probs)) / num_draws
    sigma = np.sqrt(probs * (1 - probs) / num_draws)
    return np.flatnonzero(np.abs(freq - probs) > 4 * sigma + 1e-12)


STAT_CASES = {"full": (1.0, 0, 1.0), "top_k": (0.7, 5, 1.0), "top_p": (1.3, 0, 0.8), "both": (0.8, 10, 0.7),
              "cold": (0.5, 0, 1.0)}


@pytest.fixture(scope="module")
def stat_logits():
    return np.random.default_rng(99).normal(size=50).astype(np.float32) * 1.5


def _draw_tokens(logits, temperature, top_k, top_p, num_draws=20000):
    uniform = np.random.default_rng(5).random(num_draws, dtype=np.float32)
    case = _case(np.tile(logits, (num_draws, 1)), temperature, top_k, top_p, uniform)
    return _run(case, 1, len(logits))[0], case


@pytest.mark.parametrize("name", list(STAT_CASES))
def test_sampled_frequencies_match_kept_probs(name, stat_logits):
    temperature, top_k, top_p = STAT_CASES[name]
    tokens, case = _draw_tokens(stat_logits, temperature, top_k, top_p)
    probs = reference.kept_probs(*(case[n][:1] for n in ARGS[:5]), max_top_k=50)[0].astype(np.float64)
    naive, _ = _naive_kept(stat_logits, temperature, top_k, top_p)
    _assert_close("kept_probs", probs, naive, atol=1e-6)
    assert not len(_frequency_failures(tokens, probs, len(tokens)))


def test_frequency_check_rejects_a_wrong_distribution(stat_logits):
    """The deliberately wrong variant: the temperature ignored. The same check must fail."""
    tokens, case = _draw_tokens(stat_logits, *STAT_CASES["cold"])
    wrong = reference.kept_probs(case["logits"][:1], case["logit_bias"][:1], np.ones(1, np.float32),
                                 case["top_k"][:1], case["top_p"][:1], max_top_k=50)[0].astype(np.float64)
    assert len(_frequency_failures(tokens, wrong, len(tokens))) > 0


# --- greedy rows, logprobs and numerical robustness --------------------------------------------

def test_greedy_rows_ignore_uniform_and_logprobs_are_log_softmax():
    rng = np.random.default_rng(3)
    logits = np.repeat(rng.normal(size=(1, 300)) * 3, 4, axis=0)
    bias = np.zeros_like(logits)
    bias[:, 17] = 15.0                                    # the bias decides the argmax
    case = _case(logits, 0.0, [0, 1, 5, 300], [1.0, 0.3, 0.9, 1.0], [0.0, 0.5, 0.9, 0.99999994], bias)
    token_ids, top_logprobs, top_ids = _run(case, 5, 300)
    x = logits.astype(np.float64) + bias
    assert (token_ids == np.argmax(x, axis=1)).all()
    log_softmax = x - x.max(axis=1, keepdims=True)
    log_softmax -= np.log(np.exp(log_softmax).sum(axis=1, keepdims=True))
    want_ids = np.argsort(-log_softmax, axis=1, kind="stable")[:, :5]
    assert (top_ids == want_ids).all()
    _assert_close("top_logprobs", top_logprobs.astype(np.float64),
                  np.take_along_axis(log_softmax, want_ids, axis=1), atol=1e-5)


def _run_both(case, num_logprobs, max_top_k):
    got = _run(case, num_logprobs, max_top_k)
    want = reference.sample(*(case[name] for name in ARGS), num_logprobs, max_top_k)
    for g in got:
        if g.dtype.kind == "f":
            assert not np.isnan(g).any()
    return got, want


def test_minus_inf_bias_never_sampled_and_no_nan():
    logits = np.zeros((4, 50), np.float32)
    bias = np.zeros_like(logits)
    bias[:, :45] = -np.inf                                # only tokens 45..49 are allowed
    case = _case(logits, [0.0, 1.0, 2.0, 0.5], [0, 0, 3, 50], [1.0, 0.9, 1.0, 0.3],
                 [0.1, 0.99999994, 0.5, 0.7], bias)
    got, want = _run_both(case, 3, 50)
    assert (got[0] >= 45).all() and (got[0] == want[0]).all(), (got[0], want[0])
    assert np.isfinite(got[1]).all()


def test_all_equal_and_huge_logits():
    equal = _case(np.full((3, 50), 3.0), [0.0, 1.0, 0.5], [5, 0, 5], [1.0, 0.5, 0.9], [0.3, 0.6, 0.99])
    got, want = _run_both(equal, 2, 50)
    assert got[0][0] == 0 and (got[0] == want[0]).all()  # ties: greedy is the first, the rest all kept
    huge = _case(np.random.default_rng(0).normal(size=(3, 300)) * 1e30, [0.5, 2.0, 1.0], [0, 5, 300],
                 [0.9, 1.0, 0.3], [0.2, 0.5, 0.8])
    got, want = _run_both(huge, 3, 300)
    assert (got[0] == want[0]).all() and (got[2] == want[2]).all()


def test_uniform_just_below_one_picks_a_kept_token():
    logits = np.random.default_rng(4).normal(size=(2, 300)).astype(np.float32)
    case = _case(logits, 1.0, [3, 0], [1.0, 1.0], np.nextafter(np.float32(1), np.float32(0)))
    got, want = _run_both(case, 1, 300)
    assert got[0][0] in np.argsort(-logits[0])[:3] and (got[0] == want[0]).all()


def test_model_checks_and_declares_its_attributes():
    model = body.make_model(16, vocab_size=64)
    onnx.checker.check_model(model, full_check=True)
    function = model.functions[0]
    assert (function.domain, function.name) == ("trtllm", "Sample")
    assert set(function.attribute) == set(schema.ATTRIBUTES)
    node = model.graph.node[0]
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    assert attrs == {"max_top_k": 16, "plugin_namespace": b"trtllm", "plugin_version": b"1"}


@pytest.mark.parametrize("change, field", [
    ({"top_k": [6]}, "top_k"), ({"top_k": [-1]}, "top_k"), ({"top_p": [0.0]}, "top_p"),
    ({"top_p": [1.5]}, "top_p"), ({"temperature": [-1.0]}, "temperature"), ({"uniform": [1.0]}, "uniform"),
    ({"logit_bias": np.zeros((1, 4))}, "logit_bias"), ({"logits": np.full((1, 8), np.nan)}, "logits"),
])
def test_reference_validation_names_the_field(change, field):
    case = _case(np.zeros((1, 8)), 1.0, 0, 1.0, 0.5)
    case.update({k: np.asarray(v) for k, v in change.items()})
    with pytest.raises(ValueError, match=field):
        reference.sample(*(case[name] for name in ARGS), 1, 5)


@pytest.mark.parametrize("num_logprobs, max_top_k, field", [(0, 5, "num_logprobs"), (6, 5, "num_logprobs"),
                                                              (51, 100, "num_logprobs"), (1, 0, "max_top_k"),
                                                              (1, 9, "max_top_k")])
def test_reference_rejects_bad_limits(num_logprobs, max_top_k, field):
    case = _case(np.zeros((1, 8 if max_top_k < 100 else 200)), 1.0, 0, 1.0, 0.5)
    with pytest.raises(ValueError, match=field):
        reference.sample(*(case[name] for name in ARGS), num_logprobs, max_top_k)


def test_make_node_and_function_validate():
    with pytest.raises(ValueError, match="max_top_k"):
        body.make_function(3840)
    with pytest.raises(ValueError, match="inputs"):
        body.make_node(["logits"], list(schema.OUTPUT_NAMES), 8)
