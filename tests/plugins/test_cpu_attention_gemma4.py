"""trtllm.cpu::Attention for Gemma 4 (plugins/cpu/attention.cc): each v head RMS-normalized before it is
written (v_norm), a layer reading another's KV (shared_kv: q alone in, nothing written, y alone out), and
its full layers' head size 512, against the float64 reference of test_cpu_attention.py, on every path."""
from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import helper  # noqa: E402

from trtllm.plugins import cpu  # noqa: E402

from tests.plugins.cpu_ops import on_portable_path, one_node_model, session  # noqa: E402
from tests.plugins.test_cpu_attention import F32, I64, NAMES, case, head_norm, reference  # noqa: E402

# (shape as test_cpu_attention's CASES, window): a decode row, a prefill chunk after a prefix with a
# window, head size 512 (gemma-4-E2B's full layers: one kv head) and 256 (its sliding ones), a long
# context split in parts, and head size 40 (the portable path)
CASES = [((1, 1, 8, 1, 64, 40, [17]), 0), ((2, 11, 4, 2, 32, 64, [0, 9]), 5), ((1, 3, 8, 1, 512, 40, [9]), 0),
         ((2, 9, 8, 1, 256, 64, [3, 30]), 7), ((1, 1, 8, 1, 512, 1300, [1200]), 0), ((1, 5, 4, 2, 40, 30, [3]), 3)]


def op_model(h: int, hk: int, window: int, v_norm: bool = False, shared: bool = False, outputs: int = 3) -> bytes:
    """The node as the builder writes it for Gemma 4: q/k norms, epsilon, and v_norm or shared_kv (then
    y alone out, and no k_norm: the keys are the other layer's)."""
    names = NAMES + ["q_norm", "" if shared else "k_norm"]
    types = [F32, F32, F32, I64, I64, I64, F32, F32, F32, F32]
    inputs = [helper.make_tensor_value_info(n, t, None) for n, t in zip(names, types) if n]
    outs = [helper.make_tensor_value_info(n, F32, None) for n in ("y", "present_key", "present_value")[:outputs]]
    attrs = {"num_heads": h, "kv_num_heads": hk, "epsilon": 1e-6, **({"window": window} if window else {}),
             **({"v_norm": 1} if v_norm else {}), **({"shared_kv": 1} if shared else {})}
    node = helper.make_node("Attention", names, [o.name for o in outs], domain=cpu.DOMAIN, **attrs)
    return one_node_model(node, inputs, outs)


def feeds_of(shape, window):
    b, s, h, hk, d, c, past = shape
    feeds = case(b, s, h, hk, d, c, past, seed=b + s + d + window)
    rng = np.random.default_rng(window + d)
    feeds.update(q_norm=(1 + 0.3 * rng.standard_normal(d)).astype(np.float32),
                 k_norm=(1 + 0.3 * rng.standard_normal(d)).astype(np.float32))
    return feeds


def v_normed(feeds, h, hk, d):
    """qkv with each v head RMS-normalized: what the reference writes for a v_norm node."""
    qkv = feeds["qkv"].astype(np.float64).copy()
    for g in range(hk):
        at = slice((h + hk + g) * d, (h + hk + g + 1) * d)
        qkv[..., at] = np.apply_along_axis(head_norm, -1, qkv[..., at], 1.0, 1e-6)
    return qkv


def check_v_norm(shape, window, reference_norms_v=True) -> float:
    b, s, h, hk, d, c, past = shape
    feeds = feeds_of(shape, window)
    got = session(op_model(h, hk, window, v_norm=True)).run(None, feeds)
    qkv = v_normed(feeds, h, hk, d) if reference_norms_v else feeds["qkv"]
    want = reference(qkv, *list(feeds.values())[1:8], h, hk, d ** -0.5, window=window,
                     norms=(feeds["q_norm"], feeds["k_norm"]))
    return float(max(np.abs(g - w).max() for g, w in zip(got, want)))


def check_shared(shape, window) -> float:
    """q alone against a cache that already holds the step's keys and values (the source layer's node
    wrote them): the reference attends over that cache as it is."""
    b, s, h, hk, d, c, past = shape
    feeds = feeds_of(shape, window)
    given = {k: v for k, v in feeds.items() if k != "k_norm"}
    given["qkv"] = np.ascontiguousarray(feeds["qkv"][..., :h * d])
    before = given["past_key"].copy(), given["past_value"].copy()
    (y,) = session(op_model(h, hk, window, shared=True, outputs=1)).run(None, given)
    assert np.array_equal(given["past_key"], before[0]) and np.array_equal(given["past_value"], before[1])
    want = reference(*list(feeds.values())[:8], h, hk, d ** -0.5, window=window,
                     norms=(feeds["q_norm"], feeds["k_norm"]), cache=before)[0]
    return float(np.abs(y - want).max())


@pytest.mark.parametrize("shape, window", CASES)
def test_v_normed_before_it_is_written_matches_the_reference(shape, window):
    assert check_v_norm(shape, window) < 1e-5
    assert check_v_norm(shape, window, reference_norms_v=False) > 1e-3  # the wrong variant: v as it came


@pytest.mark.parametrize("shape, window", CASES)
def test_a_layer_reading_another_layers_kv_matches_the_reference(shape, window):
    assert check_shared(shape, window) < 1e-5


@pytest.mark.parametrize("kernel", ["generic", "avx2"])
def test_on_the_portable_and_avx2_paths_too(kernel):
    errors = on_portable_path("test_cpu_attention_gemma4",
                              "[f(*c) for c in CASES for f in (check_v_norm, check_shared)]", kernel=kernel)
    assert np.max(errors) < 1e-5


def test_a_shared_kv_node_with_kv_outputs_fails_with_a_message():
    with pytest.raises(Exception, match="shared_kv 1 writes no KV: its node has one output, y"):
        session(op_model(4, 2, 0, shared=True, outputs=3))
