"""trtllm.cpu::Sample (plugins/cpu/sample.cc) against the numpy reference, the sampler's one source.

As for the GPU kernel (test_sample_triton.py): token ids equal the reference's for the same uniforms,
logprobs within 1e-5, logprob ids equal but for rounding-level near-ties. Its AVX-512 and portable
paths give the same tokens. An engine on our kernels samples with it: its tokens are the
reference's draws from the logits the same step gives.
"""
from __future__ import annotations

import numpy as np
import pytest

from trtllm.plugins import cpu

pytestmark = pytest.mark.skipif(cpu.library() is None, reason="needs the native CPU kernel library")

from tests.plugins.cpu_ops import on_portable_path  # noqa: E402
from tests.plugins.cpu_sample_ops import run_kernel  # noqa: E402
from tests.plugins.sample_cases import tail_case  # noqa: E402
from tests.plugins.test_sample_triton import INTERPRET_CONFIGS, compare, random_case  # noqa: E402
from trtllm.plugins.sample import reference, schema  # noqa: E402

CONFIGS = INTERPRET_CONFIGS + [(49152, 1024)]  # V, M: small to the demo model's vocabulary


def cases(seed: int, per_config: int = 25):
    rng = np.random.default_rng(seed)
    for vocab_size, max_top_k in CONFIGS:
        for _ in range(per_config if vocab_size < 10000 else 4):
            yield random_case(rng, vocab_size, max_top_k, int(rng.integers(1, 9)))[0], max_top_k


def test_kernel_matches_reference_on_random_cases():
    rows, problems = 0, []
    for case, max_top_k in cases(7):
        want = reference.sample(*(case[name] for name in schema.INPUT_NAMES), max_top_k)
        problems += compare(run_kernel(case, max_top_k), want, case, max_top_k)
        rows += len(want[0])
    assert rows > 700 and not problems, problems[:5]


def test_the_comparison_catches_a_sampler_without_penalties():
    """The deliberately wrong variant: the reference with its penalty stage left out disagrees with
    the kernel on the same cases, so the comparison above can see such a bug."""
    differ = 0
    for case, max_top_k in cases(8, per_config=6):
        wrong = {**case, "penalty_bias": np.zeros_like(case["penalty_bias"]),
                 "repetition_penalty": np.ones_like(case["repetition_penalty"])}
        want = reference.sample(*(wrong[name] for name in schema.INPUT_NAMES), max_top_k)
        differ += not np.array_equal(run_kernel(case, max_top_k)[0], want[0])
    assert differ >= 10


def portable_outputs(seed: int) -> list:
    return [[o.tolist() for o in run_kernel(case, m)] for case, m in cases(seed, per_config=5)]


@pytest.mark.parametrize("kernel", ["generic", "avx2"])
def test_portable_and_avx2_paths_give_the_same_tokens(kernel):
    """The portable loops (a CPU other than x86) and the AVX2 ones (x86 without AVX-512): the same
    tokens and logprob ids, logprobs within 1e-6 (the log-softmax's sum is the one vectorised exp)."""
    fast = portable_outputs(9)
    portable = on_portable_path("test_cpu_sample", "portable_outputs(9)", kernel=kernel)
    for (tokens, logprobs, ids), (p_tokens, p_logprobs, p_ids) in zip(fast, portable):
        assert tokens == p_tokens and ids == p_ids
        np.testing.assert_allclose(p_logprobs, logprobs, atol=1e-6, rtol=0)


def test_the_least_likely_tokens_are_drawn():
    """The op (and the host's draw of one row) sums the CDF in float64, as the reference: tokens a
    float32 running sum cannot hold are drawn where the exact CDF puts them (sample_cases.tail_case)."""
    from trtllm.runtime import sampling

    case, want = tail_case()
    assert np.array_equal(run_kernel(case, 64)[0], want)
    batch = sampling.SamplingBatch(**{name: np.ascontiguousarray(case[name]) for name in (
        "logit_bias", "penalty_bias", "seen", "repetition_penalty", "temperature", "min_p", "top_k", "top_p")},
        uniform=case["uniform"], version=np.zeros(len(want), np.int64), num_logprobs=1)
    got = [sampling.host_draw(case["logits"][b], batch, b, case["uniform"][b], 64) for b in range(len(want))]
    assert got == want.tolist()


def test_a_row_of_nan_logits_fails_alone():
    """Token -1 and NaN logprobs for the bad row (the runtime fails that request alone); its
    neighbours sample."""
    rng = np.random.default_rng(3)
    case, _ = random_case(rng, 300, 64, 3)
    case["logits"][1, 5] = np.nan
    tokens, logprobs, _ = run_kernel(case, 64)
    assert tokens[1] == -1 and np.isnan(logprobs[1]).all() and np.isfinite(logprobs[[0, 2], 0]).all()
    ok = {name: case[name][[0, 2]] for name in schema.INPUT_NAMES}
    want = reference.sample(*(ok[name] for name in schema.INPUT_NAMES), 64)
    assert tokens[[0, 2]].tolist() == want[0].tolist()


def test_top_k_beyond_max_top_k_is_refused():
    case, _ = random_case(np.random.default_rng(4), 300, 64, 2)
    case["top_k"][1] = 65
    with pytest.raises(Exception, match=r"top_k must be in \[0, max_top_k=64\], got 65 in row 1"):
        run_kernel(case, 64)


def test_a_logit_bias_of_the_wrong_rank_is_refused_by_name():
    """A model that declares no shapes (ONNX Runtime then checks none): a scalar logit_bias gets the
    op's message, not the C++ library's range error."""
    from onnx import helper

    from tests.plugins.cpu_ops import one_node_model, session
    from tests.plugins.cpu_sample_ops import TYPES

    inputs = [helper.make_tensor_value_info(name, TYPES[dtype], None) for name, dtype, _ in schema.INPUTS]
    outputs = [helper.make_tensor_value_info(name, TYPES[dtype], None) for name, dtype, _ in schema.OUTPUTS]
    node = helper.make_node(cpu.SAMPLE, list(schema.INPUT_NAMES), list(schema.OUTPUT_NAMES), domain=cpu.DOMAIN,
                            max_top_k=64)
    case, _ = random_case(np.random.default_rng(4), 300, 64, 2)
    feeds = {name: np.asarray(case[name]) for name in schema.INPUT_NAMES}
    feeds["logit_bias"] = np.array(0.0, np.float32)
    with pytest.raises(Exception, match=r"logit_bias \(input 1\) must be \[B, V\]"):
        session(one_node_model(node, inputs, outputs)).run(None, feeds)


def test_parameter_rows_serve_several_logits_rows_without_logprobs():
    """EAGLE verification's form: N = B x R logits rows for B rows of parameters (uniform [N]), the
    token output alone: each logits row gets the reference's token with its parameter row."""
    from onnx import helper

    from tests.plugins.cpu_ops import one_node_model, session
    from tests.plugins.cpu_sample_ops import TYPES

    rng = np.random.default_rng(12)
    case, _ = random_case(rng, 300, 64, 3)
    repeat = 4
    logits = rng.normal(size=(3 * repeat, 300)).astype(np.float32) * 2
    uniform = rng.random(3 * repeat, dtype=np.float32)
    inputs = [helper.make_tensor_value_info(name, TYPES[dtype], None) for name, dtype, _ in schema.INPUTS]
    node = helper.make_node(cpu.SAMPLE, list(schema.INPUT_NAMES), ["token_ids"], domain=cpu.DOMAIN, max_top_k=64)
    out = helper.make_tensor_value_info("token_ids", TYPES["int64"], None)
    got = session(one_node_model(node, inputs, [out])).run(None, {**case, "logits": logits, "uniform": uniform})[0]
    tiled = {name: np.repeat(case[name], repeat, axis=0) for name in schema.INPUT_NAMES}
    want = reference.sample(*({**tiled, "logits": logits, "uniform": uniform}[name] for name in schema.INPUT_NAMES), 64)
    assert got.tolist() == want[0].tolist()


def test_a_row_with_every_token_banned_fails_alone_and_an_out_of_range_min_p_stays_in_bounds():
    rng = np.random.default_rng(13)
    case, _ = random_case(rng, 300, 64, 3)
    case["logit_bias"][1] = -np.inf
    case["logit_bias"][1, 7] = 0.0
    case["penalty_bias"][1, 7] = -np.inf
    tokens, logprobs, _ = run_kernel(case, 64)
    assert tokens[1] == -1 and np.isnan(logprobs[1]).all() and np.isfinite(logprobs[[0, 2], 0]).all()
    case, _ = random_case(rng, 300, 64, 2)
    case["min_p"][:], case["temperature"][:] = [1.0, 1.5], 1.0  # 1.5: the top token, as min_p 1 keeps
    tokens = run_kernel(case, 64)[0]
    case["min_p"][1] = 1.0
    assert tokens.tolist() == reference.sample(*(case[name] for name in schema.INPUT_NAMES), 64)[0].tolist()


def test_the_host_draws_a_rows_token_as_the_op_does():
    """trtllm_cpu_sample_row (runtime/sampling.host_draw: speculation's walked positions) runs the op's own
    code on one row: the op's token for every row of the random cases, ties and boundaries included;
    a row of NaN logits gives -1 there too, and arguments out of range -2."""
    from trtllm.runtime import sampling

    f, rows = cpu.row_sampler(), 0
    for case, max_top_k in cases(11, per_config=8):
        want = run_kernel(case, max_top_k)[0]
        batch = sampling.SamplingBatch(**{name: np.ascontiguousarray(case[name]) for name in (
            "logit_bias", "penalty_bias", "seen", "repetition_penalty", "temperature", "min_p", "top_k", "top_p")},
            uniform=case["uniform"], version=np.zeros(len(want), np.int64), num_logprobs=1)
        got = [sampling.host_draw(case["logits"][b], batch, b, case["uniform"][b], max_top_k) for b in range(len(want))]
        assert got == want.tolist()
        rows += len(want)
    assert rows > 200
    nan = np.full(8, np.nan, np.float32)
    zeros, seen = np.zeros(8, np.float32), np.zeros(8, np.bool_)
    pointers = [a.ctypes.data for a in (nan, zeros, zeros, seen)]
    assert f(*pointers, 1.0, 1.0, 0.0, 0, 1.0, 0.5, 8, 4) == -1
    assert f(*pointers, 1.0, 1.0, 0.0, 5, 1.0, 0.5, 8, 4) == -2  # top_k past max_top_k


def test_greedy_on_the_host_is_the_ops_greedy_token_native_or_numpy():
    """sampling.greedy (speculation's walked greedy positions): the op's token at temperature 0 for
    every row of the random cases (ties, bans, penalties, a row of equal logits; each row has a
    token nothing bans), through the native code and through numpy's (the standard-op sampler's
    engines) alike."""
    from trtllm.runtime import sampling

    cases_seen = 0
    for case, max_top_k in cases(12, per_config=6):
        case = {**case, "temperature": np.zeros_like(case["temperature"])}
        want = run_kernel(case, max_top_k)[0].tolist()
        batch = sampling.SamplingBatch(**{name: np.ascontiguousarray(case[name]) for name in (
            "logit_bias", "penalty_bias", "seen", "repetition_penalty", "temperature", "min_p", "top_k", "top_p")},
            uniform=case["uniform"], version=np.zeros(len(want), np.int64), num_logprobs=1)
        for native in (True, False):
            assert [sampling.greedy(case["logits"][b], batch, b, native) for b in range(len(want))] == want
        cases_seen += 1
    assert cases_seen > 20
