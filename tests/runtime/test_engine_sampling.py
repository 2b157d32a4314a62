"""The sampler inside a real engine graph: first-token frequencies follow the renormalised
top-k/top-p distribution of transformers' logits, and a fixed seed replays exactly."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from trtllm.plugins.sample.reference import kept_probs  # noqa: E402
from trtllm.runtime.engine import load_engine  # noqa: E402
from trtllm.runtime.generate import RowState, run_batch  # noqa: E402
from trtllm.runtime.sampling import SamplingParams  # noqa: E402

pytestmark = pytest.mark.hf
PROMPT = [5, 17, 42, 99, 7, 31]
ROWS, ROUNDS = 256, 8


def first_tokens(engine, params: SamplingParams, seed: int) -> np.ndarray:
    seeds = np.random.SeedSequence(seed).spawn(ROWS)
    params = dataclasses.replace(params, max_new_tokens=1)
    rows = [RowState(prompt_ids=PROMPT, params=params, rng=np.random.default_rng(s), eos_ids=frozenset())
            for s in seeds]
    run_batch(engine, rows)
    return np.array([r.output_ids[0] for r in rows])


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=1.0, top_k=0, top_p=1.0),
    SamplingParams(temperature=0.7, top_k=5, top_p=1.0),
    SamplingParams(temperature=1.3, top_k=0, top_p=0.6),
    SamplingParams(temperature=1.0, top_k=8, top_p=0.8),
    SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.05),
    SamplingParams(temperature=0.8, top_k=20, top_p=0.9, min_p=0.02),
])
def test_first_token_frequencies(params, tiny_checkpoint, tiny_engine):
    engine = load_engine(tiny_engine("llama"))
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_checkpoint("llama"), dtype=torch.float32)
    with torch.no_grad():
        logits = model(torch.tensor([PROMPT])).logits[0, -1].numpy()[None]
    expected = kept_probs(logits, np.zeros_like(logits), np.zeros_like(logits), np.zeros(logits.shape, bool),
                          np.ones(1, np.float32), np.array([params.temperature], np.float32),
                          np.array([params.min_p], np.float32), np.array([params.top_k]),
                          np.array([params.top_p], np.float32), engine.manifest.max_top_k)[0]
    draws = np.concatenate([first_tokens(engine, params, seed) for seed in range(ROUNDS)])
    freq = np.bincount(draws, minlength=expected.size) / draws.size
    sigma = np.sqrt(expected * (1 - expected) / draws.size)
    assert np.all(freq[expected == 0] == 0), "sampled a token outside the top-k/top-p set"
    assert np.all(np.abs(freq - expected) <= 4.5 * sigma + 1e-3)


def test_same_seed_same_tokens(tiny_engine):
    engine = load_engine(tiny_engine("llama"))
    params = SamplingParams(temperature=1.0, top_k=0, top_p=1.0)
    a, b = first_tokens(engine, params, 123), first_tokens(engine, params, 123)
    assert np.array_equal(a, b)
    assert len(set(a.tolist())) > 1  # it really sampled


def test_the_engines_sampler_draws_the_reference_token_from_its_logits(tiny_engine):
    """One prefill of 4 rows with mixed settings (penalties, bias, min-p, top-k, top-p), 8 times with
    new uniforms: the token each row gets is the reference's draw from the logits of the same step,
    on our kernels' trtllm.cpu::Sample (when the library is built) or the ONNX body."""
    from trtllm.plugins import cpu
    from trtllm.plugins.sample import reference, schema
    from trtllm.runtime import sampling
    from trtllm.runtime.generate import prefill_inputs
    from trtllm.runtime.kv_cache import KVCacheManager

    engine = load_engine(tiny_engine("llama"))
    m = engine.manifest
    assert (cpu.SAMPLE_LOWERING in m.lowerings) == (cpu.library() is not None)
    params = [SamplingParams(temperature=1.0, top_k=0, top_p=1.0, logit_bias={3: 2.5, 7: -1.0}),
              SamplingParams(temperature=0.7, top_k=20, top_p=0.9, repetition_penalty=1.3),
              SamplingParams(temperature=1.3, top_k=0, top_p=0.8, min_p=0.02),
              SamplingParams(temperature=0.0, top_k=5)]
    rows = [RowState(prompt_ids=PROMPT[: 3 + i], params=p, rng=np.random.default_rng(i), eos_ids=frozenset())
            for i, p in enumerate(params)]
    batch = sampling.make_batch(params, m.model.vocab_size, m.max_top_k, prompts=[r.prompt_ids for r in rows])
    rng = np.random.default_rng(11)
    for _ in range(8):
        batch.uniform[:] = rng.random(len(rows), dtype=np.float32)
        kv = KVCacheManager(m.model, len(rows), 64)
        out = engine.step(prefill_inputs(rows, m.pad_token_id, batch), kv.view(0, len(rows)), want_logits=True)
        args = {"logits": out.logits, **{name: getattr(batch, name) for name in schema.INPUT_NAMES[1:]}}
        want = reference.sample(*(args[name] for name in schema.INPUT_NAMES), m.max_top_k)
        assert out.token_ids.tolist() == want[0].tolist()
        k = out.top_logprobs.shape[1]  # (the batch asks for one)
        np.testing.assert_allclose(out.top_logprobs, want[1][:, :k], atol=1e-5, rtol=0)
