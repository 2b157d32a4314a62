"""trtllm.cpu::LoraAdd against a float64 numpy reference: shared and per-row adapters, modules of
rank 0, every rank and column tail, SwiGLU, prefill-sized inputs, the portable and AVX2 paths, and bad
shapes.
The deliberately wrong variant (each row taking row 0's adapter) must miss."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from trtllm.plugins import cpu

from tests.plugins.cpu_ops import on_portable_path, one_node_model, session  # noqa: E402

F = TensorProto.FLOAT


def op_model(columns: list[int], activation: str = "none", y_from_a_node: bool = False) -> bytes:
    """One LoraAdd (LoraAddSwiglu) node; `y_from_a_node`: y made by an Add first, as in an engine
    (y = the fused projection), not a graph input."""
    modules = len(columns) // 2
    names = ["y", "x"] + [f"{ab}{j}" for j in range(modules) for ab in "ab"]
    op = cpu.LORA_SWIGLU if activation == "swiglu" else cpu.LORA
    node = helper.make_node(op, ["y1" if y_from_a_node else "y", *names[1:]], ["out"], domain=cpu.DOMAIN, columns=columns)
    inputs = [helper.make_tensor_value_info(name, F, None) for name in names]
    outputs = [helper.make_tensor_value_info("out", F, None)]
    if not y_from_a_node:
        return one_node_model(node, inputs, outputs)
    graph = helper.make_graph([helper.make_node("Add", ["y", "y"], ["y1"]), node], "g", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 24), helper.make_opsetid(cpu.DOMAIN, 1)])
    model.ir_version = 11
    return model.SerializeToString()


def case(b: int, s: int, k: int, widths: list[int], ranks: list[int], shared: bool, seed: int = 0):
    rng = np.random.default_rng(seed)
    n = sum(widths)
    feeds = {"y": rng.standard_normal((b, s, n)).astype(np.float32),
             "x": rng.standard_normal((b, s, k)).astype(np.float32)}
    lead = 1 if shared else b
    for j, (w, r) in enumerate(zip(widths, ranks)):
        feeds[f"a{j}"] = (rng.standard_normal((lead, k, r)) / np.sqrt(k)).astype(np.float32)
        feeds[f"b{j}"] = rng.standard_normal((lead, r, w)).astype(np.float32)
    columns = list(np.repeat(np.cumsum([0] + widths), 2)[1:-1])
    return feeds, [int(c) for c in columns]


def reference(feeds: dict, modules: int, row_adapter=lambda b: b, swiglu: bool = False) -> np.ndarray:
    y, x = feeds["y"].astype(np.float64), feeds["x"].astype(np.float64)
    out = y.copy()
    lo = 0
    for j in range(modules):
        a, b = feeds[f"a{j}"].astype(np.float64), feeds[f"b{j}"].astype(np.float64)
        hi = lo + b.shape[2]
        for row in range(x.shape[0]):
            pick = 0 if a.shape[0] == 1 else row_adapter(row)
            out[row, :, lo:hi] += x[row] @ a[pick] @ b[pick]
        lo = hi
    if swiglu:
        gate, up = np.split(out, 2, axis=-1)
        out = gate / (1 + np.exp(-gate)) * up
    return out


def error(b, s, k, widths, ranks, shared, swiglu=False, threads=2) -> float:
    feeds, columns = case(b, s, k, widths, ranks, shared)
    got = session(op_model(columns, "swiglu" if swiglu else "none"), threads).run(None, feeds)[0]
    want = reference(feeds, len(widths), swiglu=swiglu)
    assert got.shape == want.shape
    return float(np.abs(got - want).max() / max(1.0, np.abs(want).max()))


CASES = [  # b, s, k, widths, ranks, shared
    (1, 1, 64, [64, 32, 32], [16, 16, 16], True),       # decode, q|k|v
    (1, 1, 576, [576, 192, 192], [8, 0, 8], True),      # k not adapted
    (4, 1, 96, [40], [3], False),                       # per-row adapters, tails everywhere
    (3, 7, 200, [130, 130], [70, 1], False),            # ranks above 64, prefill-sized rows
    (2, 33, 128, [256], [0], True),                     # no adapter at all
    (8, 1, 1536, [576], [64], False),                   # down_proj, 12 parts of K
    (8, 1, 64, [64, 32, 32], [8, 8, 8], True),          # decode batch 8, one adapter: rows in groups of 4
    (2, 21, 96, [80, 48], [16, 24], True),              # prefill, one adapter: groups of 4 across batch rows
]


@pytest.mark.parametrize("b, s, k, widths, ranks, shared", CASES)
def test_matches_the_float64_reference(b, s, k, widths, ranks, shared):
    assert error(b, s, k, widths, ranks, shared) < 1e-5


def test_swiglu_and_one_thread():
    assert error(2, 3, 64, [48, 48], [4, 4], False, swiglu=True) < 1e-5
    assert error(2, 3, 64, [48, 48], [0, 0], True, swiglu=True) < 1e-5  # no adapter: straight from y
    assert error(2, 3, 64, [48, 48], [4, 4], True, threads=1) < 1e-5


@pytest.mark.parametrize("ranks", [[8, 0, 8], [0, 0, 0]])
def test_y_made_by_another_node(ranks):
    feeds, columns = case(3, 40, 256, [256, 64, 64], ranks, shared=True)
    got = session(op_model(columns, y_from_a_node=True)).run(None, feeds)[0]
    doubled = dict(feeds, y=2 * feeds["y"])
    np.testing.assert_allclose(got, reference(doubled, 3), atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("kernel", ["generic", "avx2"])
def test_portable_and_avx2_paths_match_too(kernel):
    errors = on_portable_path("test_cpu_lora", "[error(*c) for c in CASES] + [error(2, 3, 64, [48, 48], [4, 4], False, True)]",
                              kernel=kernel)
    assert max(errors) < 1e-5


def test_rows_taking_another_rows_adapter_are_caught():
    feeds, columns = case(4, 2, 64, [64], [8], shared=False)
    got = session(op_model(columns)).run(None, feeds)[0]
    assert np.abs(got - reference(feeds, 1, row_adapter=lambda b: 0)).max() > 100 * 1e-5


@pytest.mark.parametrize("change, message", [
    (lambda f: f.update(b0=f["b0"][:, :, :5]), "lora_b [same, r, 16]"),
    (lambda f: f.update(a0=np.concatenate([f["a0"]] * 2)), "lora_a must be [1 or B, K, r]"),
    (lambda f: f.update(y=f["y"][:, :, :8]), "y [B, S, 16]"),
])
def test_bad_shapes_fail_with_a_message(change, message):
    feeds, columns = case(3, 2, 32, [16], [4], shared=False)
    change(feeds)
    with pytest.raises(Exception, match=message.replace("[", r"\[").replace("]", r"\]")):
        session(op_model(columns)).run(None, feeds)


def rows_alone_match(shared: bool, swiglu: bool = False) -> bool:
    """Every batch row's first and last position computed alone (one row in the call) equal, bit for
    bit, the same rows inside the whole [4, 10] call: the kernel's sums do not depend on how many
    rows share a call (batch and saved-prefix invariance)."""
    widths = [64, 64] if swiglu else [64, 32, 32]
    feeds, columns = case(4, 10, 576, widths, [8] * len(widths), shared, seed=3)
    s = session(op_model(columns, "swiglu" if swiglu else "none"))
    full = s.run(None, feeds)[0]
    for b in range(4):
        for pos in (0, 9):
            one = {name: (v[b:b + 1, pos:pos + 1] if name in ("x", "y") else v if shared else v[b:b + 1])
                   for name, v in feeds.items()}
            if not np.array_equal(s.run(None, one)[0][0, 0], full[b, pos]):
                return False
    return True


@pytest.mark.parametrize("shared, swiglu", [(True, False), (False, False), (True, True)])
def test_a_row_alone_is_the_row_in_a_batch(shared, swiglu):
    assert rows_alone_match(shared, swiglu)


@pytest.mark.parametrize("kernel", ["generic", "avx2"])
def test_a_row_alone_is_the_row_in_a_batch_on_the_portable_and_avx2_paths(kernel):
    assert on_portable_path("test_cpu_lora", "[rows_alone_match(s) for s in (True, False)]", kernel=kernel) == [True, True]
