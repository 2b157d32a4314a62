"""MatMulBlockQuant with activations="int8" or "int16" (plugins/cpu/matmul_int8.cc): rows quantized
per block of 32 and multiplied in integers, 4-bit and 8-bit weights, against a numpy reference of
the same quantization, on all three code paths (VNNI, AVX-512BW, portable). Without the `generated`
input (engines from before it) calls of up to 16 rows are quantized and longer ones stay float32;
with it, the runtime's flag decides for any number of rows."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnx")

from trtllm.plugins import cpu  # noqa: E402

from tests.plugins.cpu_ops import on_portable_path, session  # noqa: E402
from tests.plugins.test_cpu_kernels import case, op_model  # noqa: E402


def int8_model(k: int, n: int, packed, scale, offset, activations: str = "int8", bits: int = 4) -> bytes:
    return op_model(k, n, bits, packed, scale, offset, activations=activations)


def quantized(x: np.ndarray, levels: int = 1, per_block: bool = True) -> np.ndarray:
    """x as the kernel sees it, per block of 32 (per row with per_block=False, the wrong variant):
    d a with a = round(x * 127 / max|x|), d = max|x| / 127; levels 2 adds d / 256 a2 with
    a2 = round((x - d a) * 256 / d). Computed in float32 where the kernel is."""
    m, k = x.shape
    groups = x.reshape(m, k // 32, 32) if per_block else x.reshape(m, 1, k)
    amax = np.abs(groups).max(axis=-1, keepdims=True)
    amax = np.where(amax > np.float32(1e-30), amax, 0).astype(np.float32)  # tinier blocks count as zeros
    inv = np.where(amax > 0, np.float32(127) / np.where(amax > 0, amax, 1), 0).astype(np.float32)
    d = (amax / np.float32(127)).astype(np.float32)
    whole = np.rint(groups * inv)
    value = whole.astype(np.float64) * d
    if levels == 2:
        rest = (groups.astype(np.float64) - whole.astype(np.float64) * d).astype(np.float32)  # one rounding, as fnmadd
        part = np.clip(np.rint(rest * (np.float32(256) * inv)), -127, 127)
        value += part.astype(np.float64) * (d.astype(np.float64) / 256)
    return value.reshape(m, k)


def reference(x: np.ndarray, wd: np.ndarray, offset, levels: int = 1, per_block: bool = True):
    """sum_b s_b d_b (q_b . a_b) + o_b sum(x_b): the quantized x times the weights, with the offsets'
    share taken from the exact block sums (offset: [n, k / 32], the block minimum, or None)."""
    m, k = x.shape
    xq = quantized(x, levels, per_block)
    y = xq @ wd.astype(np.float64)
    if offset is None:
        return y
    exact = x.astype(np.float64).reshape(m, k // 32, 32).sum(-1)
    moved = xq.reshape(m, k // 32, 32).sum(-1)
    return y + (exact - moved) @ offset.astype(np.float64).T


LEVELS = {"int8": 1, "int16": 2}


def check(m: int, k: int, n: int, activations: str = "int8", bits: int = 4, per_block: bool = True,
          x_scale: float = 1.0) -> float:
    wd, packed = case(bits, k, n, seed=m + k + n)
    x = (np.random.default_rng(m).standard_normal((m, k)) * x_scale).astype(np.float32)
    if m % 2 and k > 32:
        x[:, :32] = 0.0  # an all-zero block: d = 0
    if m > 2 and k > 64:
        x[1, 32:64] *= np.float32(1e-32)  # a block below 1e-30: zeros
    y = session(int8_model(k, n, *packed, activations, bits)).run(None, {"x": x.reshape(1, m, k)})[0][0]
    ref = reference(x, wd, packed[2], LEVELS[activations], per_block)
    return float(np.abs(y - ref).max() / np.abs(ref).max())


# M: 1 to 16 decode rows (tiles of up to 8 and their tails); K (in blocks of 32): runs of 16 blocks and
# units of 4 (4-bit) or 2 (8-bit) for the rest: 1, 5, 16 + 2, 16 + 1, 2 x 16, 16 + 15 (a 3-block unit),
# 3 x 16; N: tails of the 4-row steps and 32-row tasks.
SHAPES = [(1, 576, 70), (2, 96, 9), (1, 32, 5), (3, 160, 7), (4, 544, 64), (5, 64, 5), (8, 576, 70),
          (16, 1536, 33), (7, 1024, 4), (9, 992, 6), (1, 224, 1)]


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("activations", ["int8", "int16"])
@pytest.mark.parametrize("m, k, n", SHAPES)
def test_matches_the_integer_reference(m, k, n, activations, bits):
    assert check(m, k, n, activations, bits) < 2e-6


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("activations", ["int8", "int16"])
def test_large_and_tiny_activations(activations, bits):
    assert check(3, 576, 40, activations, bits, x_scale=300.0) < 2e-6
    assert check(3, 576, 40, activations, bits, x_scale=1e-3) < 2e-6


@pytest.mark.parametrize("bits", [4, 8])
def test_a_per_row_scale_fails(bits):
    """The deliberately wrong variant: one scale per row instead of per block of 32."""
    assert check(2, 576, 70, bits=bits, per_block=False) > 1e-3


@pytest.mark.parametrize("activations, low, high", [("int8", 1e-4, 2e-2), ("int16", 1e-7, 1e-4)])
def test_within_quantization_error_of_float32(activations, low, high):
    wd, packed = case(4, 576, 64, seed=5)
    x = np.random.default_rng(5).standard_normal((1, 2, 576)).astype(np.float32)
    y = session(int8_model(576, 64, *packed, activations)).run(None, {"x": x})[0]
    exact = x.astype(np.float64) @ wd
    err = np.abs(y - exact).max() / np.abs(exact).max()
    assert low < err < high  # int8: steps of max|x| / 127; int16: of max|x| / 32512


@pytest.mark.parametrize("bits", [4, 8])
def test_calls_of_more_than_16_rows_stay_float32(bits):
    wd, packed = case(bits, 576, 40, seed=2)
    x = np.random.default_rng(2).standard_normal((1, 17, 576)).astype(np.float32)
    int8 = session(int8_model(576, 40, *packed, bits=bits)).run(None, {"x": x})[0]
    float32 = session(int8_model(576, 40, *packed, activations="float32", bits=bits)).run(None, {"x": x})[0]
    assert np.array_equal(int8, float32)


def flagged_model(k: int, n: int, packed, scale, offset, activations: str = "int8", bits: int = 4) -> bytes:
    """The op with its fifth input, `generated` (int64 [1]), as integer-activation engines have it."""
    import onnx
    from onnx import TensorProto, helper

    model = onnx.load_from_string(int8_model(k, n, packed, scale, offset, activations, bits))
    node = model.graph.node[0]
    while len(node.input) < 4:  # 8-bit weights have no offset: an empty name skips it
        node.input.append("")
    node.input.append("generated")
    model.graph.input.append(helper.make_tensor_value_info("generated", TensorProto.INT64, [1]))
    return model.SerializeToString()


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("activations", ["int8", "int16"])
def test_generated_input_decides_not_the_call_size(activations, bits):
    """generated=1: every row quantized, however many (an EAGLE verification step of a batch);
    generated=0: float32 on the prefill path, even for one row (a prompt's last token after a
    restored prefix). Either way each row's result is bit for bit the one it gets alone, so an
    answer does not depend on batching."""
    wd, packed = case(bits, 576, 40, seed=3)
    x = np.random.default_rng(3).standard_normal((1, 40, 576)).astype(np.float32)
    flagged = session(flagged_model(576, 40, *packed, activations, bits))
    float32 = session(int8_model(576, 40, *packed, activations="float32", bits=bits))
    many = flagged.run(None, {"x": x, "generated": np.ones(1, np.int64)})[0][0]
    ref = reference(x[0], wd, packed[2], LEVELS[activations])
    assert np.abs(many - ref).max() / np.abs(ref).max() < 2e-6
    for r in (0, 17, 39):
        alone = flagged.run(None, {"x": x[:, r:r + 1], "generated": np.ones(1, np.int64)})[0][0]
        assert np.array_equal(alone[0], many[r])
    prompt = flagged.run(None, {"x": x, "generated": np.zeros(1, np.int64)})[0][0]
    assert np.array_equal(prompt, float32.run(None, {"x": x})[0][0])  # 40 rows: the float32 prefill path
    for r in (0, 17, 39):
        alone = flagged.run(None, {"x": x[:, r:r + 1], "generated": np.zeros(1, np.int64)})[0][0]
        assert np.array_equal(alone[0], prompt[r])


def kernel_path() -> int:
    """The code path the library runs in this process: 4 VNNI, 3 AVX-512BW, 2 AVX2, 1 portable."""
    import ctypes

    return ctypes.CDLL(str(cpu.library())).trtllm_cpu_kernel_path()


@pytest.mark.parametrize("kernel, path", [("generic", 1), ("avx2", 2), ("avx512", 3)])
def test_every_code_path_matches(kernel, path):
    errors = on_portable_path("test_cpu_matmul_int8", "[check(*s, a, b) for s in SHAPES for a in LEVELS "
                              "for b in (4, 8)] + [nan_rows(a, b) for a in LEVELS for b in (4, 8)] + [kernel_path()]",
                              kernel=kernel)
    # the path asked for is the one that ran, where this CPU has it (an AMD EPYC VM without AVX-512
    # runs AVX2 for "avx512": the library falls back, and the numbers are checked alike)
    assert errors[-1] == min(path, kernel_path())
    assert len(errors) == 4 * len(SHAPES) + 5 and max(errors[:-5]) < 2e-6 and all(errors[-5:-1])


def nan_rows(activations: str, bits: int) -> bool:
    """A row with a NaN or an infinity gives no finite output, as in float32; its neighbours are exact."""
    wd, packed = case(bits, 576, 9, seed=4)
    x = np.random.default_rng(4).standard_normal((3, 576)).astype(np.float32)
    x[0, 40], x[2, 500] = np.nan, np.inf
    y = session(int8_model(576, 9, *packed, activations, bits)).run(None, {"x": x[None]})[0][0]
    ref = reference(x[1:2], wd, packed[2], LEVELS[activations])
    return bool(np.isnan(y[0]).all() and not np.isfinite(y[2]).any()
                and np.abs(y[1] - ref[0]).max() / np.abs(ref).max() < 2e-6)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("activations", ["int8", "int16"])
def test_nan_and_infinity_are_not_lost(activations, bits):
    assert nan_rows(activations, bits)


def test_bad_activations_fail_with_a_message():
    _, (packed, scale, offset) = case(4, 32, 4)
    with pytest.raises(Exception, match="activations must be float32, int16 or int8, got bfloat16"):
        session(int8_model(32, 4, packed, scale, offset, "bfloat16"))
