"""trtllm::Sample's Triton kernel against the numpy reference: interpreted on CPU, and on a CUDA GPU.

Token ids must equal the reference's for the same uniforms (on a GPU, which sums in another order,
a token may instead be the exact draw near a CDF boundary: see compare), logprobs within 1e-5, and
logprob ids exactly, except that two ids may swap where their logits differ by a rounding-level
amount (never for an exact tie: ties go lower id first). On a failure each problem names the
row, and for a token says how far the uniform sat from a CDF boundary.

Triton's interpreter must be chosen before triton is first imported (triton.language's own
jit helpers are decorated then), and other tests may import triton first; so the interpreted
run happens in a subprocess: this file run as a script with TRITON_INTERPRET=1.
`scripts/gpu_kernel_check.py` reuses random_case, compare and run_cases.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from trtllm.plugins.sample import reference, schema

ARGS = schema.INPUT_NAMES
KEPT_ARGS = tuple(name for name in ARGS if name != "uniform")
# (V, M): V below, at and above the block sizes used, M < V and M == V.
INTERPRET_CONFIGS = [(7, 7), (300, 300), (300, 16), (1000, 64), (1025, 1024), (2000, 1024), (2000, 2000)]
INTERPRET_BLOCK = 512        # small blocks: several per row, so the carries across blocks are exercised
GPU_CONFIGS = [(1000, 1000), (4099, 1024), (49152, 1024)]
DRAW_TOL = 2e-6              # see compare: float32 sums of the kernel's order, and the GPU's approximate exp


def near_allowed(num_rows: int) -> int:
    """How many of a check's rows may be `near` (compare): 2%, at least one. A CDF biased by less
    than DRAW_TOL would pass row by row; its near rows would pile up past this."""
    return max(1, num_rows // 50)


def random_case(rng, vocab_size: int, max_top_k: int, num_rows: int) -> tuple[dict, int]:
    """Inputs covering every feature, and a num_logprobs in [1, min(50, M)]."""
    shape = (num_rows, vocab_size)
    rows = np.arange(num_rows)
    logits = rng.normal(size=shape) * rng.choice([0.1, 0.5, 2.0, 8.0], (num_rows, 1))   # flat to peaked
    if rng.random() < 0.3:
        logits = np.round(logits * 2) / 2                                # many exact ties
    logits[rng.random(num_rows) < 0.1] = 1.0                            # a row of equal logits
    bias_scale = rng.choice([0.0, 0.0, 3.0, 100.0], (num_rows, 1))    # 100: a few tokens dominate
    bias = np.where(rng.random(shape) < 0.1, rng.uniform(-1, 1, shape) * bias_scale, 0.0)
    bias[rng.random(shape) < rng.choice([0.0, 0.05, 0.5, 0.99], (num_rows, 1))] = -np.inf   # bans (0.99: a grammar)
    on = rng.random(num_rows) < 0.7                                     # rows with penalties
    seen = (rng.random(shape) < rng.choice([0.05, 0.3], (num_rows, 1))) & on[:, None]
    counts = rng.poisson(0.5, shape) * seen
    frequency, presence = rng.choice([0.0, 0.5, 2.0], (2, num_rows, 1))
    penalty_bias = -(frequency * counts + presence * (counts > 0))
    penalty_bias[(rng.random(shape) < rng.choice([0.0, 0.05, 0.5], (num_rows, 1))) & on[:, None]] = -np.inf
    allowed = rng.integers(0, vocab_size, num_rows)                     # one token nothing bans
    bias[rows, allowed] = 0.0
    penalty_bias[rows, allowed] = 0.0
    uniform = rng.random(num_rows, dtype=np.float32)
    uniform[rng.random(num_rows) < 0.1] = np.nextafter(np.float32(1), np.float32(0))
    case = {
        "logits": logits.astype(np.float32), "logit_bias": bias.astype(np.float32),
        "penalty_bias": penalty_bias.astype(np.float32), "seen": seen,
        "repetition_penalty": np.where(on, rng.choice([1.0, 0.8, 1.3, 2.0], num_rows), 1.0).astype(np.float32),
        "temperature": rng.choice([0.0, 0.5, 1.0, 2.0], num_rows).astype(np.float32),
        "min_p": rng.choice([0.0, 0.0, 0.05, 0.3, 1.0], num_rows).astype(np.float32),
        "top_k": rng.choice([k for k in (0, 0, 1, 5, max_top_k) if k <= max_top_k], num_rows).astype(np.int64),
        "top_p": rng.choice([0.3, 0.9, 1.0], num_rows).astype(np.float32), "uniform": uniform}
    return case, int(rng.integers(1, min(schema.MAX_NUM_LOGPROBS, max_top_k) + 1))


def compare(got, want, case: dict, max_top_k: int, near: list | None = None) -> list[str]:
    """Problems (empty when the kernel's outputs agree with the reference's).

    With `near` (a list), a token that differs from the reference's but is the exact draw (float64
    CDF) for a uniform within DRAW_TOL of the row's is no problem: it is appended to `near`
    instead. The reference's CDF is a sequential float32 sum, off from the exact one by up to 2e-4
    over 46,000 kept tokens, so where the uniform sits that close to a boundary a kernel summing
    in another order (a GPU's blocks and trees) can be right where the reference is not. Without
    `near` every token must equal the reference's (the CPU paths sum in its order).
    """
    for name, g, w in zip(schema.OUTPUT_NAMES, got, want):
        if g.shape != w.shape or g.dtype != w.dtype:
            return [f"{name}: shape/dtype {g.shape} {g.dtype}, want {w.shape} {w.dtype}"]
    (tokens, logprobs, ids), (want_tokens, want_logprobs, want_ids) = got, want
    problems = []
    for row in np.flatnonzero(tokens != want_tokens):
        message = f"token_ids[{row}] = {tokens[row]}, want {want_tokens[row]}{_boundary(case, row, max_top_k)}"
        if near is not None and _exact_draw_near(case, row, max_top_k, tokens[row]):
            near.append(message)
        else:
            problems.append(message)
    with np.errstate(invalid="ignore"):                                 # -inf - -inf
        err = np.where(logprobs == want_logprobs, 0.0, np.abs(logprobs.astype(np.float64) - want_logprobs))
    bad = np.argwhere(~(err <= 1e-5))                                   # NaN and inf count as bad
    if len(bad):
        problems.append(f"top_logprobs: {len(bad)} bad, first at {bad[:5].tolist()}, max abs err {err.max():.3g}")
    x = case["logits"] + case["logit_bias"]
    for row, pos in np.argwhere(ids != want_ids):
        a, b = x[row, ids[row, pos]], x[row, want_ids[row, pos]]
        if a == b or not abs(a - b) <= 1e-5 * (1 + abs(b)):             # only rounding-level near-ties
            problems.append(f"top_logprob_ids[{row}, {pos}] = {ids[row, pos]}, want {want_ids[row, pos]} "
                            f"(x {a!r} vs {b!r})")
    return problems


def _exact_draw_near(case, row, max_top_k, token) -> bool:
    """Whether `token` is the float64-exact draw of the row for some uniform within DRAW_TOL of its own."""
    probs = reference.kept_probs(*(case[name][row:row + 1] for name in KEPT_ARGS), max_top_k=max_top_k)[0]
    cdf = np.cumsum(probs.astype(np.float64))
    cdf /= cdf[-1]
    below = cdf[token - 1] if token > 0 else 0.0                        # the CDF just before the token
    u = float(case["uniform"][row])
    return bool(probs[token] > 0 and below <= u + DRAW_TOL and cdf[token] > u - DRAW_TOL)


def _boundary(case, row, max_top_k):
    """How far the row's uniform sits from the nearest boundary of the reference's CDF."""
    probs = reference.kept_probs(*(case[name][row:row + 1] for name in KEPT_ARGS), max_top_k=max_top_k)[0]
    gap = np.min(np.abs(np.cumsum(probs.astype(np.float64)) - case["uniform"][row]))
    return f" (uniform {case['uniform'][row]!r} is {gap:.2g} from a CDF boundary)"


def run_cases(kernel, configs, seed: int, num_cases: int, device: str, ties_last: bool = False,
              coverage: dict | None = None, near: list | None = None):
    """(rows compared, problems) over num_cases random cases of 1-8 rows per (V, M) config.

    `coverage`, when given, counts the rows that exercise each feature (see _count_features);
    `near` is compare's."""
    import torch

    rng = np.random.default_rng(seed)
    num_rows, problems = 0, []
    for vocab_size, max_top_k in configs:
        for i in range(num_cases):
            case, _ = random_case(rng, vocab_size, max_top_k, int(rng.integers(1, 9)))
            num_logprobs = schema.num_logprob_columns(max_top_k)   # the op's static width
            want = reference.sample(*(case[name] for name in ARGS), max_top_k)
            # every other case gives seen as int32 0/1, as the TensorRT plugin gets it (schema.PLUGIN_SEEN)
            given = {**case, "seen": case["seen"].astype(np.int32)} if i % 2 else case
            got = kernel.sample(*(torch.as_tensor(given[name], device=device) for name in ARGS), max_top_k,
                                ties_last=ties_last)
            got = [g.cpu().numpy() for g in got]
            problems += [f"V={vocab_size} M={max_top_k} K={num_logprobs} case {i}: {p}"
                         for p in compare(got, want, case, max_top_k, near)]
            num_rows += len(want[0])
            if coverage is not None:
                _count_features(coverage, case, want, max_top_k, num_logprobs)
    return num_rows, problems


def _count_features(counts: dict, case: dict, want, max_top_k: int, num_logprobs: int) -> None:
    """Add the rows of this case that exercise each feature (the test requires every count > 0)."""
    t, x = case["temperature"], case["logits"] + case["logit_bias"]
    sampling = t > 0
    top_x = -np.sort(-x, axis=1)[:, :num_logprobs + 1]
    features = {
        "greedy": t == 0, "sampling": sampling, "top_k": sampling & (case["top_k"] > 0),
        "top_p": sampling & (case["top_p"] < 1), "min_p": sampling & (case["min_p"] > 0),
        "unrestricted": sampling & (case["top_k"] == 0) & (case["top_p"] == 1) & (case["min_p"] == 0),
        "banned": np.isneginf(case["logit_bias"]).any(1) | np.isneginf(case["penalty_bias"]).any(1),
        "penalised": case["seen"].any(1) & (case["repetition_penalty"] != 1),
        "tied_logprobs": (np.diff(top_x, axis=1) == 0).any(1),
        "token_past_first_block": sampling & (want[0] >= INTERPRET_BLOCK),
        "m_below_v": np.full(len(t), max_top_k < x.shape[1]), "m_equals_v": np.full(len(t), max_top_k == x.shape[1]),
        "k_above_10": np.full(len(t), num_logprobs > 10),
    }
    for name, rows in features.items():
        counts[name] = counts.get(name, 0) + int(np.sum(rows))


@pytest.fixture(scope="module")
def interpreted():
    """The worker's JSON: the kernel and its wrong variant on INTERPRET_CONFIGS, interpreted on CPU."""
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    proc = subprocess.run([sys.executable, __file__], env={**os.environ, "TRITON_INTERPRET": "1"},
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_interpreted_kernel_matches_reference(interpreted):
    result = interpreted["exact"]
    assert result["num_rows"] > 150 and all(result["coverage"].values()), result["coverage"]
    assert not result["problems"], f"{len(result['problems'])} problems:\n" + "\n".join(result["problems"][:20])


def test_the_draw_takes_no_token_past_the_last_kept_one(interpreted):
    assert interpreted["past_kept"] == {"token": 63, "want": 63}


def test_the_least_likely_tokens_are_drawn(interpreted):
    """The CDF in float64, as the reference's: tokens a float32 running sum cannot hold are drawn
    where the exact CDF puts them (sample_cases.tail_case; test_sample.py has its wrong variant)."""
    assert interpreted["tail"]["got"] == interpreted["tail"]["want"]


def test_wrong_variant_fails(interpreted):
    """Greedy takes the last maximum and tied logprobs go higher id first: the comparison must see it."""
    problems = interpreted["ties_last"]["problems"]
    assert any("token_ids" in p for p in problems) and any("top_logprob_ids" in p for p in problems), problems


@pytest.mark.gpu
def test_gpu_kernel_matches_reference():
    torch = pytest.importorskip("torch")
    pytest.importorskip("triton")
    if not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("needs a CUDA device (and TRITON_INTERPRET unset)")
    from trtllm.plugins.sample import triton_kernel

    near = []
    num_rows, problems = run_cases(triton_kernel, GPU_CONFIGS, seed=2, num_cases=12, device="cuda", near=near)
    assert num_rows > 100
    assert not problems, f"{len(problems)} problems:\n" + "\n".join(problems[:20])
    assert len(near) <= near_allowed(num_rows), near
    from tests.plugins.sample_cases import tail_case

    case, want = tail_case()
    got = triton_kernel.sample(*(torch.as_tensor(case[name], device="cuda") for name in ARGS), 64)[0]
    assert got.cpu().tolist() == want.tolist()  # the CDF in float64 on the device too


def test_compare_takes_only_the_exact_draw_near_a_boundary():
    """A token off the reference's is no problem only where it is the exact (float64) draw for some
    uniform within DRAW_TOL of the row's: either side of a boundary that close, or (the H200's rows)
    the exact draw at the uniform itself, however far the boundary the reference's sum got wrong."""
    from tests.plugins.sample_cases import kept_of, make_case

    def problems(token, uniform, near):
        case = make_case(np.log([[0.5, 0.3, 0.2]]), 1.0, 0, 1.0, uniform)
        want = reference.sample(*(case[name] for name in ARGS), 3)
        assert want[0][0] == (uniform > boundary)                       # the reference's draw is right here
        return compare((np.array([token]), *want[1:]), want, case, 3, near)

    probs = kept_of(make_case(np.log([[0.5, 0.3, 0.2]]), 1.0, 0, 1.0, 0.5), 3)[0].astype(np.float64)
    boundary = probs[0] / probs.sum()                                   # between tokens 0 and 1
    near = []
    assert not problems(0, boundary + 1e-6, near) and len(near) == 1    # the reference says 1
    assert not problems(1, boundary - 1e-6, near) and len(near) == 2    # the reference says 0
    assert problems(0, boundary + 1e-6, None)                           # without near: exact
    assert problems(0, boundary + 3e-4, []) and problems(2, boundary + 1e-6, [])   # far, or not a neighbour
    # the rule's reason: a reference off by its float32 sum (here forged: token 0 where the uniform sits
    # 1e-5 past the boundary) and a kernel giving the exact draw, 1, far beyond DRAW_TOL of the boundary
    case = make_case(np.log([[0.5, 0.3, 0.2]]), 1.0, 0, 1.0, boundary + 1e-5)
    forged = reference.sample(*(case[name] for name in ARGS), 3)
    forged = (np.array([0]), *forged[1:])
    near = []
    assert not compare((np.array([1]), *forged[1:]), forged, case, 3, near) and len(near) == 1
    assert compare((np.array([2]), *forged[1:]), forged, case, 3, [])


def speed_up_interpreter() -> None:
    """Give the interpreter a numpy xor reduction (tl.sort's compare-and-swap uses one).

    Its generic reduction calls the combine function once per element in Python: about 90% of
    an interpreted run. Same results; the compiled kernel is unaffected.
    """
    import triton.language as tl
    from triton.runtime import interpreter

    generic = interpreter.ReduceOps.apply_impl

    def apply_impl(self, input):
        if self.combine_fn is tl.standard._xor_combine and self.axis is not None:
            data = input[0].handle.data
            return self.to_tensor(np.bitwise_xor.reduce(data, axis=self.axis, keepdims=self.keep_dims),
                                  input[0].dtype)
        return generic(self, input)

    interpreter.ReduceOps.apply_impl = apply_impl


def _interpreter_worker() -> None:
    """Run under TRITON_INTERPRET=1: print one JSON line with both runs' results."""
    assert os.environ.get("TRITON_INTERPRET") == "1", "set TRITON_INTERPRET=1"
    import torch

    from trtllm.plugins.sample import triton_kernel

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    from tests.plugins.sample_cases import tail_case

    speed_up_interpreter()
    triton_kernel.BLOCK = INTERPRET_BLOCK
    result = {}
    for name, wrong, num_cases in (("exact", False, 6), ("ties_last", True, 2)):
        start = time.perf_counter()
        coverage = {}
        num_rows, problems = run_cases(triton_kernel, INTERPRET_CONFIGS, seed=1, num_cases=num_cases, device="cpu",
                                       ties_last=wrong, coverage=coverage)
        result[name] = {"num_rows": num_rows, "problems": problems, "coverage": coverage,
                        "seconds": time.perf_counter() - start}
    result["past_kept"] = _scan_past_kept(triton_kernel)
    case, want = tail_case()
    result["tail"] = {"got": triton_kernel.sample(*(torch.as_tensor(case[name]) for name in ARGS), 64)[0].tolist(),
                      "want": want.tolist()}
    print(json.dumps(result))


def _scan_past_kept(triton_kernel) -> dict:
    """A block of kept tokens whose scan (tl.cumsum: in order, here) ends below its sum (tl.sum:
    pairwise, here) by an ulp, then a block of banned ones, and the uniform one float below 1: the
    running sum passes the target only after the last kept token (the kernel drew token 64 there)."""
    import torch

    block, rng, one = 64, np.random.default_rng(0), np.nextafter(np.float32(1), np.float32(0))
    while True:  # (a few tries)
        logits = (rng.normal(size=block) * 3).astype(np.float32)
        w = np.exp(logits - logits.max())
        if np.cumsum(w, dtype=np.float32)[-1] < one * w.sum(dtype=np.float32):
            break
    f32, shape = np.float32, (1, 2 * block)
    case = {"logits": np.concatenate([logits, np.zeros(block, f32)])[None],
            "logit_bias": np.concatenate([np.zeros(block, f32), np.full(block, -np.inf, f32)])[None],
            "penalty_bias": np.zeros(shape, f32), "seen": np.zeros(shape, bool), "repetition_penalty": np.ones(1, f32),
            "temperature": np.ones(1, f32), "min_p": np.zeros(1, f32), "top_k": np.zeros(1, np.int64),
            "top_p": np.ones(1, f32), "uniform": np.full(1, one)}
    default, triton_kernel.BLOCK = triton_kernel.BLOCK, block
    try:
        got = triton_kernel.sample(*(torch.as_tensor(case[name]) for name in ARGS), 2 * block)[0].tolist()
    finally:
        triton_kernel.BLOCK = default
    return {"token": got[0], "want": int(reference.sample(*(case[name] for name in ARGS), 2 * block)[0][0])}


if __name__ == "__main__":
    _interpreter_worker()
