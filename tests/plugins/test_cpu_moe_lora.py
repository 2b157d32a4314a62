"""LoRA on the experts of trtllm.cpu::MoE and MoEBlockQuant (plugins/cpu/moe.cc): each chosen expert's
gate and up get (x a_e) b_e before the activation and its down (h a_e) b_e, one adapter for all
rows or one per batch row, against a float64 numpy reference of the adapted weights."""
from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from trtllm.builder.quantize import swiglu_rows  # noqa: E402
from trtllm.plugins import cpu  # noqa: E402

from tests.plugins.cpu_ops import on_portable_path, one_node_model, session  # noqa: E402
from tests.plugins.test_cpu_moe import experts, quant_inputs, reference  # noqa: E402

LORA = ["gate_a", "gate_b", "up_a", "up_b", "down_a", "down_b"]


def adapters(n: int, e: int, h: int, i: int, r1: int, r2: int, seed: int) -> dict:
    """gate and up [n, E, H, r1] and [n, E, r1, I] (up's rank r1 // 2: they may differ), down [n, E, I, r2]
    and [n, E, r2, H]."""
    rng = np.random.default_rng(seed)
    f = lambda *shape: (rng.standard_normal(shape) * 0.2).astype(np.float32)  # noqa: E731
    return {"gate_a": f(n, e, h, r1), "gate_b": f(n, e, r1, i), "up_a": f(n, e, h, r1 // 2),
            "up_b": f(n, e, r1 // 2, i), "down_a": f(n, e, i, r2), "down_b": f(n, e, r2, h)}


def model(w1: np.ndarray, w2: np.ndarray, k: int, bits: int) -> tuple[bytes, np.ndarray, np.ndarray]:
    """One MoE (bits 32: float32 experts) or MoEBlockQuant node with LoRA inputs, x [B, S, H]; returns
    it and the experts it computes with (dequantized)."""
    if bits == 32:
        inits, d1, d2 = {"w1": np.ascontiguousarray(w1[:, swiglu_rows(w2.shape[2])]), "w2": w2}, w1, w2
        node = helper.make_node(cpu.MOE, ["x", "logits", "w1", "w2", "generated", *LORA], ["y"], domain=cpu.DOMAIN,
                                k=k, normalize=1)
    else:
        inits, names, d1, d2 = quant_inputs(w1, w2, bits)
        node = helper.make_node(cpu.MOE_QUANT, ["x", "logits", *names, "generated", *LORA], ["y"], domain=cpu.DOMAIN,
                                k=k, normalize=1, bits=bits, exact_rows=1)
    f = lambda name, shape: helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)  # noqa: E731
    graph_inputs = [f("x", ["b", "s", "h"]), f("logits", ["b", "s", "e"]),
                    helper.make_tensor_value_info("generated", TensorProto.INT64, [1]),
                    *(f(n, ["n", "e", "k", f"r{n[0]}"] if n.endswith("_a") else ["n", "e", f"r{n[0]}", "c"])
                      for n in LORA)]
    return (one_node_model(node, graph_inputs, [f("y", ["b", "s", "h"])],
                           [numpy_helper.from_array(a, n) for n, a in inits.items()]), d1, d2)


def lora_reference(x, logits, w1, w2, k: int, lora: dict) -> np.ndarray:
    """Each batch row through the experts plus its adapter's deltas (float64)."""
    out = []
    n = lora["gate_a"].shape[0]
    f = lambda name, a: lora[name][a].astype(np.float64)  # noqa: E731
    for b in range(x.shape[0]):
        a = b if n > 1 else 0
        gate, up = (np.einsum("ehr,eri->eih", f(f"{p}_a", a), f(f"{p}_b", a)) for p in ("gate", "up"))
        d2 = np.einsum("eir,erh->ehi", f("down_a", a), f("down_b", a))
        out.append(reference(x[b], logits[b], w1.astype(np.float64) + np.concatenate([gate, up], axis=1),
                             w2.astype(np.float64) + d2, k))
    return np.stack(out)


def run(sess, x, logits, generated: int, lora: dict) -> np.ndarray:
    return sess.run(None, {"x": x, "logits": logits, "generated": np.array([generated], np.int64), **lora})[0]


def without(lora: dict) -> dict:
    """The same inputs at rank 0: no adapter."""
    return {name: a[..., :0] if name.endswith("_a") else a[:, :, :0] for name, a in lora.items()}


CASES = [(3, 1, 3, 4, 3, 1), (2, 9, 1, 4, 2, 0), (2, 9, 2, 8, 4, 0), (4, 1, 1, 0, 5, 1), (3, 1, 3, 6, 0, 1),
         (1, 1030, 1, 2, 2, 0), (2, 700, 2, 2, 2, 0)]  # (B, S, adapters, r1, r2, generated)


def check_lora(bits: int, b: int, s: int, n: int, r1: int, r2: int, generated: int) -> tuple[float, float]:
    """(the kernel's largest error, how far the adapter moves the output), relative to the output."""
    e, k, h, i = 6, 2, 64, 32
    w1, w2 = experts(e, h, i, b + s + bits, "float32")
    onnx_model, d1, d2 = model(w1, w2, k, bits)
    rng = np.random.default_rng(s + n)
    x, logits = rng.standard_normal((b, s, h)).astype(np.float32), rng.standard_normal((b, s, e)).astype(np.float32)
    lora = adapters(n, e, h, i, r1, r2, b + r1)
    y = run(session(onnx_model), x, logits, generated, lora)
    ref = lora_reference(x, logits, d1, d2, k, lora)
    plain = lora_reference(x, logits, d1, d2, k, without(lora))
    scale = float(np.abs(ref).max())
    return float(np.abs(y - ref).max()) / scale, float(np.abs(plain - ref).max()) / scale


@pytest.mark.parametrize("bits", [32, 4, 8])
@pytest.mark.parametrize("case", CASES)
def test_expert_adapters_add_their_deltas(bits, case):
    """Generated rows (the decode kernels) and a prompt's (prefill; past the kernel's 1,024 tokens a
    pass, with one adapter and with one a row, whose second block starts inside row 1); one adapter
    or one per row; a rank of 0 on one projection (its fused path kept)."""
    error, moved = check_lora(bits, *case)
    assert error <= 2e-5 and moved > 1e-2, (error, moved)


def test_the_portable_path_adds_them_too():
    """The same on the portable C++ (a CPU without AVX-512)."""
    found = on_portable_path("test_cpu_moe_lora", f"[check_lora(b, *c) for b in (32, 4) for c in {CASES[:5]}]")
    for error, moved in found:
        assert error <= 2e-5 and moved > 1e-2, (error, moved)


def test_each_row_is_what_it_computes_alone_and_gate_and_up_must_not_swap():
    """With an adapter per row (int4, exact_rows), each generated row is bit for bit what it gives in
    a batch of one; gate's and up's adapters exchanged (the wrong variant) miss the reference."""
    e, k, h, i, b = 6, 2, 64, 32, 4
    w1, w2 = experts(e, h, i, 7, "float32")
    onnx_model, d1, d2 = model(w1, w2, k, 4)
    sess = session(onnx_model)
    rng = np.random.default_rng(3)
    x, logits = rng.standard_normal((b, 1, h)).astype(np.float32), rng.standard_normal((b, 1, e)).astype(np.float32)
    lora = adapters(b, e, h, i, 4, 4, 5)
    together = run(sess, x, logits, 1, lora)
    for row in range(b):
        alone = run(sess, x[row:row + 1], logits[row:row + 1], 1, {n: a[row:row + 1] for n, a in lora.items()})
        assert np.array_equal(alone[0], together[row])
    ref = lora_reference(x, logits, d1, d2, k, lora)
    swapped = {**lora, "gate_a": lora["up_a"], "gate_b": lora["up_b"], "up_a": lora["gate_a"], "up_b": lora["gate_b"]}
    assert np.abs(run(sess, x, logits, 1, swapped) - ref).max() > 100 * 2e-5 * np.abs(ref).max()


@pytest.mark.parametrize("change, message", [
    ({"gate_a": np.zeros((1, 6, 64, 4), np.float32)}, "lora gate_a must be [n, E, 64, r] and gate_b [n, E, r, 32]"),
    ({"down_a": np.zeros((2, 6, 32, 2), np.float32), "down_b": np.zeros((2, 6, 2, 64), np.float32)},
     "n 1 or x's leading dimension 3"),
])
def test_mismatched_adapters_fail_with_a_message(change, message):
    e, k, h, i = 6, 2, 64, 32
    w1, w2 = experts(e, h, i, 1, "float32")
    sess = session(model(w1, w2, k, 32)[0])
    lora = {**adapters(1, e, h, i, 2, 2, 0), **change}
    with pytest.raises(Exception, match=message.replace("[", r"\[").replace("]", r"\]")):
        sess.run(None, {"x": np.zeros((3, 1, h), np.float32), "logits": np.zeros((3, 1, e), np.float32),
                        "generated": np.array([1], np.int64), **lora})
