"""trtllm.cpu::MoE and MoEBlockQuant (plugins/cpu/moe.cc): a mixture of experts' MLP over each token's
top-k experts, float32, float16, bfloat16, int8 or int4 experts, against a float64 numpy reference
(of the dequantized weights), on both code paths."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from trtllm.builder.quantize import QuantScheme, dequantize, pack_rows, quantize, swiglu_rows  # noqa: E402
from trtllm.plugins import cpu  # noqa: E402

from tests.plugins.cpu_ops import on_portable_path, one_node_model, session  # noqa: E402

DTYPES = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}
# (T, E, k, H, I): one row, a few (the decode kernels' batches), more rows with tails, every expert
# on every token, one expert a token, and past the kernel's 1024 tokens a pass
SHAPES = [(1, 8, 2, 64, 32), (3, 8, 2, 96, 64), (17, 16, 4, 64, 96), (40, 4, 4, 64, 32), (9, 6, 1, 32, 64),
          (1030, 4, 2, 32, 32)]


def experts(e: int, h: int, i: int, seed: int, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return ((rng.standard_normal((e, 2 * i, h)) * 0.1).astype(DTYPES[dtype]),
            (rng.standard_normal((e, h, i)) * 0.1).astype(DTYPES[dtype]))


def op_model(w1: np.ndarray, w2: np.ndarray, k: int, normalize: bool = True, reorder: bool = True,
             activation: str | None = None, scale: np.ndarray | None = None, scoring: str | None = None,
             bias: np.ndarray | None = None, norm_min: float | None = None,
             epsilon: float | None = None) -> bytes:
    """One MoE node; w1 [E, 2I, H] in the checkpoint's order (gate rows, then up rows), stored in the
    kernel's swiglu order (`reorder`; else as given); `activation` and `scoring` its attributes (None: left
    out, SiLU and softmax), `scale` its expert_scale input (Gemma 4's per_expert_scale), `bias` its
    selection_bias (LFM2-MoE's expert_bias)."""
    e, h, i = w2.shape
    tail = ["", "", "", "", "", "", "expert_scale" if scale is not None else "", "selection_bias" if bias is not None
            else ""] if scale is not None or bias is not None else []
    node = helper.make_node(cpu.MOE, ["x", "logits", "w1", "w2", "generated", *tail], ["y"], domain=cpu.DOMAIN, k=k,
                            normalize=int(normalize), **({"activation": activation} if activation else {}),
                            **({"scoring": scoring} if scoring else {}),
                            **({"norm_min": norm_min} if norm_min is not None else {}),
                            **({"norm_epsilon": epsilon} if epsilon is not None else {}))
    return one_node_model(node, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["t", "h"]),
                                 helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["t", "e"]),
                                 helper.make_tensor_value_info("generated", TensorProto.INT64, [1])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["t", "h"])],
                          [numpy_helper.from_array(np.ascontiguousarray(w1[:, swiglu_rows(i)] if reorder else w1), "w1"),
                           numpy_helper.from_array(w2, "w2"),
                           *([numpy_helper.from_array(scale.astype(np.float32), "expert_scale")]
                             if scale is not None else []),
                           *([numpy_helper.from_array(bias.astype(np.float32), "selection_bias")]
                             if bias is not None else [])])


def quantized(w: np.ndarray, bits: int) -> tuple[list[np.ndarray], np.ndarray]:
    """Each expert of w [E, N, K] quantized as the model's projections (quantize.QuantScheme's int4 or
    int8) and packed as MatMulBlockQuant reads it: ([codes, scale, offset or None] stacked over the
    experts, the dequantized weights [E, N, K])."""
    scheme = QuantScheme.named(f"int{bits}")
    parts, back = [], []
    for expert in w:
        codes, scale, offset = quantize(np.ascontiguousarray(expert.T), scheme)
        parts.append(pack_rows(codes, scale, offset, bits))
        back.append(dequantize(codes, scale, offset, 32).T)
    return [None if parts[0][j] is None else np.stack([q[j] for q in parts]) for j in range(3)], np.stack(back)


def quant_inputs(w1: np.ndarray, w2: np.ndarray, bits: int) -> tuple[dict, list[str], np.ndarray, np.ndarray]:
    """MoEBlockQuant's weight inputs of w1, w2 quantized (w1's rows in the swiglu order): (the
    initializers, the node's input names for them, "" for int8's absent offsets; the dequantized experts)."""
    (c1, s1, o1), d1 = quantized(w1, bits)
    (c2, s2, o2), d2 = quantized(w2, bits)
    order = swiglu_rows(w2.shape[2])
    c1, s1, o1 = (None if a is None else np.ascontiguousarray(a[:, order]) for a in (c1, s1, o1))
    given = {"w1": c1, "w1_scale": s1, "w1_offset": o1, "w2": c2, "w2_scale": s2, "w2_offset": o2}
    return ({n: a for n, a in given.items() if a is not None}, [n if given[n] is not None else "" for n in given],
            d1, d2)


def quant_model(w1: np.ndarray, w2: np.ndarray, k: int, bits: int, exact_rows: int = 0) -> tuple[bytes, np.ndarray,
                                                                                              np.ndarray]:
    """One MoEBlockQuant node of w1, w2 quantized; returns it and the dequantized experts."""
    inits, names, d1, d2 = quant_inputs(w1, w2, bits)
    node = helper.make_node(cpu.MOE_QUANT, ["x", "logits", *names, "generated"], ["y"], domain=cpu.DOMAIN, k=k,
                            normalize=1, bits=bits, exact_rows=exact_rows)
    model = one_node_model(node, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["t", "h"]),
                                  helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["t", "e"]),
                                  helper.make_tensor_value_info("generated", TensorProto.INT64, [1])],
                           [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["t", "h"])],
                           [numpy_helper.from_array(a, n) for n, a in inits.items()])
    return model, d1, d2


def check_quant(t: int, e: int, k: int, h: int, i: int, bits: int, generated: int = 1, exact_rows: int = 0) -> float:
    w1, w2 = experts(e, h, i, t + e + h + bits, "float32")
    model, d1, d2 = quant_model(w1, w2, k, bits, exact_rows)
    feed = inputs(t, e, h, t + k, generated)
    y = session(model).run(None, feed)[0]
    ref = reference(feed["x"], feed["logits"], d1, d2, k)
    return float(np.abs(y - ref).max() / np.abs(ref).max())


def reference(x, logits, w1, w2, k: int, normalize: bool = True, ties: str = "lower", gelu: bool = False,
              scale: np.ndarray | None = None, sigmoid: bool = False, bias: np.ndarray | None = None,
              norm_min: float = 0.0, epsilon: float | None = None) -> np.ndarray:
    """float64: softmax (or `sigmoid` each), the k largest (of the scores + `bias`; an exact tie to the lower
    index; `ties="higher"` the other way, a wrong variant), normalized or not (sigmoid's by the sum + 1e-6),
    then times each expert's `scale`, sum of weight x down(act(gate) * up), act SiLU or GELU's tanh form."""
    e, i = w1.shape[0], w2.shape[2]
    if sigmoid:
        p = 1 / (1 + np.exp(-logits.astype(np.float64)))
    else:
        p = np.exp(logits - logits.max(-1, keepdims=True)).astype(np.float64)
        p /= p.sum(-1, keepdims=True)
    keys = p if bias is None else p + bias
    y = np.zeros(x.shape, np.float64)
    for t in range(x.shape[0]):
        key = (lambda j: (-keys[t, j], j)) if ties == "lower" else (lambda j: (-keys[t, j], -j))
        chosen = sorted(range(e), key=key)[:k]
        add = 1e-6 * sigmoid if epsilon is None else epsilon
        weights = p[t, chosen] / (max(p[t, chosen].sum() + add, norm_min) if normalize else 1.0)
        if scale is not None:
            weights = weights * scale[chosen]
        for j, w in zip(chosen, weights):
            both = w1[j].astype(np.float64) @ x[t].astype(np.float64)
            gate, up = both[:i], both[i:]
            act = (0.5 * gate * (1 + np.tanh(np.sqrt(2 / np.pi) * (gate + 0.044715 * gate ** 3))) if gelu else
                   gate * 0.5 * (1 + np.tanh(gate / 2)))
            y[t] += w * (w2[j].astype(np.float64) @ (act * up))
    return y


def inputs(t: int, e: int, h: int, seed: int, generated: int = 1) -> dict:
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal((t, h)).astype(np.float32),
            "logits": rng.standard_normal((t, e)).astype(np.float32),
            "generated": np.array([generated], np.int64)}


def check(t: int, e: int, k: int, h: int, i: int, dtype: str = "float32", normalize: bool = True,
          generated: int = 1, threads: int = 2) -> float:
    w1, w2 = experts(e, h, i, t + e + h, dtype)
    feed = inputs(t, e, h, t + k, generated)
    y = session(op_model(w1, w2, k, normalize), threads).run(None, feed)[0]
    ref = reference(feed["x"], feed["logits"], w1, w2, k, normalize)
    assert y.shape == ref.shape
    return float(np.abs(y - ref).max() / np.abs(ref).max())


@pytest.mark.parametrize("generated", [0, 1])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("t, e, k, h, i", SHAPES)
def test_matches_the_float64_reference(t, e, k, h, i, dtype, generated):
    """Generated rows (the decode kernels) and a prompt's (the prefill ones)."""
    assert check(t, e, k, h, i, dtype, generated=generated) < 2e-6


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("t, e, k, h, i", SHAPES[:-1])
@pytest.mark.parametrize("generated, exact_rows", [(0, 0), (1, 0), (1, 1)])
def test_block_quantized_experts_compute_their_dequantized_weights(t, e, k, h, i, bits, generated, exact_rows):
    """Decode rows (1-2 rows an expert take x split at 4 bits, then batches of 4; exact_rows: 1-2 at a
    time) and prompt rows."""
    assert check_quant(t, e, k, h, i, bits, generated, exact_rows) < 2e-6


def test_block_quantized_experts_against_their_float_weights_fail():
    """The deliberately wrong variant: the reference with the float weights, not the dequantized ones."""
    w1, w2 = experts(8, 64, 64, 0, "float32")
    model, _, _ = quant_model(w1, w2, 2, 4)
    feed = inputs(5, 8, 64, 1)
    ref = reference(feed["x"], feed["logits"], w1, w2, 2)
    assert np.abs(session(model).run(None, feed)[0] - ref).max() / np.abs(ref).max() > 1e-3


@pytest.mark.parametrize("generated", [0, 1])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("t, e, k, h, i", SHAPES[:3])
def test_gemma4_s_gelu_experts_and_scales_per_expert(t, e, k, h, i, dtype, generated):
    """activation="gelu_tanh" (gate|up apart, then GELU's tanh form) and expert_scale (each chosen
    weight times its expert's, after the normalization): the float64 reference; the wrong variants, SiLU
    or no scale, are far from it."""
    w1, w2 = experts(e, h, i, t + e + h, dtype)
    feed, scale = inputs(t, e, h, t + k, generated), np.random.default_rng(t).uniform(0.5, 1.5, e)
    y = session(op_model(w1, w2, k, activation="gelu_tanh", scale=scale)).run(None, feed)[0]
    ref = reference(feed["x"], feed["logits"], w1, w2, k, gelu=True, scale=scale)
    assert np.abs(y - ref).max() / np.abs(ref).max() < 2e-6
    for wrong in (reference(feed["x"], feed["logits"], w1, w2, k, gelu=False, scale=scale),
                  reference(feed["x"], feed["logits"], w1, w2, k, gelu=True)):
        assert np.abs(y - wrong).max() / np.abs(ref).max() > 1e-3


@pytest.mark.parametrize("generated", [0, 1])
@pytest.mark.parametrize("t, e, k, h, i", SHAPES[:3])
def test_lfm2_moe_s_sigmoid_scores_and_selection_bias(t, e, k, h, i, generated):
    """scoring="sigmoid" (each logit's sigmoid, normalized by their sum + 1e-6), selection_bias (added to
    the scores that choose, not to the weights) and a routed scale: the float64 reference; the wrong
    variants, softmax or the bias added to the logits (so to the weights too), are far from it."""
    w1, w2 = experts(e, h, i, t + e + h, "float32")
    feed, rng = inputs(t, e, h, t + k, generated), np.random.default_rng(t)
    bias, scale = rng.standard_normal(e) * 0.3, np.full(e, 1.5)
    y = session(op_model(w1, w2, k, scale=scale, scoring="sigmoid", bias=bias)).run(None, feed)[0]
    ref = reference(feed["x"], feed["logits"], w1, w2, k, scale=scale, sigmoid=True, bias=bias)
    assert np.abs(y - ref).max() / np.abs(ref).max() < 2e-6
    for wrong in (reference(feed["x"], feed["logits"], w1, w2, k, scale=scale, bias=bias),
                  reference(feed["x"], feed["logits"] + bias, w1, w2, k, scale=scale, sigmoid=True)):
        assert np.abs(y - wrong).max() / np.abs(ref).max() > 1e-3


@pytest.mark.parametrize("t, e, k, h, i", SHAPES[:3])
def test_ernie_s_selection_bias_on_softmax_scores_and_norm_min(t, e, k, h, i):
    """ERNIE 4.5's routing: softmax scores, the experts chosen by the scores plus a bias, their scores
    divided by their sum clamped below at norm_min (0.5 here, so that the clamp acts on some tokens): the
    float64 reference; the wrong variant, the sum not clamped, is far from it."""
    w1, w2 = experts(e, h, i, t + e + h, "float32")
    feed, rng = inputs(t, e, h, t + k, 1), np.random.default_rng(t)
    bias = rng.standard_normal(e) * 0.3
    y = session(op_model(w1, w2, k, bias=bias, norm_min=0.5)).run(None, feed)[0]
    ref = reference(feed["x"], feed["logits"], w1, w2, k, bias=bias, norm_min=0.5)
    assert np.abs(y - ref).max() / np.abs(ref).max() < 2e-6
    wrong = reference(feed["x"], feed["logits"], w1, w2, k, bias=bias)
    assert np.abs(y - wrong).max() / np.abs(ref).max() > 1e-3


def test_norm_epsilon_replaces_the_sigmoid_scores_default():
    """norm_epsilon: what the chosen scores' sum gets added (AFMoE's 1e-20 in place of LFM2-MoE's 1e-6, the
    default with sigmoid scores); 0.5 here, so that it shows: the reference with it, not without."""
    t, e, k, h, i = SHAPES[1]
    w1, w2 = experts(e, h, i, 7, "float32")
    feed, bias = inputs(t, e, h, 3, 1), np.random.default_rng(1).standard_normal(e) * 0.3
    y = session(op_model(w1, w2, k, scoring="sigmoid", bias=bias, epsilon=0.5)).run(None, feed)[0]
    ref = reference(feed["x"], feed["logits"], w1, w2, k, sigmoid=True, bias=bias, epsilon=0.5)
    assert np.abs(y - ref).max() / np.abs(ref).max() < 2e-6
    wrong = reference(feed["x"], feed["logits"], w1, w2, k, sigmoid=True, bias=bias)
    assert np.abs(y - wrong).max() / np.abs(ref).max() > 1e-3


def test_an_unknown_activation_fails():
    w1, w2 = experts(4, 32, 32, 0, "float32")
    with pytest.raises(Exception, match="activation must be silu or gelu_tanh, got relu"):
        session(op_model(w1, w2, 2, activation="relu"))


@pytest.mark.parametrize("generated", [0, 1])
def test_prompt_rows_unnormalized_weights_and_one_thread(generated):
    assert check(20, 8, 3, 64, 64, normalize=False, generated=generated, threads=1) < 2e-6


@pytest.mark.parametrize("kernel", ["generic", "avx2"])  # (avx2: the portable path where the CPU lacks it)
def test_portable_and_avx2_paths_match_too(kernel):
    errors = on_portable_path("test_cpu_moe", "[check(*s, dtype=d, generated=g) for s in SHAPES[:-1] for d in DTYPES "
                              "for g in (0, 1)] + [check_quant(*s, bits=b, generated=g) for s in SHAPES[:-1] "
                              "for b in (4, 8) for g in (0, 1)]", kernel=kernel)
    assert len(errors) == 10 * (len(SHAPES) - 1) and max(errors) < 2e-6


def tied_case():
    """Four experts, the second-largest probability shared by experts 1 and 3 exactly: k = 2 takes 1."""
    w1, w2 = experts(4, 32, 32, 0, "float32")
    feed = inputs(2, 4, 32, 1)
    feed["logits"] = np.array([[2.0, 1.0, -1.0, 1.0], [0.5, 0.5, 0.5, 0.5]], np.float32)
    return w1, w2, feed, session(op_model(w1, w2, 2)).run(None, feed)[0]


def test_an_exact_tie_goes_to_the_lower_expert():
    w1, w2, feed, y = tied_case()
    ref = reference(feed["x"], feed["logits"], w1, w2, 2)
    assert np.abs(y - ref).max() / np.abs(ref).max() < 2e-6


def test_ties_to_the_higher_expert_fail():
    """The deliberately wrong variant: the reference breaking ties the other way is far off."""
    w1, w2, feed, y = tied_case()
    ref = reference(feed["x"], feed["logits"], w1, w2, 2, ties="higher")
    assert np.abs(y - ref).max() / np.abs(ref).max() > 0.1


@pytest.mark.parametrize("kind", ["float16", 4, 8])
@pytest.mark.parametrize("generated", [0, 1])
def test_a_row_is_computed_the_same_whatever_its_neighbours(generated, kind):
    """Each row's experts run with other rows routed to them or alone: its output is bit for bit the
    same (the row role, not the batch, picks the kernel path; quantized generated rows go 1-2 at a
    time with exact_rows, as the builder asks on integer-activation engines; slots are summed in
    the router's order)."""
    w1, w2 = experts(8, 64, 64, 3, "float32" if isinstance(kind, int) else kind)
    s = session(quant_model(w1, w2, 2, kind, exact_rows=1)[0] if isinstance(kind, int) else op_model(w1, w2, 2))
    feed = inputs(24, 8, 64, 4, generated)
    together = s.run(None, feed)[0]
    alone = np.concatenate([s.run(None, {**feed, "x": feed["x"][r:r + 1], "logits": feed["logits"][r:r + 1]})[0]
                            for r in range(24)])
    assert np.array_equal(together, alone)


@pytest.mark.parametrize("w1_shape, w2_shape, x_h, k, message", [
    ((4, 64, 32), (4, 32, 48), 32, 2, r"w1 must be \[E, 2I, H\] and w2 \[E, H, I\]"),
    ((4, 96, 48), (4, 48, 48), 48, 2, "H and I must be multiples of 32"),
    ((4, 64, 32), (4, 32, 32), 64, 2, "x's last dimension must be H = 32"),
    ((4, 64, 32), (4, 32, 32), 32, 5, r"k must be in \[1, E = 4\]"),
])
def test_bad_inputs_fail_with_a_message(w1_shape, w2_shape, x_h, k, message):
    model = op_model(np.zeros(w1_shape, np.float32), np.zeros(w2_shape, np.float32), k, reorder=False)
    with pytest.raises(Exception, match=message):
        session(model).run(None, {"x": np.ones((2, x_h), np.float32), "logits": np.ones((2, 4), np.float32),
                                  "generated": np.ones(1, np.int64)})


def test_logits_of_another_width_fail():
    w1, w2 = experts(4, 32, 32, 0, "float32")
    with pytest.raises(Exception, match="logits must hold E = 4 values per row of x"):
        session(op_model(w1, w2, 2)).run(None, {**inputs(2, 4, 32, 0), "logits": np.ones((2, 5), np.float32)})


def test_4_bit_experts_without_offsets_fail():
    w1, w2 = experts(4, 32, 32, 0, "float32")
    model, _, _ = quant_model(w1, w2, 2, 4)
    graph = onnx.load_from_string(model)
    graph.graph.node[0].input[4] = ""
    with pytest.raises(Exception, match=r"4-bit experts need their offsets \(w1_offset\)"):
        session(graph.SerializeToString()).run(None, inputs(2, 4, 32, 0))
