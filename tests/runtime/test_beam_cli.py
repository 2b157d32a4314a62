"""trtllm-run with num_beams (runtime/beam.py through runtime/runner.py): a request's n responses are
its best beams, best first, with their scores; its neighbours answer as without it; what beam search
does not take, or the engine cannot run, fails that request alone, naming the setting's JSON path.
(tests/parity/test_beam_search.py checks the beams themselves against transformers.)"""
from __future__ import annotations

import json

import numpy as np
import pytest

from trtllm.runtime import beam
from trtllm.runtime.engine import load_engine
from trtllm.runtime.text import TextStream
from trtllm.runtime.tokenizer import Tokenizer

pytestmark = pytest.mark.hf
CHAT = [{"role": "user", "content": "the cat the cat the cat"}]


def test_responses_are_the_best_beams(tiny_engine, run_cli):
    engine_dir = tiny_engine("llama")
    plain = {"temperature": 0, "max_generate_length": 10, "requests": [{"messages": CHAT}, {"messages": CHAT[:1]}]}
    result, want = run_cli(engine_dir, plain)
    assert result.exit_code == 0, result.output
    beams = {**plain, "batch_size": 2, "requests": [
        {"messages": CHAT, "num_beams": 4, "n": 3, "length_penalty": 0.5, "early_stopping": "never"},
        {"messages": CHAT[:1]}, {"messages": CHAT, "num_beams": 2}]}
    result, out = run_cli(engine_dir, beams, "--stream")
    assert result.exit_code == 0, result.output
    got = out["responses"]
    assert [r["request_idx"] for r in got] == [0, 0, 0, 1, 2] and [r["sample_idx"] for r in got[:3]] == [0, 1, 2]
    assert got[3]["output_ids"] == want["responses"][1]["output_ids"]  # the neighbour is as without it
    engine = load_engine(engine_dir)
    tok = Tokenizer.from_engine_dir(engine_dir, engine.manifest.files)
    prompt = tok.encode(got[0]["formatted_complete_request"], add_special_tokens=False)
    found = beam.run(engine, prompt, beam.BeamParams(4, 10, frozenset(engine.manifest.eos_token_ids),
                                                     length_penalty=0.5, early_stopping="never"))
    assert [r["output_ids"] for r in got[:3]] == [list(h.tokens) for h in found[:3]]
    # the two searches shared steps; the 2-beam one's answer is what it gives alone too
    alone = beam.run(engine, prompt, beam.BeamParams(2, 10, frozenset(engine.manifest.eos_token_ids)))
    assert (got[4]["output_ids"], got[4]["beam_score"]) == (list(alone[0].tokens), pytest.approx(alone[0].score))
    assert [r["beam_score"] for r in got[:3]] == pytest.approx([h.score for h in found[:3]])
    assert got[0]["beam_score"] >= got[1]["beam_score"] >= got[2]["beam_score"]
    assert all(r["finish_reason"] in ("max-length", "end-of-sequence") for r in got)
    assert "beam_score" not in got[3] and got[4]["beam_score"] is not None
    # each beam's stream: one line with its whole answer
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{\"request_idx\"")]
    firsts = [line for line in lines if line["request_idx"] == 0]
    assert [line["token_ids"] for line in firsts] == [r["output_ids"] for r in got[:3]]


def test_logprobs_are_each_beams_own(tiny_engine, run_cli):
    """num_logprobs with beams: each response's logprobs and token_logprobs are its hypothesis' own
    (runtime/beam.py; tests/parity/test_beam_search.py checks them against transformers)."""
    engine_dir = tiny_engine("llama")
    result, out = run_cli(engine_dir, {"temperature": 0, "max_generate_length": 6, "requests": [
        {"messages": CHAT, "num_beams": 3, "n": 2, "num_logprobs": 4}, {"messages": CHAT, "num_logprobs": 2}]})
    assert result.exit_code == 0, result.output
    got = out["responses"]
    engine = load_engine(engine_dir)
    tok = Tokenizer.from_engine_dir(engine_dir, engine.manifest.files)
    prompt = tok.encode(got[0]["formatted_complete_request"], add_special_tokens=False)
    found = beam.run(engine, prompt, beam.BeamParams(3, 6, frozenset(engine.manifest.eos_token_ids), num_logprobs=4))
    for r, h in zip(got[:2], found):
        assert r["output_ids"] == list(h.tokens)
        assert [[e["token_id"] for e in step] for step in r["logprobs"]] == [list(ids) for _, ids, _ in h.logprobs]
        np.testing.assert_allclose([[e["logprob"] for e in step] for step in r["logprobs"]],
                                   [values for values, _, _ in h.logprobs], rtol=1e-6)
        assert [e["token_id"] for e in r["token_logprobs"]] == r["output_ids"]
        assert [e["logprob"] for e in r["token_logprobs"]] == pytest.approx([own for _, _, own in h.logprobs])
    assert len(got[2]["logprobs"][0]) == 2  # (the plain neighbour its own)


def test_stop_strings_end_beams(tiny_engine, run_cli):
    """`stop` with beams: the responses are the search's with the request's stop strings (runtime/beam.py;
    tests/parity/test_beam_search.py checks those against transformers' stop_strings); a beam that
    ended at one says stop-words and its text ends before it, as plain decoding's does."""
    engine_dir = tiny_engine("llama")
    plain = {"temperature": 0, "max_generate_length": 12, "requests": [{"messages": CHAT, "num_beams": 3, "n": 3}]}
    result, out = run_cli(engine_dir, plain)
    assert result.exit_code == 0, result.output
    text = out["responses"][0]["output_text"]
    stops = [text[4:6], text[-3:-1]]  # (text the beams write)
    result, out = run_cli(engine_dir, {**plain, "requests": [{**plain["requests"][0], "stop": stops}]})
    assert result.exit_code == 0, result.output
    got = out["responses"]
    engine = load_engine(engine_dir)
    tok = Tokenizer.from_engine_dir(engine_dir, engine.manifest.files)
    prompt = tok.encode(got[0]["formatted_complete_request"], add_special_tokens=False)
    found = beam.run(engine, prompt, beam.BeamParams(3, 12, frozenset(engine.manifest.eos_token_ids),
                                                     text=TextStream(tok, tuple(stops))))
    assert [r["output_ids"] for r in got] == [list(h.tokens) for h in found]
    stopped = [r for r in got if r["finish_reason"] == "stop-words"]
    assert stopped and all(not any(s in r["output_text"] for s in stops) for r in stopped)
    assert all(any(s in tok.decode(r["output_ids"]) for s in stops) for r in stopped)


def test_beams_restore_saved_system_prompt_and_context_kv(tiny_engine, run_cli, tmp_path):
    """A beam request's prompt starts from saved KV as a plain one's does: its saved system prompt
    (save_system_prompt_kv_cache), then --context-reuse's KV of an earlier request; the beams and
    scores are those computed from nothing, and the profile counts the restored tokens."""
    engine_dir = tiny_engine("llama")
    system = [{"role": "system", "content": "You are a terse assistant that answers in one line."}]
    request = {"messages": system + CHAT, "num_beams": 3, "n": 2, "save_system_prompt_kv_cache": True}
    payload = {"temperature": 0, "max_generate_length": 6, "requests": [request]}
    result, fresh = run_cli(engine_dir, payload)
    assert result.exit_code == 0, result.output

    def run(*extra):
        profile = tmp_path / "p.json"
        result, out = run_cli(engine_dir, payload, "--kv-cache-dir", str(tmp_path / "kv"), "--profile", str(profile),
                              *extra)
        assert result.exit_code == 0, result.output
        assert [(r["output_ids"], r["beam_score"]) for r in out["responses"]] == \
            [(r["output_ids"], r["beam_score"]) for r in fresh["responses"]]
        return json.loads(profile.read_text())["prefill"]["reused_tokens"]

    assert run() == 0            # saves the system prompt's KV
    saved = run()                # restores it
    assert saved > 0
    plain = {**payload, "requests": [{"messages": system + CHAT}]}  # (a plain request leaves its KV for the next)
    assert run_cli(engine_dir, plain, "--context-reuse", "--kv-cache-dir", str(tmp_path / "kv"))[0].exit_code == 0
    assert run("--context-reuse") > saved  # (the whole prompt but MIN_COMPUTED tokens, past the system prompt)
    # a beam request keeps its prompt's KV for later requests: a plain one on a longer prompt restores it
    other = {**payload, "requests": [{"messages": system + [{"role": "user", "content": "the dog the dog"}],
                                      "num_beams": 2}]}
    store = ("--context-reuse", "--kv-cache-dir", str(tmp_path / "kv2"))
    assert run_cli(engine_dir, other, *store)[0].exit_code == 0
    longer = {**payload, "requests": [{"messages": system + [{"role": "user", "content": "the dog the dog"},
                                                             {"role": "assistant", "content": "a"},
                                                             {"role": "user", "content": "b"}]}]}
    result, _ = run_cli(engine_dir, longer, *store, "--profile", str(tmp_path / "p2.json"))
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "p2.json").read_text())["prefill"]["reused_tokens"] > 0  # (a fresh store)


def test_prompt_logprobs_score_a_beam_request_s_prompt(tiny_engine, run_cli, monkeypatch):
    """prompt_logprobs with beams: the prompt is scored as a plain request's is (its prefill in steps
    of SCORE_CHUNK positions, here 8 so that it takes several), the beams unchanged."""
    from trtllm.runtime import prompt_scores

    engine_dir = tiny_engine("llama")
    monkeypatch.setattr(prompt_scores, "SCORE_CHUNK", 8)
    plain = {"messages": CHAT, "prompt_logprobs": 3}
    payload = {"temperature": 0, "max_generate_length": 6, "requests": [{**plain, "num_beams": 3, "n": 2}, plain]}
    result, out = run_cli(engine_dir, payload)
    assert result.exit_code == 0, result.output
    beams, greedy = out["responses"][0], out["responses"][2]
    assert len(beams["prompt_token_logprobs"]) > 16  # (three steps at least)
    for name in ("prompt_token_logprobs", "prompt_logprobs"):
        ours, theirs = beams[name][1:], greedy[name][1:]
        flat = (lambda x: x) if name == "prompt_token_logprobs" else (lambda x: [e for step in x for e in step])
        assert [e["token_id"] for e in flat(ours)] == [e["token_id"] for e in flat(theirs)]
        assert [e["logprob"] for e in flat(ours)] == pytest.approx([e["logprob"] for e in flat(theirs)], abs=1e-5)
    result, alone = run_cli(engine_dir, {**payload, "requests": [{"messages": CHAT, "num_beams": 3, "n": 2}]})
    assert [r["output_ids"] for r in out["responses"][:2]] == [r["output_ids"] for r in alone["responses"]]


def test_prompt_logprobs_with_nothing_to_generate_score_a_beam_request_s_prompt(tiny_engine, run_cli):
    """max_generate_length 0 with prompt_logprobs (the log-likelihood recipe): nothing to search, the
    prompt scored as a plain request's (its scores were dropped: answered before any step)."""
    plain = {"messages": CHAT, "prompt_logprobs": 1}
    payload = {"temperature": 0, "max_generate_length": 0, "requests": [plain, {**plain, "num_beams": 2}]}
    result, out = run_cli(tiny_engine("llama"), payload)
    assert result.exit_code == 0, result.output
    greedy, beams = out["responses"]
    assert len(beams["prompt_token_logprobs"]) == beams["prompt_tokens"] > 1
    assert beams["prompt_token_logprobs"] == greedy["prompt_token_logprobs"] and beams["output_ids"] == []


def test_a_scored_beam_prompt_never_ends_in_a_one_token_chunk(tiny_engine, run_cli, monkeypatch):
    """A scored prompt one token past a chunk takes that token with the chunk before it (as plain
    requests do, step_inputs.chunk_stop): a step of one token is a decode step to ONNX Runtime's
    attention, whose low bits differ, and the KV it leaves is kept under --context-reuse."""
    from trtllm.runtime import prompt_scores
    from trtllm.runtime.backends import onnxruntime as ort_backend

    engine_dir, widths, step = tiny_engine("llama"), [], ort_backend.OnnxRuntimeEngine.step
    monkeypatch.setattr(ort_backend.OnnxRuntimeEngine, "step", lambda self, inputs, kv, *a, **k:
                        widths.append(inputs.input_ids.shape[1]) or step(self, inputs, kv, *a, **k))
    result, out = run_cli(engine_dir, {"temperature": 0, "max_generate_length": 1, "requests": [{"messages": CHAT}]})
    prompt = out["responses"][0]["prompt_tokens"]
    monkeypatch.setattr(prompt_scores, "SCORE_CHUNK", prompt - 1)
    widths.clear()
    result, out = run_cli(engine_dir, {"temperature": 0, "max_generate_length": 2, "requests": [
        {"messages": CHAT, "num_beams": 2, "prompt_logprobs": 1}]})
    assert result.exit_code == 0 and widths[0] == prompt, (widths, result.output)  # (not prompt - 1, then 1)


@pytest.mark.parametrize("extra, path, says", [
    ({}, "temperature", "0.0 with `requests[0].num_beams` 2 (beam search does not sample)"),
    ({"temperature": 0, "n": 3}, "requests[0].n", "at most `requests[0].num_beams` 2"),
    ({"temperature": 0, "presence_penalty": 0.5}, "requests[0].presence_penalty", "has no such penalty"),
    ({"temperature": 0, "frequency_penalty": 0.5}, "requests[0].frequency_penalty", "has no such penalty"),
    ({"temperature": 0, "early_stopping": "sometimes"}, "requests[0].early_stopping", '"never"'),
    ({"temperature": 0, "num_beams": 17}, "requests[0].num_beams", "16"),
])
def test_what_beam_search_does_not_take_fails_the_request(tiny_engine, run_cli, extra, path, says):
    request = {"messages": CHAT, "num_beams": 2, **extra}
    result, out = run_cli(tiny_engine("llama"), {"max_generate_length": 4, "requests": [request, {"messages": CHAT}]})
    assert result.exit_code == 1, result.output  # (that request fails alone)
    error = out["responses"][0]["error"]
    assert f"`{path}`" in error and says in error, error
    assert [r["finish_reason"] != "error" for r in out["responses"] if r["request_idx"] == 1] == [True]


def test_more_beams_than_the_engine_has_rows_fails_that_request_alone(tiny_engine, run_cli):
    requests = {"temperature": 0, "max_generate_length": 4, "requests": [
        {"messages": CHAT, "num_beams": 8}, {"messages": CHAT}]}  # (the tiny engine's max_batch_size is 4)
    result, out = run_cli(tiny_engine("llama"), requests)
    assert result.exit_code == 1, result.output
    first, second = out["responses"]
    assert first["finish_reason"] == "error" and "max_batch_size 4" in first["error"]
    assert second["finish_reason"] in ("max-length", "end-of-sequence")


def test_max_generate_length_zero_and_ignore_eos(tiny_engine, run_cli, tmp_path):
    """max_generate_length 0: no search, as a plain request (no step, no slot, no score; a review
    found transformers' -1e9 placeholder as the score, a slot and a prefill); the profile counts a
    token for each running beam of each decode step, as plain decoding counts each running row (it
    counted one a search, with the prompt step's)."""
    requests = {"temperature": 0, "batch_size": 8, "requests": [
        {"messages": CHAT, "num_beams": 2, "max_generate_length": 0},
        {"messages": CHAT, "num_beams": 3, "n": 3, "max_generate_length": 6, "ignore_eos": True}]}
    profile = tmp_path / "profile.json"
    result, out = run_cli(tiny_engine("llama"), requests, "--profile", str(profile))
    assert result.exit_code == 0, result.output
    empty, *full = out["responses"]
    assert empty["output_ids"] == [] and empty["finish_reason"] == "max-length"
    assert empty["batch_idx"] is None and "beam_score" not in empty
    assert all(len(r["output_ids"]) == 6 and r["finish_reason"] == "max-length" for r in full)
    p = json.loads(profile.read_text())
    assert p["prefill"]["total_runs"] == 1 and p["generation"]["total_runs"] == 5
    assert p["generation"]["generated_tokens"] == 5 * 3
    # its KV: the prompt and all its answer but the last token, never fed back (a review found one
    # position more, past max_bytes where a long answer reached the capacity)
    slots = p["kv_cache"]["allocated_bytes"] // p["kv_cache"]["bytes_per_token"] // (full[0]["prompt_tokens"] + 5)
    assert p["kv_cache"]["allocated_bytes"] == slots * (full[0]["prompt_tokens"] + 5) * p["kv_cache"]["bytes_per_token"]
    assert slots == 3  # the search's 3 beams, not the batch's max_batch_size slots


def test_logits_that_overflow_fail_that_request_alone(tiny_engine, run_cli, monkeypatch):
    engine_dir = tiny_engine("llama")  # (built before the engine is patched)
    real = beam.Search.advance
    monkeypatch.setattr(beam.Search, "advance", lambda self, scores, ids: real(
        self, scores * np.nan if self.p.num_beams == 2 else scores, ids))  # (the 3-beam search is fine)
    requests = {"temperature": 0, "max_generate_length": 4, "requests": [
        {"messages": CHAT, "num_beams": 2, "n": 2}, {"messages": CHAT, "num_beams": 3}, {"messages": CHAT}]}
    result, out = run_cli(engine_dir, requests)
    assert result.exit_code == 1, result.output
    failed, fine = out["responses"][:2], out["responses"][2:]
    assert all("logits were not finite (NaN or infinite) at token 1" in r["error"] for r in failed)
    assert all("a float16 engine or a LoRA adapter's weights can" in r["error"] for r in failed)  # (what can)
    assert all(r["finish_reason"] in ("max-length", "end-of-sequence") for r in fine)


def test_an_engine_failure_in_a_shared_step_fails_its_searches_alone(tiny_engine, run_cli, monkeypatch):
    """The engine raises in the first step two searches share: those two fail, naming the error; the
    search waiting for rows and the plain request answer."""
    from trtllm.runtime.backends import onnxruntime as ort_backend

    engine_dir = tiny_engine("llama")
    step, calls = ort_backend.OnnxRuntimeEngine.step, [0]

    def step_raising_at_call_3(self, inputs, kv, want_logits=False):  # (two prefills, then their shared step)
        calls[0] += 1
        if calls[0] == 3:
            assert inputs.input_ids.shape == (4, 1)
            raise RuntimeError("device lost")
        return step(self, inputs, kv, want_logits)

    monkeypatch.setattr(ort_backend.OnnxRuntimeEngine, "step", step_raising_at_call_3)
    requests = {"temperature": 0, "max_generate_length": 4, "batch_size": 4, "requests": [
        {"messages": CHAT, "num_beams": 2}, {"messages": CHAT, "num_beams": 2}, {"messages": CHAT, "num_beams": 3},
        {"messages": CHAT}]}
    result, out = run_cli(engine_dir, requests)
    assert result.exit_code == 1, result.output
    r = out["responses"]
    assert [x["finish_reason"] for x in r[:2]] == ["error"] * 2
    assert all(x["error"].endswith("beam search failed (RuntimeError: device lost)") for x in r[:2])
    assert [x["batch_idx"] for x in r] == [0, 2, 0, 0]  # (the slots each took, failed or not; plain ones after)
    assert [x["finish_reason"] in ("max-length", "end-of-sequence") for x in r[2:]] == [True, True]
    assert r[2]["beam_score"] is not None


def test_guided_beams_answer_within_their_grammar(tiny_engine, run_cli):
    """guided_decoding with beams (tests/parity/test_beam_search.py checks the search against
    transformers): every beam of a choice guide ends at EOS on one of the choices, the plain
    neighbour as without it."""
    choices = ["the cat", "a dog sat", "cats"]
    requests = {"temperature": 0, "max_generate_length": 16, "requests": [
        {"messages": CHAT, "num_beams": 3, "n": 3, "guided_decoding": {"choice": choices}},
        {"messages": CHAT}]}
    result, out = run_cli(tiny_engine("llama"), requests)
    assert result.exit_code == 0, result.output
    got = out["responses"]
    assert [r["finish_reason"] for r in got[:3]] == ["end-of-sequence"] * 3
    assert all(r["output_text"] in choices for r in got[:3]) and len({r["output_text"] for r in got[:3]}) == 3
    assert got[3]["finish_reason"] in ("max-length", "end-of-sequence") and "beam_score" not in got[3]


def test_a_search_that_finishes_no_hypothesis_fails_its_request(tiny_engine, run_cli):
    """length_penalty -10: past a few tokens no running beam's score over length ** -10 can beat a
    placeholder's -1e9, and transformers' heuristic stops with nothing finished (EOS ignored here).
    Its placeholders are no answer: the request fails, saying why."""
    requests = {"temperature": 0, "requests": [
        {"messages": CHAT, "num_beams": 2, "length_penalty": -10, "ignore_eos": True, "max_generate_length": 30},
        {"messages": CHAT, "num_beams": 2, "length_penalty": -10, "ignore_eos": True, "max_generate_length": 3}]}
    result, out = run_cli(tiny_engine("llama"), requests)
    assert result.exit_code == 1, result.output
    failed, fine = out["responses"]
    # (by JSON path: its own length_penalty; n its default, the top level's to set)
    assert "fewer than `n` (1)" in failed["error"] and "`requests[0].length_penalty` -10.0" in failed["error"]
    assert len(fine["output_ids"]) == 3 and fine["finish_reason"] == "max-length"


def test_a_generation_config_with_beams_under_sampling_defaults_model(tiny_engine, run_cli, tmp_path):
    """--sampling-defaults model: a config's num_beams (without do_sample) is beam search, as
    transformers' generate() runs it; the file's own settings still come first."""
    import shutil

    engine = tmp_path / "engine"
    shutil.copytree(tiny_engine("llama"), engine)
    config = json.loads((engine / "generation_config.json").read_text())
    (engine / "generation_config.json").write_text(json.dumps({**config, "num_beams": 3, "max_new_tokens": 5}))
    payload = {"requests": [{"messages": CHAT}, {"messages": CHAT, "num_beams": 1}]}
    result, out = run_cli(engine, payload, "--sampling-defaults", "model")
    assert result.exit_code == 0, result.output
    beams, greedy = out["responses"]
    assert "beam_score" in beams and "beam_score" not in greedy
    written = {"temperature": 0, "max_generate_length": 5, "num_beams": 3}
    _, want = run_cli(engine, {**written, "requests": payload["requests"]})
    assert out["responses"] == want["responses"]


def test_a_search_whose_bans_leave_too_few_hypotheses_fails_saying_why(tiny_engine, run_cli):
    """no_repeat_ngram_size 1 within allowed_token_ids that are the prompt's tokens and EOS: EOS alone
    can come, one hypothesis finishes; n 2 fails, naming the bans (not the length_penalty); n 1 is
    answered with it."""
    import json as _json

    from trtllm.runtime.engine import load_engine
    from trtllm.runtime.tokenizer import Tokenizer

    engine = tiny_engine("llama")
    manifest = load_engine(engine).manifest
    allowed = sorted(set(Tokenizer.from_engine_dir(engine, manifest.files).encode("ab ab")) | {manifest.eos_token_ids[0]})
    ask = {"messages": [{"role": "user", "content": "ab ab"}], "num_beams": 2, "allowed_token_ids": allowed,
           "no_repeat_ngram_size": 1}
    _, out = run_cli(engine, {"apply_chat_template": False, "temperature": 0, "max_generate_length": 12,
                              "requests": [{**ask, "n": 2}, ask]})
    failed, _, answered = out["responses"]
    assert failed["error"] == ("beam search failed (no beam can go on at token 1: `requests[0].allowed_token_ids` "
                               "and `requests[0].no_repeat_ngram_size` ban every token that does not end it, and 1 hypotheses had "
                               "finished, fewer than `requests[0].n` (2))"), _json.dumps(failed)
    assert answered["output_ids"] == list(manifest.eos_token_ids[:1]) and answered["finish_reason"] == "end-of-sequence"
