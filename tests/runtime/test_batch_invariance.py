"""A prompt's logits do not depend on its batch or on a restored prefix, bit for bit, on the CPU
engines (float32, int4 on our kernels, float16 on our kernels, an int8 KV cache): each kernel computes a prompt's rows
the same way whatever else shares the step (the graph's `generated` input tells our MatMul kernels
a prompt step from a generated one; plugins/cpu)."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")

from trtllm.builder.config import BuildConfig  # noqa: E402
from trtllm.builder.export import build  # noqa: E402
from trtllm.runtime import sampling  # noqa: E402
from trtllm.runtime.engine import load_engine  # noqa: E402
from trtllm.runtime.generate import RowState, prefill_inputs  # noqa: E402
from trtllm.runtime.kv_cache import KVCacheManager  # noqa: E402

from tests.plugins.cpu_ops import portable_only  # noqa: E402

pytestmark = pytest.mark.hf
CAPACITY = 128
PROMPT = [(7 * i + 3) % 50 + 1 for i in range(24)]
OTHERS = [[(5 * i + 1) % 40 + 2 for i in range(40)], [9, 4, 11]]
KINDS = {"float32": {}, "int4": {"quantization": "int4"}, "float16": {"dtype": "float16"},
         "kv-int8": {"kv_cache_dtype": "int8"}}


@pytest.fixture(scope="module")
def engines(tiny_checkpoint, tmp_path_factory):
    """kind -> a loaded tiny engine: float32, int4 (our kernels, float32 activations), float16, and
    float32 with an int8 KV cache (a prompt's own keys are read back from it as its later steps read them)."""
    loaded = {}
    for kind in KINDS:
        options = KINDS[kind]
        out = tmp_path_factory.mktemp(f"invariance-{kind}") / "engine"
        build(BuildConfig(model=str(tiny_checkpoint("llama")), output=str(out), max_input_len=64,
                          max_kv_cache_capacity=CAPACITY, verify=False, **options), log=lambda m: None)
        loaded[kind] = load_engine(out, huge_pages=False)
    yield loaded
    for e in loaded.values():
        e.close()


@pytest.fixture(params=list(KINDS))
def engine(request, engines):
    return engines[request.param]


def prefill(engine, prompts, kv=None, reused=()):
    """The first-token logits [B, V] of a prefill of `prompts` (row b's first reused[b] positions
    already in `kv`)."""
    m = engine.manifest
    rows = [RowState(prompt_ids=p, params=sampling.SamplingParams(temperature=0), rng=np.random.default_rng(0),
                     eos_ids=frozenset()) for p in prompts]
    for r, n in zip(rows, reused):
        r.num_reused = r.computed = n
    kv = kv or KVCacheManager(m.model, len(rows), CAPACITY)
    batch = sampling.make_batch([r.params for r in rows], m.model.vocab_size, m.max_top_k)
    # (a copy: the engine's logits are valid until its next step)
    return engine.step(prefill_inputs(rows, m.pad_token_id, batch), kv.view(0, len(rows)), want_logits=True).logits.copy()


def test_a_prompt_in_a_batch_is_the_prompt_alone(engine):
    alone = prefill(engine, [PROMPT])[0]
    for batch in ([PROMPT, *OTHERS], [*OTHERS, PROMPT]):
        together = prefill(engine, batch)
        assert np.array_equal(together[batch.index(PROMPT)], alone)


@pytest.mark.parametrize("split", [23, 12])  # the rest: 1 token (a short step), 12 tokens
def test_a_restored_prefix_gives_the_same_logits(engine, split):
    alone = prefill(engine, [PROMPT])[0]
    kv = KVCacheManager(engine.manifest.model, 1, CAPACITY)
    prefill(engine, [PROMPT[:split]], kv)  # what a saved system prompt's KV holds
    assert np.array_equal(prefill(engine, [PROMPT], kv, reused=[split])[0], alone)


def test_wrong_variant_prompt_steps_called_generated(tiny_checkpoint, tmp_path, monkeypatch):
    """The runtime telling the kernels every step is generated: an int4 prompt of <= 16 rows then
    takes the decode path, and a restored prefix changes the logits."""
    from trtllm.runtime.backends import onnxruntime as ort_backend

    monkeypatch.setattr(ort_backend, "PROMPT", ort_backend.GENERATED)
    build(BuildConfig(model=str(tiny_checkpoint("llama")), output=str(tmp_path / "e"), max_input_len=64,
                      max_kv_cache_capacity=CAPACITY, verify=False, quantization="int4"), log=lambda m: None)
    engine = load_engine(tmp_path / "e", huge_pages=False)
    try:
        alone = prefill(engine, [PROMPT])[0]
        kv = KVCacheManager(engine.manifest.model, 1, CAPACITY)
        prefill(engine, [PROMPT[:12]], kv)
        # (where the decode and prefill paths are AVX-512's or AVX2's: the portable code has one for both)
        assert np.array_equal(prefill(engine, [PROMPT], kv, reused=[12])[0], alone) == portable_only()
    finally:
        engine.close()


@pytest.mark.parametrize("kind", ["float32", "float16", "kv-int8"])
def test_a_decode_step_in_a_batch_is_the_step_alone(engines, kind):
    """Generated rows too, on float32 and float16 engines (and int16/int8-activation ones:
    tests/builder/test_quantized.py). int4 and int8 with float32 activations are the exception: their
    decode kernels specialise by row count (one or two rows take x split), so only their prompts are
    exact (docs/input_format.md says so)."""
    assert_decode_step_alone(engines[kind])


def assert_decode_step_alone(engine, prompts=(PROMPT, *OTHERS)) -> None:
    """Row 0's logits of a decode step of every row equal those of a step of row 0 alone."""
    from trtllm.runtime.engine import StepInputs

    m = engine.manifest
    kv = KVCacheManager(m.model, len(prompts), CAPACITY)
    prefill(engine, list(prompts), kv)
    params = [sampling.SamplingParams(temperature=0)] * len(prompts)

    def decode(n):  # one generated token for the first n rows, each at the position after its prompt
        pos = np.array([len(p) for p in prompts[:n]], np.int64)
        step = StepInputs(input_ids=np.full((n, 1), 5, np.int64), position_ids=pos[:, None], write_index=pos,
                          last_index=np.zeros(n, np.int64),
                          sampling=sampling.make_batch(params[:n], m.model.vocab_size, m.max_top_k))
        return engine.step(step, kv.view(0, n), want_logits=True).logits[0].copy()

    together, alone = decode(len(prompts)), decode(1)  # the same KV writes both times: position len(prompt)
    assert np.array_equal(together, alone)


@pytest.mark.parametrize("options", [{}, {"quantization": "int4", "activations": "int16"}],
                         ids=["float32", "int4-a16"])
def test_a_mixture_of_experts_is_batch_invariant_too(options, tiny_checkpoint, tmp_path):
    """Its experts on our MoE kernel see other rows routed with them: a prompt, and on float32 and
    integer-activation engines a generated row, is still computed the same alone and in a batch
    (8 rows, 4 experts, 2 a token: several rows share an expert)."""
    build(BuildConfig(model=str(tiny_checkpoint("qwen3_moe")), output=str(tmp_path / "e"), max_input_len=64,
                      max_kv_cache_capacity=CAPACITY, verify=False, **options), log=lambda m: None)
    engine = load_engine(tmp_path / "e", huge_pages=False)
    try:
        assert any("MoE" in name for name in engine.manifest.lowerings)
        prompts = [PROMPT, *OTHERS, *[[(3 * i + j) % 45 + 2 for i in range(5 + 3 * j)] for j in range(5)]]
        alone = prefill(engine, [PROMPT])[0]
        assert np.array_equal(prefill(engine, prompts)[0], alone)
        assert_decode_step_alone(engine, prompts)
    finally:
        engine.close()


def test_prompt_path_bench_runs(engines):
    """scripts/bench_prompt_path.py on the tiny int4 engine: both paths measured."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "scripts" / "bench_prompt_path.py"
    spec = importlib.util.spec_from_file_location("bench_prompt_path", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    rows = bench.main([str(engines["int4"].engine_dir), "--tokens", "1,3", "--repeats", "2"])
    assert [r["tokens"] for r in rows] == [1, 3]
    assert all(r["prefill_path_ms"] > 0 and r["decode_path_ms"] > 0 for r in rows)


def test_a_restored_prefix_is_exact_on_onnxruntime_attention(tiny_checkpoint, tmp_path):
    """ONNX Runtime's GroupQueryAttention (--cpu-kernels onnxruntime) rounds a one-token step as a
    decode step: a saved prefix that left one prompt token changed the first logits (3e-6 here, a
    flipped near-tie on real prompts). The scheduler leaves two."""
    from trtllm.runtime.generate import run_rows
    from trtllm.runtime.prefix_cache import PrefixStore

    build(BuildConfig(model=str(tiny_checkpoint("llama")), output=str(tmp_path / "e"), max_input_len=64,
                      max_kv_cache_capacity=CAPACITY, verify=False, cpu_kernels="onnxruntime"), log=lambda m: None)
    engine, store = load_engine(tmp_path / "e", huge_pages=False), PrefixStore(tmp_path / "kv", "engine")
    assert not any(name.startswith("trtllm.cpu") for name in engine.manifest.lowerings)

    def first_step(save: bool):
        row = RowState(prompt_ids=list(PROMPT), params=sampling.SamplingParams(temperature=0, max_new_tokens=1,
                                                                                num_logprobs=8),
                       rng=np.random.default_rng(0), eos_ids=frozenset(), prefix_ids=tuple(PROMPT[:-1]),
                       save_prefix=save)
        run_rows(engine, [row], 1, prefixes=store)
        return row.num_reused, row.logprobs[0]

    try:
        (fresh, uncached), (reused, restored) = first_step(True), first_step(False)
    finally:
        engine.close()
    assert fresh == 0 and reused == len(PROMPT) - 2
    assert np.array_equal(uncached[0], restored[0]) and np.array_equal(uncached[1], restored[1])


def chunked_vs_whole(engine, chunk: int = 16) -> None:
    """C, a 40-token prompt sampled with a seed and logprobs, takes slot 0 while A generates in
    slot 1: with --prefill-chunk 16 it is prefilled in three steps (16, 16, 8) between A's decode
    steps, parked in them (with 13: 13, 13, 14, never a lone last token); its tokens and logprobs
    are bit for bit those of a whole prefill (and it draws no random numbers for the chunks). A
    generates throughout, so C's decode steps have the same batch either way."""
    from trtllm.runtime.generate import Timing, run_rows

    def run(chunk: int):
        params = [sampling.SamplingParams(temperature=0, max_new_tokens=1),
                  sampling.SamplingParams(temperature=0, max_new_tokens=40),
                  sampling.SamplingParams(temperature=0.9, top_p=0.95, max_new_tokens=8, num_logprobs=4)]
        rows = [RowState(prompt_ids=p, params=sp, rng=np.random.default_rng(7), eos_ids=frozenset())
                for p, sp in zip([[9, 4, 11], [3, 5, 8, 13], OTHERS[0]], params)]
        timing = Timing()
        run_rows(engine, rows, 2, timing, prefill_chunk=chunk)
        return rows[2], timing

    (chunked, t), (whole, _) = run(chunk), run(0)
    assert chunked.batch_idx == 0 and t.prefill_runs == 1 + 3  # B and A in one step, then C's three chunks
    assert chunked.output_ids == whole.output_ids
    for (v1, i1), (v2, i2) in zip(chunked.logprobs, whole.logprobs, strict=True):
        assert np.array_equal(v1, v2) and np.array_equal(i1, i2)


def grown_vs_fixed(engine, monkeypatch) -> None:
    """A row generating 100 tokens from a KV buffer that starts at 64 positions and grows to 128
    (its KV copied over) gets the tokens and logprobs of one allocated at 128 from the start."""
    from trtllm.runtime import generate

    def run(grow: bool):
        monkeypatch.setattr(generate.Scheduler, "grow_kv", grow)
        r = RowState(prompt_ids=list(PROMPT), rng=np.random.default_rng(3), eos_ids=frozenset(),
                     params=sampling.SamplingParams(temperature=0.8, max_new_tokens=100, num_logprobs=4))
        timing = generate.Timing()
        generate.run_rows(engine, [r], 1, timing)
        return r, timing.kv_cache_bytes

    monkeypatch.setattr(generate, "GENERATION_HEADROOM", 0)
    monkeypatch.setattr(generate, "runs_to_length", lambda row: False)  # (its length known: it would not grow)
    grows, grow = [], generate.Scheduler.grow
    monkeypatch.setattr(generate.Scheduler, "grow", lambda self, c: grows.append(c) or grow(self, c))
    (grown, grown_bytes), (fixed, fixed_bytes) = run(True), run(False)
    assert grows  # (it did grow)
    assert grown_bytes == fixed_bytes and len(grown.output_ids) == 100  # it did reach 128
    assert grown.output_ids == fixed.output_ids
    for (v1, i1), (v2, i2) in zip(grown.logprobs, fixed.logprobs, strict=True):
        assert np.array_equal(v1, v2) and np.array_equal(i1, i2)


def test_a_chunked_prompt_is_computed_as_a_whole_one(engine):
    chunked_vs_whole(engine)


def test_a_grown_kv_buffer_is_the_same_as_a_full_one(engine, monkeypatch):
    grown_vs_fixed(engine, monkeypatch)


def test_chunks_and_growth_are_exact_on_onnxruntime_attention(tiny_checkpoint, tmp_path, monkeypatch):
    build(BuildConfig(model=str(tiny_checkpoint("llama")), output=str(tmp_path / "e"), max_input_len=64,
                      max_kv_cache_capacity=CAPACITY, verify=False, cpu_kernels="onnxruntime"), log=lambda m: None)
    engine = load_engine(tmp_path / "e", huge_pages=False)
    try:
        chunked_vs_whole(engine, 13)  # wrong variant: a last chunk of one token (13, 13, 13, 1) changes its logprobs
        grown_vs_fixed(engine, monkeypatch)
    finally:
        engine.close()


@pytest.mark.parametrize("penalty", [{"repetition_penalty": 2.0}, {"frequency_penalty": 1.5, "presence_penalty": 1.0}])
def test_a_penalized_request_in_a_reused_slot_is_the_request_alone(engines, penalty):
    """In flight, a request takes over the slot of one that finished: its penalties count its own
    tokens only (a slot that kept the last request's `seen` or counts penalised its answer)."""
    from trtllm.runtime.generate import run_rows

    params = sampling.SamplingParams(temperature=0, max_new_tokens=24, **penalty)

    def rows(prompts):
        return [RowState(prompt_ids=p, params=params, rng=np.random.default_rng(0), eos_ids=frozenset())
                for p in prompts]

    engine = engines["float32"]
    alone = rows([PROMPT])
    run_rows(engine, alone, 1)
    after = rows([OTHERS[0], PROMPT])
    run_rows(engine, after, 1)  # one slot: PROMPT's request reuses the first one's
    assert after[1].output_ids == alone[0].output_ids


def test_a_row_s_logprobs_are_its_own_whatever_its_neighbours_ask(engines):
    """The step gives the largest num_logprobs any row of the run asks for; a row's token past its
    own K takes its value from the logits, as alone (the graph's top-K value of the same token
    rounds otherwise: token_logprobs 1 ulp apart with a neighbour asking for 20)."""
    from trtllm.runtime.generate import run_rows

    def row(prompt, k, seed):
        params = sampling.SamplingParams(temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=24, num_logprobs=k)
        return RowState(prompt_ids=prompt, params=params, rng=np.random.default_rng(seed), eos_ids=frozenset())

    engine = engines["float32"]
    alone = [row(PROMPT, 1, 3)]
    run_rows(engine, alone, 2)
    together = [row(PROMPT, 1, 3), row(OTHERS[0], 20, 4)]
    run_rows(engine, together, 2)
    mine, theirs = alone[0], together[0]
    assert theirs.output_ids == mine.output_ids
    assert len(mine.logprobs[0][0]) == 1 and len(theirs.logprobs[0][0]) == 1
    assert theirs.token_logprobs == mine.token_logprobs  # bit for bit
    # (sampled at temperature 1: some tokens were not the top one, the case the neighbour changed)
    assert any(t != top[1][0] for t, top in zip(mine.output_ids, mine.logprobs))
