"""trtllm::Sample: the ONNX body on ONNX Runtime against the numpy reference (statistics of its
draws: test_sample_statistics.py)."""
from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from trtllm.plugins import lint  # noqa: E402
from trtllm.plugins.sample import body, reference, schema  # noqa: E402

from tests.plugins.sample_cases import (ARGS, ambiguous, assert_close, kept_of, make_case,  # noqa: E402
                                        naive_penalized, naive_row, random_case, random_penalties, run_body,
                                        run_reference)

def test_the_random_comparison_catches_a_sampler_without_penalties():
    """The deliberately wrong variant: the reference with its penalty stage left out must disagree
    with the body on the same random cases, so the comparison below can see such a bug."""
    rng = np.random.default_rng(1234)
    differ = 0
    for _ in range(40):
        case, num_logprobs, max_top_k = random_case(rng)
        wrong = {**case, "penalty_bias": np.zeros_like(case["penalty_bias"]),
                 "repetition_penalty": np.ones_like(case["repetition_penalty"])}
        differ += int((run_body(case, num_logprobs, max_top_k)[0] != run_reference(wrong, num_logprobs, max_top_k)[0]).any())
    assert differ >= 5


def test_body_matches_reference_on_random_cases():
    rng = np.random.default_rng(1234)
    num_rows = num_skipped = 0
    for _ in range(200):
        case, num_logprobs, max_top_k = random_case(rng)
        got = run_body(case, num_logprobs, max_top_k)
        want = run_reference(case, num_logprobs, max_top_k)
        for g, w, name in zip(got, want, schema.OUTPUT_NAMES):
            assert g.shape == w.shape and g.dtype == w.dtype, (name, g.shape, g.dtype, w.shape, w.dtype)
            assert g.dtype.kind != "f" or not np.isnan(g).any(), name
        assert_close("top_logprobs", got[1], want[1], atol=1e-5)
        logprobs = np.sort(reference._log_softmax(case["logits"] + case["logit_bias"]), axis=1)[:, ::-1]
        gaps = np.diff(logprobs[:, :num_logprobs + 1], axis=1) if logprobs.shape[1] > num_logprobs else None
        for row in range(len(got[0])):
            num_rows += 1
            # (a NaN gap is two -inf logprobs: masked tokens, in no particular order)
            tied = gaps is not None and not (np.abs(gaps[row]) >= 1e-5).all()
            if not tied:
                assert (got[2][row] == want[2][row]).all(), (row, got[2][row], want[2][row])
            if got[0][row] != want[0][row]:
                assert ambiguous(case, row), (row, got[0][row], want[0][row], {k: v[row] for k, v in case.items()})
                num_skipped += 1
            assert kept_of(case, max_top_k, slice(row, row + 1))[0, got[0][row]] > 0 or ambiguous(case, row)
    assert num_rows > 700 and num_skipped <= num_rows // 100, (num_rows, num_skipped)


KEPT_CASES = [  # temperature, top_k, top_p, min_p, penalised
    (1.0, 0, 1.0, 0.0, False), (0.7, 5, 1.0, 0.0, False), (1.3, 0, 0.8, 0.0, False), (0.8, 10, 0.7, 0.0, False),
    (0.0, 3, 0.5, 0.0, False), (1.0, 0, 1.0, 0.1, False), (1.5, 0, 0.9, 0.05, True), (0.9, 8, 0.8, 0.02, True),
    (1.0, 0, 1.0, 0.0, True), (0.0, 0, 1.0, 0.2, True), (2.0, 4, 1.0, 0.5, True),
]


@pytest.mark.parametrize("temperature, top_k, top_p, min_p, penalised", KEPT_CASES)
def test_reference_kept_probs_matches_naive_statement(temperature, top_k, top_p, min_p, penalised):
    rng = np.random.default_rng(7)
    logits = rng.normal(size=(3, 50)) * 2
    penalties = random_penalties(np.random.default_rng(8), 3, 50) if penalised else {}
    case = make_case(logits, temperature, top_k, top_p, 0.5, min_p=min_p, **penalties)
    got = kept_of(case, 50)
    for row in range(3):
        naive, margin = naive_row(case, row)
        assert margin > 1e-4, "the case sits on a cut: pick other values"
        assert_close("kept_probs", got[row].astype(np.float64), naive, atol=1e-6)


def test_penalties_match_vllm_from_token_counts():
    """kept_probs against vLLM's formula written from prompt/output token ids, all in float64."""
    rng = np.random.default_rng(11)
    vocab_size, eos_id = 60, 3
    logits = rng.normal(size=vocab_size) * 3
    prompt_ids, output_ids = rng.integers(0, vocab_size, 12), rng.integers(0, vocab_size, 20)
    rep, frequency, presence = 1.4, 0.3, 0.7
    counts = np.bincount(output_ids, minlength=vocab_size)
    seen = (np.bincount(prompt_ids, minlength=vocab_size) > 0) | (counts > 0)
    # vLLM v1 apply_penalties, then the min_new_tokens ban of EOS.
    want = logits.copy()
    positive = want > 0
    want[positive & seen] /= rep
    want[~positive & seen] *= rep
    want -= frequency * counts + presence * (counts > 0)
    want[eos_id] = -np.inf
    penalty_bias = -(frequency * counts + presence * (counts > 0))
    penalty_bias[eos_id] = -np.inf
    case = make_case(logits[None], 1.0, 0, 1.0, 0.5, penalty_bias=penalty_bias[None], seen=seen[None],
                 repetition_penalty=rep)
    probs = np.exp(want - want.max())
    assert_close("kept_probs", kept_of(case, vocab_size)[0].astype(np.float64), probs / probs.sum(), atol=1e-6)
    assert kept_of(case, vocab_size)[0, eos_id] == 0


# --- greedy rows, logprobs and numerical robustness --------------------------------------------

def test_greedy_rows_ignore_uniform_and_logprobs_are_log_softmax():
    rng = np.random.default_rng(3)
    logits = np.repeat(rng.normal(size=(1, 300)) * 3, 4, axis=0)
    bias = np.zeros_like(logits)
    bias[:, 17] = 15.0                                    # the bias decides the argmax
    case = make_case(logits, 0.0, [0, 1, 5, 300], [1.0, 0.3, 0.9, 1.0], [0.0, 0.5, 0.9, 0.99999994], bias,
                 min_p=[0.0, 0.5, 0.0, 1.0])
    token_ids, top_logprobs, top_ids = run_body(case, 5, 300)
    x = logits.astype(np.float64) + bias
    assert (token_ids == np.argmax(x, axis=1)).all()
    log_softmax = x - x.max(axis=1, keepdims=True)
    log_softmax -= np.log(np.exp(log_softmax).sum(axis=1, keepdims=True))
    want_ids = np.argsort(-log_softmax, axis=1, kind="stable")[:, :5]
    assert (top_ids == want_ids).all()
    assert_close("top_logprobs", top_logprobs.astype(np.float64),
                  np.take_along_axis(log_softmax, want_ids, axis=1), atol=1e-5)


def test_greedy_rows_pick_argmax_of_penalised_logits():
    logits = np.array([[5.0, 4.0, 3.0, -1.0, 2.9]] * 4, np.float32)
    seen = np.zeros((4, 5), bool)
    seen[:, 0] = True
    penalty_bias = np.zeros((4, 5), np.float32)
    penalty_bias[2, 1] = -np.inf                          # row 2: 0 penalised to 2.5, 1 banned -> 2
    penalty_bias[3, 0] = -1.5                             # row 3: no repetition penalty, 0 drops to 3.5
    case = make_case(logits, 0.0, 0, 1.0, 0.5, seen=seen, penalty_bias=penalty_bias,
                 repetition_penalty=[1.0, 2.0, 2.0, 1.0])
    got, want = _run_both(case, 2, 5)
    assert got[0].tolist() == want[0].tolist() == [0, 1, 2, 1]
    for row in range(4):
        y = naive_penalized(logits[row], seen[row], case["repetition_penalty"][row], penalty_bias[row])
        assert got[0][row] == np.argmax(y)


def _body_tensor(name: str, case: dict, max_top_k: int) -> np.ndarray:
    """An intermediate tensor of the body (the reference's variable `name`), run on ONNX Runtime."""
    function = body.make_function(max_top_k)
    model = body.make_model(max_top_k)
    graph = onnx.helper.make_graph(function.node, "body", model.graph.input,
                                   [onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None)])
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", schema.OPSET)], ir_version=11)
    feeds = {n: case[n] for n in ARGS}
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]


def test_body_penalties_are_bit_exact():
    """The body's Min/Max form of step 3 equals the reference's where(x > 0, x / r, x * r) bit for bit."""
    tiny, huge = np.finfo(np.float32).tiny, np.finfo(np.float32).max
    values = np.array([0.0, -0.0, 1e-45, -1e-45, tiny, -tiny, 1.0, -1.0, 3.3, -3.3, huge, -huge, -np.inf,
                       1e30, -1e30, 0.1, -0.1, 7e-39, -7e-39], np.float32)
    rs = np.array([1.0, 1.5, 0.5, 3.0, 0.3, 1e-20, 1e20, 1.0000001, 0.99999994], np.float32)
    logits = np.tile(values, (len(rs), 1))
    seen = np.ones(logits.shape, bool)
    seen[:, 1::4] = False
    case = make_case(logits, 1.0, 0, 1.0, 0.5, seen=seen, repetition_penalty=rs)
    with np.errstate(over="ignore"):
        want = reference._penalize(logits, case["penalty_bias"], seen, rs)
        got = _body_tensor("y", case, 8)
    assert got.dtype == want.dtype and np.array_equal(got.view(np.int32), want.view(np.int32)), \
        np.argwhere(got.view(np.int32) != want.view(np.int32))[:5].tolist()


def test_body_takes_seen_as_int32_too():
    """A --sampling-plugin graph casts seen to int32 before the node (TensorRT plugins take no BOOL
    tensor: schema.PLUGIN_SEEN); the body, the graph's fallback, gives the same outputs from it."""
    sessions = {}

    def session(max_top_k):
        if max_top_k not in sessions:
            model = body.make_model(max_top_k)
            next(i for i in model.graph.input if i.name == "seen").type.tensor_type.elem_type = onnx.TensorProto.INT32
            sessions[max_top_k] = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        return sessions[max_top_k]

    rng = np.random.default_rng(5)
    penalised = 0
    for _ in range(30):
        case, num_logprobs, max_top_k = random_case(rng)
        want = run_body(case, num_logprobs, max_top_k)
        got = session(max_top_k).run(None, {**{n: case[n] for n in ARGS}, "seen": case["seen"].astype(np.int32)})
        assert all(np.array_equal(g[:, :num_logprobs] if g.ndim == 2 else g, w) for g, w in zip(got, want))
        penalised += int((case["seen"].any(1) & (case["repetition_penalty"] != 1)).sum())
    assert penalised > 10


def test_logprobs_ignore_penalties():
    rng = np.random.default_rng(21)
    logits = rng.normal(size=(4, 300)) * 3
    args = (logits, [0.0, 1.0, 0.7, 1.0], 0, 1.0, [0.1, 0.5, 0.9, 0.3])
    plain = make_case(*args)
    penalties = dict(random_penalties(rng, 4, 300), seen=np.ones((4, 300), bool), repetition_penalty=3.0)
    penalised = make_case(*args, min_p=0.1, **penalties)
    a, b = run_body(plain, 7, 300), run_body(penalised, 7, 300)
    assert np.array_equal(a[1], b[1]) and np.array_equal(a[2], b[2])
    assert not np.array_equal(a[0], b[0])                 # while the tokens did change


def _run_both(case, num_logprobs, max_top_k):
    got = run_body(case, num_logprobs, max_top_k)
    want = run_reference(case, num_logprobs, max_top_k)
    for g in got:
        if g.dtype.kind == "f":
            assert not np.isnan(g).any()
    return got, want


def test_minus_inf_bias_never_sampled_and_no_nan():
    logits = np.zeros((4, 50), np.float32)
    bias = np.zeros_like(logits)
    bias[:, :45] = -np.inf                                # only tokens 45..49 are allowed
    case = make_case(logits, [0.0, 1.0, 2.0, 0.5], [0, 0, 3, 50], [1.0, 0.9, 1.0, 0.3],
                 [0.1, 0.99999994, 0.5, 0.7], bias)
    got, want = _run_both(case, 3, 50)
    assert (got[0] >= 45).all() and (got[0] == want[0]).all(), (got[0], want[0])
    assert np.isfinite(got[1]).all()


def test_minus_inf_penalty_bias_never_sampled_and_no_nan():
    logits = np.random.default_rng(6).normal(size=(6, 50)).astype(np.float32)
    penalty_bias = np.zeros_like(logits)
    penalty_bias[:, 5:] = -np.inf                         # only tokens 0..4 are allowed
    penalty_bias[5, 1:] = -np.inf                         # row 5: only token 0
    seen = np.ones(logits.shape, bool)                    # -inf * r and -inf / r stay -inf
    case = make_case(logits, [0.0, 1.0, 2.0, 0.5, 1.0, 1.0], [0, 0, 3, 50, 0, 2], [1.0, 0.9, 1.0, 0.3, 1.0, 0.5],
                 [0.1, 0.99999994, 0.5, 0.7, 0.0, 0.6], penalty_bias=penalty_bias, seen=seen,
                 repetition_penalty=[1.0, 1.5, 0.5, 2.0, 1.0, 1.2], min_p=[0.0, 0.0, 0.1, 0.0, 1.0, 0.5])
    got, want = _run_both(case, 3, 50)
    assert (got[0] < 5).all() and got[0][5] == 0 and (got[0] == want[0]).all(), (got[0], want[0])
    assert np.isfinite(got[1]).all()


def test_all_equal_and_huge_logits():
    equal = make_case(np.full((3, 50), 3.0), [0.0, 1.0, 0.5], [5, 0, 5], [1.0, 0.5, 0.9], [0.3, 0.6, 0.99],
                  min_p=[0.0, 1.0, 0.5])
    got, want = _run_both(equal, 2, 50)
    assert got[0][0] == 0 and (got[0] == want[0]).all()  # ties: greedy is the first, the rest all kept
    huge = make_case(np.random.default_rng(0).normal(size=(3, 300)) * 1e30, [0.5, 2.0, 1.0], [0, 5, 300],
                 [0.9, 1.0, 0.3], [0.2, 0.5, 0.8], min_p=[0.0, 0.1, 0.0], seen=np.ones((3, 300), bool),
                 repetition_penalty=[1.0, 1.0, 2.0])
    got, want = _run_both(huge, 3, 300)
    assert (got[0] == want[0]).all() and (got[2] == want[2]).all()


def test_uniform_just_below_one_picks_a_kept_token():
    logits = np.random.default_rng(4).normal(size=(3, 300)).astype(np.float32)
    case = make_case(logits, 1.0, [3, 0, 0], [1.0, 1.0, 1.0], np.nextafter(np.float32(1), np.float32(0)),
                 min_p=[0.0, 0.0, 0.5])
    got, want = _run_both(case, 1, 300)
    assert got[0][0] in np.argsort(-logits[0])[:3] and (got[0] == want[0]).all()
    assert kept_of(case, 300)[2, got[0][2]] > 0


def test_min_p_keeps_tokens_within_the_ratio_of_the_max():
    logits = np.log(np.array([[0.4, 0.3, 0.15, 0.1, 0.05]] * 3, np.float32))
    case = make_case(logits, 1.0, 0, 1.0, 0.5, min_p=[0.3, 0.5, 1.0])   # ratios 1, .75, .375, .25, .125
    kept = kept_of(case, 5) > 0
    assert kept.tolist() == [[True] * 3 + [False] * 2, [True] * 2 + [False] * 3, [True] + [False] * 4]


def test_model_checks_and_declares_its_attributes():
    model = body.make_model(16, vocab_size=64)
    onnx.checker.check_model(model, full_check=True)
    function = model.functions[0]
    assert (function.domain, function.name) == ("trtllm", "Sample")
    assert list(function.input) == list(schema.INPUT_NAMES) == [
        "logits", "logit_bias", "penalty_bias", "seen", "repetition_penalty", "temperature", "min_p", "top_k",
        "top_p", "uniform"]
    assert set(function.attribute) == set(schema.ATTRIBUTES)
    node = model.graph.node[0]
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    assert attrs == {"max_top_k": 16, "plugin_namespace": b"trtllm", "plugin_version": b"1"}
    widths = [[d.dim_value for d in o.type.tensor_type.shape.dim][1:] for o in model.graph.output]
    assert widths == [[], [16], [16]]                      # K = min(50, M), static


@pytest.mark.parametrize("trt_version, opset", [("11.1", 24), ("10.3", 20)])
@pytest.mark.parametrize("max_top_k", [16, 1024])
def test_body_passes_tensorrt_lint(trt_version, opset, max_top_k):
    assert lint.lint_model(body.make_model(max_top_k, 49152, opset=opset), trt_version) == []


def test_body_at_opset_20_samples_as_at_24():
    """The legacy graph's body (opset 20) on sampled and greedy rows: the same outputs as opset 24."""
    rng = np.random.default_rng(7)
    case = make_case(rng.standard_normal((4, 300)) * 3, [0.0, 0.7, 1.0, 1.3], [0, 5, 0, 40], [1.0, 0.9, 0.5, 1.0],
                 rng.random(4), min_p=[0.0, 0.0, 0.05, 0.0], repetition_penalty=[1.0, 1.2, 1.0, 0.9])
    feeds = {name: case[name] for name in ARGS}
    outs = [ort.InferenceSession(body.make_model(64, opset=opset).SerializeToString(),
                                 providers=["CPUExecutionProvider"]).run(None, feeds) for opset in (20, 24)]
    for got, want in zip(*outs):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("opset", [17, 25])
def test_body_opset_out_of_range_is_refused(opset):
    with pytest.raises(ValueError, match="opset must be in"):
        body.make_function(8, opset=opset)


@pytest.mark.parametrize("change, field", [
    ({"top_k": [6]}, "top_k"), ({"top_k": [-1]}, "top_k"), ({"top_p": [0.0]}, "top_p"),
    ({"top_p": [1.5]}, "top_p"), ({"temperature": [-1.0]}, "temperature"), ({"uniform": [1.0]}, "uniform"),
    ({"logit_bias": np.zeros((1, 4))}, "logit_bias"), ({"logits": np.full((1, 8), np.nan)}, "logits"),
    ({"min_p": [-0.1]}, "min_p"), ({"min_p": [1.5]}, "min_p"), ({"min_p": [np.nan]}, "min_p"),
    ({"repetition_penalty": [0.0]}, "repetition_penalty"), ({"repetition_penalty": [np.inf]}, "repetition_penalty"),
    ({"penalty_bias": np.full((1, 8), np.nan)}, "penalty_bias"), ({"penalty_bias": np.full((1, 8), np.inf)},
                                                                  "penalty_bias"),
    ({"penalty_bias": np.full((1, 8), -np.inf)}, "penalty_bias"), ({"seen": np.zeros((1, 7), bool)}, "seen"),
])
def test_reference_validation_names_the_field(change, field):
    case = make_case(np.zeros((1, 8)), 1.0, 0, 1.0, 0.5)
    case.update({k: np.asarray(v) for k, v in change.items()})
    with pytest.raises(ValueError, match=field):
        reference.sample(*(case[name] for name in ARGS), 5)


def test_reference_seen_must_be_bool():
    case = make_case(np.zeros((1, 8)), 1.0, 0, 1.0, 0.5)
    case["seen"] = np.ones((1, 8), np.int64)
    with pytest.raises(TypeError, match="seen"):
        reference.sample(*(case[name] for name in ARGS), 5)


@pytest.mark.parametrize("max_top_k", [0, 9])
def test_reference_rejects_bad_limits(max_top_k):
    case = make_case(np.zeros((1, 8)), 1.0, 0, 1.0, 0.5)
    with pytest.raises(ValueError, match="max_top_k"):
        reference.sample(*(case[name] for name in ARGS), max_top_k)


def test_make_node_and_function_validate():
    with pytest.raises(ValueError, match="max_top_k"):
        body.make_function(3840)
    with pytest.raises(ValueError, match="inputs"):
        body.make_node(["logits"], list(schema.OUTPUT_NAMES), 8)


def test_argmax_form_gives_the_same_outputs():
    """ONNX Runtime's form takes greedy from ArgMax (first maximum): same outputs, ties included."""
    rng = np.random.default_rng(5)
    logits = np.round(rng.standard_normal((6, 300)) * 2) / 2          # many exact ties, at the max too
    case = make_case(logits, [0.0, 0.0, 0.7, 1.0, 0.0, 1.3], [0, 5, 0, 40, 0, 0], [1.0, 0.9, 0.5, 1.0, 1.0, 1.0],
                 rng.random(6), repetition_penalty=[1.0, 1.2, 1.0, 0.9, 1.0, 1.0])
    feeds = {name: case[name] for name in ARGS}
    outs = [ort.InferenceSession(body.make_model(64, argmax=argmax).SerializeToString(),
                                 providers=["CPUExecutionProvider"]).run(None, feeds) for argmax in (False, True)]
    for got, want in zip(*outs):
        np.testing.assert_array_equal(got, want)
    greedy = {name: case[name][[0, 1, 4]] for name in ARGS}          # the all-greedy branch too
    outs = [ort.InferenceSession(body.make_model(64, argmax=argmax).SerializeToString(),
                                 providers=["CPUExecutionProvider"]).run(None, greedy) for argmax in (False, True)]
    np.testing.assert_array_equal(outs[0][0], outs[1][0])
    assert (outs[1][0] == reference.sample(*greedy.values(), 64)[0]).all()


@pytest.mark.parametrize("min_p", [0.0, 0.01])
def test_min_p_survivors_beyond_max_top_k_renormalise_top_p(min_p):
    """More tokens pass min-p than the sampler sorts (M = 8 of 200): top-p must still divide by all
    of their mass. Dividing by the first M inflated every probability and cut the nucleus to one
    token here, where it is two (the wrong variant: any min_p > 0 then differed from min_p 0)."""
    logits = np.concatenate([[3.0, 2.9], np.zeros(198)])[None, :]
    case = make_case(logits, 1.0, 0, 0.15, 0.5, min_p=min_p)
    got = kept_of(case, 8)[0].astype(np.float64)
    naive, margin = naive_row(case, 0)
    assert margin > 1e-4
    assert np.count_nonzero(got) == 2
    assert_close("kept_probs", got, naive, atol=1e-6)


def test_the_body_with_a_top_p_of_zero_keeps_the_top_token():
    """A top_p that rounds to 0 in float32 (the runtime refuses those, the graph does not see why):
    the nucleus is still the top token, not the top M (a threshold index of -1 wrapped to M - 1)."""
    logits = np.random.default_rng(3).normal(size=(4, 50)).astype(np.float32)
    case = make_case(logits, 1.0, 0, 0.0, np.array([0.0, 0.3, 0.6, 0.999]))
    assert (run_body(case, 1, 16)[0] == np.argmax(logits, axis=1)).all()


def test_top_k_keeps_ties_so_top_k_1_is_not_greedy():
    """top_k keeps every token tied with the k-th (transformers' rule): top_k 1 at temperature 1
    draws among tied top tokens, so EAGLE must not treat it as greedy (argmax takes the first)."""
    from trtllm.runtime.sampling import SamplingParams
    from trtllm.runtime.speculative import greedy

    logits = [[3.0, 3.0, 1.0, 0.0]] * 2
    case = make_case(logits, 1.0, 1, 1.0, [0.2, 0.7])
    for tokens in (run_reference(case, 1, 4)[0], run_body(case, 1, 4)[0]):
        assert tokens.tolist() == [0, 1]
    assert not greedy(SamplingParams(temperature=1.0, top_k=1)) and greedy(SamplingParams(temperature=0.0))
