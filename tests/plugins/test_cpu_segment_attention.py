"""trtllm.cpu::SegmentAttention (plugins/cpu/segment_attention.cc): a vision encoder's rotary and
bidirectional attention within runs of rows, against a float64 numpy reference, on both code paths."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402

from trtllm.plugins import cpu  # noqa: E402

from tests.plugins.cpu_ops import on_portable_path, one_node_model, session  # noqa: E402

pytestmark = pytest.mark.skipif(cpu.library() is None, reason="the trtllm.cpu library is not built")
F32, I64 = TensorProto.FLOAT, TensorProto.INT64


def op_model(h: int, rotary: bool = True, scale: float | None = None) -> bytes:
    names = ["qkv", "cos", "sin", "segment_ids"] if rotary else ["qkv", "", "", "segment_ids"]
    inputs = [helper.make_tensor_value_info(n, t, None) for n, t in zip(names, [F32, F32, F32, I64]) if n]
    node = helper.make_node("SegmentAttention", names, ["y"], domain=cpu.DOMAIN, num_heads=h,
                            **({"scale": scale} if scale else {}))
    return one_node_model(node, inputs, [helper.make_tensor_value_info("y", F32, None)])


def rope(x, cos, sin):
    half = cos.shape[-1]
    r = 2 * half
    return np.concatenate([x[..., :half] * cos - x[..., half:r] * sin, x[..., half:r] * cos + x[..., :half] * sin,
                           x[..., r:]], -1)


def reference(qkv, cos, sin, ids, h, scale=None):
    """float64: each row attends to the run of consecutive rows that share its id."""
    qkv = qkv.astype(np.float64)
    p, d = qkv.shape[0], qkv.shape[1] // (3 * h)
    q, k, v = (qkv.reshape(p, 3, h, d)[:, i].transpose(1, 0, 2) for i in range(3))  # [h, p, d]
    if cos is not None:
        q, k = rope(q, cos[None].astype(np.float64), sin[None].astype(np.float64)), \
            rope(k, cos[None].astype(np.float64), sin[None].astype(np.float64))
    out = np.zeros((h, p, d))
    starts = [0] + [i for i in range(1, p) if ids[i] != ids[i - 1]] + [p]
    for s0, s1 in zip(starts, starts[1:]):
        s = q[:, s0:s1] @ k[:, s0:s1].transpose(0, 2, 1) * (scale or d ** -0.5)
        w = np.exp(s - s.max(-1, keepdims=True))
        out[:, s0:s1] = (w / w.sum(-1, keepdims=True)) @ v[:, s0:s1]
    return out.transpose(1, 0, 2).reshape(p, h * d)


def case(sizes, h, d, half=None, seed=0, ids=None):
    """Inputs for segments of `sizes` rows (ids 0, 1, ...; `ids`: given instead)."""
    rng = np.random.default_rng(seed)
    p = sum(sizes)
    qkv = (rng.standard_normal((p, 3 * h * d)) * 2).astype(np.float32)  # (scores wide enough to matter)
    half = d // 2 if half is None else half
    angles = rng.uniform(0, 6, (p, half)).astype(np.float32)
    if ids is None:
        ids = np.repeat(np.arange(len(sizes)), sizes).astype(np.int64)
    return qkv, np.cos(angles), np.sin(angles), np.asarray(ids, np.int64)


def run(h, qkv, cos, sin, ids, scale=None):
    rotary = cos is not None
    feeds = {"qkv": qkv, "segment_ids": ids, **({"cos": cos, "sin": sin} if rotary else {})}
    return session(op_model(h, rotary, scale)).run(None, feeds)[0]


# head sizes: the AVX-512 kernel's (multiples of 16: Qwen2-VL/2.5-VL's 80, Qwen3-VL's 64, 128) and the
# portable fallback's (24); segments: one row, fewer than a vector, unaligned starts, many chunks
SHAPES = [(2, 64, [7, 64, 1, 130, 33]), (3, 80, [64, 64, 17, 200]), (1, 128, [300]), (2, 32, [5, 70, 16, 16]),
          (2, 24, [9, 40, 3]), (4, 48, [1, 1, 2, 90])]


def relative(ours, ref) -> float:
    return float(np.abs(ours - ref).max() / max(1.0, np.abs(ref).max()))


def errors(shapes=SHAPES) -> list[float]:
    """Max |ours - reference| / max |reference| per shape (float32's rounding: the outputs reach 9, the
    scores 20), with and without the rotary, a partial one and a scale."""
    out = []
    for n, (h, d, sizes) in enumerate(shapes):
        qkv, cos, sin, ids = case(sizes, h, d, seed=n)
        out.append(relative(run(h, qkv, cos, sin, ids), reference(qkv, cos, sin, ids, h)))
        out.append(relative(run(h, qkv, None, None, ids), reference(qkv, None, None, ids, h)))
        qkv, cos, sin, ids = case(sizes, h, d, half=d // 4, seed=n + 10)
        out.append(relative(run(h, qkv, cos, sin, ids, 0.3), reference(qkv, cos, sin, ids, h, 0.3)))
    return out


def test_matches_the_reference():
    assert max(errors()) < 1e-5


def test_portable_path_matches_the_reference():
    assert max(on_portable_path("test_cpu_segment_attention", "errors()")) < 1e-5


def test_runs_of_equal_ids_not_equal_ids():
    """A segment is a run: two runs of one id attend apart (Qwen2.5-VL's windows are contiguous; an id
    met again later is another segment), and a reference that let rows see across runs must differ."""
    qkv, cos, sin, _ = case([20, 30, 25], 2, 64)
    ids = np.repeat([4, 9, 4], [20, 30, 25])
    ours = run(2, qkv, cos, sin, ids)
    assert relative(ours, reference(qkv, cos, sin, ids, 2)) < 1e-5
    # equal ids as one group (rows 0-19 and 50-74 together): computed with them made adjacent
    order = np.r_[0:20, 50:75, 20:50]
    grouped = np.empty_like(ours)
    grouped[order] = reference(qkv[order], cos[order], sin[order], np.repeat([0, 1], [45, 30]), 2)
    assert np.abs(ours - grouped).max() > 1e-2
    whole = reference(qkv, cos, sin, np.zeros(75, np.int64), 2)  # one segment: rows see across runs
    assert np.abs(ours - whole).max() > 1e-2


def test_agrees_with_onnx_attention_and_a_mask():
    """The graph it replaces: ONNX's Attention over [1, H, P, D] with an equal-ids mask."""
    h, d = 2, 80
    qkv, cos, sin, ids = case([40, 24, 70], h, d, seed=3)
    q, k, v = (qkv.reshape(-1, 3, h, d)[:, i].transpose(1, 0, 2)[None] for i in range(3))
    full = lambda c: np.concatenate([c, c], -1)[None, None]  # noqa: E731
    q, k = (x * full(cos) + np.concatenate([-x[..., d // 2:], x[..., :d // 2]], -1) * full(sin) for x in (q, k))
    mask = (ids[:, None] == ids[None, :])[None, None]
    names = ["q", "k", "v", "mask"]
    node = helper.make_node("Attention", names, ["y"], scale=d ** -0.5)
    inputs = [helper.make_tensor_value_info(n, TensorProto.BOOL if n == "mask" else F32, None) for n in names]
    graph = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info("y", F32, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 24)])
    model.ir_version = 11
    standard = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"q": q.astype(np.float32), "k": k.astype(np.float32), "v": v.astype(np.float32), "mask": mask})[0]
    standard = standard[0].transpose(1, 0, 2).reshape(-1, h * d)
    assert relative(run(h, qkv, cos, sin, ids), standard) < 1e-5


def test_threads_and_empty_input():
    qkv, cos, sin, ids = case([100, 3, 50], 2, 64, seed=5)
    one = session(op_model(2), threads=1).run(None, {"qkv": qkv, "cos": cos, "sin": sin, "segment_ids": ids})[0]
    assert np.array_equal(one, run(2, qkv, cos, sin, ids))  # (each row's sums in one order, whatever the split)
    empty = run(2, qkv[:0], cos[:0], sin[:0], ids[:0])
    assert empty.shape == (0, 128)


@pytest.mark.parametrize("feeds, message", [
    (lambda q, c, s, i: (q[:, :-1], c, s, i), "qkv must be [rows, 3 x num_heads 2 x head_size]"),
    (lambda q, c, s, i: (q, c[:-1], s[:-1], i), "cos must be [rows 10, R / 2]"),
    (lambda q, c, s, i: (q, c, s[:, :-1], i), "sin must have cos's shape"),
    (lambda q, c, s, i: (q, c, s, i[:-1]), "segment_ids must be [rows 10]"),
])
def test_refuses_shapes_it_would_misread(feeds, message):
    qkv, cos, sin, ids = feeds(*case([4, 6], 2, 16))
    with pytest.raises(Exception, match=message.replace("[", r"\[").replace("]", r"\]")):
        run(2, qkv, cos, sin, ids)


def peak_growth_mb(p: int) -> float:
    """How far one call on p rows (one head of 64, one segment) raises this process's peak memory, in MB."""
    import resource

    qkv, cos, sin, ids = case([p], 1, 64)
    s = session(op_model(1))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    s.run(None, {"qkv": qkv, "cos": cos, "sin": sin, "segment_ids": ids})
    return (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024


def test_memory_grows_with_the_rows_not_their_square():
    """16,000 rows in one segment: ONNX's Attention would hold a 1 GB [P, P] score matrix for the one
    head; the kernel holds the keys and values again (8 MB) and its tasks' blocks."""
    assert on_portable_path("test_cpu_segment_attention", "peak_growth_mb(16000)", kernel="auto") < 100
