"""Beam search (runtime/beam.py) against transformers' generate(num_beams=B, do_sample=False) on tiny
random checkpoints: every returned hypothesis token-exact, in transformers' order, and its score
within float32 rounding, across beam widths, length penalties, early_stopping's three values, EOS
ids that end hypotheses early and min_new_tokens. The wrong variant, beams that keep their own
slot's KV instead of the KV of the beam they extend, must miss."""
from __future__ import annotations

import dataclasses
import json
from collections import Counter

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from trtllm.runtime import beam  # noqa: E402
from trtllm.runtime.engine import load_engine  # noqa: E402
from trtllm.runtime.text import TextStream  # noqa: E402
from trtllm.runtime.tokenizer import Tokenizer  # noqa: E402

pytestmark = pytest.mark.hf
PROMPTS = [[5, 17, 42, 99, 7], list(range(30, 52))]
NEW = 12


def hf_beams(model, prompt, p: beam.BeamParams, stops=(), tokenizer=None) -> list[tuple[tuple[int, ...], float]]:
    """transformers' hypotheses and scores; `stops`: its stop_strings (with the HF `tokenizer`); a
    logit_bias as its sequence_bias, repetition_penalty, bad_words as its bad_words_ids,
    no_repeat_ngram_size, and allowed_token_ids as a processor of -inf elsewhere."""
    shaping = dict(repetition_penalty=p.repetition_penalty,
                   sequence_bias={(t,): b for t, b in p.logit_bias} or None,
                   bad_words_ids=[list(seq) for seq in p.bad_words] or None,
                   no_repeat_ngram_size=p.no_repeat_ngram_size or None)
    if p.allowed_token_ids is not None:
        banned = torch.ones(model.config.vocab_size, dtype=torch.bool)
        banned[sorted(p.allowed_token_ids)] = False
        shaping["logits_processor"] = transformers.LogitsProcessorList([lambda ids, x: x.masked_fill(banned, -torch.inf)])
    eos = sorted(p.eos_ids) or None
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.int64),
                             num_beams=p.num_beams, num_return_sequences=p.num_beams, do_sample=False,
                             max_new_tokens=p.max_new_tokens, min_new_tokens=p.min_new_tokens or None,
                             length_penalty=p.length_penalty, early_stopping=p.early_stopping,
                             eos_token_id=eos, pad_token_id=0, return_dict_in_generate=True, output_scores=True,
                             **(dict(stop_strings=list(stops), tokenizer=tokenizer) if stops else {}), **shaping)
    answers = []
    for seq, score in zip(out.sequences[:, len(prompt):].tolist(), out.sequences_scores.tolist()):
        end = next((i + 1 for i, t in enumerate(seq) if t in p.eos_ids
                    or stops and any(s in tokenizer.decode(seq[:i + 1]) for s in stops)), p.max_new_tokens)
        answers.append((tuple(seq[:end]), score))  # (transformers pads the shorter ones)
    return answers


def same(ours: list[beam.Hypothesis], theirs) -> bool:
    """Tokens equal, scores within float32 rounding: 1e-4, or 1e-6 of the score where that is more (a
    length_penalty below 0 multiplies a dozen tokens' summed log-probabilities by the length: -273.67169
    against -273.67181 on an Intel Xeon, where a Zen 4 had them within 1e-4)."""
    return [h.tokens for h in ours] == [t for t, _ in theirs] and np.allclose(
        [h.score for h in ours], [s for _, s in theirs], atol=1e-4, rtol=1e-6)


@pytest.fixture(scope="module")
def llama(tiny_checkpoint, tiny_engine):
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_checkpoint("llama"), dtype=torch.float32).eval()
    engine = load_engine(tiny_engine("llama"))
    # EOS ids that beams produce: the commonest tokens of beam answers without one
    free = [hf_beams(model, p, beam.BeamParams(4, NEW, frozenset())) for p in PROMPTS]
    common = Counter(t for answers in free for tokens, _ in answers for t in tokens).most_common(2)
    return model, engine, frozenset(t for t, _ in common)


@pytest.mark.parametrize("num_beams, length_penalty, early_stopping, min_new",
                         [(2, 1.0, False, 0), (4, 1.0, False, 0), (4, 0.0, "never", 0), (3, 2.0, "never", 0),
                          (4, -1.0, True, 0), (4, 1.0, True, 0), (5, 1.0, False, 6)])
def test_beams_are_transformers(llama, num_beams, length_penalty, early_stopping, min_new):
    model, engine, eos = llama
    ended = 0
    for prompt in PROMPTS:
        for ids in (eos, frozenset(sorted(eos)[:1])):
            p = beam.BeamParams(num_beams, NEW, ids, min_new, length_penalty, early_stopping)
            ours, theirs = beam.run(engine, prompt, p), hf_beams(model, prompt, p)
            assert same(ours, theirs), (prompt, sorted(ids), ours, theirs)
            ended += sum(len(h.tokens) < NEW for h in ours)
    # (hypotheses that end with an EOS id were compared too; length_penalty 2 favours long ones)
    assert ended > 0 or length_penalty > 1


@pytest.mark.parametrize("arch", ["qwen3", "gemma3", "granite4-h"])  # (granite4-h: each beam's Mamba state copied)
def test_other_architectures(arch, tiny_checkpoint, tiny_engine):
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_checkpoint(arch), dtype=torch.float32).eval()
    engine = load_engine(tiny_engine(arch))
    p = beam.BeamParams(3, NEW, frozenset({int(engine.manifest.eos_token_ids[0])}))
    for prompt in PROMPTS:
        assert same(beam.run(engine, prompt, p), hf_beams(model, prompt, p))


def test_many_eos_ids_take_the_logits(llama):
    """keep = (1 + EOS ids) x B candidates a step: past the graph's top_logprobs width (12 EOS ids,
    4 beams: 52), each beam's best come from its logits (top_candidates) instead."""
    model, engine, _ = llama
    free = hf_beams(model, PROMPTS[1], beam.BeamParams(4, NEW, frozenset()))
    eos = frozenset(t for t, _ in Counter(t for tokens, _ in free for t in tokens).most_common(12))
    p = beam.BeamParams(4, NEW, eos, min_new_tokens=2)
    assert beam.Search(p, 1).width > engine.manifest.logprob_width
    for prompt in PROMPTS:
        assert same(beam.run(engine, prompt, p), hf_beams(model, prompt, p))


def test_wrong_variant_beams_keep_their_own_kv_miss(llama, monkeypatch):
    """A beam that extends another must continue from that beam's KV: left with its slot's own,
    the answers are no longer transformers'."""
    model, engine, eos = llama
    p = beam.BeamParams(4, NEW, eos)
    theirs = [hf_beams(model, prompt, p) for prompt in PROMPTS]
    real = beam.reorder

    def uncopied(kv, parents, held, n, length, base=0):  # (the prompt's first copy aside)
        return real(kv, parents, held, n, length, base) if None in held else [held[i] for i in parents]

    monkeypatch.setattr(beam, "reorder", uncopied)
    assert not all(same(beam.run(engine, prompt, p), t) for prompt, t in zip(PROMPTS, theirs))


def test_searches_share_steps_and_each_gives_what_it_gives_alone(llama):
    """run_many (what trtllm-run does with several beam requests): searches of 2 and 3 beams side by
    side in the engine's 4 rows, the 3-beam one waiting for slots that finished ones free, one taking
    its candidates from the logits where the others take the graph's: each search's hypotheses and
    scores are bit for bit what it gives alone."""
    model, engine, eos = llama
    free = hf_beams(model, PROMPTS[1], beam.BeamParams(4, NEW, frozenset()))
    common = [t for t, _ in Counter(t for tokens, _ in free for t in tokens).most_common()]
    many = frozenset((common + [t for t in range(400) if t not in common])[:17])  # (its beams' tokens first)
    jobs = [(PROMPTS[0], beam.BeamParams(2, NEW, eos)), (PROMPTS[0], beam.BeamParams(2, 6, many, min_new_tokens=2)),
            (PROMPTS[1], beam.BeamParams(3, NEW, eos, early_stopping="never")),
            (PROMPTS[1], beam.BeamParams(2, 8, eos, length_penalty=0.5))]
    assert beam.Search(jobs[1][1], 1).width > engine.manifest.logprob_width >= beam.Search(jobs[0][1], 1).width
    assert engine.manifest.limits.max_batch_size == 4
    alone = [beam.run(engine, prompt, p) for prompt, p in jobs]
    together = beam.run_many(engine, jobs)
    assert [found for found, _ in together] == alone
    assert [base for _, base in together[:2]] == [0, 2]  # (the first two side by side)
    assert same(alone[2], hf_beams(model, *jobs[2]))


@pytest.mark.parametrize("num_logprobs", [5, 60])  # (60: wider than the graph's top_logprobs, from the logits)
def test_logprobs_are_transformers_log_softmax_along_each_hypothesis(llama, num_logprobs):
    """num_logprobs: each hypothesis token's step, its best log-probabilities and its own, are
    transformers' log_softmax of the logits along that hypothesis (teacher-forced), within float32
    rounding; they sum to its score; and asking for them leaves the hypotheses as they were."""
    model, engine, eos = llama
    p = beam.BeamParams(3, NEW, eos, min_new_tokens=2, length_penalty=0.5)
    wide = beam.BeamParams(3, NEW, eos, min_new_tokens=2, length_penalty=0.5, num_logprobs=num_logprobs)
    assert (beam.Search(wide, 1).width > engine.manifest.logprob_width) == (num_logprobs == 60)
    for prompt in PROMPTS:
        found = beam.run(engine, prompt, wide)
        assert found == beam.run(engine, prompt, p)
        for h in found:
            with torch.no_grad():
                logits = model(torch.tensor([prompt + list(h.tokens)])).logits[0, len(prompt) - 1:-1]
            theirs = torch.log_softmax(logits.double(), -1).numpy()
            assert len(h.logprobs) == len(h.tokens)
            for step, (token, (values, ids, own)) in enumerate(zip(h.tokens, h.logprobs)):
                assert len(values) == len(ids) == num_logprobs
                assert list(ids) == list(np.argsort(-theirs[step], kind="stable")[:num_logprobs])
                np.testing.assert_allclose(values, theirs[step, ids], atol=1e-4, rtol=0)
                assert own == pytest.approx(theirs[step, token], abs=1e-4)
            assert sum(own for _, _, own in h.logprobs) / len(h.tokens) ** 0.5 == pytest.approx(h.score, abs=1e-4)


# (these beams' text holds them: within a token, a multi-byte character, across tokens)
@pytest.mark.parametrize("stops", [("GPU", " Pa"), ("\u4e2d",), ("s",), ("Usw", "smal>")])
def test_stop_strings_end_hypotheses_as_transformers_stop_strings_do(llama, tiny_checkpoint, tiny_engine, stops):
    """A request's stop strings end a continuation whose text then holds one, as transformers'
    StopStringCriteria does in its beam search: its hypotheses and scores, on the tiny model's
    byte-level BPE (a multi-byte character among the stops), across length penalties."""
    model, engine, eos = llama
    ours_tok = Tokenizer.from_engine_dir(tiny_engine("llama"), engine.manifest.files)
    theirs_tok = transformers.AutoTokenizer.from_pretrained(tiny_checkpoint("llama"))
    ended = 0
    for prompt in PROMPTS:
        for length_penalty in (1.0, 0.0):
            p = beam.BeamParams(3, 16, frozenset(), length_penalty=length_penalty)
            found = beam.run(engine, prompt, dataclasses.replace(p, text=TextStream(ours_tok, stops)))
            assert same(found, hf_beams(model, prompt, p, stops, theirs_tok))
            ended += sum(len(h.tokens) < 16 for h in found)
    assert ended >= 2  # (the stops ended hypotheses early)


def test_wrong_variant_beams_sharing_one_text_miss(llama, tiny_checkpoint, tiny_engine, monkeypatch):
    """Each continuation's text goes on from its parent beam's own: with one text for all (no fork),
    stop strings are found in text no hypothesis has, and the answers must miss transformers'."""
    model, engine, eos = llama
    ours_tok = Tokenizer.from_engine_dir(tiny_engine("llama"), engine.manifest.files)
    theirs_tok = transformers.AutoTokenizer.from_pretrained(tiny_checkpoint("llama"))
    monkeypatch.setattr(TextStream, "fork", lambda self: self)
    stops = ("Usw", "smal>")  # (each across two tokens)
    p = beam.BeamParams(3, 16, frozenset())
    assert not all(same(beam.run(engine, prompt, dataclasses.replace(p, text=TextStream(ours_tok, stops))),
                        hf_beams(model, prompt, p, stops, theirs_tok)) for prompt in PROMPTS)


@pytest.mark.parametrize("penalty, bias", [(1.3, ()), (0.8, ()), (1.0, ((77, 2.5), (140, -1.0))), (1.5, ((77, 2.5),))])
def test_logit_bias_and_repetition_penalty_are_transformers_processors(llama, penalty, bias):
    """logit_bias and repetition_penalty shape each step's log-probabilities as transformers' beam
    search does (sequence_bias, then RepetitionPenaltyLogitsProcessor over the prompt and the beam):
    its hypotheses and scores, with EOS ids, min_new_tokens and several searches sharing steps; and
    num_logprobs still reports log_softmax(logits + logit_bias), before the penalty."""
    model, engine, eos = llama
    jobs = [(prompt, beam.BeamParams(3, NEW, eos, min_new_tokens=min_new, logit_bias=bias, repetition_penalty=penalty))
            for prompt in PROMPTS for min_new in (0, 3)]
    plain = [beam.run(engine, prompt, dataclasses.replace(p, logit_bias=(), repetition_penalty=1.0))
             for prompt, p in jobs]
    together = beam.run_many(engine, jobs, rows=6)
    for (prompt, p), (found, _), unshaped in zip(jobs, together, plain):
        assert same(found, hf_beams(model, prompt, p))
        assert found != unshaped  # (the shaping changes them)
    prompt, p = jobs[0]
    found = beam.run(engine, prompt, dataclasses.replace(p, num_logprobs=4))
    assert found == together[0][0]
    h = found[0]
    with torch.no_grad():
        logits = model(torch.tensor([prompt + list(h.tokens)])).logits[0, len(prompt) - 1:-1].double()
    dense = torch.zeros(logits.shape[1], dtype=torch.float64)
    for t, b in bias:
        dense[t] = b
    theirs = torch.log_softmax(logits + dense, -1).numpy()
    np.testing.assert_allclose([own for _, _, own in h.logprobs], theirs[np.arange(len(h.tokens)), list(h.tokens)],
                               atol=1e-4, rtol=0)
    assert [list(ids) for _, ids, _ in h.logprobs] == [list(np.argsort(-row, kind="stable")[:4]) for row in theirs]


def test_bad_words_are_transformers_bad_words_ids(llama, monkeypatch):
    """bad_words (as token sequences) mask each beam's next tokens as transformers' bad_words_ids do,
    matched against the beam's own tokens (the prompt's last ones match no word's start here, where
    transformers would match them too); allowed_token_ids keeps every hypothesis within them. The
    wrong variant, words matched against no beam (one-token words alone), must miss."""
    model, engine, _ = llama
    eos = frozenset()  # (hypotheses of every length: the words are picked from them)
    free = [beam.run(engine, prompt, beam.BeamParams(3, NEW, eos)) for prompt in PROMPTS]
    jobs = []
    for prompt, found in zip(PROMPTS, free):
        best, second = found[0].tokens, found[1].tokens
        words = (tuple(best[1:3]), tuple(second[2:5]), (best[6],))
        assert all(prompt[-1] not in w[:-1] for w in words)
        jobs.append((prompt, beam.BeamParams(3, NEW, eos, bad_words=words)))
    for (prompt, p), unshaped in zip(jobs, free):
        found = beam.run(engine, prompt, p)
        assert same(found, hf_beams(model, prompt, p)) and found != unshaped
    allowed = frozenset(range(40, 300, 3))
    found = beam.run(engine, PROMPTS[0], beam.BeamParams(3, NEW, eos, allowed_token_ids=allowed))
    assert all(set(h.tokens) <= allowed for h in found)
    monkeypatch.setattr(beam.bans, "banned_next", lambda seqs, output: {s[0] for s in seqs if len(s) == 1})
    assert not all(same(beam.run(engine, prompt, p), hf_beams(model, prompt, p)) for prompt, p in jobs)


def test_no_repeat_ngram_size_is_transformers(llama, monkeypatch):
    """no_repeat_ngram_size masks each beam's tokens that would repeat n of its prompt's and its own
    tokens in a row, as transformers' NoRepeatNGramLogitsProcessor does (the prompts end with the
    start of their best beam, which the search goes on with). The wrong variant, the prompt's
    n-grams not counted, must miss."""
    model, engine, _ = llama
    eos, jobs, changed = frozenset(), [], 0
    for prompt in PROMPTS:
        best = beam.run(engine, prompt, beam.BeamParams(3, NEW, eos))[0].tokens
        jobs += [(prompt + list(best[:6]), beam.BeamParams(3, NEW, eos, no_repeat_ngram_size=n)) for n in (1, 2, 3)]
    for prompt, p in jobs:
        found = beam.run(engine, prompt, p)
        assert same(found, hf_beams(model, prompt, p)), (prompt, p.no_repeat_ngram_size)
        changed += found != beam.run(engine, prompt, dataclasses.replace(p, no_repeat_ngram_size=0))
    assert changed >= 2  # (the bans change some searches: 2 to 4 of these 9, by the CPU's kernels)
    real = beam.bans.RepeatedNgrams.__init__
    monkeypatch.setattr(beam.bans.RepeatedNgrams, "__init__", lambda self, n, prompt: real(self, n, ()))
    assert not all(same(beam.run(engine, prompt, p), hf_beams(model, prompt, p)) for prompt, p in jobs)


def test_beams_that_bans_leave_no_token_end_the_search_with_what_finished(llama, run_cli, tiny_engine):
    """Every running beam banned from every token (allowed_token_ids whose pairs no_repeat_ngram_size
    2 uses up): transformers' search ends there with its finished hypotheses, and so does ours,
    token-exact; it failed the whole request before. With fewer finished than n, the request fails
    saying so."""
    model, engine, _ = llama
    prompt = [5, 100, 2, 7, 101, 2]
    p = beam.BeamParams(2, 12, frozenset({2}), allowed_token_ids=frozenset({100, 101, 2}), no_repeat_ngram_size=2)
    ours, theirs = beam.run(engine, prompt, p), hf_beams(model, prompt, p)
    assert ours.stuck and ours[0].finished and (ours[0].tokens, ) == theirs[0][:1]
    assert np.isclose(ours[0].score, theirs[0][1], atol=1e-4, rtol=0)
    assert not ours[1].finished


def test_bans_that_leave_fewer_tokens_than_beams_are_transformers(llama):
    """Two allowed ids under four beams: the first step's copies of beam 0 (scores -1e9) go on, and
    their continuations read beam 0's prompt KV (they read their own slots', never computed: other
    tokens and scores above the true optimum, and answers that depended on the search before). The
    wrong variant is that: a search after another gives other hypotheses than alone."""
    model, engine, _ = llama
    p = beam.BeamParams(4, 6, frozenset(), allowed_token_ids=frozenset({244, 394}))
    for prompt in PROMPTS:
        ours = beam.run(engine, prompt, p)
        assert same(ours, hf_beams(model, prompt, p)), (prompt, ours)
        other = beam.BeamParams(4, 6, frozenset(), allowed_token_ids=frozenset({7, 9, 11}))
        (first, _), (second, _) = beam.run_many(engine, [(prompt[::-1], other), (prompt, p)], rows=4)
        assert second == ours


def test_searches_share_at_most_rows_and_a_wider_one_runs_alone(llama):
    """run_many's rows bound the beams running side by side; a search of more beams than that runs
    alone, and those after it still keep to the bound (each search as alone)."""
    model, engine, eos = llama
    jobs = [(PROMPTS[0], beam.BeamParams(4, 6, eos))] + [(PROMPTS[1], beam.BeamParams(2, 6, eos))] * 3
    steps = []
    real = engine.step

    def counting(inputs, kv, want_logits=False):
        steps.append(inputs.input_ids.shape[0])
        return real(inputs, kv, want_logits)

    engine.step = counting
    try:
        together = beam.run_many(engine, jobs, rows=2)
    finally:
        del engine.step
    wide = [i for i, rows in enumerate(steps) if rows == 4]  # (the 4-beam search's steps, first)
    assert wide == list(range(1, len(wide) + 1)) and max(steps[wide[-1] + 1:]) == 2
    assert [base for _, base in together] == [0, 0, 0, 0]  # (one 2-beam search at a time, in slots 0-1)
    assert [found for found, _ in together] == [beam.run(engine, prompt, p) for prompt, p in jobs]


def test_a_stop_in_text_the_decoder_holds_back_ends_at_its_token(llama, tiny_checkpoint, tiny_engine):
    """A token whose bytes are letters and the start of a character the next token would complete:
    the decoder holds its text back, and a stop string made of those letters ends the hypothesis at
    that token, as transformers' byte-wise StopStringCriteria ends it (not a token later)."""
    model, engine, eos = llama
    ours_tok = Tokenizer.from_engine_dir(tiny_engine("llama"), engine.manifest.files)
    theirs_tok = transformers.AutoTokenizer.from_pretrained(tiny_checkpoint("llama"))
    token = next(i for i in range(engine.manifest.model.vocab_size) if len(b := ours_tok.token_bytes(i)) >= 2
                 and b[:-1].isalpha() and 0xC2 <= b[-1] <= 0xF4)
    stops = (ours_tok.token_bytes(token)[:-1].decode(),)
    p = beam.BeamParams(3, 8, frozenset(), logit_bias=((token, 8.0),))  # (so the beams write it)
    for prompt in PROMPTS:
        found = beam.run(engine, prompt, dataclasses.replace(p, text=TextStream(ours_tok, stops)))
        assert same(found, hf_beams(model, prompt, p, stops, theirs_tok))
        assert any(h.tokens[-1] == token for h in found)


@pytest.mark.parametrize("kind, text", [("regex", "(the|cat|dog| )+[.!]"), ("choice", '["the cat", "a dog sat", "cats"]')])
def test_guided_beams_are_transformers_beams_under_the_same_grammar(llama, tiny_engine, kind, text, monkeypatch):
    """guided_decoding with beams: each beam's next tokens are those its own grammar place allows
    (-inf elsewhere), as transformers' prefix_allowed_tokens_fn masks them, given the grammar's
    allowed tokens after each beam's tokens: the same hypotheses and scores. An answer that ends at
    EOS is a whole match."""
    import re

    from trtllm.runtime.grammar import Grammars, Matcher
    from trtllm.runtime.guided import Guide

    model, engine, _ = llama
    tok = Tokenizer.from_engine_dir(tiny_engine("llama"), engine.manifest.files)
    eos = engine.manifest.eos_token_ids
    grammars = Grammars(tok.to_json(), engine.manifest.model.vocab_size, eos, tok.vocab_size)
    guide = Guide(kind, text, f"guided_decoding.{kind}")

    def allowed(prompt):
        def fn(batch_id, ids):
            matcher = grammars.matcher(guide)
            for t in ids[len(prompt):].tolist():
                if matcher.consume(t):  # (a beam its grammar never allowed: its score is -inf anyway)
                    return list(range(engine.manifest.model.vocab_size))
            return np.flatnonzero(matcher.allowed()).tolist()
        return fn

    def hf(prompt):
        with torch.no_grad():
            out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.int64),
                                 num_beams=3, num_return_sequences=3, do_sample=False, max_new_tokens=10,
                                 eos_token_id=list(eos), pad_token_id=0, return_dict_in_generate=True,
                                 output_scores=True, prefix_allowed_tokens_fn=allowed(prompt))
        theirs = []
        for seq, score in zip(out.sequences[:, len(prompt):].tolist(), out.sequences_scores.tolist()):
            end = next((i + 1 for i, t in enumerate(seq) if t in eos), len(seq))
            theirs.append((tuple(seq[:end]), score))
        return theirs

    whole = 0
    for prompt in PROMPTS:
        found = beam.run(engine, prompt, beam.BeamParams(3, 10, frozenset(eos), guide=grammars.matcher(guide)))
        assert same(found, hf(prompt))
        for h in found:
            if h.tokens and h.tokens[-1] in eos:
                answer = tok.decode(list(h.tokens[:-1]))
                assert re.fullmatch(text, answer) if kind == "regex" else answer in json.loads(text)
                whole += 1
    assert whole  # (some hypotheses ended at EOS, each a whole match)
    # the wrong variant: every continuation consuming its token in one shared matcher must miss
    monkeypatch.setattr(Matcher, "copy", lambda self: self)
    for prompt in PROMPTS:
        try:
            wrong = beam.run(engine, prompt, beam.BeamParams(3, 10, frozenset(eos), guide=grammars.matcher(guide)))
        except ValueError:  # (the shared matcher refuses a token another beam's place allowed)
            continue
        assert not same(wrong, hf(prompt))
