"""transformers' `no_repeat_ngram_size` (runtime/bans.py RepeatedNgrams): read with its JSON path,
its bans those of transformers' NoRepeatNGramLogitsProcessor over the prompt and the answer, as -inf
in the row's penalty bias. Greedy answers are transformers' generate(no_repeat_ngram_size=n) token
for token, with a repetition penalty too; speculation (--spec-ngram) gives plain decoding's answers.
The wrong variant, n-grams of the answer alone (the prompt's not counted), must give other tokens."""
from __future__ import annotations

import random

import numpy as np
import pytest

from tests.runtime.test_bans import (chat, engine, lookup_gives, model, plain, run_rows_of,  # noqa: F401 (fixtures)
                                     standard_engine)
from trtllm.runtime import bans, sampling
from trtllm.runtime.input_format import InputError, parse_input

pytestmark = pytest.mark.hf



@pytest.fixture(scope="module")
def prompts(engine):
    """Prompts that end with the start of the tiny model's own answer to them, which it goes on
    with: the n-grams it wants next are often the prompt's."""
    from tests.runtime.test_bans import PROMPTS

    free, _ = plain(engine, [sampling.SamplingParams(temperature=0, max_new_tokens=8)] * len(PROMPTS))
    return [p + f for p, f in zip(PROMPTS, free)]


@pytest.mark.parametrize("value, says", [(-1, ">= 0"), (2.5, "an integer"), (True, "an integer"), ("3", "an integer")])
def test_bad_values_name_their_path(value, says):
    with pytest.raises(InputError) as e:
        parse_input({"requests": [chat(no_repeat_ngram_size=value)]})
    assert e.value.json_path == "requests[0].no_repeat_ngram_size" and says in str(e.value)
    inp = parse_input({"no_repeat_ngram_size": 3, "requests": [chat(), chat(no_repeat_ngram_size=0)]})
    assert [r.no_repeat_ngram_size for r in inp.requests] == [3, 0]


def test_the_index_bans_what_transformers_bans():
    """Random token runs over a small vocabulary (many repeats), n from 1 to 5: the ids banned after
    each token, kept up to date (`add`) and looked up for a beam (`banned_after`), are those
    transformers' processor sets to -inf."""
    torch = pytest.importorskip("torch")
    from transformers.generation.logits_process import NoRepeatNGramLogitsProcessor

    def theirs(n, tokens):
        scores = NoRepeatNGramLogitsProcessor(n)(torch.tensor([tokens]), torch.zeros(1, 6))
        return set(torch.nonzero(torch.isinf(scores[0])).flatten().tolist())

    rng = random.Random(0)
    for _ in range(400):
        n, prompt = rng.randint(1, 5), [rng.randrange(6) for _ in range(rng.randint(1, 8))]
        answer = [rng.randrange(6) for _ in range(rng.randint(0, 10))]
        kept, fixed = bans.RepeatedNgrams(n, prompt), bans.RepeatedNgrams(n, prompt)
        assert kept.banned() == theirs(n, prompt)
        for i, token in enumerate(answer):
            before = kept.banned()
            kept.add(token)
            tokens = prompt + answer[:i + 1]
            assert kept.before == before and kept.banned() == theirs(n, tokens) == fixed.banned_after(answer[:i + 1])


def test_penalty_bias_follows_the_answer():
    """set_row bans what the prompt's n-grams ban first; penalize lifts what they banned before the
    token back to its penalty value, and bans what they ban now."""
    p = sampling.SamplingParams(temperature=0, no_repeat_ngram_size=2, presence_penalty=0.5)
    prompt = [4, 6, 4, 8, 2]
    repeats = bans.RepeatedNgrams(2, prompt)
    batch = sampling.make_batch([p], 12, 12)
    sampling.set_row(batch, 0, p, 12, prompt, frozenset(), repeats)
    assert np.flatnonzero(np.isneginf(batch.penalty_bias[0])).tolist() == []  # (2 has not come before)
    counts = {}
    for token, banned in ((4, [6, 8]), (6, [4]), (8, [2])):
        counts[token] = counts.get(token, 0) + 1
        repeats.add(token)
        sampling.penalize(batch, 0, p, counts, token, sum(counts.values()), frozenset(), (), repeats)
        assert np.flatnonzero(np.isneginf(batch.penalty_bias[0])).tolist() == banned
    assert (batch.penalty_bias[0, [4, 6, 8]] == -0.5).all()  # (bans lifted to the presence penalty)


def test_greedy_answers_are_transformers(engine, model, prompts, monkeypatch):
    import torch

    sizes, new = (2, 1, 1, 3), 24
    params = [sampling.SamplingParams(temperature=0, max_new_tokens=new, no_repeat_ngram_size=n,
                                      repetition_penalty=1.3 if i == 3 else 1.0) for i, n in enumerate(sizes)]
    free, _ = plain(engine, [sampling.SamplingParams(temperature=0, max_new_tokens=new)] * len(prompts), prompts=prompts)
    got, _ = plain(engine, params, prompts=prompts)
    for prompt, p, ids, f in zip(prompts, params, got, free):
        with torch.no_grad():
            hf = model.generate(torch.tensor([prompt]), max_new_tokens=new, min_new_tokens=new, do_sample=False,
                                no_repeat_ngram_size=p.no_repeat_ngram_size, repetition_penalty=p.repetition_penalty,
                                eos_token_id=None)
        assert ids == hf[0, len(prompt):].tolist()
    assert sum(g != f for g, f in zip(got, free)) >= 2
    # the wrong variant: the answer's n-grams alone
    real = bans.RepeatedNgrams.__init__
    monkeypatch.setattr(bans.RepeatedNgrams, "__init__", lambda self, n, prompt: real(self, n, ()))
    assert plain(engine, params, prompts=prompts)[0] != got


def test_speculation_gives_plain_answers(engine, prompts, monkeypatch):
    """The bans change with every token (SamplingParams.changing_bans): --spec-ngram walks such rows
    on the host, greedy and sampled (seeded: the same draws), as plain decoding bans. The wrong
    variant, a sampled row's positions drawn by the graph under the step's first bans, differs."""
    params = [sampling.SamplingParams(temperature=t, top_k=0, top_p=1.0, max_new_tokens=30, no_repeat_ngram_size=n)
              for t, n in ((0, 1), (0.3, 2), (0, 2), (0.5, 1))]
    want, _ = plain(engine, params, prompts=prompts)
    free, _ = plain(engine, [sampling.SamplingParams(temperature=t, top_k=0, top_p=1.0, max_new_tokens=30)
                             for t in (0, 0.3, 0, 0.5)], prompts=prompts)
    assert sum(w != f for w, f in zip(want, free)) >= 3
    got = lookup_gives(engine, params, want, free, prompts, monkeypatch)
    assert got[1] != want[1] or got[3] != want[3]


@pytest.mark.parametrize("which", ["ours", "standard"])
def test_bans_that_leave_no_token_fail_the_row_alone(engine, standard_engine, prompts, which):
    """n = 1 within allowed_token_ids {77, 78}: the third token has nothing left. The row fails there,
    naming both settings, on either sampler (the standard-op one answers token 0); its neighbour runs on."""
    eng = engine if which == "ours" else standard_engine
    stuck = sampling.SamplingParams(temperature=0, max_new_tokens=8, allowed_token_ids=frozenset({77, 78}),
                                    no_repeat_ngram_size=1)
    rows, _ = run_rows_of(eng, [stuck, sampling.SamplingParams(temperature=0, max_new_tokens=8)], prompts=prompts[:2])
    assert sorted(rows[0].output_ids) == [77, 78] and rows[0].finish_reason == "error"
    assert rows[0].error == ("no token can come at its token 3: `allowed_token_ids` and `no_repeat_ngram_size` ban every one")
    assert rows[1].finish_reason == "max-length" and len(rows[1].output_ids) == 8


def test_through_trtllm_run(run_cli, tiny_engine):
    """The file's setting reaches every request (its own 0 turns it off), and beam search takes it;
    no answer repeats n tokens of its prompt and answer."""
    engine = tiny_engine("llama")
    _, out = run_cli(engine, {"temperature": 0, "max_generate_length": 30, "no_repeat_ngram_size": 2, "requests": [
        chat("the the the the the"), chat("the the the the the", no_repeat_ngram_size=0),
        chat("the the the the the", num_beams=2)]})
    for response in out["responses"][::2]:
        assert response["finish_reason"] in ("max-length", "end-of-sequence"), response
        ids = response["output_ids"]
        pairs = list(zip(ids, ids[1:]))
        assert len(pairs) == len(set(pairs))
    assert out["responses"][1]["output_ids"] != out["responses"][0]["output_ids"]


def test_bans_that_leave_no_first_token_are_refused_before_the_run(run_cli, tiny_engine):
    """allowed_token_ids all in the prompt, with n = 1: no first token whatever the model says."""
    from trtllm.runtime.engine import load_engine
    from trtllm.runtime.tokenizer import Tokenizer

    engine = tiny_engine("llama")
    ids = Tokenizer.from_engine_dir(engine, load_engine(engine).manifest.files).encode("seven eight")
    payload = {"apply_chat_template": False, "temperature": 0, "max_generate_length": 4, "requests": [
        chat("seven eight", allowed_token_ids=ids, no_repeat_ngram_size=1),
        chat("seven eight", allowed_token_ids=ids, no_repeat_ngram_size=2)]}
    _, out = run_cli(engine, payload)
    first, second = out["responses"]
    assert first["error"] == ("`requests[0].allowed_token_ids`: the ids allowed_token_ids leaves would each repeat "
                              "an n-gram of the prompt (no_repeat_ngram_size): no token could come")
    assert second["finish_reason"] == "max-length" and set(second["output_ids"]) <= set(ids)
