"""--spec-ngram for rows with penalties or a grammar, greedy and sampled (runtime/ngram.py): their
checked positions are walked on the host, each under the penalties and the mask after the tokens
taken before it (a sampled row's drawn by the engine's own sampler code with the same number), so
the answers are plain decoding's token for token. The wrong variant, every position
under the step's first penalties (what the graph's sampler has), must change them."""
from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest

from trtllm.runtime import ngram
from trtllm.runtime.engine import load_engine
from trtllm.runtime.generate import RowState, Timing, run_rows
from trtllm.runtime.sampling import SamplingParams

pytestmark = pytest.mark.hf
PROMPTS = [list(range(30, 52)) * 2, [5, 17, 42, 99, 7] * 5, [3, 200, 11, 3, 200], list(range(100, 140, 3))]
PENALTIES = [dict(repetition_penalty=1.3), dict(repetition_penalty=0.8), dict(frequency_penalty=0.7),
             dict(presence_penalty=-0.9), dict(frequency_penalty=-0.4, presence_penalty=0.5, repetition_penalty=1.1),
             dict(repetition_penalty=1.2, min_new_tokens=30, num_logprobs=3)]


@pytest.fixture(scope="module")
def engine(tiny_engine):
    return load_engine(tiny_engine("llama"))


def oracle(texts: list[list[int]], k: int, wrong: bool = True) -> ngram.Lookup:
    """Guesses from the plain answers themselves (the tiny model's penalized text repeats little),
    with a wrong last guess every third step (`wrong`): taken where they hold, replaced where not."""
    @dataclasses.dataclass(frozen=True)
    class Oracle(ngram.Lookup):
        def propose(self, tokens):
            text = next((t for t in texts if t[:len(tokens)] == tokens), tokens)  # (none: a wrong variant's)
            guesses = text[len(tokens):len(tokens) + self.k]
            return guesses[:-1] + [(guesses[-1] + 1) % 400] if wrong and len(tokens) % 3 == 0 and guesses else guesses

    return Oracle(k, adaptive=False)


def run(engine, prompts, params, lookup=None, guides=None, eos=()):
    rows = [RowState(prompt_ids=p, params=SamplingParams(**{"temperature": 0.0, "max_new_tokens": 40, **params[i]}),
                     rng=np.random.default_rng(i), eos_ids=frozenset(eos),
                     guide=guides[i] if guides else None) for i, p in enumerate(prompts)]
    timing = Timing()
    run_rows(engine, rows, None, timing, lookup=lookup)
    return [Answer((r.output_ids, r.finish_reason, r.error, [v[1][:3].tolist() for v in r.logprobs],
                    [v[0][:3].tolist() for v in r.logprobs] + [r.token_logprobs])) for r in rows], timing


class Answer(tuple):
    """(ids, finish, error, top ids, logprobs): the logprobs within float32 rounding (a checked
    position's come from numpy, a plain step's from the graph's sampler), the rest equal."""

    def __eq__(self, other):
        return self[:4] == other[:4] and all(np.allclose(a, b, atol=1e-5)
                                             for a, b in zip(self[4], other[4], strict=True))

    __hash__ = tuple.__hash__


def test_penalized_greedy_rows_speculate_exactly(engine):
    prompts = (PROMPTS * 2)[:len(PENALTIES)]
    eos = [int(np.bincount(sum(prompts, [])).argmax())]  # (held back from the last by its min_new_tokens)
    want, _ = run(engine, prompts, PENALTIES, eos=eos)
    texts = [p + w[0] for p, w in zip(prompts, want)]
    for lookup in (oracle(texts, 5), oracle(texts, 2), ngram.Lookup(4, adaptive=False)):
        got, timing = run(engine, prompts, PENALTIES, lookup, eos=eos)
        assert got == want, lookup
        assert timing.verify_runs > 0 and timing.drafted_tokens > 0
    assert 60 < timing.accepted_tokens or lookup.k == 4  # (the oracle's guesses hold two steps in three)


def test_wrong_variant_the_steps_first_penalties_change_answers(engine, monkeypatch):
    """Every checked position under the penalties the row had at the step's first, as the graph's
    sampler has them: where the model would take again a token taken earlier in the same step,
    plain decoding penalizes it and this variant does not."""
    # prompts whose unpenalized answers repeat a token two and one tokens on
    params = [dict(repetition_penalty=3.0), dict(frequency_penalty=2.0), dict(presence_penalty=2.0)]
    prompts = [PROMPTS[2], [7, 7, 7, 7], [3, 200, 11, 3, 200]]
    want, _ = run(engine, prompts, params)
    texts = [p + w[0] for p, w in zip(prompts, want)]
    verify = ngram.NgramScheduler.verify

    def stale(self, s, row, drafts, out):
        first = (self.batch.penalty_bias[s].copy(), self.batch.seen[s].copy())
        penalize = ngram.sampling.greedy

        def greedy(logits, batch, r, native):
            now = batch.penalty_bias[r].copy(), batch.seen[r].copy()
            batch.penalty_bias[r], batch.seen[r] = first
            try:
                return penalize(logits, batch, r, native)
            finally:
                batch.penalty_bias[r], batch.seen[r] = now

        monkeypatch.setattr(ngram.sampling, "greedy", greedy)
        try:
            verify(self, s, row, drafts, out)
        finally:
            monkeypatch.setattr(ngram.sampling, "greedy", penalize)

    monkeypatch.setattr(ngram.NgramScheduler, "verify", stale)
    for k in (3, 6):
        got, _ = run(engine, prompts, params, oracle(texts, k, wrong=False))
        assert got != want, k


def guided_runs(engine, tiny_engine, kind: str, text: str, params: list[dict]):
    """(run(lookup) -> the rows' answers under the guide, the tokenizer)."""
    from trtllm.runtime.grammar import Grammars
    from trtllm.runtime.guided import Guide
    from trtllm.runtime.tokenizer import Tokenizer

    tok = Tokenizer.from_engine_dir(tiny_engine("llama"), engine.manifest.files)
    eos = engine.manifest.eos_token_ids
    grammars = Grammars(tok.to_json(), engine.manifest.model.vocab_size, eos, tok.vocab_size)
    guide = Guide(kind, text, f"guided_decoding.{kind}")
    def guided(lookup=None):
        return run(engine, PROMPTS, params, lookup, [grammars.matcher(guide) for _ in PROMPTS], eos)

    return guided, tok


@pytest.mark.parametrize("kind, text", [("regex", "(the|cat|sat|on|a|mat| )+"), ("regex", "[a-z]{3,12}"),
                                        ("choice", '["first answer", "second answer here"]')])
def test_guided_greedy_rows_speculate_exactly(engine, tiny_engine, monkeypatch, kind, text):
    """Each checked position under the grammar's mask after the tokens before it (the graph had the
    first position's): with guesses that hold and others that break the grammar, the answers are
    plain decoding's, each a match where it ends at EOS. The wrong variant, every position under
    the step's first mask, must change them."""
    params = [{}, dict(num_logprobs=2), dict(repetition_penalty=1.4), {}]
    guided, tok = guided_runs(engine, tiny_engine, kind, text, params)
    want, _ = guided()
    texts = [p + w[0] for p, w in zip(PROMPTS, want)]
    got, timing = guided(oracle(texts, 4))
    assert got == want and 0 < timing.accepted_tokens < timing.drafted_tokens
    assert guided(ngram.Lookup(3, adaptive=False))[0] == want
    for ids, why, error, _, _ in want:
        assert error is None
        if why == "end-of-sequence":
            answer = tok.decode(ids[:-1])
            assert re.fullmatch(text, answer) if kind == "regex" else answer in eval(text)
    fill = ngram.NgramScheduler.fill_masks
    monkeypatch.setattr(ngram.NgramScheduler, "fill_masks", lambda self, slots=None: slots or fill(self, slots))
    assert guided(oracle(texts, 4))[0] != want


SAMPLED = [dict(temperature=0.7, top_k=20, repetition_penalty=1.3), dict(temperature=0.05, frequency_penalty=0.8),
           dict(temperature=1.0, top_p=0.9, presence_penalty=-0.5, num_logprobs=2),
           dict(temperature=0.05, min_p=0.1, repetition_penalty=0.9, min_new_tokens=30)]


def test_sampled_rows_with_penalties_speculate_exactly(engine, monkeypatch):
    """A sampled row's positions after the first are drawn on the host by the engine's own sampler
    code (sampling.host_draw) with the numbers plain decoding draws them with, under the penalties
    after the tokens before them: a seeded answer is plain decoding's. The wrong variant, the graph's
    draws (under the step's first penalties) at every position, must differ."""
    assert ngram.sampling.host_draws(engine.manifest)
    eos = [int(np.bincount(sum(PROMPTS, [])).argmax())]
    want, _ = run(engine, PROMPTS, SAMPLED, eos=eos)
    texts = [p + w[0] for p, w in zip(PROMPTS, want)]
    for lookup in (oracle(texts, 5), oracle(texts, 2), ngram.Lookup(4, adaptive=False)):
        got, timing = run(engine, PROMPTS, SAMPLED, lookup, eos=eos)
        assert got == want, lookup
        assert timing.drafted_tokens > 0
    monkeypatch.setattr(ngram.NgramScheduler, "walked", lambda self, row: False)
    assert run(engine, PROMPTS, SAMPLED, oracle(texts, 5, wrong=False), eos=eos)[0] != want


def test_sampled_guided_rows_speculate_exactly(engine, tiny_engine):
    guided, _ = guided_runs(engine, tiny_engine, "regex", "(the|cat|sat|on|a|mat| )+", [
        dict(temperature=0.8), dict(temperature=0.3, num_logprobs=2), dict(temperature=1.0, repetition_penalty=1.2),
        dict(temperature=0.6, top_k=3)])
    want, _ = guided()
    texts = [p + w[0] for p, w in zip(PROMPTS, want)]
    got, timing = guided(oracle(texts, 4))
    assert got == want and 0 < timing.accepted_tokens < timing.drafted_tokens


@pytest.mark.parametrize("kernels", ["native", "onnxruntime"])
def test_a_row_whose_every_token_is_banned_ends_as_in_plain_decoding(tiny_engine, tiny_checkpoint, tmp_path, kernels):
    """A guided row whose grammar allows only EOS while min_new_tokens bans it: every token is -inf.
    Plain decoding's sampler answers -1 there (our kernel) or token 0 (the standard-op sampler), and
    the row fails either way; speculation's host walk takes the same token, as that engine's own
    sampler does, so the answer and its error are plain decoding's."""
    from trtllm.builder.config import BuildConfig
    from trtllm.builder.export import build
    from trtllm.runtime.grammar import Grammars
    from trtllm.runtime.guided import Guide
    from trtllm.runtime.tokenizer import Tokenizer

    path = tiny_engine("llama") if kernels == "native" else build(BuildConfig(
        model=str(tiny_checkpoint("llama")), output=str(tmp_path / "e"), cpu_kernels="onnxruntime", max_batch_size=4,
        max_input_len=256, max_kv_cache_capacity=512), log=lambda m: None)
    engine = load_engine(path)
    tok = Tokenizer.from_engine_dir(path, engine.manifest.files)
    eos = engine.manifest.eos_token_ids
    grammars = Grammars(tok.to_json(), engine.manifest.model.vocab_size, eos, tok.vocab_size)
    guide = Guide("choice", '["first answer", "a"]', "guided_decoding.choice")
    params = [dict(min_new_tokens=12, max_new_tokens=20)] * 2

    def guided(lookup=None):
        return run(engine, PROMPTS[:2], params, lookup, [grammars.matcher(guide) for _ in range(2)], eos)

    want, _ = guided()
    assert all(why == "error" for _, why, *_ in want)
    texts = [p + w[0] for p, w in zip(PROMPTS, want)]
    assert guided(oracle([t + [5] for t in texts], 3, wrong=False))[0] == want  # (a guess past the end too)
