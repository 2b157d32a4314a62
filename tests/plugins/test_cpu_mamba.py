"""trtllm.cpu::MambaScan against a float64 numpy reference of transformers' recurrent form: one-token and
prompt-sized steps, rows that start (write_index 0: their slot's old states ignored), continue, are
padded or parked (last_index -1: both states kept), one group or several, with and without a
convolution bias, the states written in place (a binding of the outputs to the inputs), the portable
and AVX2 paths, and bad shapes. The deliberately wrong variant (a parked row's pad taken in) must miss."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from trtllm.plugins import cpu

from tests.plugins.cpu_ops import on_portable_path, one_node_model, session  # noqa: E402

if cpu.library() is None:
    pytest.skip("the trtllm.cpu library is not built", allow_module_level=True)

F, I64 = TensorProto.FLOAT, TensorProto.INT64
NAMES = ["xbc", "dt", "conv", "ssm", "write_index", "last_index", "w", "bias", "A", "dt_bias", "D"]


def op_model(heads: int, dim: int, n: int, groups: int, bias: bool = True) -> bytes:
    ins = [name if bias or name != "bias" else "" for name in NAMES]
    node = helper.make_node(cpu.MAMBA, ins, ["y", "conv_out", "ssm_out"], domain=cpu.DOMAIN, heads=heads,
                            head_dim=dim, state_size=n, groups=groups)
    inputs = [helper.make_tensor_value_info(name, I64 if "index" in name else F, None)
              for name in NAMES if bias or name != "bias"]
    outputs = [helper.make_tensor_value_info(o, F, None) for o in ("y", "conv_out", "ssm_out")]
    return one_node_model(node, inputs, outputs)


def case(b: int, s: int, heads=4, dim=8, n=16, groups=2, taps=4, seed=0, write_index=None, last_index=None):
    rng = np.random.default_rng(seed)
    c = heads * dim + 2 * groups * n
    feeds = {"xbc": rng.standard_normal((b, s, c)), "dt": rng.standard_normal((b, s, heads)),
             "conv": rng.standard_normal((b, taps - 1, c)),
             "ssm": rng.standard_normal((b, groups, heads // groups, dim, n)),
             "write_index": np.array(write_index if write_index is not None else [3] * b, np.int64),
             "last_index": np.array(last_index if last_index is not None else [s - 1] * b, np.int64),
             "w": rng.standard_normal((taps, c)) * 0.5, "bias": rng.standard_normal(c) * 0.1,
             "A": -np.exp(rng.standard_normal(heads) * 0.5), "dt_bias": rng.standard_normal(heads) * 0.5,
             "D": rng.standard_normal(heads)}
    return {k: v if v.dtype == np.int64 else v.astype(np.float32) for k, v in feeds.items()}, (heads, dim, n, groups)


def reference(f: dict, heads: int, dim: int, n: int, groups: int, bias: bool = True, take_pads: bool = False):
    """(y, conv state, ssm state) in float64: transformers' causal_conv1d_update and
    mamba2_selective_state_update token by token, each row from zeros where its write_index is 0."""
    g64 = {k: v.astype(np.float64) for k, v in f.items()}
    b, s, c = f["xbc"].shape
    taps, inner, per = f["w"].shape[0], heads * dim, heads // groups
    y = np.zeros((b, s, inner))
    conv, ssm = g64["conv"].copy(), g64["ssm"].reshape(b, heads, dim, n).copy()
    for r in range(b):
        if f["write_index"][r] == 0:
            conv[r], ssm[r] = 0, 0
        window = np.concatenate([conv[r], g64["xbc"][r]])
        last = min(int(f["last_index"][r]), s - 1)
        for t in range(s):
            out = (window[t:t + taps] * g64["w"]).sum(0) + (g64["bias"] if bias else 0)
            out = out / (1 + np.exp(-out))
            x, bb, cc = out[:inner].reshape(heads, dim), out[inner:inner + groups * n], out[inner + groups * n:]
            for h in range(heads):
                g = h // per
                if t <= last or take_pads:
                    dt = np.logaddexp(0, g64["dt"][r, t, h] + g64["dt_bias"][h])
                    ssm[r, h] = ssm[r, h] * np.exp(dt * g64["A"][h]) + np.outer(x[h] * dt, bb[g * n:(g + 1) * n])
                y[r, t, h * dim:(h + 1) * dim] = ssm[r, h] @ cc[g * n:(g + 1) * n] + g64["D"][h] * x[h]
        end = s - 1 if take_pads else last
        conv[r] = window[end + 1:end + taps]
    return y, conv, ssm.reshape(f["ssm"].shape)


def run(feeds: dict, shape, bias: bool = True):
    model = op_model(*shape, bias=bias)
    return session(model).run(None, {k: v for k, v in feeds.items() if bias or k != "bias"})


CASES = [  # (batch, seq, write_index, last_index, groups)
    (1, 1, [5], [0], 2),               # a decode step
    (3, 1, [0, 7, 2], [0, -1, 0], 2),  # a row starting, a parked one, a generating one
    (2, 9, [0, 4], [8, 5], 1),         # prompt chunks, the second padded past its last token
    (2, 33, [0, 0], [32, 20], 4),      # prefill-sized, four groups
]


@pytest.mark.parametrize("b, s, write_index, last_index, groups", CASES)
@pytest.mark.parametrize("bias", [True, False])
def test_the_kernel_is_transformers_recurrent_form(b, s, write_index, last_index, groups, bias):
    feeds, shape = case(b, s, groups=groups, write_index=write_index, last_index=last_index, heads=8)
    want = reference(feeds, *shape, bias=bias)
    for got, ref in zip(run(feeds, shape, bias), want):
        np.testing.assert_allclose(got, ref, atol=2e-5, rtol=1e-5)


def test_wrong_variant_a_parked_row_taking_its_pad_misses():
    feeds, shape = case(3, 1, write_index=[0, 7, 2], last_index=[0, -1, 0])
    got = run(feeds, shape)
    wrong = reference(feeds, *shape, take_pads=True)
    assert np.abs(got[2] - wrong[2]).max() > 1e-2  # (the parked row's SSM state)


def test_states_bound_in_place_are_updated_in_place():
    """As the runtime binds them: present_state is the past_state buffer; the results are those of
    separate buffers, the first token's state read before it is written."""
    import onnxruntime as ort

    feeds, shape = case(2, 5, write_index=[0, 3], last_index=[4, 2])
    want = run(feeds, shape)
    sess = session(op_model(*shape))
    binding = sess.io_binding()
    conv, ssm = feeds["conv"].copy(), feeds["ssm"].copy()
    for name, value in feeds.items():
        binding.bind_cpu_input(name, {"conv": conv, "ssm": ssm}.get(name, value))
    binding.bind_output("y")
    binding.bind_ortvalue_output("conv_out", ort.OrtValue.ortvalue_from_numpy(conv))
    binding.bind_ortvalue_output("ssm_out", ort.OrtValue.ortvalue_from_numpy(ssm))
    sess.run_with_iobinding(binding)
    np.testing.assert_array_equal(binding.copy_outputs_to_cpu()[0], want[0])
    np.testing.assert_array_equal(conv, want[1])
    np.testing.assert_array_equal(ssm, want[2])


def portable_errors() -> list[float]:
    """Each case's largest error against the reference (run on the portable path by the next test)."""
    out = []
    for b, s, write_index, last_index, groups in CASES:
        feeds, shape = case(b, s, groups=groups, write_index=write_index, last_index=last_index, heads=8)
        out.append(max(float(np.abs(g - r).max()) for g, r in zip(run(feeds, shape), reference(feeds, *shape))))
    return out


@pytest.mark.parametrize("path", ["generic", "avx2"])
def test_every_code_path(path):
    assert max(on_portable_path("test_cpu_mamba", "portable_errors()", kernel=path)) < 1e-4


@pytest.mark.parametrize("change, words", [
    ({"conv": np.zeros((1, 2, 1), np.float32)}, "conv_state must be"),
    ({"ssm": np.zeros((1, 2, 2, 8, 15), np.float32)}, "ssm_state must be"),
    ({"A": np.zeros(3, np.float32)}, "A, dt_bias and D must be"),
    ({"last_index": np.zeros(2, np.int64)}, "write_index and last_index must be")])
def test_bad_shapes_are_named(change, words):
    feeds, shape = case(1, 2)
    with pytest.raises(Exception, match=words):
        run({**feeds, **change}, shape)
