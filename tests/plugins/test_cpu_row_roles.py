"""The `generated` input of trtllm.cpu's MatMul kernels: a row's path goes by its role (a prompt's
rows the prefill path, generated rows the decode path), not by how many rows share the call, so
a prompt row's result is bit for bit the same alone or in any batch. Without the input (engines from
before it) a call of <= 16 rows takes the decode path, a longer one the prefill path, and those two
round differently: the wrong variant, which must show a difference here."""
from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402

from tests.plugins.cpu_ops import on_portable_path, session  # noqa: E402
from tests.plugins.test_cpu_kernels import case, op_model  # noqa: E402
from tests.plugins.test_cpu_matmul_half import op_model as half_model  # noqa: E402
from tests.plugins.test_cpu_matmul_half import weights  # noqa: E402

K, N, M = 576, 40, 40


def with_flag(model: bytes, position: int) -> bytes:
    """The node with its `generated` input at `position` (empty names for skipped optional inputs)."""
    m = onnx.load_from_string(model)
    node = m.graph.node[0]
    while len(node.input) < position:
        node.input.append("")
    node.input.append("generated")
    m.graph.input.append(helper.make_tensor_value_info("generated", TensorProto.INT64, [1]))
    return m.SerializeToString()


def models(kind: str) -> tuple[bytes, int]:
    """(one-node model, the flag's input position) for 'int4', 'int8' (float32 activations) or 'half'."""
    if kind == "half":
        return half_model(weights(N, K, 5)), 2
    bits = int(kind[-1])
    _, packed = case(bits, K, N, seed=5)
    return op_model(K, N, bits, *packed), 4


def rows_alone_and_together(kind: str, flag: int | None, m: int = M) -> list[bool]:
    """For rows 0, 17 and 39 (of m; 0, m // 2 and m - 1 where m < 40): is the row alone bit-identical
    to the same row in an m-row call?"""
    model, position = models(kind)
    s = session(with_flag(model, position) if flag is not None else model)
    x = np.random.default_rng(6).standard_normal((1, m, K)).astype(np.float32)

    def run(rows):
        feeds = {"x": rows} if flag is None else {"x": rows, "generated": np.full(1, flag, np.int64)}
        return s.run(None, feeds)[0][0]

    together = run(x)
    picked = (0, 17, 39) if m == M else (0, m // 2, m - 1)
    return [bool(np.array_equal(run(x[:, r:r + 1])[0], together[r])) for r in picked]


@pytest.mark.parametrize("kind, flag", [("int4", 0), ("int8", 0), ("half", 0), ("half", 1)])
def test_a_row_is_the_same_alone_and_in_a_batch(kind, flag):
    """Prompt rows everywhere; generated rows of float16 weights. (Generated rows of block-quantized
    weights with float32 activations are not: their decode kernels specialise by row count, 1-2 rows
    taking a split form of x; with integer activations they are, test_cpu_matmul_int8.py.)"""
    assert rows_alone_and_together(kind, flag) == [True] * 3


@pytest.mark.parametrize("kind", ["int4", "half"])
def test_without_the_input_the_call_size_decides(kind):
    """The wrong variant: 1 row takes the decode path, 40 rows the prefill path; they differ where the
    two paths are AVX-512's or AVX2's (the portable code runs one path for both, and they agree)."""
    from tests.plugins.test_cpu_matmul_int8 import kernel_path

    assert (rows_alone_and_together(kind, None) != [True] * 3) == (kernel_path() >= 2)


@pytest.mark.parametrize("kernel", ["generic", "avx2"])
@pytest.mark.parametrize("kind", ["int4", "half"])
def test_portable_and_avx2_paths_too(kind, kernel):
    assert on_portable_path("test_cpu_row_roles", f"rows_alone_and_together({kind!r}, 0)", kernel=kernel) == [True] * 3


@pytest.mark.parametrize("m", [3, 16])
@pytest.mark.parametrize("kind", ["int4", "int8"])
def test_avx2_decode_rows_of_quantized_weights_are_the_same_alone_and_in_a_batch(kind, m):
    """Up to 16 rows (the decode path) with float32 activations: the AVX2 path takes the scale out of
    each block's dot product for every row count (AVX-512's dequantizes for 3-4 rows), so a row does
    not depend on how many share the call. (Past 16 rows the prefill path runs, test_without_the_input...)"""
    got = on_portable_path("test_cpu_row_roles", f"rows_alone_and_together({kind!r}, 1, {m})", kernel="avx2")
    assert got == [True] * 3


@pytest.mark.parametrize("kind", ["int4", "half"])
def test_a_generated_input_without_one_value_fails_with_a_message(kind):
    """It was read at [0] whatever its size (past the end of an empty tensor)."""
    model, position = models(kind)
    m = onnx.load_from_string(with_flag(model, position))
    m.graph.input[-1].type.tensor_type.shape.dim[0].dim_param = "g"
    x = np.zeros((1, 1, K), np.float32)
    for flag in (np.zeros(0, np.int64), np.zeros(2, np.int64)):
        with pytest.raises(Exception, match="generated must hold one value"):
            session(m.SerializeToString()).run(None, {"x": x, "generated": flag})


def weights_as_inputs(k: int, n: int):
    """(codes, scale, a MatMulBlockQuant model that takes them as graph inputs), 8-bit."""
    from tests.plugins.cpu_ops import one_node_model
    from trtllm.plugins import cpu

    _, (codes, scale, _) = case(8, k, n)
    node = helper.make_node(cpu.OP, ["x", "codes", "scale"], ["y"], domain=cpu.DOMAIN, bits=8, n=n, layout=cpu.LAYOUT)
    model = one_node_model(node, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, None, k]),
                                  helper.make_tensor_value_info("codes", TensorProto.UINT8, None),
                                  helper.make_tensor_value_info("scale", TensorProto.FLOAT16, None)],
                           [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return codes, scale, model


def test_weights_are_checked_on_every_call():
    """Weights fed as graph inputs (the builder makes them initializers): a later call with
    smaller tensors and the same K is refused, not read past their end."""
    k, n = 64, 8
    codes, scale, model = weights_as_inputs(k, n)
    s, x = session(model), np.ones((1, 1, k), np.float32)
    s.run(None, {"x": x, "codes": codes, "scale": scale})
    with pytest.raises(Exception, match="codes hold"):
        s.run(None, {"x": x, "codes": codes[:1].copy(), "scale": scale[:1].copy()})


def test_weights_fed_as_graph_inputs_are_read_every_call_and_never_copied():
    """Only constant initializers are copied onto huge pages (once, by address): a weight fed as a
    graph input may change in place between calls (it was kept as first read: the old answer), and
    its pages are the caller's (dropping them reverted a copy-on-write mapping's edits)."""
    from trtllm.plugins import cpu

    k, n = 64, 8
    codes, scale, model = weights_as_inputs(k, n)
    cpu.set_huge_pages(True)
    s, x = session(model), np.ones((1, 1, k), np.float32)
    before = cpu.copied_bytes()
    y1 = s.run(None, {"x": x, "codes": codes, "scale": scale})[0]
    scale *= np.float16(2)  # every weight doubled, in the same buffer
    y2 = s.run(None, {"x": x, "codes": codes, "scale": scale})[0]
    np.testing.assert_array_equal(y2, 2 * y1)
    assert cpu.copied_bytes() == before
    # the same weights as initializers: copied (the decode path's huge pages are still there)
    s = session(op_model(k, n, 8, codes, scale, None))
    s.run(None, {"x": x})
    assert cpu.copied_bytes() - before >= codes.nbytes + scale.nbytes


def test_half_weights_fed_as_graph_inputs_are_read_every_call():
    from tests.plugins.cpu_ops import one_node_model
    from trtllm.plugins import cpu

    k, n = 64, 8
    node = helper.make_node(cpu.HALF, ["x", "w"], ["y"], domain=cpu.DOMAIN, n=n)
    model = one_node_model(node, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, k]),
                                  helper.make_tensor_value_info("w", TensorProto.FLOAT16, [n, k])],
                           [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, n])])
    cpu.set_huge_pages(True)
    s, x, w = session(model), np.ones((1, 1, k), np.float32), np.ones((n, k), np.float16)
    assert s.run(None, {"x": x, "w": w})[0][0, 0, 0] == k
    w[:] = 2
    assert s.run(None, {"x": x, "w": w})[0][0, 0, 0] == 2 * k
