"""vLLM's `bad_words` and `allowed_token_ids` (runtime/bans.py): read with their JSON paths, tokenized
as vLLM tokenizes them, and applied as -inf in the row's penalty bias, which follows each token.
Greedy answers are transformers' with the same `bad_words_ids` (its NoBadWordsLogitsProcessor) and,
for allowed_token_ids, the argmax over the allowed ids of transformers' logits; speculation
(--spec-ngram) gives plain decoding's answers. The wrong variant, a ban that never changes after the
first token, must give other tokens."""
from __future__ import annotations

import dataclasses
import json
import re

import numpy as np
import pytest

from trtllm.runtime import bans, sampling
from trtllm.runtime.input_format import InputError, parse_input
from trtllm.runtime.input_checks import check_against_engine

pytestmark = pytest.mark.hf

def chat(text="Hello", **extra):
    return {"messages": [{"role": "user", "content": text}], **extra}


@pytest.mark.parametrize("field, value, path, says", [
    ("bad_words", "word", "requests[0].bad_words", "an array of at most 128 non-empty strings"),
    ("bad_words", ["ok", ""], "requests[0].bad_words[1]", "a non-empty string"),
    ("bad_words", ["ok", "  "], "requests[0].bad_words[1]", "a word (its leading blanks"),
    ("bad_words", ["x"] * 129, "requests[0].bad_words", "at most 128"),
    ("bad_words", ["x" * 257], "requests[0].bad_words[0]", "at most 256 characters"),
    ("allowed_token_ids", [], "requests[0].allowed_token_ids", "a non-empty array of token ids"),
    ("allowed_token_ids", [1, -2], "requests[0].allowed_token_ids[1]", ">= 0"),
    ("allowed_token_ids", [1, 2.5], "requests[0].allowed_token_ids[1]", "an integer"),
])
def test_bad_values_name_their_path(field, value, path, says):
    with pytest.raises(InputError) as e:
        parse_input({"requests": [chat(**{field: value})]})
    assert e.value.json_path == path and says in str(e.value)


def test_values_inherit_and_null_turns_them_off():
    inp = parse_input({"bad_words": ["a b"], "allowed_token_ids": [3, 4],
                       "requests": [chat(), chat(bad_words=None, allowed_token_ids=None), chat(bad_words=["c"])]})
    assert [r.bad_words for r in inp.requests] == [("a b",), (), ("c",)]
    assert [r.allowed_token_ids for r in inp.requests] == [(3, 4), None, (3, 4)]
    checked = parse_input({"allowed_token_ids": [3, 40], "requests": [chat(), chat(allowed_token_ids=[1, 99])]})
    assert check_against_engine(checked, 40) == [
        (0, "`allowed_token_ids[1]` must be a token id below the vocabulary size 40, got 40"),
        (1, "`requests[1].allowed_token_ids[1]` must be a token id below the vocabulary size 40, got 99")]


def test_sequences_follow_vllms_two_spellings():
    """The word without leading blanks, and with one space before it where that is as many tokens
    with another first one (vLLM's update_from_tokenizer)."""
    vocab = {"cat": [1], " cat": [2], "big dog": [3, 4], " big dog": [5, 4], "zz": [6, 6], " zz": [7],
             "same": [8], " same": [8]}
    encode = vocab.__getitem__
    assert bans.sequences(["cat", "  big dog", "zz", "same"], encode) == ((1,), (2,), (3, 4), (5, 4), (6, 6), (8,))
    seqs, error = bans.request_sequences(["cat", "zz"], lambda t, add_special_tokens: vocab[t], 6, "bad_words")
    assert seqs == () and error == "`bad_words[1]` 'zz' has token 6, past the model's vocabulary size 6 (a token the tokenizer adds)"


def test_banned_next_matches_the_answers_last_tokens():
    seqs = ((9,), (1, 2), (1, 1, 3))
    assert bans.banned_next(seqs, ()) == {9}
    assert bans.banned_next(seqs, (5, 1)) == {9, 2}
    assert bans.banned_next(seqs, (1, 1)) == {9, 2, 3}
    assert bans.banned_next(seqs, (1, 2)) == {9}
    assert bans.banned_next(seqs, (1, 2, 7), 1) == {9, 2} and bans.banned_next(seqs, (1, 2, 7), 2) == {9}


def test_penalty_bias_follows_the_answer():
    """A ban lifts when its prefix stops matching, back to the token's frequency/presence value;
    allowed_token_ids' -inf outlives min_new_tokens' ban on EOS."""
    p = sampling.SamplingParams(temperature=0, frequency_penalty=0.5, presence_penalty=0.25, min_new_tokens=2,
                                bad_words=((1, 2), (7,)), allowed_token_ids=frozenset({1, 2, 3, 7}))
    batch = sampling.make_batch([p], 10, 8, banned=[frozenset({3, 4})])
    pb = batch.penalty_bias[0]
    assert np.isneginf(pb[[0, 3, 4, 5, 7]]).all() and pb[1] == pb[2] == 0
    counts, out = {}, []
    for token in (2, 1, 2):  # (2 after 1 is the banned pair: a pick by hand, past the sampler)
        out.append(token)
        counts[token] = counts.get(token, 0) + 1
        sampling.penalize(batch, 0, p, counts, token, len(out), frozenset({3, 4}), out)
        if out == [2]:
            assert pb[2] == -0.75 and np.isneginf(pb[3])
        if out == [2, 1]:  # the ban on EOS ends; 2 is banned after 1
            assert np.isneginf(pb[2]) and pb[3] == 0 and np.isneginf(pb[4]) and pb[1] == -0.75
    assert pb[2] == -1.25 and np.isneginf(pb[[0, 4, 5, 7]]).all()
    # a token that changes no ban leaves the row's version (a device copy of its [V] arrays on TensorRT)
    q = sampling.SamplingParams(temperature=0, bad_words=((1, 2), (7,)))
    batch = sampling.make_batch([q], 10, 8)
    before = int(batch.version[0])
    sampling.penalize(batch, 0, q, {5: 1}, 5, 1, frozenset(), [5])
    assert batch.version[0] == before and np.isneginf(batch.penalty_bias[0, 7])
    sampling.penalize(batch, 0, q, {5: 1, 1: 1}, 1, 2, frozenset(), [5, 1])
    assert batch.version[0] == before + 1 and np.isneginf(batch.penalty_bias[0, [2, 7]]).all()


@pytest.fixture(scope="module")
def model(tiny_checkpoint):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    return transformers.AutoModelForCausalLM.from_pretrained(tiny_checkpoint("llama"), dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def engine(tiny_engine):
    from trtllm.runtime.engine import load_engine

    return load_engine(tiny_engine("llama"))


PROMPTS = [[5, 17, 42, 99, 7], [30, 31, 32, 33], [200, 11, 3], [3, 200, 11, 3, 200]]


def run_rows_of(engine, params, lookup=None, prompts=PROMPTS):
    """The rows of `params` over `prompts` (sample i seeded i), run to their end; and the timing."""
    from trtllm.runtime.generate import RowState, Timing, run_rows

    rows = [RowState(prompt_ids=p, params=q, rng=np.random.default_rng(i), eos_ids=frozenset())
            for i, (p, q) in enumerate(zip(prompts, params))]
    timing = Timing()
    run_rows(engine, rows, None, timing, lookup=lookup)
    return rows, timing


def plain(engine, params, lookup=None, prompts=PROMPTS):
    rows, timing = run_rows_of(engine, params, lookup, prompts)
    return [r.output_ids for r in rows], timing


def banned_pairs(free: list[int]) -> tuple[tuple[int, ...], ...]:
    """Words the free answer has: its 4th-5th tokens, its 13th-15th, and its 21st alone."""
    return tuple(free[3:5]), tuple(free[12:15]), (free[20],)


def test_bad_words_match_transformers(engine, model, monkeypatch):
    import torch

    free, _ = plain(engine, [sampling.SamplingParams(temperature=0, max_new_tokens=24)] * len(PROMPTS))
    params = [sampling.SamplingParams(temperature=0, max_new_tokens=24, bad_words=banned_pairs(f)) for f in free]
    got, _ = plain(engine, params)
    for prompt, p, ids, f in zip(PROMPTS, params, got, free):
        assert all(prompt[-1] not in s[:-1] for s in p.bad_words)  # (transformers matches the prompt's tokens too)
        with torch.no_grad():
            hf = model.generate(torch.tensor([prompt]), max_new_tokens=24, min_new_tokens=24, do_sample=False,
                                bad_words_ids=[list(s) for s in p.bad_words], eos_token_id=None)
        assert ids == hf[0, len(prompt):].tolist() and ids != f
    # the wrong variant: bans never follow the answer (the first token's, one-token words', at every step)
    monkeypatch.setattr(bans, "banned_next", lambda seqs, output, end=None: {s[0] for s in seqs if len(s) == 1})
    assert plain(engine, params)[0] != got


def test_allowed_token_ids_take_the_argmax_over_them(engine, model):
    import torch

    allowed = frozenset(range(40, 300, 7))
    params = [sampling.SamplingParams(temperature=0, max_new_tokens=12, allowed_token_ids=allowed),
              sampling.SamplingParams(temperature=0.9, top_k=0, top_p=1.0, max_new_tokens=12, allowed_token_ids=allowed)]
    got, _ = plain(engine, params)
    assert all(set(ids) <= allowed for ids in got)
    ids = list(PROMPTS[0])
    index = np.array(sorted(allowed))
    for _ in range(12):
        with torch.no_grad():
            x = model(torch.tensor([ids])).logits[0, -1].numpy()
        ids.append(int(index[np.argmax(x[index])]))
    assert got[0] == ids[len(PROMPTS[0]):]
    # and bad words beside them: words of that answer (its 4th token, its 7th-8th) are banned, the rest allowed
    word, pair = got[0][3], tuple(got[0][6:8])
    banned, _ = plain(engine, [dataclasses.replace(params[0], bad_words=((word,), pair))])
    assert set(banned[0]) <= allowed and banned[0] != got[0] and word not in banned[0]
    assert all(tuple(banned[0][i:i + 2]) != pair for i in range(11))


def test_ngram_speculation_gives_plain_answers(engine, monkeypatch):
    """Rows whose bad words have several tokens are walked on the host (spec_rules.changing): guesses
    that would complete a banned word are rejected where plain decoding bans them, greedy and sampled
    (seeded: the same draws). The wrong variant, a sampled row's positions drawn by the graph under
    the step's first bans, must give other tokens."""
    prompts = [list(range(30, 52)) * 2, [5, 17, 42, 99, 7] * 5, [3, 200, 11, 3, 200], [7, 7, 7, 7]]
    base = [sampling.SamplingParams(temperature=t, top_k=0, top_p=1.0, max_new_tokens=30) for t in (0, 0.3, 0, 0.5)]
    free, _ = plain(engine, base, prompts=prompts)
    params = [dataclasses.replace(p, bad_words=banned_pairs(f)) for p, f in zip(base, free)]
    want, _ = plain(engine, params, prompts=prompts)
    assert all(w != f for w, f in zip(want, free))
    got = lookup_gives(engine, params, want, free, prompts, monkeypatch)
    assert got[0] == want[0] and got[2] == want[2]  # (greedy rows are walked anyway)
    assert got[1] != want[1] or got[3] != want[3]


def lookup_gives(engine, params, want, free, prompts, monkeypatch) -> list[list[int]]:
    """--spec-ngram gives plain decoding's answers `want`: guesses from them, and from the answers
    `free` without the bans (that break them), and the real lookup. Returns the wrong variant's
    answers: the guesses from `free` with no row walked on the host (the graph's draws at every
    position, under a step's first bans)."""
    from tests.runtime.test_ngram_walked import oracle
    from trtllm.runtime import ngram

    for texts in ([p + w for p, w in zip(prompts, want)], [p + f for p, f in zip(prompts, free)]):
        got, timing = plain(engine, params, oracle(texts, 4), prompts=prompts)
        assert got == want and timing.drafted_tokens > 0
    assert plain(engine, params, ngram.Lookup(3, adaptive=False), prompts=prompts)[0] == want
    monkeypatch.setattr(ngram.NgramScheduler, "walked", lambda self, row: False)
    return plain(engine, params, oracle([p + f for p, f in zip(prompts, free)], 4), prompts=prompts)[0]


def test_through_trtllm_run(run_cli, tiny_engine):
    """Words are tokenized by the engine's tokenizer; a word past the vocabulary fails its request alone."""
    engine = tiny_engine("llama")
    payload = {"temperature": 0, "max_generate_length": 16, "requests": [chat("The quick brown fox")]}
    _, free = run_cli(engine, payload)
    text = free["responses"][0]["output_text"]
    word = text.split()[1] if len(text.split()) > 1 else text.strip()[:3]
    _, out = run_cli(engine, {**payload, "requests": [chat("The quick brown fox", bad_words=[word]),
                                                      chat("Hi", allowed_token_ids=[10**6])]})
    first, second = out["responses"]
    assert first["finish_reason"] == "max-length" and first["output_text"] != text
    assert second["finish_reason"] == "error" and "requests[1].allowed_token_ids[0]" in second["error"]


@pytest.fixture(scope="module")
def standard_engine(tiny_checkpoint, tmp_path_factory):
    """The tiny model on ONNX Runtime's own kernels: the standard-op sampler (TensorRT's), which takes
    token 0 where every token is banned (ours answers -1)."""
    from trtllm.builder.config import BuildConfig
    from trtllm.builder.export import build
    from trtllm.runtime.engine import load_engine

    out = tmp_path_factory.mktemp("bans-ort") / "engine"
    build(BuildConfig(model=str(tiny_checkpoint("llama")), output=str(out), cpu_kernels="onnxruntime",
                      max_batch_size=4, max_input_len=256, max_kv_cache_capacity=512), log=lambda m: None)
    return load_engine(out)


@pytest.mark.parametrize("which", ["ours", "standard"])
def test_bans_that_leave_no_token_fail_the_row_alone(engine, standard_engine, which):
    """allowed_token_ids {77} with the word 77 77: the second token has nothing left. The row fails
    there, saying so (not as an overflow), and never takes a token it may not (the standard-op sampler
    answers token 0); its neighbour is answered. Greedy and sampled, with speculation too."""
    from trtllm.runtime import ngram

    eng = engine if which == "ours" else standard_engine
    stuck = [sampling.SamplingParams(temperature=t, top_k=0, top_p=1.0, max_new_tokens=8,
                                     allowed_token_ids=frozenset({77}), bad_words=((77, 77),)) for t in (0, 0.7)]
    free = sampling.SamplingParams(temperature=0, max_new_tokens=8)
    for lookup in (None, ngram.Lookup(3, adaptive=False)):
        rows, _ = run_rows_of(eng, [stuck[0], free, stuck[1]], lookup)
        for row in (rows[0], rows[2]):
            assert row.output_ids == [77] and row.finish_reason == "error", (row.output_ids, row.error)
            assert row.error == ("no token can come at its token 2: `allowed_token_ids` and `bad_words` ban every one")
        assert rows[1].finish_reason == "max-length" and len(rows[1].output_ids) == 8


def test_bans_that_leave_no_first_token_are_refused_before_the_run(run_cli, tiny_engine):
    engine = tiny_engine("llama")
    eos = json.loads((engine / "manifest.json").read_text())["eos_token_ids"][0]
    _, out = run_cli(engine, {"temperature": 0, "max_generate_length": 4, "allowed_token_ids": [eos, 9], "requests": [
        chat(min_new_tokens=2, stop_token_ids=[9]), chat(bad_words=["x"], allowed_token_ids=[]), chat(min_new_tokens=2),
        chat(allowed_token_ids=[200, 201], no_repeat_ngram_size=1)]})
    first, second, third, fourth = out["responses"]
    assert first["error"] == ("`allowed_token_ids`: the ids allowed_token_ids leaves are all EOS or stop_token_ids, "
                              "which min_new_tokens holds back for its first tokens: no token could come")
    assert "requests[1].allowed_token_ids" in second["error"]  # (empty: refused when read)
    assert third["finish_reason"] == "max-length" and set(third["output_ids"]) == {9}
    # bans that leave none later on: the error names the settings by their paths (a review found it
    # naming them bare: in a long file, which request's, the top level's or its own?)
    assert re.fullmatch(r"no token can come at its token [23]: `requests\[3\]\.allowed_token_ids` and "
                        r"`requests\[3\]\.no_repeat_ngram_size` ban every one", fourth["error"]), fourth


def test_a_beam_search_its_bans_leave_no_token_fails_saying_so(engine):
    from trtllm.runtime import beam

    p = beam.BeamParams(2, 6, frozenset(), allowed_token_ids=frozenset({77}), bad_words=((77, 77),))
    with pytest.raises(ValueError, match="no token can come at token 2 of any beam: `allowed_token_ids` and `bad_words` "
                                         "ban every one"):
        beam.run(engine, PROMPTS[0], p)
