"""Sampled requests with EAGLE speculation (engines whose verification samples: eagle.verify
"sampled"), with a head trained by scripts/train_eagle.py so that drafts are accepted: a seeded
request gives the tokens it gives without speculation, token for token, with chains and trees, in
flight. Verification draws the token at each drafted position with the random number plain decoding
would draw it with (the row's next numbers, by depth), and a row puts back the numbers after what it
emitted. The wrong variant, a row that drops them, must give other tokens."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from tests.parity.test_eagle_trained import scripted, trained  # noqa: E402,F401 (the fixtures)
from trtllm.runtime.engine import load_engine  # noqa: E402
from trtllm.runtime.generate import RowState, Timing, run_rows  # noqa: E402
from trtllm.runtime.sampling import SamplingParams  # noqa: E402
from trtllm.runtime.speculative import Drafter, SpecScheduler  # noqa: E402

pytestmark = pytest.mark.hf
PARAMS = [SamplingParams(temperature=0.02, top_k=5, top_p=1.0, max_new_tokens=24),  # near greedy: drafts taken
          SamplingParams(temperature=0.05, top_k=0, top_p=0.9, max_new_tokens=24),
          SamplingParams(temperature=0.0, logit_bias={5: 0.5}, max_new_tokens=24),
          SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.2, max_new_tokens=24),
          SamplingParams(temperature=0.7, top_k=20, top_p=0.95, max_new_tokens=20),
          SamplingParams(temperature=0.8, repetition_penalty=1.2, max_new_tokens=20)]  # penalties: walked on the host


def generate(engine_dir, prompts, step, top_k: int = 1, num_slots=None, guess: bool = True, params=PARAMS,
             rows_out: bool = False):
    engine = load_engine(engine_dir)
    drafter = Drafter.load(engine_dir, engine.manifest, step, top_k) if step else None
    if drafter is not None:
        drafter.guess = guess
    rows = [RowState(prompt_ids=p, params=q, rng=np.random.default_rng(100 + i), eos_ids=frozenset())
            for i, (p, q) in enumerate(zip(prompts, params))]
    timing = Timing()
    run_rows(engine, rows, num_slots, timing, drafter=drafter)
    return ([r.output_ids for r in rows], timing) + ((rows,) if rows_out else ())


@pytest.mark.parametrize("step,top_k,num_slots", [(1, 1, None), (3, 1, None), (3, 1, 2), (3, 2, None), (2, 3, 3)])
def test_sampled_speculation_draws_plain_decodings_tokens(trained, step, top_k, num_slots):
    _, _, engine_dir, prompts = trained
    assert load_engine(engine_dir).manifest.eagle["verify"] == "sampled"
    plain, _ = generate(engine_dir, prompts, 0)
    got, timing = generate(engine_dir, prompts, step, top_k, num_slots)
    assert got == plain
    assert timing.accepted_tokens >= 8  # drafts were taken (about one in seven here: the tiny model is flat)


@pytest.fixture(scope="module")
def body_engine(trained, tmp_path_factory):
    """The same model and head on ONNX Runtime's own kernels: verification runs trtllm::Sample's
    ONNX body (as TensorRT's graph does), over a copy of the parameters per position."""
    from trtllm.builder.config import BuildConfig
    from trtllm.builder.export import build

    ck, draft_dir, _, _ = trained
    out = tmp_path_factory.mktemp("eagle-sampled-ort") / "engine"
    return build(BuildConfig(model=str(ck), output=str(out), eagle=str(draft_dir), cpu_kernels="onnxruntime",
                             max_input_len=128, max_kv_cache_capacity=256), log=lambda m: None)


def test_the_onnx_body_verifies_as_our_kernel_does(trained, body_engine):
    from trtllm.plugins import cpu
    from trtllm.runtime.manifest import load

    _, _, _, prompts = trained
    lowerings = load(body_engine).lowerings
    assert "GroupQueryAttention" in lowerings and cpu.SAMPLE_LOWERING not in lowerings
    plain, _ = generate(body_engine, prompts, 0)
    got, timing = generate(body_engine, prompts, 3)
    assert got == plain and timing.accepted_tokens >= 8


def test_on_tensorrt(trained, tmp_path):
    """The TensorRT backend (tests/fakes: a strict stand-in that runs the plan's ONNX, trtllm::Sample's
    body included) binds verify_uniform in the prefill profile: chains and trees keep the tokens."""
    from tests import fakes
    from trtllm.builder.config import BuildConfig
    from trtllm.builder.export import build

    ck, draft_dir, _, prompts = trained
    with fakes.installed():
        engine_dir = build(BuildConfig(model=str(ck), output=str(tmp_path / "trt"), eagle=str(draft_dir),
                                       backend="tensorrt", max_input_len=128, max_kv_cache_capacity=256),
                           log=lambda m: None)
        plain, _ = generate(engine_dir, prompts, 0)
        for top_k in (1, 2):
            got, timing = generate(engine_dir, prompts, 3, top_k)
            assert got == plain and timing.accepted_tokens >= 8


def test_pauses_and_resumptions_keep_the_tokens(trained, scripted):
    """auto's k scripted to pause (plain steps: a number a token) and resume (verification: numbers
    drawn ahead, the unused put back) in every order."""
    _, _, engine_dir, prompts = trained
    plain, _ = generate(engine_dir, prompts, 0)
    got, timing = generate(engine_dir, prompts, "auto", num_slots=3)
    assert got == plain and timing.draft_steps.get(0, 0) > 3 and timing.accepted_tokens >= 4


def test_wrong_variant_dropping_the_unused_numbers_changes_the_tokens(trained, monkeypatch):
    _, _, engine_dir, prompts = trained
    plain, _ = generate(engine_dir, prompts, 0)

    def forgetful(self, n):
        self.spare.clear()
        return [self.rng.random(dtype=np.float32) for _ in range(n)]

    monkeypatch.setattr(RowState, "uniforms", forgetful)
    got, _ = generate(engine_dir, prompts, 3)
    assert got != plain



@pytest.mark.parametrize("top_k", [1, 2])
def test_a_head_that_knows_the_models_distribution_guesses_every_draw(trained, monkeypatch, top_k):
    """Sampled rows draft guesses at their own draws (sampling.propose, with the random numbers
    verification will draw with). Given the model's own 10 best tokens at each position (an oracle
    head), a guess is the model's draw wherever its kept tokens are among them, so most drafts are
    kept; the model's own most likely token only where the model draws it. Through the whole
    cycle: each draft's number is the one its position is drawn with (a guess one number off would
    be kept by chance only), in chains and trees."""
    _, _, engine_dir, prompts = trained
    params = [dataclasses.replace(p, num_logprobs=10) for p in PARAMS]
    plain, _, model = generate(engine_dir, prompts, 0, params=params, rows_out=True)
    streams = [RowState(prompt_ids=[], params=p, rng=np.random.default_rng(100 + i), eos_ids=frozenset()).uniforms(30)
               for i, p in enumerate(PARAMS)]
    original = SpecScheduler.guess

    guessing = [True]

    def oracle(row, ids, logprobs, uniform):
        b = next(b for b, p in enumerate(prompts) if p == row.prompt_ids)
        i = streams[b].index(uniform)  # the token this number draws in plain decoding
        if i >= len(model[b].logprobs):  # a tree's node past the row's end
            return original(row, ids, logprobs, uniform)
        lps, best = model[b].logprobs[i]
        if not guessing[0]:
            return int(best[0])  # the baseline: the model's own most likely token (with the bias)
        unbiased = [lp - row.params.logit_bias.get(int(t), 0.0) for t, lp in zip(best, lps)]
        return original(row, best, unbiased, uniform)

    monkeypatch.setattr(SpecScheduler, "guess", staticmethod(oracle))
    got, guessed = generate(engine_dir, prompts, 3, top_k)
    guessing[0] = False
    argmax, top = generate(engine_dir, prompts, 3, top_k)
    assert got == argmax == [r.output_ids for r in model]
    # the share of the speculating rows' tokens that were drafts (at most 3 in 4 with k = 3): with a
    # chain 77 of 111 (84% of its drafts kept; the rest are where the sampler keeps tokens beyond the
    # 10: the tiny model is flat), against 71 of 110 (68%) for the model's own most likely token,
    # which the sampled rows draw only some of the time
    share = lambda t: t.accepted_tokens / t.speculative_tokens  # noqa: E731
    assert share(guessed) > 0.6 and share(guessed) > share(top) + 0.03


def banned_at(free: list[int], first: int = 4) -> tuple[int, int]:
    """(m, T): the first index m >= `first` whose token T the unbanned text has not had before, so
    that with stop token T and min_new_tokens m the ban decides the text at m and nowhere else."""
    m = next(i for i in range(first, len(free)) if free[i] not in free[:i])
    return m, free[m]


def test_min_new_tokens_rows_speculate_within_the_ban(trained, monkeypatch):
    """A row with min_new_tokens speculates: every position of a cycle is drawn with the ban (EOS and
    stop_token_ids) that the row has at its first position, so while the ban lasts a cycle drafts and
    emits no further than its end. Each row's stop token is what its unbanned greedy text has at
    index m, so the ban decides that token. The wrong variant, cycles that run past the ban's end
    (`held` always 0), must give other tokens."""
    from trtllm.runtime import spec_rules, speculative

    _, _, engine_dir, prompts = trained
    free, _ = generate(engine_dir, prompts, 0, params=[SamplingParams(temperature=0, max_new_tokens=24)] * len(prompts))
    params = []
    for i, f in enumerate(free):
        m, stop = banned_at(f)
        params.append(SamplingParams(temperature=0.0 if i % 2 == 0 else 0.05, top_k=0, top_p=0.9, max_new_tokens=24,
                                     min_new_tokens=m, stop_token_ids=(stop,)))
    plain, _ = generate(engine_dir, prompts, 0, params=params)
    assert any(len(p) < 24 for p in plain)  # the stop token ends rows once the ban is over
    for step, top_k in ((3, 1), (2, 2)):
        got, timing = generate(engine_dir, prompts, step, top_k, params=params)
        assert got == plain and timing.accepted_tokens >= 8
    for module in (speculative, spec_rules):  # (the rules' exact() reads it there)
        monkeypatch.setattr(module, "held", lambda row: 0)
    got, _ = generate(engine_dir, prompts, 3, params=params)
    assert got != plain


def test_greedy_rows_with_penalties_speculate(trained, monkeypatch):
    """Greedy requests with penalties speculate. On an engine that gives the verified positions'
    logits (this one), each position is walked on the host under the penalties after the tokens
    emitted before it (`walk`): any penalties, whole cycles. Elsewhere (TensorRT; here `walked` is
    turned off), verification applies the penalties of a cycle's first position to all of them, so
    only penalties that only lower a generated token (repetition_penalty >= 1, frequency and presence
    penalties >= 0) speculate, a cycle stopping before a token it has already emitted (`exact`).
    Sampled requests with penalties take plain steps. Rows 0-3 favour their unbiased text's second
    token (logit_bias) and penalise it once generated, so a cycle can verify it twice in a row. The
    wrong variants, walked positions under the cycle's first penalties (the graph's tokens) and
    cycles that emit the repeat too, must give other tokens."""
    from trtllm.runtime import speculative

    kinds = [SamplingParams(temperature=0, repetition_penalty=1.3), SamplingParams(temperature=0, presence_penalty=0.4),
             SamplingParams(temperature=0, presence_penalty=-0.5), SamplingParams(temperature=0.8, repetition_penalty=1.2)]
    assert [speculative.sampled(p) for p in kinds] == [True, True, False, False]  # raising, sampled: not by the graph
    _, _, engine_dir, prompts = trained
    free, _ = generate(engine_dir, prompts, 0, params=[SamplingParams(temperature=0, max_new_tokens=24)] * len(prompts))
    params = [SamplingParams(temperature=0, logit_bias={f[1]: 4.0}, presence_penalty=2.0, frequency_penalty=2.0,
                             max_new_tokens=24) for f in free[:4]]
    params += [SamplingParams(temperature=0, repetition_penalty=1.3, min_new_tokens=6, max_new_tokens=24),
               SamplingParams(temperature=0, presence_penalty=-0.5, max_new_tokens=24)][: len(prompts) - 4]
    plain, _ = generate(engine_dir, prompts, 0, params=params)

    def same(least: int) -> None:
        for step, top_k in ((3, 1), (2, 2)):
            got, timing = generate(engine_dir, prompts, step, top_k, params=params)
            assert got == plain and timing.accepted_tokens >= least

    same(16)
    with monkeypatch.context() as m:
        m.setattr(SpecScheduler, "walked_token", lambda self, slot, node, out, uniform=None: int(out.verify_ids[slot, node]))
        assert generate(engine_dir, prompts, 3, params=params)[0] != plain
    monkeypatch.setattr(SpecScheduler, "walked", lambda self, row: False)
    same(8)
    monkeypatch.setattr(speculative, "exact", lambda row, tokens: len(tokens))
    got, _ = generate(engine_dir, prompts, 3, params=params)
    assert got != plain


def test_sampled_rows_with_penalties_speculate(trained, monkeypatch):
    """Sampled requests with penalties speculate on an engine on our kernels: a cycle's first position
    is the graph's draw, and each later one is drawn on the host by the same sampler code
    (sampling.host_draw) with the number plain decoding draws it with, under the penalties after the
    tokens emitted before it: seeded answers are plain decoding's, in chains and trees. Rows 0-3
    favour their unbiased text's second token and penalise it once drawn (as in the greedy test
    above). The wrong variant, the graph's draws (under the cycle's first penalties) at every
    position, differs."""
    _, _, engine_dir, prompts = trained
    free, _ = generate(engine_dir, prompts, 0, params=[SamplingParams(temperature=0, max_new_tokens=24)] * len(prompts))
    params = [SamplingParams(temperature=t, logit_bias={f[1]: 4.0}, presence_penalty=2.0, frequency_penalty=2.0,
                             max_new_tokens=24, num_logprobs=n) for f, t, n in zip(free[:4], (0.05, 0.02, 0.1, 0.05),
                                                                                    (0, 2, 0, 1))]
    params += [SamplingParams(temperature=0.3, top_k=5, repetition_penalty=0.8, presence_penalty=-0.5, max_new_tokens=24),
               SamplingParams(temperature=1.0, top_p=0.9, repetition_penalty=1.2, max_new_tokens=24)][: len(prompts) - 4]
    plain, _ = generate(engine_dir, prompts, 0, params=params)
    walks_as_plain(engine_dir, prompts, params, plain, monkeypatch)


def walks_as_plain(engine_dir, prompts, params, plain, monkeypatch) -> None:
    """Rows walked on the host give plain decoding's tokens `plain`, drafting chains and trees with
    drafts taken; the wrong variant, the graph's tokens under a cycle's first biases at every
    position, differs."""
    for step, top_k in ((3, 1), (2, 2)):
        got, timing = generate(engine_dir, prompts, step, top_k, params=params)
        assert got == plain and timing.accepted_tokens >= 8
    monkeypatch.setattr(SpecScheduler, "walked_token", lambda self, slot, node, out, uniform=None:
                        int(out.verify_ids[slot, node]))
    assert generate(engine_dir, prompts, 3, params=params)[0] != plain


def test_rows_with_bad_words_speculate(trained, monkeypatch):
    """bad_words of several tokens change the row's bans with each token (spec_rules.changing): such
    rows are walked on the host like penalized ones, greedy and sampled, and one-token words and
    allowed_token_ids (the same at every position) verify in the graph; the answers are plain
    decoding's. Where the walk is off (TensorRT), they take plain steps. The wrong variant, the
    graph's tokens under the cycle's first bans at every position, differs."""
    _, _, engine_dir, prompts = trained
    free, _ = generate(engine_dir, prompts, 0, params=[SamplingParams(temperature=0, max_new_tokens=24)] * len(prompts))
    words = [(tuple(f[1:3]), tuple(f[6:9]), (f[12],)) for f in free]
    params = [SamplingParams(temperature=t, top_k=0, top_p=1.0, max_new_tokens=24, bad_words=w)
              for w, t in zip(words, (0, 0.02, 0, 0.05, 0, 0.1))]
    params[2] = dataclasses.replace(params[2], bad_words=((free[2][3],),), allowed_token_ids=frozenset(free[2][:12]))
    plain, _ = generate(engine_dir, prompts, 0, params=params)
    assert plain[0] != free[0] and plain[1] != free[1]
    with monkeypatch.context() as m:
        m.setattr(SpecScheduler, "walked", lambda self, row: False)
        assert generate(engine_dir, prompts, 3, params=params)[0] == plain
    walks_as_plain(engine_dir, prompts, params, plain, monkeypatch)


def test_rows_with_no_repeat_ngram_size_speculate(trained, monkeypatch):
    """no_repeat_ngram_size changes the row's bans with each token, as bad words of several tokens
    do: such rows are walked on the host, greedy and sampled, and the answers are plain decoding's.
    The first three prompts are followed by the start of the model's answer to them and their own
    last tokens again: the model would answer as before, and the n-grams are the prompt's. The
    wrong variant, the graph's tokens under the cycle's first bans at every position, differs."""
    _, _, engine_dir, prompts = trained
    params = [SamplingParams(temperature=t, top_k=0, top_p=1.0, max_new_tokens=24, no_repeat_ngram_size=n)
              for t, n in zip((0, 0, 0.02, 0, 0.05, 0.1), (2, 2, 2, 2, 3, 1))][:len(prompts)]
    unbanned = [dataclasses.replace(p, no_repeat_ngram_size=0) for p in params]
    free, _ = generate(engine_dir, prompts, 0, params=unbanned)
    prompts = [p + f[:8] + p[-16:] if i < 3 else p for i, (p, f) in enumerate(zip(prompts, free))]
    free, _ = generate(engine_dir, prompts, 0, params=unbanned)
    plain, _ = generate(engine_dir, prompts, 0, params=params)
    assert sum(a != b for a, b in zip(plain, free)) >= 2
    walks_as_plain(engine_dir, prompts, params, plain, monkeypatch)


def test_rows_with_logprobs_speculate(trained, monkeypatch):
    """Rows that ask for logprobs speculate (eagle.logprobs: the graph gives the verified positions'
    logits): each emitted token's top logprobs are those at the position it was drawn at, as plain
    decoding's sampler reports them (log_softmax of the logits plus logit_bias), in chains and trees.
    The wrong variant, every token of a cycle given its first position's logprobs, must differ."""
    from trtllm.runtime import speculative

    _, _, engine_dir, prompts = trained
    assert load_engine(engine_dir).manifest.eagle["logprobs"] is True
    params = [dataclasses.replace(p, num_logprobs=n) for p, n in zip(PARAMS, (5, 1, 20, 3, 5, 2))]
    assert speculative.sampled(params[0], logprobs=True) and not speculative.sampled(params[0])
    plain, _, want = generate(engine_dir, prompts, 0, params=params, rows_out=True)

    def close(rows) -> bool:
        for r, w in zip(rows, want):
            k = r.params.num_logprobs
            assert len(r.logprobs) == len(r.output_ids) == len(r.token_logprobs)
            if not np.allclose(r.token_logprobs, w.token_logprobs, atol=1e-4):
                return False
            for (values, ids), (wv, wi) in zip(r.logprobs, w.logprobs):
                if list(ids[:k]) != list(wi[:k]) or not np.allclose(values[:k], wv[:k], atol=1e-4):
                    return False
        return True

    for step, top_k in ((3, 1), (2, 2)):
        got, timing, rows = generate(engine_dir, prompts, step, top_k, params=params, rows_out=True)
        assert got == plain and timing.accepted_tokens >= 8
        assert close(rows)
    original = SpecScheduler.emit
    monkeypatch.setattr(SpecScheduler, "emit", lambda self, slot, row, tokens, out, sources:
                        original(self, slot, row, tokens, out, [0] * len(tokens)))
    got, _, rows = generate(engine_dir, prompts, 3, params=params, rows_out=True)
    assert got == plain and not close(rows)
