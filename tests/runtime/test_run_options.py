"""trtllm-run's Edge-LLM run options on a tiny engine: --batch-size and --max-generate-length replace
the file's values, --warmup answers the first request before the run and leaves no trace in it."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from tests.runtime.test_run_stdout import chat
from trtllm.runtime import input_format as fmt
from trtllm.runtime import strict_json
from trtllm.runtime.cli import generation_defaults, main
from trtllm.runtime.generation_config import model_defaults

pytest.importorskip("torch")  # the tiny engine is built with the builder
pytestmark = pytest.mark.hf

REQUESTS = [chat("Hello there"), chat("The quick brown fox", max_generate_length=6), chat("Paris", min_new_tokens=2)]


def test_overrides_answer_as_the_file_with_those_values(run_cli, tmp_path, tiny_engine):
    """--max-generate-length and --num-logprobs replace the top-level value and each request's own;
    --batch-size the file's batch_size. A request the new value makes invalid fails alone, naming its path."""
    engine = tiny_engine("llama")
    payload = {"batch_size": 1, "temperature": 0, "max_generate_length": 8, "requests": REQUESTS}
    payload["requests"] = [REQUESTS[0], {**REQUESTS[1], "num_logprobs": 5}, REQUESTS[2]]
    result, got = run_cli(engine, payload, "--max-generate-length", "3", "--batch-size", "2", "--num-logprobs", "2")
    assert result.exit_code == 0, result.output
    edited = {**payload, "batch_size": 2, "max_generate_length": 3, "num_logprobs": 2,
              "requests": [REQUESTS[0], {**REQUESTS[1], "max_generate_length": 3, "num_logprobs": 2}, REQUESTS[2]]}
    _, want = run_cli(engine, edited)
    assert got == want
    assert [r["batch_idx"] for r in got["responses"]][:2] == [0, 1]  # two slots, not the file's one
    assert all(len(step) == 2 for r in got["responses"] for step in r["logprobs"])
    result, out = run_cli(engine, payload, "--max-generate-length", "1")
    assert result.exit_code == 1
    error = out["responses"][2]["error"]
    assert error.startswith("`requests[2].min_new_tokens` must be <= `max_generate_length` (set by "
                            "--max-generate-length) (1)")
    assert [r["finish_reason"] for r in out["responses"][:2]] == ["max-length"] * 2


def test_overrides_keep_the_files_checks():
    doc = strict_json.decode(b'{"requests": [{"messages": [], "n": 1, "n": 2}]}', "test")
    with pytest.raises(fmt.InputError, match="given twice|more than once|duplicate"):
        fmt.parse_input(fmt.apply_overrides(doc, {"max_generate_length": 2}))
    doc = strict_json.decode(b'{"batch_size": 1, "batch_size": 2, "requests": []}', "test")
    with pytest.raises(fmt.InputError, match="batch_size"):
        fmt.parse_input(fmt.apply_overrides(doc, {"batch_size": 3}))


def brief(text, **extra):
    return {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": text}], **extra}


def test_warmup_answers_the_first_request_before_the_run(run_cli, tmp_path, tiny_engine, monkeypatch):
    """The warm-up runs the first request that can run, with no saved system-prompt KV read or
    written, so the run answers, saves and reuses as without it, and --profile counts the run alone."""
    from trtllm.runtime.runner import Runner

    engine = tiny_engine("llama")
    payload = {"batch_size": 1, "temperature": 0, "max_generate_length": 4,
               "requests": [{"messages": []}, brief("a", save_system_prompt_kv_cache=True), brief("b")]}
    payload["requests"][0]["lora_name"] = "nope"  # the first requests fail: the warm-up takes the next
    payload["available_lora_weights"] = {}
    image = {"messages": [{"role": "user", "content": [{"type": "image", "image": "x.png"}]}]}
    payload["requests"].insert(1, image)  # (it reads, and fails as it is prepared)
    answers, profiles, caches = [], [], []
    run, runs = Runner.run, []

    def counted(self, inp, *args, **kwargs):
        runs.append([r.messages for r in inp.requests])
        return run(self, inp, *args, **kwargs)

    monkeypatch.setattr(Runner, "run", counted)
    for warmup in ("0", "2"):
        cache, profile = tmp_path / f"cache{warmup}", tmp_path / f"profile{warmup}.json"
        result, out = run_cli(engine, payload, "--warmup", warmup, "--kv-cache-dir", str(cache),
                              "--profile", str(profile))
        assert result.exit_code == 1 and out["responses"][0]["finish_reason"] == "error"
        answers.append(out["responses"])
        profiles.append(json.loads(profile.read_text()))
        caches.append(sorted(p.name for p in cache.glob("*.kv")))
    assert runs[1:3] == [[fmt.parse_input(payload, isolate=True).requests[2].messages]] * 2  # the warm-ups
    assert answers[0] == answers[1] and caches[0] == caches[1] and len(caches[0]) == 1
    for part in ("prefill", "generation"):
        for key in ("total_runs", "reused_tokens", "computed_tokens", "generated_tokens"):
            assert profiles[0][part].get(key) == profiles[1][part].get(key), (part, key)
    assert profiles[1]["prefill"]["reused_tokens"] > 0  # request 2 reused what request 1 saved


def test_a_ctrl_c_while_warming_up_writes_nothing(tmp_path, tiny_engine, monkeypatch):
    from trtllm.runtime import runner

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "run_rows", interrupted)
    (tmp_path / "out.json").write_text('{"good": true}')
    (tmp_path / "in.json").write_text(json.dumps({"requests": [chat("a")]}))
    result = CliRunner().invoke(main, [str(tmp_path / "in.json"), "--engine", str(tiny_engine("llama")),
                                       "--output", str(tmp_path / "out.json"), "--warmup", "1"])
    assert result.exit_code == 130 and "interrupted while warming up" in result.output
    assert json.loads((tmp_path / "out.json").read_text()) == {"good": True}


@pytest.mark.parametrize("during", ["warm-up", "run"])
def test_one_signal_still_stops_a_run_with_a_warmup(tmp_path, tiny_engine, monkeypatch, during):
    """A warm-up pass ends as a run does (its interrupts settled, to wait for the writes): the run
    after it must take the first Ctrl-C or SIGTERM again. One request of 4 tokens warms up in steps
    1-4; a SIGTERM comes in step 3 (the warm-up: nothing runs or is written) or step 7 (the run:
    its requests are cancelled, not all answered)."""
    import os
    import signal

    from trtllm.runtime.backends import onnxruntime as ort_backend

    engine = tiny_engine("llama")  # (built, and checked, before steps are counted)
    step, calls = ort_backend.OnnxRuntimeEngine.step, [0]
    at = 3 if during == "warm-up" else 7

    def terminated_at(self, inputs, kv, want_logits=False):
        calls[0] += 1
        if calls[0] == at:
            os.kill(os.getpid(), signal.SIGTERM)
        return step(self, inputs, kv, want_logits)

    monkeypatch.setattr(ort_backend.OnnxRuntimeEngine, "step", terminated_at)
    payload = {"batch_size": 1, "temperature": 0, "max_generate_length": 4, "ignore_eos": True,
               "requests": [chat("a"), chat("b"), chat("c")]}
    (tmp_path / "in.json").write_text(json.dumps(payload))
    result = CliRunner().invoke(main, [str(tmp_path / "in.json"), "--engine", str(engine),
                                       "--output", str(tmp_path / "out.json"), "--warmup", "1"])
    assert result.exit_code == 130, result.output
    if during == "warm-up":
        assert "interrupted while warming up" in result.output and not (tmp_path / "out.json").exists()
    else:
        assert "requests were cancelled" in result.output, result.output


def test_threads_past_a_few_per_core_are_refused(tmp_path):
    """Ten thousand threads exhausted memory while the engine loaded, past any signal: refused up front."""
    from trtllm.runtime.cli import MAX_THREADS

    (tmp_path / "in.json").write_text(json.dumps({"requests": [chat("a")]}))
    result = CliRunner().invoke(main, [str(tmp_path / "in.json"), "--engine", str(tmp_path), "--threads",
                                       str(MAX_THREADS + 1)])
    assert result.exit_code == 2 and f"1<=x<={MAX_THREADS}" in result.output


@pytest.mark.parametrize("config, want", [
    ({}, {"temperature": 0, "top_k": 50, "top_p": 1.0}),  # transformers' generate(): greedy unless the config samples
    ({"do_sample": False, "temperature": 0.7, "top_p": 0.9, "min_p": 0.1, "repetition_penalty": 1.2},
     {"temperature": 0, "top_k": 50, "top_p": 0.9, "min_p": 0.1, "repetition_penalty": 1.2}),  # (for a request that samples)
    ({"do_sample": True}, {"temperature": 1.0, "top_k": 50, "top_p": 1.0}),  # GenerationConfig's defaults
    ({"do_sample": True, "temperature": 0.6, "top_k": None, "top_p": 0.9, "min_p": 0.05, "max_new_tokens": 64},
     {"temperature": 0.6, "top_k": 50, "top_p": 0.9, "min_p": 0.05, "max_generate_length": 64}),
    ({"num_beams": 4, "length_penalty": 0.8, "early_stopping": True},  # beam search
     {"temperature": 0, "top_k": 50, "top_p": 1.0, "num_beams": 4, "length_penalty": 0.8, "early_stopping": True}),
    ({"num_beams": 1, "length_penalty": 0.8}, {"temperature": 0, "top_k": 50, "top_p": 1.0}),
    ({"do_sample": True, "num_beams": 4}, {"temperature": 1.0, "top_k": 50, "top_p": 1.0}),  # (beam sampling: not here)
    ({"no_repeat_ngram_size": 3, "num_beams": 2},  # (generate() applies it to any decoding)
     {"temperature": 0, "top_k": 50, "top_p": 1.0, "no_repeat_ngram_size": 3, "num_beams": 2}),
])
def test_model_defaults_are_what_generate_does_with_the_config(config, want):
    assert model_defaults(config) == want


def test_model_defaults_fill_only_what_the_file_leaves_out(run_cli, tmp_path, tiny_engine, capsys):
    """--sampling-defaults model: the engine's generation_config.json, where neither the top level nor
    the request sets a value; the answers are those of the file with the values written in. A
    config this runtime refuses stops the run, naming the file."""
    import shutil

    engine = tmp_path / "engine"
    shutil.copytree(tiny_engine("llama"), engine)
    config = json.loads((engine / "generation_config.json").read_text())
    (engine / "generation_config.json").write_text(json.dumps(
        {**config, "do_sample": True, "temperature": 0.7, "top_k": 5, "repetition_penalty": 1.1, "max_new_tokens": 3}))
    payload = {"seed": 3, "requests": [chat("Hello"), chat("Paris", top_k=0, max_generate_length=5)]}
    result, got = run_cli(engine, payload, "--sampling-defaults", "model")
    assert result.exit_code == 0, result.output
    written = {"temperature": 0.7, "top_k": 5, "top_p": 1.0, "repetition_penalty": 1.1, "max_generate_length": 3}
    _, want = run_cli(engine, {**written, **payload})
    assert got["responses"] == want["responses"]
    assert [r["output_tokens"] for r in got["responses"]][0] <= 3
    _, plain = run_cli(engine, payload)  # Edge-LLM's defaults (top_p 0.8, 256 tokens): another answer
    assert plain["responses"] != got["responses"]
    (engine / "generation_config.json").write_text(json.dumps({"do_sample": True, "max_new_tokens": -1}))
    result, _ = run_cli(engine, payload, "--sampling-defaults", "model")
    assert result.exit_code == 2 and "generation_config.json: its `max_new_tokens` is refused" in result.output
    assert "`max_new_tokens` must be an integer >= 0, got -1" in result.output
    # a refused value the file or the command line replaces is never used: no reason to stop (a review's)
    assert run_cli(engine, {**payload, "max_generate_length": 2}, "--sampling-defaults", "model")[0].exit_code == 0
    assert run_cli(engine, payload, "--sampling-defaults", "model", "--max-generate-length", "2")[0].exit_code == 0
    for config, says in (({"do_sample": "no"}, "its `do_sample` is refused (`do_sample` must be true or false"),
                         ({"do_sample": True, "temperature": 0}, "its `temperature` is refused (`temperature` must be "
                                                                  "above 0 with `do_sample`")):
        (engine / "generation_config.json").write_text(json.dumps(config))  # the engine's limit, transformers' checks
        result, _ = run_cli(engine, payload, "--sampling-defaults", "model")
        assert result.exit_code == 2 and says in result.output, result.output
    (engine / "generation_config.json").write_text(json.dumps({"do_sample": True, "top_k": 200}))
    small = SimpleNamespace(files={}, max_top_k=100, model=SimpleNamespace(vocab_size=400),  # (the tiny one's is all)
                            limits=SimpleNamespace(max_batch_size=4))
    _, refused = generation_defaults(engine, small)  # a top_k the engine's sampler cannot take, as a request's would be
    assert "its `top_k` is refused (`top_k` must be <= 100 (the engine's sampler limit)" in refused["top_k"]
    (engine / "generation_config.json").write_text(json.dumps({"num_beams": 8}))  # more beams than the engine's rows
    _, refused = generation_defaults(engine, small)  # (every request failed, naming a `num_beams` the file lacks)
    assert ("its `num_beams` is refused (`num_beams` must be at most the engine's max_batch_size 4 (each beam is a "
            "batch row), got 8") in refused["num_beams"]
    (engine / "generation_config.json").write_text(json.dumps({"max_new_tokens": 2}))
    result, out = run_cli(engine, {"requests": [chat("Hi", min_new_tokens=3)]}, "--sampling-defaults", "model")
    assert out["responses"][0]["error"] == ("`requests[0].min_new_tokens` must be <= `max_generate_length` "
                                            "(generation_config.json's `max_new_tokens`) (2), got 3")
    result, out = run_cli(engine, {"requests": [chat("Hi", min_new_tokens=3)]}, "--sampling-defaults", "model",
                          "--max-generate-length", "2")  # the option's value, not the config's
    assert out["responses"][0]["error"] == ("`requests[0].min_new_tokens` must be <= `max_generate_length` "
                                            "(set by --max-generate-length) (2), got 3")
