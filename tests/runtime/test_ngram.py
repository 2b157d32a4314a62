"""--spec-ngram (prompt lookup decoding, runtime/ngram.py): the guesses, and answers token-exact with
plain decoding for greedy rows beside sampled, penalized, logprobs and min_new_tokens ones, in flight,
with chunked prompts, at the length and KV limits. The wrong variant, guesses taken unchecked, must
change the answers."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from trtllm.runtime import ngram
from trtllm.runtime.engine import load_engine
from trtllm.runtime.generate import RowState, Timing, run_rows
from trtllm.runtime.sampling import SamplingParams

pytestmark = pytest.mark.hf
LOOPING = [list(range(30, 52)) * 2, [5, 17, 42, 99, 7] * 5, [3, 200, 11, 3, 200], list(range(100, 140, 3))]


def test_guesses_follow_the_most_recent_longest_match():
    look = ngram.Lookup(3, adaptive=False)
    assert look.propose([1, 2, 3, 9, 9, 1, 2, 3, 8, 7, 1, 2, 3]) == [8, 7, 1]  # the latest of two matches
    assert look.propose([5, 6, 7, 1, 2, 3, 4, 0, 2, 3, 4]) == [0, 2, 3]  # "2 3 4" (n=3) before "3 4"
    assert look.propose([4, 1, 2, 9, 1, 2]) == [9, 1, 2]
    assert look.propose([1, 2, 3, 4, 1, 2]) == [3, 4, 1]
    assert look.propose([7, 1, 8, 1]) == []  # one token alone matches nothing (MIN_NGRAM 2)
    assert look.propose([1, 2, 1, 2]) == [1, 2, 1]  # a loop shorter than k: the copy goes on through it
    assert ngram.Lookup(7).propose([9, 5, 6, 7, 5, 6]) == [7, 5, 6, 7, 5, 6, 7]
    assert ngram.Lookup(2).propose([9, 5, 6, 7, 5, 6]) == [7, 5]
    assert look.propose([1]) == [] and look.propose([]) == []


def rows_for(prompts, **params):
    made = []
    for i, p in enumerate(prompts):
        kind = params.get("kinds", ["greedy"] * len(prompts))[i]
        sp = {"greedy": dict(temperature=0.0), "sampled": dict(temperature=0.9, top_k=20),
              "penalized": dict(temperature=0.0, repetition_penalty=1.3), "logprobs": dict(temperature=0.0, num_logprobs=3),
              "min_new": dict(temperature=0.0, min_new_tokens=params.get("min_new", 20)),
              # draws that mostly follow the argmax (guesses hold) and sometimes not (they are replaced)
              "cold": dict(temperature=0.05, top_p=0.95),
              "cold_min_new": dict(temperature=0.05, min_new_tokens=params.get("min_new", 20)),
              "cold_biased": dict(temperature=0.05, min_p=0.05, logit_bias={3: 2.0, 200: -5.0}),
              "sampled_logprobs": dict(temperature=0.9, top_p=0.9, num_logprobs=4, logit_bias={7: 1.5})}[kind]
        made.append(RowState(prompt_ids=p, params=SamplingParams(max_new_tokens=params.get("n", 40), **sp),
                             rng=np.random.default_rng(i), eos_ids=frozenset(params.get("eos", ()))))
    return made


class Answer(tuple):
    """(output ids, finish reason, (top logprobs, top ids, each token's logprob)): equal where the
    tokens, the finish and the top ids are, and the logprobs within float32 rounding (a checked
    position's come from numpy, a plain step's from the graph's sampler)."""

    def __eq__(self, other):
        (ids, why, (top, top_ids, own)), (ids2, why2, (top2, top_ids2, own2)) = self, other
        return (ids == ids2 and why == why2 and top_ids == top_ids2 and len(top) == len(top2)
                and np.allclose(top, top2, atol=1e-5) and np.allclose(own, own2, atol=1e-5))

    __hash__ = tuple.__hash__


def answers(engine, prompts, lookup=None, num_slots=None, prefill_chunk=0, **params):
    rows, timing = rows_for(prompts, **params), Timing()
    run_rows(engine, rows, num_slots, timing, prefill_chunk=prefill_chunk, lookup=lookup)
    # (a plain step gives every row the batch's widest logprobs; the response keeps the row's own k)
    return [Answer((r.output_ids, r.finish_reason, ([v[0][:r.params.num_logprobs].tolist() for v in r.logprobs],
                                                    [v[1][:r.params.num_logprobs].tolist() for v in r.logprobs],
                                                    r.token_logprobs)))
            for r in rows], timing


@pytest.fixture(scope="module")
def engine(tiny_engine):
    return load_engine(tiny_engine("llama"))


@pytest.mark.parametrize("k", [1, 4, 9])
def test_greedy_answers_are_plain_decoding_s(engine, k):
    want, _ = answers(engine, LOOPING)
    got, timing = answers(engine, LOOPING, ngram.Lookup(k, adaptive=False))
    assert got == want
    # both ways a guess goes were taken: held, and replaced by the model's own choice
    assert timing.verify_runs > 0 and 0 < timing.accepted_tokens < timing.drafted_tokens
    assert timing.generated_tokens == sum(len(a[0]) for a in got) - len(got)  # (each prefill's first one aside)
    alone, timing = answers(engine, LOOPING[2:3], ngram.Lookup(k, adaptive=False))  # an answer that loops: fewer steps than tokens
    assert alone == want[2:3] and timing.generation_runs < 39


def test_other_rows_in_the_same_steps_are_as_without_it(engine):
    kinds = ["sampled", "penalized", "greedy", "logprobs", "min_new", "greedy"]  # (the third's answer loops)
    prompts = LOOPING + [[9, 8, 7, 9, 8, 7, 9], list(range(60, 90))]
    prompts = prompts[:len(kinds)]
    eos = [int(np.bincount(sum(prompts, [])).argmax())]  # an id the answers produce: EOS ends some
    want, _ = answers(engine, prompts, kinds=kinds, eos=eos)
    got, timing = answers(engine, prompts, ngram.Lookup(4, adaptive=False), kinds=kinds, eos=eos)
    assert got == want and timing.accepted_tokens > 0


def test_a_ban_that_ends_inside_a_step(engine):
    """min_new_tokens bans EOS until its end: where that end falls right after a run of guesses that
    hold, the token after them is chosen without the ban, as plain decoding chooses it (the graph's
    sampler had the step's first biases). EOS is the answer's token q, new there, and q tokens are
    its min_new_tokens: plain decoding ends right at it (at q = 36 the guesses before it hold)."""
    plain = answers(engine, LOOPING[2:3])[0][0][0]
    for q in range(30, 39):
        if plain[q] in plain[:q]:
            continue
        for k in (1, 2, 4):
            want, _ = answers(engine, LOOPING[2:3], kinds=["min_new"], min_new=q, eos=[plain[q]])
            got, _ = answers(engine, LOOPING[2:3], ngram.Lookup(k, adaptive=False), kinds=["min_new"], min_new=q, eos=[plain[q]])
            assert got == want, (q, k)
            assert want[0][1] == "end-of-sequence" and len(want[0][0]) == q + 1


def test_disable_spec_decode_is_honoured(engine):
    rows = rows_for(LOOPING[2:3])
    rows[0].speculative = False  # (the request's disable_spec_decode)
    timing = Timing()
    run_rows(engine, rows, timing=timing, lookup=ngram.Lookup(4, adaptive=False))
    assert timing.drafted_tokens == 0 and rows[0].output_ids == answers(engine, LOOPING[2:3])[0][0][0]


def test_in_flight_with_chunked_prompts_and_limits(engine):
    """Two slots for five rows (admissions and compaction between speculative steps), a long prompt
    chunked while others speculate (its parked slot writes pads over where its chunks go), and rows
    that end at max_new_tokens exactly."""
    prompts = LOOPING + [list(range(10, 200))]
    for n in (5, 40):
        want, _ = answers(engine, prompts, num_slots=2, prefill_chunk=16, n=n)
        got, timing = answers(engine, prompts, ngram.Lookup(6, adaptive=False), num_slots=2, prefill_chunk=16, n=n)
        assert got == want and all(len(ids) == n for ids, _, _ in got)
        assert timing.accepted_tokens > 0 or n == 5


def test_the_kv_buffer_bounds_the_guesses(engine, tiny_engine):
    """A prompt that leaves few positions: guesses never write past the KV limit (the standard
    graph's TensorScatter fails such a step; our kernel drops the writes), and the answer is the
    plain one."""
    capacity = engine.manifest.limits.max_kv_cache_capacity
    prompt = ([5, 17, 42, 99, 7] * 200)[:capacity - 6]
    want, _ = answers(engine, [prompt], n=100)
    got, _ = answers(engine, [prompt], ngram.Lookup(8, adaptive=False), n=100)
    assert got == want and len(got[0][0]) == 7  # (what the KV holds: capacity - prompt + 1)
    # a row near the limit bounds its neighbours' guesses too: each slot writes the step's width (the
    # second's answer loops from its 28th token on, while the first nears its last position)
    prompts = [prompt[:capacity - 33], LOOPING[2]]
    standard = load_engine(tiny_engine("llama"), graph="onnx")
    want, _ = answers(standard, prompts, n=100, kinds=["sampled", "greedy"])
    got, timing = answers(standard, prompts, ngram.Lookup(8, adaptive=False), n=100, kinds=["sampled", "greedy"])
    assert got == want and timing.accepted_tokens > 0


def unchecked(self, s, row, drafts, out):
    """The wrong variant of NgramScheduler.verify: every guess taken, then the step's own token."""
    for guess in drafts:
        self.accept_token(s, guess)
        if row.finish_reason:
            return
    self.accept(s, out, s)


def test_wrong_variant_taking_guesses_unchecked_changes_answers(engine, monkeypatch):
    want, _ = answers(engine, LOOPING)
    monkeypatch.setattr(ngram.NgramScheduler, "verify", unchecked)
    got, _ = answers(engine, LOOPING, ngram.Lookup(4, adaptive=False))
    assert got != want


def test_trtllm_run_spec_ngram(tiny_engine, run_cli, tmp_path):
    engine = tiny_engine("llama")
    requests = {"temperature": 0, "max_generate_length": 32, "requests": [
        {"messages": [{"role": "user", "content": "the cat the cat the cat the cat"}]},
        {"messages": [{"role": "user", "content": "Hi"}], "temperature": 0.7, "seed": 3}]}
    result, plain = run_cli(engine, requests)
    assert result.exit_code == 0, result.output
    profile = tmp_path / "p.json"
    result, out = run_cli(engine, requests, "--spec-ngram", "5", "--profile", str(profile))
    assert result.exit_code == 0 and "warning" not in result.output, result.output
    assert [r["output_ids"] for r in out["responses"]] == [r["output_ids"] for r in plain["responses"]]
    spec = json.loads(profile.read_text())["ngram_generation"]
    assert spec["draft_step"] == 5 and spec["verify_steps"] > 0 and spec["drafted_tokens"] >= spec["accepted_tokens"]
    result, _ = run_cli(engine, requests, "--spec-ngram", "17")
    assert result.exit_code == 2 and "--spec-ngram" in result.output


def test_pace_takes_the_faster_kind_and_measures_the_other_again():
    pace = ngram.Pace()
    assert pace.guessing() is False  # plain steps are measured first,
    pace.record(False, 4, 0.1)
    assert pace.guessing() is True  # then steps that check guesses
    pace.record(True, 5, 0.2)  # 25 tok/s against 40: plain is faster
    kinds = []
    for _ in range(8 * ngram.PROBE):
        kinds.append(pace.guessing())
        pace.record(kinds[-1], 4 if not kinds[-1] else 5, 0.1 if not kinds[-1] else 0.2)
    # a probe after PROBE plain steps, then after twice as many each time it still loses
    probes = [i for i, kind in enumerate(kinds) if kind]
    p = ngram.PROBE
    assert probes == [p, p + 1 + 2 * p, p + 1 + 2 * p + 1 + 4 * p]
    for _ in range(10):  # guesses that hold more and more: checking them becomes the faster
        pace.record(True, 20, 0.2)
    assert pace.guessing() is True


def test_adaptive_lookup_is_exact_too(engine):
    """Whichever kind of step Pace takes, the answers are plain decoding's."""
    want, _ = answers(engine, LOOPING, n=60)
    got, timing = answers(engine, LOOPING, ngram.Lookup(4), n=60)
    assert got == want and timing.generation_runs > 0


def test_sampled_answers_are_plain_sampling(engine):
    """Rows that sample speculate on an engine whose graph samples the checked positions: each
    position drawn with the number plain decoding draws it with, the rest put back, so a seeded
    answer is the same token for token (with top-p, min-p, logit bias, min_new_tokens' ban and EOS)."""
    assert engine.manifest.verify_sampler
    kinds = ["cold", "cold_biased", "cold_min_new", "sampled", "greedy", "cold"]
    prompts = (LOOPING + [[9, 8, 7, 9, 8, 7, 9], list(range(60, 90))])[:len(kinds)]
    eos = [int(np.bincount(sum(prompts, [])).argmax())]
    for k in (1, 3, 7):
        want, _ = answers(engine, prompts, kinds=kinds, eos=eos, n=48)
        got, timing = answers(engine, prompts, ngram.Lookup(k, adaptive=False), kinds=kinds, eos=eos, n=48)
        assert got == want, k
        assert 0 < timing.accepted_tokens < timing.drafted_tokens


def test_wrong_variant_sampled_numbers_not_put_back_changes_answers(engine, monkeypatch):
    """A step draws a number for each checked position; those after what it took are the next
    tokens' numbers. Dropping them (each step starting on fresh numbers) changes seeded answers."""
    kinds = ["cold"] * 4
    want, _ = answers(engine, LOOPING, kinds=kinds, n=48)
    spare = property(lambda row: [], lambda row, value: None)  # numbers put back vanish
    monkeypatch.setattr(RowState, "spare", spare, raising=False)
    got, timing = answers(engine, LOOPING, ngram.Lookup(4, adaptive=False), kinds=kinds, n=48)
    assert timing.accepted_tokens > 0 and got != want


def test_hot_sampling_with_guesses_that_hold(engine):
    """At temperature 0.9 the tiny model's text repeats nothing, so guesses come from an oracle: plain
    sampling's own answer, with a wrong token in every third step. Drawn tokens must then hold (the
    numbers line up with plain decoding's) and be replaced where wrong; rows that ask for logprobs
    get plain decoding's at every token."""
    prompts, kinds = LOOPING, ["sampled", "sampled_logprobs", "greedy", "logprobs"]
    want, _ = answers(engine, prompts, kinds=kinds, n=48)
    texts = [p + w[0] for p, w in zip(prompts, want)]

    @dataclasses.dataclass(frozen=True)
    class Oracle(ngram.Lookup):
        def propose(self, tokens):
            text = next(t for t in texts if t[:len(tokens)] == tokens)
            guesses = text[len(tokens):len(tokens) + self.k]
            return guesses[:-1] + [(guesses[-1] + 1) % 400] if len(tokens) % 3 == 0 and guesses else guesses

    got, timing = answers(engine, prompts, Oracle(5, adaptive=False), kinds=kinds, n=48)
    assert got == want and all(len(a[2][0]) == 48 for a in got[1::2])  # (logprobs at every token)
    assert timing.accepted_tokens > 80 and timing.accepted_tokens < timing.drafted_tokens


def test_a_checked_step_whose_first_position_overflowed_fails_that_row_alone(engine, monkeypatch):
    """NaN logits at a row's first checked position (its own token's): the row fails there, as in a
    plain step, whatever token the graph's sampler made of them; its neighbour answers as before."""
    from trtllm.runtime.backends import onnxruntime as ort_backend

    prompts = [LOOPING[2], LOOPING[1]]  # (the first's answer loops from its 28th token: guesses then)
    want, _ = answers(engine, prompts, n=48)
    step, calls = ort_backend.OnnxRuntimeEngine.step, []

    def overflow_row_0(self, inputs, kv, want_logits=False):
        out = step(self, inputs, kv, want_logits)
        calls.append(inputs.verify_index is not None and inputs.input_ids.shape[1] > 1)
        if calls.count(True) == 1 and calls[-1]:
            out.verify_logits[0, 0, 7] = np.nan
        return out

    monkeypatch.setattr(ort_backend.OnnxRuntimeEngine, "step", overflow_row_0)
    rows, timing = rows_for(prompts, n=48), Timing()
    run_rows(engine, rows, None, timing, lookup=ngram.Lookup(4, adaptive=False))
    assert calls.count(True) >= 1 and rows[0].finish_reason == "error" and "not finite" in rows[0].error
    assert rows[0].output_ids == want[0][0][:len(rows[0].output_ids)]
    assert (rows[1].output_ids, rows[1].finish_reason) == want[1][:2]
