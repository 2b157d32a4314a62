"""trtllm.cpu::MatMulHalf (plugins/cpu/matmul_half.cc): float16 or bfloat16 weights [N, K], float32
activations and accumulation, against a float64 numpy reference, on both code paths."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from trtllm.builder.quantize import swiglu_rows  # noqa: E402
from trtllm.plugins import cpu  # noqa: E402

from tests.plugins.cpu_ops import on_portable_path, one_node_model, session  # noqa: E402

# (M, K, N): decode rows 1-4 and their tails up to 16, prefill panels past 48; N tails of the 4-row
# tiles and 32-row tasks; K = 32 .. 1536
SHAPES = [(1, 576, 70), (2, 96, 9), (1, 32, 5), (4, 64, 7), (8, 576, 70), (16, 64, 9), (17, 32, 33),
          (50, 576, 70), (130, 64, 1), (3, 1536, 64)]
SWIGLU = [(1, 576, 40), (8, 64, 17), (50, 64, 5)]


def op_model(w: np.ndarray, activation: str = "none", rank: int = 3, k: int | None = None) -> bytes:
    n, k = w.shape[0], k or w.shape[1]
    node = helper.make_node(cpu.HALF, ["x", "w"], ["y"], domain=cpu.DOMAIN, n=n, activation=activation)
    dims = [f"d{i}" for i in range(rank - 1)]
    out = n // 2 if activation == "swiglu" else n
    return one_node_model(node, [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims + [k])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, dims + [out])],
                          [numpy_helper.from_array(w, "w")])


DTYPES = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16}


def weights(n: int, k: int, seed: int, dtype: str = "float16") -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal((n, k)) * 0.1).astype(DTYPES[dtype])


def check(m: int, k: int, n: int, rank: int = 3, threads: int = 2, dtype: str = "float16") -> float:
    w = weights(n, k, m + k + n, dtype)
    x = np.random.default_rng(m).standard_normal((1, m, k) if rank == 3 else (m, k)).astype(np.float32)
    y = session(op_model(w, rank=rank), threads).run(None, {"x": x})[0]
    ref = x.astype(np.float64) @ w.astype(np.float64).T
    assert y.shape == ref.shape
    return float(np.abs(y - ref).max() / np.abs(ref).max())


def check_swiglu(m: int, k: int, f: int, dtype: str = "float16") -> float:
    w = weights(2 * f, k, m + k + f, dtype)
    x = np.random.default_rng(m).standard_normal((1, m, k)).astype(np.float32)
    y = session(op_model(w[swiglu_rows(f)], "swiglu")).run(None, {"x": x})[0]
    both = x.astype(np.float64) @ w.astype(np.float64).T
    gate, up = both[..., :f], both[..., f:]
    ref = gate * 0.5 * (1 + np.tanh(gate / 2)) * up  # silu, without exp's overflow
    assert y.shape == ref.shape
    return float(np.abs(y - ref).max() / np.abs(ref).max())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m, k, n", SHAPES)
def test_matches_the_float64_matmul(m, k, n, dtype):
    assert check(m, k, n, dtype=dtype) < 2e-6


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m, k, f", SWIGLU)
def test_swiglu_matches_silu_gate_times_up(m, k, f, dtype):
    assert check_swiglu(m, k, f, dtype) < 2e-6


def test_one_thread_and_a_2d_input():
    assert check(9, 576, 37, rank=2, threads=1) < 2e-6


@pytest.mark.parametrize("kernel", ["generic", "avx2"])  # (avx2: the portable path where the CPU lacks it)
def test_portable_and_avx2_paths_match_too(kernel):
    errors = on_portable_path("test_cpu_matmul_half", "[check(*s, dtype=t) for s in SHAPES for t in DTYPES] + "
                              "[check_swiglu(*s, dtype=t) for s in SWIGLU for t in DTYPES]", kernel=kernel)
    assert len(errors) == 2 * (len(SHAPES) + len(SWIGLU)) and max(errors) < 2e-6



def test_a_transposed_weight_fails():
    """The deliberately wrong variant: w stored [K, N] (MatMul's order) where the op reads [N, K]."""
    w = weights(64, 64, 0)
    x = np.random.default_rng(1).standard_normal((1, 3, 64)).astype(np.float32)
    y = session(op_model(np.ascontiguousarray(w.T))).run(None, {"x": x})[0]
    ref = x.astype(np.float64) @ w.astype(np.float64).T
    assert np.abs(y - ref).max() > 0.1


@pytest.mark.parametrize("w_shape, x_k, message", [
    ((4, 64), 32, r"w must be \[n, K\] = \[4, 32\]"),
    ((4, 48), 48, "is not a multiple of 32"),
])
def test_bad_inputs_fail_with_a_message(w_shape, x_k, message):
    model = op_model(np.zeros(w_shape, np.float16), k=x_k)
    with pytest.raises(Exception, match=message):
        session(model).run(None, {"x": np.ones((1, 1, x_k), np.float32)})


def test_anonymous_memory_where_a_file_was_mapped_is_not_dropped(tmp_path):
    """The kernel copies its weights and drops the source pages only when they are a private file
    mapping. Memory mapped anonymously where a closed file mapping was (a closed engine's weights)
    must not be classed by an old reading of /proc/self/maps: dropping it would zero the caller's
    array."""
    import ctypes
    import mmap

    n, k = 2048, 1024
    node = helper.make_node(cpu.HALF, ["x", "w"], ["y"], domain=cpu.DOMAIN, n=n)
    model = one_node_model(node, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, k]),
                                  helper.make_tensor_value_info("w", TensorProto.FLOAT16, [n, k])],
                           [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    s = session(model, threads=1)
    x = np.ones((1, k), np.float32)
    path = tmp_path / "w.bin"
    np.full((n + 64, k), 0.5, np.float16).tofile(path)
    mapped = np.memmap(path, np.float16, "c", shape=(n + 64, k))  # a private file mapping
    s.run(None, {"x": x, "w": mapped[:n]})
    lo = mapped.ctypes.data
    del mapped  # unmapped
    libc = ctypes.CDLL(None)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    fixed_noreplace = 0x100000
    addr = libc.mmap(lo + 4096, n * k * 2, mmap.PROT_READ | mmap.PROT_WRITE,
                     mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | fixed_noreplace, -1, 0)
    assert addr == lo + 4096, "the old range was taken"  # the test needs that hole
    try:
        w = np.ctypeslib.as_array((ctypes.c_uint16 * (n * k)).from_address(addr)).view(np.float16).reshape(n, k)
        w[:] = 1.0
        y = s.run(None, {"x": x, "w": w})[0]
        assert (w == 1.0).all() and np.allclose(y, k)
    finally:
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        libc.munmap(addr, n * k * 2)
