"""trtllm.cpu::MatMulBlockQuant (plugins/cpu): the native kernel against a float64 numpy reference,
on both of its code paths (AVX-512 and portable), with the shapes that exercise every tail."""
from __future__ import annotations

import os
import subprocess

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from trtllm.builder.quantize import (QuantScheme, dequantize, half_grid, pack_rows, quantize,  # noqa: E402
                                     swiglu_rows)
from trtllm.plugins import cpu  # noqa: E402

from tests.plugins.cpu_ops import on_portable_path, one_node_model, session  # noqa: E402


def test_the_library_is_built():
    # scripts/setup.sh builds it; every engine test with --quantization relies on it
    assert cpu.library() is not None, cpu.missing_hint()


def op_model(k: int, n: int, bits: int, packed, scale, offset, rank: int = 3, activation: str = "none",
             **attrs) -> bytes:
    inits = [numpy_helper.from_array(packed, "codes"), numpy_helper.from_array(scale, "scale")]
    inputs = ["x", "codes", "scale"]
    if offset is not None:
        inits.append(numpy_helper.from_array(offset, "offset"))
        inputs.append("offset")
    node = helper.make_node(cpu.OP, inputs, ["y"], domain=cpu.DOMAIN, bits=bits, n=n, activation=activation,
                            layout=cpu.LAYOUT, **attrs)
    dims = [f"d{i}" for i in range(rank - 1)]
    out = n // 2 if activation == "swiglu" else n
    return one_node_model(node, [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims + [k])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, dims + [out])], inits)


def case(bits: int, k: int, n: int, seed: int = 0, pack=pack_rows):
    """(float weight [k, n] the graph means, packed inputs)."""
    w = np.random.default_rng(seed).standard_normal((k, n)).astype(np.float32) * 0.1
    scheme = QuantScheme(bits, asymmetric=bits == 4)
    codes, scale, offset = quantize(w, scheme)
    return dequantize(codes, scale, offset, 32), pack(codes, scale, offset, bits)


# M = activation rows: 1 and 2 (decode, scale factored out), 8 (decode, a batch), 5 and 17 (tails of
# the register tiles), 50 and 130 (prefill panels of 48 rows); N: 1, 5 and 70 (tails of the 4-row
# tiles and 32-row tasks); K: 32, 96, 576 and 1536 (16-block groups of parameters and their tails).
SHAPES = [(1, 576, 70), (2, 96, 9), (1, 32, 5), (6, 64, 7), (8, 576, 70), (5, 64, 5), (16, 64, 9), (17, 32, 33),
          (50, 576, 70), (130, 64, 1), (3, 1536, 64), (1, 1536, 33)]


def check(bits: int, m: int, k: int, n: int, threads: int = 2, rank: int = 3) -> float:
    wd, packed = case(bits, k, n, seed=m + k + n)
    x = np.random.default_rng(m).standard_normal((m, k)).astype(np.float32)
    x = x.reshape(1, m, k) if rank == 3 else x
    y = session(op_model(k, n, bits, *packed, rank=rank), threads).run(None, {"x": x})[0]
    ref = x.astype(np.float64) @ wd.astype(np.float64)
    assert y.shape == ref.shape
    return float(np.abs(y - ref).max() / np.abs(ref).max())


def check_swiglu(bits: int, m: int, k: int, f: int, x_scale: float = 1.0) -> float:
    """activation=swiglu over [gate; up] rows in swiglu_rows order: silu(x @ gate) * (x @ up)."""
    wd, (packed, scale, offset) = case(bits, k, 2 * f, seed=m + k + f)
    order = swiglu_rows(f)
    model = op_model(k, 2 * f, bits, packed[order], scale[order], None if offset is None else offset[order],
                     activation="swiglu")
    x = np.random.default_rng(m).standard_normal((1, m, k)).astype(np.float32) * np.float32(x_scale)
    y = session(model).run(None, {"x": x})[0]
    both = x.astype(np.float64) @ wd.astype(np.float64)
    gate, up = both[..., :f], both[..., f:]
    ref = gate * 0.5 * (1 + np.tanh(gate / 2)) * up  # silu, without exp's overflow
    assert y.shape == ref.shape
    return float(np.abs(y - ref).max() / np.abs(ref).max())


# F = outputs: 1, 5, 17 and 40 (tails of the 16-output groups); M: decode, a register tail, prefill panels
SWIGLU = [(1, 576, 40), (8, 64, 17), (5, 32, 1), (50, 64, 5), (100, 576, 16)]


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("m, k, n", SHAPES)
def test_matches_the_dequantized_matmul(bits, m, k, n):
    assert check(bits, m, k, n) < 2e-6


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("m, k, f", SWIGLU)
def test_swiglu_matches_silu_gate_times_up(bits, m, k, f):
    assert check_swiglu(bits, m, k, f) < 2e-6


def test_swiglu_saturates_like_silu():
    # gates of several hundred: exp(-gate) beyond float32's range on both sides
    assert check_swiglu(4, 3, 576, 40, x_scale=400.0) < 2e-6


def test_concurrent_runs_share_nothing():
    """Sessions run from several Python threads at once (ONNX Runtime's pools, the kernel's
    thread-local buffers) give each caller its own right answer."""
    from concurrent.futures import ThreadPoolExecutor

    wd, packed = case(4, 576, 70)
    sessions = [session(op_model(576, 70, 4, *packed), threads=3) for _ in range(3)]
    xs = [np.random.default_rng(i).standard_normal((1, m, 576)).astype(np.float32) for i, m in enumerate([1, 8, 60])]

    def run(i):
        y = sessions[i % 3].run(None, {"x": xs[i % 3]})[0]
        ref = xs[i % 3].astype(np.float64) @ wd
        return np.abs(y - ref).max() / np.abs(ref).max()

    with ThreadPoolExecutor(4) as pool:
        assert max(pool.map(run, range(60))) < 2e-6


def test_huge_page_copies_on_or_off_compute_the_same():
    """trtllm-run --no-huge-pages reaches the kernels through trtllm_cpu_set_huge_pages: weights
    then stay where ONNX Runtime put them, with the same results."""
    try:
        for on in (False, True):
            cpu.set_huge_pages(on)
            assert check(4, 3, 576, 70) < 2e-6
    finally:
        cpu.set_huge_pages(True)


def test_swiglu_rows_pair_gate_and_up_in_groups():
    assert list(swiglu_rows(5, group=2)) == [0, 1, 5, 6, 2, 3, 7, 8, 4, 9]
    assert sorted(swiglu_rows(40)) == list(range(80))


def test_one_thread_and_a_2d_input():
    assert check(4, 9, 576, 37, threads=1, rank=2) < 2e-6


@pytest.mark.parametrize("kernel", ["generic", "avx2"])  # (avx2: the portable path where the CPU lacks it)
def test_portable_and_avx2_paths_match_too(kernel):
    errors = on_portable_path("test_cpu_kernels", "[check(b, *s) for b in (4, 8) for s in SHAPES] + "
                                                  "[check_swiglu(b, *s) for b in (4, 8) for s in SWIGLU]",
                              kernel=kernel)
    assert len(errors) == 2 * (len(SHAPES) + len(SWIGLU)) and max(errors) < 2e-6


def wrong_nibble_order(codes, scale, offset, bits):
    """The deliberately wrong variant: neighbours share a byte (ONNX's int4 order) instead of q[i]
    and q[i + 16] (the kernel's, GGUF's)."""
    packed, s, o = pack_rows(codes, scale, offset, bits)
    q = (codes.astype(np.int8).T.astype(np.int16) + 8).astype(np.uint8)
    return np.ascontiguousarray(q[:, 0::2] | (q[:, 1::2] << 4)), s, o


def test_a_wrong_packing_fails():
    wd, packed = case(4, 64, 8, pack=wrong_nibble_order)
    x = np.random.default_rng(1).standard_normal((1, 2, 64)).astype(np.float32)
    y = session(op_model(64, 8, 4, *packed)).run(None, {"x": x})[0]
    ref = x.astype(np.float64) @ wd
    assert np.abs(y - ref).max() / np.abs(ref).max() > 1e-2


def test_packing_layout():
    codes = np.arange(-8, 8, dtype=np.int8).repeat(4).reshape(64, 1)     # one column, two blocks
    scale = np.full((2, 1), 0.5, np.float32)
    packed, s, o = pack_rows(codes, scale, np.ones((2, 1), np.float32), 4)
    q = codes[:, 0] + 8
    assert packed.shape == (1, 32) and packed.dtype == np.uint8
    assert list(packed[0, :16]) == list(q[:16] | (q[16:32] << 4))
    assert s.dtype == np.float16 and o.dtype == np.float16
    assert o[0, 0] == np.float16(1 - 8 * 0.5)  # the block minimum: w = s q + o with q = c + 8


def test_scales_sit_on_the_float16_grid():
    w = np.random.default_rng(3).standard_normal((96, 40)).astype(np.float32)
    for scheme in (QuantScheme(8), QuantScheme(4, asymmetric=True)):
        codes, scale, offset = quantize(w, scheme)
        assert np.array_equal(half_grid(scale), scale)
        if offset is not None:  # o = min + 8 s with both on the grid: min is recovered exactly
            assert np.array_equal(half_grid(offset - 8 * scale), offset - 8 * scale)
    with pytest.raises(ValueError, match="float16"):
        half_grid(np.array([1e6], np.float32))


@pytest.mark.parametrize("shift", [0.0, 0.5])
def test_int4_minimum_and_offset_are_both_float16_values(shift):
    """Our kernels store a block's minimum in float16 and a float16 llm.onnx (W4A16) its offset
    min + 8 s: both are float16 values, so both forms hold the same weights, still within 0.8 of a
    step of the float32 weight (0.5 for zero-mean blocks). The deliberately wrong variant, the
    rounded minimum plus 8 s, is off float16's grid for some blocks."""
    rng = np.random.default_rng(5)
    w = (rng.standard_normal((1024, 256)) * 0.02 + shift * rng.uniform(0, 1, (1, 256))).astype(np.float32)
    codes, scale, offset = quantize(w, QuantScheme(4, asymmetric=True))
    lo = offset - 8 * scale
    for values in (scale, offset, lo):
        assert np.array_equal(half_grid(values), values)
    step = np.repeat(scale, 32, axis=0)
    assert (np.abs(dequantize(codes, scale, offset, 32) - w) / step).max() <= (0.5 + 1e-6 if not shift else 0.8)
    grouped = w.reshape(32, 32, 256)
    rounded = half_grid(grouped.min(axis=1)) + 8 * half_grid((grouped.max(axis=1) - grouped.min(axis=1)) / 15)
    assert not np.array_equal(half_grid(rounded), rounded)


@pytest.mark.parametrize("attrs, inputs, message", [
    ({"bits": 3, "n": 4, "layout": 1}, 4, "bits must be 4 or 8"),
    ({"bits": 4, "n": 4, "activation": "gelu", "layout": 1}, 4, "activation must be none or swiglu, got gelu"),
    ({"bits": 4, "n": 4, "layout": 2}, 4, "packing layout 2, this library reads layout 1: rebuild the engine"),
    ({"bits": 4, "n": 5, "layout": 1}, 4, "codes hold 64 bytes, expected 80"),
    ({"bits": 4, "n": 4, "layout": 1}, 3, "4-bit weights need their offset"),
])
def test_bad_nodes_fail_with_a_message(attrs, inputs, message):
    _, (packed, scale, offset) = case(4, 32, 4)
    model = onnx.load_from_string(op_model(32, 4, 4, packed, scale, offset))
    node = model.graph.node[0]
    del node.attribute[:]
    node.attribute.extend([helper.make_attribute(k, v) for k, v in attrs.items()])
    del node.input[inputs:]
    with pytest.raises(Exception, match=message):
        session(model.SerializeToString()).run(None, {"x": np.ones((1, 1, 32), np.float32)})


def test_the_portable_code_compiles_alone():
    """What a CPU other than x86 builds (TRTLLM_PORTABLE_ONLY leaves out every AVX-512 path) must
    compile warning-free too, not only the x86 library this machine runs."""
    from trtllm.plugins.cpu import build

    include = build.ROOT / "build" / "ort-headers" / "onnxruntime"
    cmd = [os.environ.get("CXX", "g++"), "-std=c++17", "-fsyntax-only", "-Wall", "-Werror", "-DTRTLLM_PORTABLE_ONLY",
           f"-I{include}", *map(str, build.SOURCES)]
    out = subprocess.run(cmd, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def test_the_library_is_rebuilt_when_its_sources_change_not_when_they_are_newer(tmp_path, monkeypatch):
    """A checkout of older sources leaves older file times: the library's stamp is a digest of its
    sources, so a stale library is rebuilt and a touched but unchanged source is not."""
    from trtllm.plugins.cpu import build

    sources = []
    for path in [*build.SOURCES, *build.HEADERS]:
        sources.append(tmp_path / path.name)
        sources[-1].write_bytes(path.read_bytes())
    monkeypatch.setattr(build, "SOURCES", sources[:len(build.SOURCES)])
    monkeypatch.setattr(build, "HEADERS", sources[len(build.SOURCES):])
    library = tmp_path / "lib.so"
    assert build.needs_build(library)  # nothing built
    library.write_bytes(b"built")
    assert build.needs_build(library)  # no stamp: built by something else
    build.stamp_of(library).write_text(f"{build.source_digest()}\n{build.library_digest(library)}\ng++\n")
    monkeypatch.delenv("CXX", raising=False)
    assert not build.needs_build(library)
    monkeypatch.setenv("CXX", "clang++")  # another compiler: rebuilt by setup, still used at run time
    assert build.needs_build(library) and not build.needs_build(library, compiler=False)
    monkeypatch.delenv("CXX")
    library.write_bytes(b"buil")  # truncated (an interrupted copy): ONNX Runtime died on it with SIGBUS
    assert build.needs_build(library, compiler=False)
    library.write_bytes(b"built")
    os.utime(sources[0], (1e9, 1e9))  # older, same content
    os.utime(library, (2e9, 2e9))
    assert not build.needs_build(library)
    sources[0].write_text(sources[0].read_text() + "\n// changed\n")
    os.utime(sources[0], (1e9, 1e9))  # changed but older than the library: still rebuilt
    assert build.needs_build(library)


def test_a_library_out_of_step_with_its_sources_is_not_used(monkeypatch):
    """ONNX Runtime ignores attributes an op does not know: an old library would run new engines
    wrongly without a word, so it counts as missing, with its own fix."""
    from trtllm.plugins.cpu import build

    assert cpu.library() is not None
    monkeypatch.setattr(build, "needs_build", lambda out=build.LIBRARY, compiler=True: True)
    assert cpu.library() is None
    assert "was built from other sources than these, or is damaged: run `bash scripts/setup.sh`" in cpu.missing_hint()
