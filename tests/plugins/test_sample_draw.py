"""trtllm::Sample's draw (step 10): ONNX Runtime's form sums the CDF in float64, TensorRT's in float32
with its rounding carried (body._compensated); both against the numpy reference, with the plain
float32 sum as the wrong variant, and a parallel scan's rounding past the last weighted token."""
from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from trtllm.plugins.sample import body, reference  # noqa: E402

from tests.plugins.sample_cases import ARGS, make_case, run_reference, tail_case  # noqa: E402


def plain_float32_draw(b):
    """The wrong variant: step 10 on CumSum's float32 sum as it comes (TensorRT's form until
    session 40), its rounding lost."""
    b.op("CumSum", "w", "axis_1", out="c")
    b.op("Where", "weighted", "c", "zero_f", out="c_weighted")
    b.op("ReduceMax", "c_weighted", "axes_1", out="total", keepdims=1)
    b.op("Mul", "u2", "total", out="target")
    b.op("Greater", "c", "target", out="past_target")
    b.op("GreaterOrEqual", "c", "total", out="at_total")


def draws(case, float64: bool, max_top_k: int = 64) -> np.ndarray:
    model = body.make_model(max_top_k, float64_draw=float64, argmax=float64)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {name: case[name] for name in ARGS})[0]


def test_the_least_likely_tokens_are_drawn(monkeypatch):
    """Sampled with nothing restricted, tokens whose weights a float32 running sum cannot hold are
    drawn where the exact CDF puts them: by the reference and ONNX Runtime's form of the body
    (float64 sums), and by TensorRT's (float32, its rounding carried). The wrong variant, a plain
    float32 sum, never draws one (the demo model's 36,700 least likely tokens, 2e-4 of the mass,
    were unreachable on TensorRT)."""
    case, want = tail_case()
    assert (want[2:] > 0).all() and np.array_equal(reference.sample(*(case[n] for n in ARGS), 64)[0], want)
    assert np.array_equal(draws(case, float64=True), want)
    assert np.array_equal(draws(case, float64=False), want)
    monkeypatch.setattr(body, "_compensated", plain_float32_draw)
    assert (draws(case, float64=False) == 0).all()


def test_the_float32_draw_gives_the_float64_draws_tokens(monkeypatch):
    """TensorRT's form of the draw (float32 only) against the reference (float64 sums) on rows
    shaped like a language model's: three likely tokens over 49,152 spread at logits of sd 2, each
    uniform inside the tail (1% of the mass). Every token is the reference's; the wrong variant, a
    plain float32 sum, missed 29 of 192 this way (15 of these 64)."""
    rng = np.random.default_rng(7)
    logits = (rng.standard_normal((64, 49152)) * 2).astype(np.float32)
    for row in logits:
        row[rng.integers(0, 49152, 3)] += 16
    w = np.exp(logits.astype(np.float64) - logits.max(1, keepdims=True))
    tail = 1 - np.sort(w, 1)[:, -3:].sum(1) / w.sum(1)
    case = make_case(logits, 1.0, 0, 1.0, (1 - rng.random(64) * tail).astype(np.float32))
    want = reference.sample(*(case[n] for n in ARGS), 1024)[0]
    assert np.array_equal(draws(case, float64=False, max_top_k=1024), want)
    monkeypatch.setattr(body, "_compensated", plain_float32_draw)
    assert (draws(case, float64=False, max_top_k=1024) != want).sum() >= 5


def test_the_float32_draw_is_exact_after_a_large_weight_and_for_any_uniform():
    """Where a large weight follows small ones (a likely token after a tail), c[i] - c[i-1] is not
    exact: its own rounding is taken off too (TwoSum). Without that the running sum was 2^-25 of it
    off from there on, and every draw aimed into the tail after such a token came 6 tokens early
    (60 of 60 here, a review's). Uniforms spread over [0, 1) on language-model-like rows too (the
    error's effect grows with 1 - u, which the test above keeps small). A uniform whose target
    falls within 1e-9 of a weight of a boundary is one the backends may round apart (DESIGN.md)."""
    vocab, big = 4096, 1000
    row = np.full(vocab, -20.0, np.float32)
    row[[big, vocab - 1]] = 0.0
    w = np.exp(row).astype(np.float64)  # (the weights as the sampler computes them: float32)
    c = np.cumsum(w)
    uniforms = np.array([(c[big] + (j + 0.5) * w[0]) / c[-1] for j in range(0, 3000, 50)], np.float32)
    case = make_case(np.tile(row, (len(uniforms), 1)), 1.0, 0, 1.0, uniforms)
    target = uniforms.astype(np.float64) * c[-1]
    clear = np.abs(c[None, :] - target[:, None]).min(axis=1) > 1e-9 * w[0]
    assert clear.sum() >= 55
    want = reference.sample(*(case[n] for n in ARGS), 64)[0]
    assert np.array_equal(draws(case, float64=False)[clear], want[clear])
    rng = np.random.default_rng(3)
    logits = (rng.standard_normal((64, 49152)) * 2).astype(np.float32)
    for r in logits:
        r[rng.integers(0, 49152, 3)] += 16
    case = make_case(logits, 1.0, 0, 1.0, rng.random(64, dtype=np.float32))
    want = reference.sample(*(case[n] for n in ARGS), 1024)[0]
    assert np.array_equal(draws(case, float64=False, max_top_k=1024), want)


def _with_scan_error(model, error: np.ndarray, unweighted: bool = False):
    """The body with `error` added to CumSum(w): a parallel scan's rounding, as a GPU's may round.
    `unweighted`: the draw's rule before weights counted (the wrong variant): total the largest
    running sum anywhere (c[-1] when summed in order), and any token may be drawn."""
    def patch(nodes):
        for i, node in enumerate(nodes):
            if node.op_type == "CumSum" and list(node.input[:1]) == ["w"]:
                node.output[0] = "c_scan"
                nodes.insert(i + 1, onnx.helper.make_node("Add", ["c_scan", "scan_error"], ["c"]))
                nodes.insert(i + 1, onnx.helper.make_node("Constant", [], ["scan_error"],
                                                          value=onnx.numpy_helper.from_array(error)))
                for later in nodes:
                    if unweighted and later.op_type == "ReduceMax" and list(later.input[:1]) == ["c_weighted"]:
                        later.input[0] = "c"
                    if unweighted and later.op_type == "And" and list(later.output) == ["chosen"]:
                        later.op_type, later.input[:] = "Identity", ["passed"]
                return True
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.GRAPH and patch(attr.g.node):
                    return True
        return False

    assert patch(model.functions[0].node)
    return model


@pytest.mark.parametrize("uniform", [0.999, np.nextafter(np.float32(1), np.float32(0))])
def test_a_scan_rounding_up_past_the_last_weighted_token_draws_a_weighted_one(uniform, monkeypatch):
    """Sums past the last weighted token rounded above it (a parallel scan) must not draw a token of
    weight 0 (here banned): the body draws the weighted one the exact sums give, as the reference.
    TensorRT's form recovers the scan's rounding from the sums themselves, so it does even without
    the rule that only weighted tokens count; on a plain float32 sum that rule is what holds it:
    without it, the wrong variant, the banned token 4 is drawn."""
    case = make_case(np.zeros((1, 8)), 1.0, 0, 1.0, uniform, bias=[[0, 0, 0, 0] + [-np.inf] * 4])
    error = np.array([[0, 0, 0, 0, 1e-2, 1e-2, 1e-2, 1e-2]], np.float32)

    def draw(unweighted):
        model = _with_scan_error(body.make_model(8, 8), error, unweighted)
        session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        return session.run(None, {name: case[name] for name in ARGS})[0].tolist()

    assert draw(unweighted=False) == draw(unweighted=True) == [3] == run_reference(case, 1, 8)[0].tolist()
    monkeypatch.setattr(body, "_compensated", plain_float32_draw)
    assert draw(unweighted=False) == [3]
    assert draw(unweighted=True) == [4]
