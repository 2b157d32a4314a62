"""trtllm-run end to end on a tiny engine: output format, exit codes, error isolation (its files:
test_run_cli_files.py)."""
from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from tests.runtime.test_run_stdout import chat
from trtllm.runtime.cli import main

pytest.importorskip("torch")  # the tiny engine is built with the builder
pytestmark = pytest.mark.hf


def test_output_format_and_greedy_determinism(run_cli, tmp_path, tiny_engine):
    engine = tiny_engine("llama")
    payload = {"batch_size": 2, "temperature": 0, "max_generate_length": 8,
               "requests": [chat("Hello there"), chat("The quick brown fox"), chat("Paris")]}
    result, out = run_cli(engine, payload, "--profile", str(tmp_path / "profile.json"))
    assert result.exit_code == 0, result.output
    assert out["input_file"].endswith("input.json")
    keys = {"output_text", "request_idx", "batch_idx", "finish_reason", "messages",
            "formatted_system_prompt", "formatted_complete_request", "output_ids", "prompt_tokens", "output_tokens"}
    assert [set(r) for r in out["responses"]] == [keys] * 3
    from trtllm.runtime import manifest
    from trtllm.runtime.tokenizer import Tokenizer

    tokenizer, eos = Tokenizer.from_engine_dir(engine), manifest.load(engine).eos_token_ids
    for r in out["responses"]:  # every generated id, a final EOS included; the text is theirs without it
        ids, ended = r["output_ids"], r["finish_reason"] == "end-of-sequence"
        assert r["output_tokens"] == len(ids) and (len(ids) == 8 or ended) and (ids[-1] in eos) == ended
        assert tokenizer.decode(ids[:-1] if ended else ids) == r["output_text"]
        assert r["prompt_tokens"] == len(tokenizer.encode(r["formatted_complete_request"]))
    assert [(r["request_idx"], r["batch_idx"]) for r in out["responses"]] == [(0, 0), (1, 1), (2, 0)]
    assert all(r["finish_reason"] in ("max-length", "end-of-sequence") for r in out["responses"])
    first = out["responses"][0]
    assert first["messages"] == [{"role": "user", "content": [{"type": "text", "text": "Hello there"}]}]
    assert first["formatted_complete_request"].startswith(first["formatted_system_prompt"])
    assert "Hello there" in first["formatted_complete_request"]
    profile = json.loads((tmp_path / "profile.json").read_text())
    # three prefill steps: request 1 copies the system prompt request 0 computed (the template's
    # default one), then computes its rest; request 2 comes in when a slot frees
    assert profile["prefill"]["total_runs"] == 3 and profile["prefill"]["reused_tokens"] > 0
    assert profile["generation"]["generated_tokens"] > 0
    kv = profile["kv_cache"]  # 2 slots x capacity rounded to 64 x bytes per token, within the limits
    assert kv["allocated_bytes"] % (2 * 64 * kv["bytes_per_token"]) == 0
    assert 0 < kv["allocated_bytes"] <= kv["max_bytes"]
    assert set(profile["huge_pages"]) >= {"mappings", "mib", "collapsed_mib", "seconds"}
    # Greedy is deterministic, and a request's answer does not depend on its batch neighbours.
    _, alone = run_cli(engine, {**payload, "batch_size": 1, "requests": [chat("The quick brown fox")]},
                       "--no-huge-pages", "--profile", str(tmp_path / "plain.json"))
    assert alone["responses"][0]["output_text"] == out["responses"][1]["output_text"]
    assert json.loads((tmp_path / "plain.json").read_text())["huge_pages"]["skipped"] == "turned off"


def test_no_spin_lets_onnx_runtimes_workers_sleep(run_cli, tiny_engine, monkeypatch):
    """--no-spin reaches the session (ONNX Runtime's allow_spinning 0: its workers sleep, for cores
    that other work shares); the answers are the same either way."""
    from trtllm.runtime import engine as engine_mod

    spins, real, key = [], engine_mod.load_engine, "session.intra_op.allow_spinning"

    def load(*args, **kwargs):
        engine = real(*args, **kwargs)
        try:
            spins.append(engine.session.get_session_options().get_session_config_entry(key))
        except Exception:  # noqa: BLE001 - ONNX Runtime's way of saying the entry was never set
            spins.append("default")
        return engine

    monkeypatch.setattr(engine_mod, "load_engine", load)
    payload = {"temperature": 0, "max_generate_length": 6, "requests": [chat("The quick brown fox")]}
    engine, answers, seen = tiny_engine("llama"), [], []
    for flag in ((), ("--no-spin",)):
        answers.append(run_cli(engine, payload, *flag)[1]["responses"][0]["output_text"])
        seen.append(spins[-1])
    assert seen == ["default", "0"] and answers[0] == answers[1]


def test_bad_request_fails_alone(run_cli, tmp_path, tiny_engine):
    engine = tiny_engine("llama")
    long_text = "word " * 400  # more tokens than the engine's max_input_len (256)
    payload = {"batch_size": 3, "temperature": 0, "max_generate_length": 4, "available_lora_weights": {"a": "x"},
               "requests": [chat("fine"), chat(long_text), chat("also fine", lora_name="a"),
                            {"messages": [{"role": "user", "content": [{"type": "image", "image": "x.png"}]}]},
                            chat("saved", save_system_prompt_kv_cache=True), chat("last")]}
    result, out = run_cli(engine, payload)
    assert result.exit_code == 1
    reasons = [r["finish_reason"] for r in out["responses"]]
    assert reasons[0] != "error" and reasons[4] != "error" and reasons[5] != "error"
    assert reasons[1:4] == ["error"] * 3
    assert "max_input_len" in out["responses"][1]["error"]
    assert "lora_name" in out["responses"][2]["error"]
    assert "image" in out["responses"][3]["error"]
    assert [r["batch_idx"] for r in out["responses"]] == [0, None, None, None, 1, 2]
    # the summary's line of a failed request says why (its output_text is the fixed failure text)
    assert f"[1] (error) {out['responses'][1]['error'][:60]}" in result.output
    assert "cannot handle this request" not in result.output


@pytest.mark.parametrize("payload, field", [
    ('{"requests": [', "line 1"),
    ({"requests": [chat("x")], "temprature": 0.5}, "temprature"),
    ({"requests": [chat("x")], "top_p": 0}, "top_p"),
    ({"requests": [chat("x")], "batch_size": 0}, "batch_size"),
    ({"requests": [chat("x")], "max_generate_length": -1}, "max_generate_length"),
    ({"requests": {"0": chat("x")}}, "requests"),
])
def test_invalid_input_exits_2_naming_the_field(run_cli, tiny_engine, payload, field):
    """The file itself, or its top level (every request takes its defaults from it): nothing runs."""
    result, out = run_cli(tiny_engine("llama"), payload)
    assert result.exit_code == 2, result.output
    assert field in result.output
    assert out is None


@pytest.mark.parametrize("bad, field", [
    ({"messages": [{"role": "bot", "content": "x"}]}, "`requests[1].messages[0].role` must be one of"),
    (chat("x", stop=[1]), "`requests[1].stop[0]` must be"),
    (chat("x", top_p=0), "`requests[1].top_p` must be a finite number in (0, 1]"),
    (chat("x", mesages=[]), "`requests[1].mesages` must be a known key"),
    ("not a request", "`requests[1]` must be"),
])
def test_a_bad_request_fails_alone_naming_its_field(run_cli, tiny_engine, bad, field):
    """A bad value inside one request fails that request (its response names the field by its JSON
    path); its neighbours are answered, and the exit code is 1. Before, one bad request stopped the
    whole file (exit 2, nothing ran)."""
    payload = {"requests": [chat("a"), bad, chat("b")], "temperature": 0, "max_generate_length": 3}
    result, out = run_cli(tiny_engine("llama"), payload)
    assert result.exit_code == 1, result.output
    reasons = [r["finish_reason"] for r in out["responses"]]
    assert reasons == ["max-length", "error", "max-length"]
    assert out["responses"][1]["error"].startswith(field) and out["responses"][1]["batch_idx"] is None
    # a conversation that reads is echoed (which says which request it was); one that does not, not
    readable = isinstance(bad, dict) and bad.get("messages") == [{"role": "user", "content": "x"}]
    assert out["responses"][1]["messages"] == ([{"role": "user", "content": [{"type": "text", "text": "x"}]}]
                                               if readable else [])
    alone, want = run_cli(tiny_engine("llama"), {**payload, "requests": [chat("a"), chat("b")]})
    assert [out["responses"][i]["output_text"] for i in (0, 2)] == [r["output_text"] for r in want["responses"]]


def test_continue_final_message_ends_the_prompt_inside_it(run_cli, tiny_engine):
    """The answer continues the assistant message the request began: the prompt ends with its text
    (no end of turn, no new assistant header); the same conversation without it closes the turn."""
    begun = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "The answer is"}]
    result, out = run_cli(tiny_engine("llama"), {"temperature": 0, "max_generate_length": 2, "requests": [
        {"messages": begun, "continue_final_message": True}, {"messages": begun}]})
    assert result.exit_code == 0, result.output
    continued, closed = (r["formatted_complete_request"] for r in out["responses"])
    assert continued.endswith("The answer is") and closed.startswith(continued) and len(closed) > len(continued)


def test_batch_size_over_the_engines_runs_at_its_max_with_a_warning(run_cli, tiny_engine):
    """batch_size 16 on an engine of max_batch_size 4: four at a time, the same answers."""
    requests = [chat(t) for t in ("a", "b", "c", "d", "e", "f")]
    small, want = run_cli(tiny_engine("llama"), {"requests": requests, "batch_size": 4, "temperature": 0,
                                                 "max_generate_length": 4})
    result, out = run_cli(tiny_engine("llama"), {"requests": requests, "batch_size": 16, "temperature": 0,
                                                 "max_generate_length": 4})
    assert small.exit_code == result.exit_code == 0, result.output
    assert "warning: batch_size 16 is more than the engine's max_batch_size 4: running 4 at a time" in result.output
    assert [r["output_text"] for r in out["responses"]] == [r["output_text"] for r in want["responses"]]
    assert max(r["batch_idx"] for r in out["responses"]) == 3


def test_an_override_named_in_an_error_says_it_came_from_the_command_line(run_cli, tiny_engine):
    """--max-generate-length replaces each request's own: the error names the option, not the file's value."""
    result, out = run_cli(tiny_engine("llama"), {"max_generate_length": 3, "requests": [
        {**chat("a"), "min_new_tokens": 5, "max_generate_length": 10}, chat("b")]}, "--max-generate-length", "2")
    first, second = out["responses"]
    assert result.exit_code == 1 and second["finish_reason"] != "error"
    assert first["error"] == ("`requests[0].min_new_tokens` must be <= `requests[0].max_generate_length` "
                              "(set by --max-generate-length) (2), got 5")


def test_logit_bias_past_vocab_fails_that_request(run_cli, tmp_path, tiny_engine):
    payload = {"temperature": 0, "max_generate_length": 2,
               "requests": [chat("a"), chat("b", logit_bias={"99999": 5})]}
    result, out = run_cli(tiny_engine("llama"), payload)
    assert result.exit_code == 1
    assert out["responses"][0]["finish_reason"] != "error"
    assert out["responses"][1]["finish_reason"] == "error"
    assert "99999" in out["responses"][1]["error"]
    # with a prompt too long as well: both said, so that one run shows all there is to fix (a
    # review found the prompt's error alone, the bias's dropped)
    payload["requests"].append(chat("word " * 400, logit_bias={"99999": 5}))
    _, out = run_cli(tiny_engine("llama"), payload)
    assert "99999" in out["responses"][2]["error"] and "max_input_len" in out["responses"][2]["error"]


def test_draft_step_on_a_plain_engine_is_named(run_cli, tiny_engine):
    payload = {"temperature": 0, "max_generate_length": 2, "requests": [chat("a")]}
    result, out = run_cli(tiny_engine("llama"), payload, "--spec-draft-step", "2")
    assert result.exit_code == 0 and out["responses"][0]["finish_reason"] != "error"
    assert "warning: --spec-draft-step ignored" in result.output and "--eagle" in result.output
    result, _ = run_cli(tiny_engine("llama"), payload)
    assert "warning" not in result.output


def test_prompt_filling_the_kv_capacity_gets_a_token(run_cli, tmp_path, tiny_checkpoint):
    """A prompt as long as the KV capacity still runs: one token, max-length, in slot 0."""
    from trtllm.builder.config import BuildConfig
    from trtllm.builder.export import build
    from trtllm.runtime.tokenizer import Tokenizer

    engine = build(BuildConfig(model=str(tiny_checkpoint("llama")), output=str(tmp_path / "e"),
                               max_input_len=64, max_kv_cache_capacity=64, verify=False), log=lambda m: None)
    tokenizer = Tokenizer.from_engine_dir(engine)
    text = "word " * 200
    while len(tokenizer.encode(text, add_special_tokens=True)) > 64:
        text = text[:-1]
    assert len(tokenizer.encode(text, add_special_tokens=True)) == 64
    payload = {"apply_chat_template": False, "temperature": 0, "max_generate_length": 10,
               "requests": [{"messages": [{"role": "user", "content": text}]}, chat("hi")]}
    result, out = run_cli(engine, payload)
    assert result.exit_code == 0, result.output
    first = out["responses"][0]
    assert first["finish_reason"] == "max-length" and first["batch_idx"] == 0
    assert first["output_text"]


def test_every_engine_problem_of_a_request_is_named(run_cli, tiny_engine):
    payload = {"temperature": 0, "max_generate_length": 2, "stop_token_ids": [99998],
               "requests": [chat("a"), chat("b", logit_bias={"99999": 5})]}
    result, out = run_cli(tiny_engine("llama"), payload)
    assert result.exit_code == 1
    first, second = (r["error"] for r in out["responses"])
    assert "stop_token_ids[0]" in first and "logit_bias" not in first
    assert "stop_token_ids[0]" in second and 'requests[1].logit_bias["99999"]' in second


def test_a_row_failing_mid_stream_ends_with_one_error_line(tmp_path, tiny_engine, monkeypatch):
    from trtllm.runtime.backends import onnxruntime as ort_backend

    engine = tiny_engine("llama")  # built (and verified) before the patch
    step, calls = ort_backend.OnnxRuntimeEngine.step, [0]

    def step_failing_row_0_at_step_3(self, inputs, kv, want_logits=False):
        out = step(self, inputs, kv, want_logits)
        calls[0] += 1
        if calls[0] == 3:
            out.token_ids[0] = 10**6  # what the sampler answers for non-finite logits
        return out

    monkeypatch.setattr(ort_backend.OnnxRuntimeEngine, "step", step_failing_row_0_at_step_3)
    (tmp_path / "in.json").write_text(json.dumps({"batch_size": 2, "temperature": 0, "max_generate_length": 6,
                                                  "requests": [chat("a"), chat("b")]}))
    result = CliRunner().invoke(main, [str(tmp_path / "in.json"), "--engine", str(engine), "--stream"])
    assert result.exit_code == 1
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    failed = [ln for ln in lines if ln["request_idx"] == 0]
    assert [ln.get("finish_reason") for ln in failed if "finish_reason" in ln] == ["error"]
    assert "logits were not finite" in failed[-1]["error"]
    other = [ln for ln in lines if ln["request_idx"] == 1]
    assert other[-1]["finish_reason"] == "max-length" and all("finish_reason" not in ln for ln in other[:-1])


def test_a_stream_line_comes_with_each_token_while_its_text_is_held_back(tmp_path, tiny_engine):
    """A long stop string holds the text back; the ids and logprobs of each token still come on
    their own line (they came in bulk with the text: 52 ids on the first line of a review's run)."""
    stop = ["z" * 200]  # (never matched: the whole answer's text is held back to its last 199 characters)
    (tmp_path / "in.json").write_text(json.dumps({"temperature": 0, "max_generate_length": 12, "ignore_eos": True,
                                                  "num_logprobs": 2, "requests": [chat("a", stop=stop)]}))
    out = tmp_path / "out.json"
    result = CliRunner().invoke(main, [str(tmp_path / "in.json"), "--engine", str(tiny_engine("llama")), "--stream",
                                       "--output", str(out)])
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    response = json.loads(out.read_text())["responses"][0]
    assert [len(ln["token_ids"]) for ln in lines] == [1] * 12
    assert [t for ln in lines for t in ln["token_ids"]] == response["output_ids"]
    assert [len(ln["logprobs"]) for ln in lines] == [1] * 12
    assert "".join(ln["text"] for ln in lines) == response["output_text"]


def test_an_engine_failure_keeps_the_samples_that_finished(tmp_path, tiny_engine, monkeypatch):
    """n = 2 with one slot: sample 0 finishes in step 1, the engine raises in step 2 (sample 1's
    prefill). Only sample 1 fails; sample 0 keeps its answer."""
    from trtllm.runtime.backends import onnxruntime as ort_backend

    engine = tiny_engine("llama")
    step, calls = ort_backend.OnnxRuntimeEngine.step, [0]

    def step_raising_at_step_2(self, inputs, kv, want_logits=False):
        calls[0] += 1
        if calls[0] == 2:
            raise RuntimeError("device lost")
        return step(self, inputs, kv, want_logits)

    monkeypatch.setattr(ort_backend.OnnxRuntimeEngine, "step", step_raising_at_step_2)
    (tmp_path / "in.json").write_text(json.dumps({"batch_size": 1, "temperature": 1.0, "seed": 1,
                                                  "max_generate_length": 1, "requests": [chat("a", n=2)]}))
    result = CliRunner().invoke(main, [str(tmp_path / "in.json"), "--engine", str(engine),
                                       "--output", str(tmp_path / "out.json")])
    assert result.exit_code == 1
    first, second = json.loads((tmp_path / "out.json").read_text())["responses"]
    assert (first["sample_idx"], first["finish_reason"], "error" in first) == (0, "max-length", False)
    assert (second["sample_idx"], second["finish_reason"]) == (1, "error")
    assert second["error"] == "the engine failed: RuntimeError: device lost"


def test_samples_admitted_together_share_the_prompt_and_answer_as_alone(run_cli, tiny_engine, tmp_path):
    """n = 3 seeded samples and a request with the same prompt, in one wave: the first computes the
    prompt, the others copy its KV (profile: reused_tokens); each answer is the one it gets when
    the requests run one at a time."""
    import shutil

    requests = [chat("A prompt shared by samples", n=3, temperature=0.9, seed=5, num_logprobs=2),
                chat("A prompt shared by samples", temperature=0), chat("another one", temperature=0)]
    answers = {}
    for batch_size in (1, 4):
        result, out = run_cli(tiny_engine("llama"), {"requests": requests, "batch_size": batch_size,
                                                     "max_generate_length": 6}, "--profile", str(tmp_path / "p.json"),
                              "--kv-cache-dir", str(tmp_path / "kv"))  # (nothing saved by other tests)
        assert result.exit_code == 0, result.output
        answers[batch_size] = [(r["output_text"], r["logprobs"]) if "logprobs" in r else r["output_text"]
                               for r in out["responses"]]
        shutil.copy(tmp_path / "p.json", tmp_path / f"p{batch_size}.json")
    assert answers[4] == answers[1]
    reused = {b: json.loads((tmp_path / f"p{b}.json").read_text())["prefill"]["reused_tokens"] for b in (1, 4)}
    assert reused[1] == 0 and reused[4] > 0


def test_a_long_request_that_moves_slots_answers_as_alone(run_cli, tiny_engine):
    """The long request is admitted last; when the others finish it moves to slot 0 with its KV,
    penalties, logit_bias and seeded draws: its answer is the one it gets alone."""
    # +6 on token 7 against a frequency penalty of 1.5 per use: which tokens come depends on every
    # count so far, so a move that lost the penalties (or the bias) would change the text
    long = chat("the long one", temperature=0.8, seed=3, repetition_penalty=1.3, frequency_penalty=1.5,
                logit_bias={"7": 6.0}, max_generate_length=24, num_logprobs=2)
    requests = [chat("a", max_generate_length=6), chat("b", max_generate_length=3), long]
    outs = {}
    for batch_size in (1, 3):
        result, out = run_cli(tiny_engine("llama"), {"requests": requests, "batch_size": batch_size, "temperature": 0})
        assert result.exit_code == 0, result.output
        outs[batch_size] = out["responses"]
    assert [(r["output_text"], r.get("logprobs")) for r in outs[3]] == [(r["output_text"], r.get("logprobs"))
                                                                        for r in outs[1]]
    assert outs[3][2]["batch_idx"] == 2  # where it was admitted, though it moved


def test_a_long_prompt_admitted_mid_run_is_chunked_and_answers_the_same(run_cli, tiny_engine, tmp_path):
    """batch_size 2: the third request (a long prompt) takes the first one's slot while the second
    generates, so --prefill-chunk 16 prefills it in several steps; the answers are those of
    --prefill-chunk 0. A chunk below 16 tokens is refused up front."""
    long = chat(" ".join(f"word{i}" for i in range(8)), temperature=0.7, seed=1, num_logprobs=2)
    requests = [chat("a", max_generate_length=1), chat("b", max_generate_length=30), long]
    outs, runs = {}, {}
    for chunk in ("0", "16"):
        result, out = run_cli(tiny_engine("llama"), {"requests": requests, "batch_size": 2, "temperature": 0,
                                                     "max_generate_length": 8},
                              "--prefill-chunk", chunk, "--profile", str(tmp_path / "p.json"))
        assert result.exit_code == 0, result.output
        outs[chunk] = [(r["output_text"], r.get("logprobs")) for r in out["responses"]]
        runs[chunk] = json.loads((tmp_path / "p.json").read_text())["prefill"]["total_runs"]
    assert outs["16"] == outs["0"]
    assert runs["16"] >= runs["0"] + 2
    result, _ = run_cli(tiny_engine("llama"), {"requests": requests}, "--prefill-chunk", "8")
    assert result.exit_code == 2 and "--prefill-chunk" in result.output and "at least 16" in result.output


def test_a_padded_vocabulary_s_ids_are_no_text(tmp_path):
    """A model whose embedding has rows past its tokenizer's (Qwen2.5, Phi-3, Gemma pad theirs) can
    draw such an id: it stands for no text, as in transformers, and fails no request. Request 0 is
    pushed onto padding ids; request 1 beside it is answered as alone. Before, the first padding id
    failed every unfinished request of the batch."""
    from tests.tiny_models import make_checkpoint
    from trtllm.builder.config import BuildConfig
    from trtllm.builder.export import build

    ckpt = make_checkpoint("llama", tmp_path / "ckpt", padded_vocab=16)
    engine = build(BuildConfig(model=str(ckpt), output=str(tmp_path / "engine"), max_batch_size=2, max_input_len=64,
                               max_kv_cache_capacity=128), log=lambda m: None)
    vocab = json.loads((engine / "manifest.json").read_text())["model"]["vocab_size"]
    padding = vocab - 3  # past the tokenizer's 400 ids
    payload = {"temperature": 0, "max_generate_length": 6, "batch_size": 2, "num_logprobs": 1,
               "requests": [chat("a", logit_bias={str(padding): 100.0}), chat("b")]}
    (tmp_path / "in.json").write_text(json.dumps(payload))
    result = CliRunner().invoke(main, [str(tmp_path / "in.json"), "--engine", str(engine), "--output",
                                       str(tmp_path / "out.json"), "--kv-cache-dir", str(tmp_path / "kv")])
    assert result.exit_code == 0, result.output
    padded, other = json.loads((tmp_path / "out.json").read_text())["responses"]
    assert padded["output_text"] == "" and padded["finish_reason"] == "max-length"
    assert [e["token_id"] for e in padded["token_logprobs"]] == [padding] * 6
    assert all(e["bytes"] == [] for e in padded["token_logprobs"])
    (tmp_path / "alone.json").write_text(json.dumps({**payload, "requests": [chat("b")]}))
    CliRunner().invoke(main, [str(tmp_path / "alone.json"), "--engine", str(engine), "--output",
                              str(tmp_path / "alone_out.json"), "--kv-cache-dir", str(tmp_path / "kv")])
    assert other["output_text"] == json.loads((tmp_path / "alone_out.json").read_text())["responses"][0]["output_text"]


def test_truncate_prompt_tokens_keeps_the_prompts_last_tokens(run_cli, tiny_engine):
    """vLLM's truncate_prompt_tokens: a prompt past max_input_len (256 here) is answered from its last
    k tokens (-1: the last 256), as the same tokens given alone are; a shorter one is left whole; bad
    values name their path."""
    from trtllm.runtime.engine import load_engine
    from trtllm.runtime.generate import RowState, run_batch
    from trtllm.runtime.sampling import SamplingParams
    from trtllm.runtime.tokenizer import Tokenizer

    engine = tiny_engine("llama")
    long = "The quick brown fox jumps over the lazy dog. " * 14
    payload = {"temperature": 0, "max_generate_length": 8, "apply_chat_template": False, "requests": [
        {"messages": [{"role": "user", "content": long}], "truncate_prompt_tokens": 40},
        {"messages": [{"role": "user", "content": long}], "truncate_prompt_tokens": -1},
        {"messages": [{"role": "user", "content": long}]},
        {"messages": [{"role": "user", "content": "Hi"}], "truncate_prompt_tokens": 40}]}
    result, out = run_cli(engine, payload)
    first, whole, refused, short = out["responses"]
    loaded = load_engine(engine)
    ids = Tokenizer.from_engine_dir(engine, loaded.manifest.files).encode(long, add_special_tokens=True)
    assert len(ids) > 256 and first["prompt_tokens"] == 40 and whole["prompt_tokens"] == 256
    for response, keep in ((first, 40), (whole, 256)):
        row = RowState(prompt_ids=ids[-keep:], params=SamplingParams(temperature=0, max_new_tokens=8),
                       rng=np.random.default_rng(0), eos_ids=frozenset(loaded.manifest.eos_token_ids))
        run_batch(loaded, [row])
        assert response["output_ids"] == row.output_ids
    assert "or give truncate_prompt_tokens" in refused["error"] and "error" not in short
    _, out = run_cli(engine, {**payload, "truncate_prompt_tokens": 300,
                              "requests": [{"messages": [{"role": "user", "content": "Hi"}]}]})
    assert out["responses"][0]["error"] == ("`truncate_prompt_tokens` must be at most the engine's max_input_len 256, "
                                            "or -1 (that), got 300")
    for bad in (0, -2, True, 2.5):
        _, out = run_cli(engine, {"requests": [{"messages": [{"role": "user", "content": "x"}],
                                                "truncate_prompt_tokens": bad}]})
        assert out["responses"][0]["error"].startswith("`requests[0].truncate_prompt_tokens` must be an integer >= 1")


def test_the_input_read_from_stdin(run_cli, tiny_engine, tmp_path):
    """`-` reads the input from stdin, as other tools do: the same answers as from a file, an error
    that names stdin, and an --output that is the file stdin is redirected from refused."""
    import subprocess
    import sys

    engine = tiny_engine("llama")
    payload = {"temperature": 0, "max_generate_length": 6, "requests": [chat("Hello there"), chat("Paris")]}
    _, from_file = run_cli(engine, payload)
    result = CliRunner().invoke(main, ["-", "--engine", str(engine)], input=json.dumps(payload))
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["input_file"] == "-"
    assert [r["output_ids"] for r in out["responses"]] == [r["output_ids"] for r in from_file["responses"]]
    bad = CliRunner().invoke(main, ["-", "--engine", str(engine)], input="{")
    assert bad.exit_code == 2 and "the input on stdin (`-`)" in bad.output, bad.output
    (tmp_path / "in.json").write_text(json.dumps(payload))
    with open(tmp_path / "in.json", "rb") as stdin:
        run = subprocess.run([sys.executable, "-m", "trtllm.runtime", "-", "--engine", str(engine),
                              "--output", str(tmp_path / "in.json")], stdin=stdin, capture_output=True, text=True)
    assert run.returncode == 2 and "is the input file" in run.stdout + run.stderr, run.stdout + run.stderr
    assert json.loads((tmp_path / "in.json").read_text()) == payload


def test_a_file_named_dash_is_read_as_dot_slash_dash(tiny_engine, tmp_path, monkeypatch):
    """`./-` is the file of that name, not stdin; an empty or closed stdin is an error that says so."""
    import os
    import subprocess
    import sys

    payload = {"temperature": 0, "max_generate_length": 3, "requests": [chat("Paris")]}
    (tmp_path / "-").write_text(json.dumps(payload))
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["./-", "--engine", str(tiny_engine("llama"))], input="{")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["input_file"] == "./-"
    command = [sys.executable, "-m", "trtllm.runtime", "-", "--engine", str(tiny_engine("llama"))]
    empty = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, text=True)
    assert empty.returncode == 2 and "the input on stdin (`-`) must be valid JSON" in empty.stderr, empty.stderr
    closed = subprocess.run(command, stdin=None, capture_output=True, text=True, preexec_fn=lambda: os.close(0))
    assert closed.returncode == 2 and "stdin is closed" in closed.stderr, closed.stderr
