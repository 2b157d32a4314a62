"""prompt_logprobs (vLLM's) against transformers: every prompt token's log-probability and the top
ones at its place, within fp32 tolerance, whole or in chunks, beside requests that do not ask (whose
answers stay the same), with n samples, saved system prompts and --context-reuse, and on an EAGLE
engine. The wrong variant, a token scored by its own position's logits, must fail."""
from __future__ import annotations

import json

import numpy as np
import pytest

from tests.eagle_drafts import random_draft
from trtllm.builder.config import BuildConfig
from trtllm.builder.export import build
from trtllm.runtime import prompt_scores

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.hf
ATOL = 1e-4
TEXTS = ["The quick brown fox jumps over the lazy dog. " * 3, "What is the capital of France?"]


def chat(text, **extra):
    return {"messages": [{"role": "user", "content": text}], **extra}


def reference(checkpoint, ids: list[int]) -> np.ndarray:
    """transformers' log_softmax over the vocabulary at every prompt position [S, V]."""
    model = transformers.AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    with torch.no_grad():
        return torch.log_softmax(model(torch.tensor([ids])).logits[0], -1).numpy()


def prompt_ids(engine, response) -> list[int]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(engine / "tokenizer.json"))
    ids = tok.encode(response["formatted_complete_request"], add_special_tokens=False).ids
    assert len(ids) == response["prompt_tokens"] == len(response["prompt_token_logprobs"])
    return ids


def error(checkpoint, engine, response, k: int) -> float:
    """The largest difference from transformers of a response's prompt scores (each prompt token's
    own and its top k, which must be transformers' k best ids in order)."""
    ids = prompt_ids(engine, response)
    ref = reference(checkpoint, ids)
    own, top = response["prompt_token_logprobs"], response.get("prompt_logprobs")
    assert own[0] is None and (k == 0) == (top is None)
    worst = 0.0
    for p in range(1, len(ids)):
        assert own[p]["token_id"] == ids[p]
        worst = max(worst, abs(own[p]["logprob"] - ref[p - 1, ids[p]]))
        if k:
            assert [e["token_id"] for e in top[p]] == np.argsort(-ref[p - 1], kind="stable")[:k].tolist()
            worst = max(worst, max(abs(e["logprob"] - ref[p - 1, e["token_id"]]) for e in top[p]))
    return worst


def run(run_cli, engine, requests, *extra, **top):
    result, out = run_cli(engine, {"temperature": 0, "max_generate_length": 6, "batch_size": 4,
                                   "requests": requests, **top}, *extra)
    assert result.exit_code == 0, result.output
    return out["responses"]


@pytest.mark.parametrize("arch", ["llama", "gemma3", "gemma4", "granite4-h"])
@pytest.mark.parametrize("chunk", [5, prompt_scores.SCORE_CHUNK])
def test_prompt_logprobs_match_transformers(arch, chunk, tiny_checkpoint, tiny_engine, run_cli, monkeypatch):
    """Whole, and in chunks of 5 positions (gemma3's sliding window is 8: chunks cross it; gemma4's KV-sharing
    layers then compute every position, not the last alone: DecoderWriter.shared_rows)."""
    monkeypatch.setattr(prompt_scores, "SCORE_CHUNK", chunk)
    engine = tiny_engine(arch)
    responses = run(run_cli, engine, [chat(TEXTS[0], prompt_logprobs=3), chat(TEXTS[1], prompt_logprobs=0)])
    assert responses[0]["prompt_tokens"] > 3 * 5
    assert error(tiny_checkpoint(arch), engine, responses[0], 3) < ATOL
    assert error(tiny_checkpoint(arch), engine, responses[1], 0) < ATOL


def test_gemma4_s_standard_op_graph_scores_every_position(tiny_checkpoint, run_cli, tmp_path):
    """Without our kernels (the compiled form llm.onnx's standard ops, TensorRT's graph) Gemma 4's KV-sharing
    layers keep every position where the step asks for them, as on our kernel."""
    engine = build(BuildConfig(model=str(tiny_checkpoint("gemma4")), output=str(tmp_path / "e"), cpu_kernels="onnxruntime",
                               max_batch_size=4, max_input_len=256, max_kv_cache_capacity=512), log=lambda m: None)
    responses = run(run_cli, engine, [chat(TEXTS[0], prompt_logprobs=3), chat(TEXTS[1], prompt_logprobs=0)])
    assert error(tiny_checkpoint("gemma4"), engine, responses[0], 3) < ATOL
    assert error(tiny_checkpoint("gemma4"), engine, responses[1], 0) < ATOL


def test_a_prompt_is_scored_with_nothing_generated(tiny_checkpoint, tiny_engine, run_cli):
    """max_generate_length 0 (a continuation's log-likelihood): the prompt is prefilled for its
    scores alone, with n samples and a plain neighbour, which still takes no step."""
    engine = tiny_engine("llama")
    result, out = run_cli(engine, {"max_generate_length": 0, "apply_chat_template": False, "requests": [
        {"messages": [{"role": "user", "content": TEXTS[1]}], "prompt_logprobs": 1, "n": 2},
        {"messages": [{"role": "user", "content": TEXTS[0]}]}]}, "--stream")
    assert result.exit_code == 0, result.output
    scored, samples, plain = out["responses"]
    for r in (scored, samples):
        assert r["finish_reason"] == "max-length" and r["output_ids"] == [] and r["output_text"] == ""
    assert samples["prompt_logprobs"] == scored["prompt_logprobs"] and "prompt_logprobs" not in plain
    assert plain["finish_reason"] == "max-length" and plain["batch_idx"] is None  # (no slot: no step)
    assert error(tiny_checkpoint("llama"), engine, scored, 1) < ATOL
    assert len([line for line in result.output.splitlines() if line.startswith("{")]) == 3  # each stream ends


def test_wrong_variant_scoring_a_token_by_its_own_position_fails(tiny_checkpoint, tiny_engine, run_cli, monkeypatch):
    def shifted(row, start, logits):  # position p's logits taken for token p, not token p + 1
        for t in range(logits.shape[0]):
            lp = prompt_scores.sampling.log_softmax(logits[t], np.float32(0))
            row.prompt_scores.append((float(lp[row.prompt_ids[start + t]]), np.empty(0, np.float32),
                                      np.empty(0, np.int64)))

    monkeypatch.setattr(prompt_scores, "record", shifted)
    engine = tiny_engine("llama")
    responses = run(run_cli, engine, [chat(TEXTS[0], prompt_logprobs=0)])
    assert error(tiny_checkpoint("llama"), engine, responses[0], 0) > 0.1


def test_neighbours_and_samples(tiny_engine, run_cli, monkeypatch):
    """Scored requests beside plain ones, in chunks: every answer is the one without prompt_logprobs;
    a request's n samples give the same scores; a request that does not ask gets none."""
    monkeypatch.setattr(prompt_scores, "SCORE_CHUNK", 4)
    engine = tiny_engine("llama")
    plain = [chat(TEXTS[0], n=2), chat(TEXTS[1]), chat("Numbers 0 1 2 3")]
    scored = [chat(TEXTS[0], n=2, prompt_logprobs=2), chat(TEXTS[1]), chat("Numbers 0 1 2 3", prompt_logprobs=1)]
    want = [(r["output_text"], r["output_ids"]) for r in run(run_cli, engine, plain)]
    got = run(run_cli, engine, scored)
    assert [(r["output_text"], r["output_ids"]) for r in got] == want
    assert got[0]["prompt_logprobs"] == got[1]["prompt_logprobs"] and len(got[0]["prompt_logprobs"][1]) == 2
    assert got[0]["prompt_token_logprobs"] == got[1]["prompt_token_logprobs"]
    assert "prompt_logprobs" not in got[2] and "prompt_token_logprobs" not in got[2]
    assert len(got[3]["prompt_logprobs"]) == got[3]["prompt_tokens"]
    # the top level's value is every request's; a request's own null turns it off (vLLM's null)
    top = run(run_cli, engine, [chat(TEXTS[1]), chat(TEXTS[1], prompt_logprobs=None)], prompt_logprobs=0)
    assert len(top[0]["prompt_token_logprobs"]) == top[0]["prompt_tokens"] and "prompt_logprobs" not in top[0]
    assert "prompt_token_logprobs" not in top[1] and top[1]["output_ids"] == top[0]["output_ids"]


def test_restored_kv_is_not_taken_for_a_scored_prompt(tiny_engine, run_cli, tmp_path):
    """A saved system prompt and --context-reuse hold KV for the prompt, but no logits: a scored
    prompt is computed whole, and scores as it does without them."""
    engine = tiny_engine("llama")
    req = {"messages": [{"role": "system", "content": "Be brief. " * 4}, {"role": "user", "content": TEXTS[1]}],
           "save_system_prompt_kv_cache": True, "prompt_logprobs": 1}
    alone = run(run_cli, engine, [req])[0]
    cache = ["--kv-cache-dir", str(tmp_path / "kv"), "--context-reuse", "--profile", str(tmp_path / "p.json")]
    for _ in range(2):  # the first run saves, the second could restore
        again = run(run_cli, engine, [req, {**req, "prompt_logprobs": None}], *cache)
        assert again[0]["prompt_token_logprobs"] == alone["prompt_token_logprobs"]
        assert again[0]["prompt_logprobs"] == alone["prompt_logprobs"]
        assert again[0]["output_text"] == again[1]["output_text"] == alone["output_text"]
    assert json.loads((tmp_path / "p.json").read_text())["prefill"]["reused_tokens"] > 0  # (the plain one did)


def test_bad_values_name_their_path(tiny_engine, run_cli):
    engine = tiny_engine("llama")
    for value in (-1, 51, 1.5, "3", True):
        result, out = run_cli(engine, {"requests": [chat("hi", prompt_logprobs=value), chat("hi")],
                                       "max_generate_length": 2})
        assert result.exit_code == 1, result.output  # that request fails alone
        assert "`requests[0].prompt_logprobs` must be" in out["responses"][0]["error"]
        assert out["responses"][1]["finish_reason"] == "max-length"


def test_an_engine_without_prompt_logits_fails_the_request_alone(tiny_engine):
    import dataclasses

    from trtllm.runtime import input_format as fmt
    from trtllm.runtime.engine import load_engine
    from trtllm.runtime.request_checks import unscored

    engine = load_engine(tiny_engine("llama"))
    inp = fmt.parse_input({"prompt_logprobs": 1, "requests": [chat("hi"), chat("hi", prompt_logprobs=2),
                                                              chat("hi", prompt_logprobs=None)]})
    for backend, why in (("onnxruntime", "rebuild it"), ("tensorrt", "TensorRT plan")):
        m = dataclasses.replace(engine.manifest, prompt_logits=False, backend=backend)
        why_not = [unscored(r, i, m) for i, r in enumerate(inp.requests)]
        assert [w and w.split(":")[0] for w in why_not] == ["`prompt_logprobs`", "`requests[1].prompt_logprobs`",
                                                             None]  # (its null: off)
        assert why in why_not[0]
    assert unscored(inp.requests[0], 0, engine.manifest) is None


def test_manifest_prompt_logits_must_be_a_bool(tiny_engine, tmp_path):
    import shutil

    from trtllm.runtime import manifest as mf

    engine = tmp_path / "engine"
    shutil.copytree(tiny_engine("llama"), engine)
    assert mf.load(engine).prompt_logits is True
    raw = json.loads((engine / "manifest.json").read_text())
    (engine / "manifest.json").write_text(json.dumps({**raw, "prompt_logits": "yes"}))
    with pytest.raises(mf.ManifestError, match="prompt_logits must be true or false"):
        mf.load(engine)


def test_eagle_engine_scores_as_the_plain_one(tiny_checkpoint, tiny_engine, tmp_path, run_cli, monkeypatch):
    """An EAGLE engine's prompt scores (its verify_logits, its sampler run over the positions too) are
    the plain engine's, and speculation after a scored prefill changes no answer."""
    monkeypatch.setattr(prompt_scores, "SCORE_CHUNK", 6)
    ckpt = tiny_checkpoint("llama")
    draft = random_draft(ckpt, tmp_path / "draft", seed=3, aux=[0, 1, 1])
    eagle = build(BuildConfig(model=str(ckpt), output=str(tmp_path / "eagle"), eagle=str(draft), max_batch_size=4,
                              max_input_len=96, max_kv_cache_capacity=192), log=lambda m: None)
    requests = [chat(TEXTS[0][:90], prompt_logprobs=2), chat(TEXTS[1])]
    plain = run(run_cli, tiny_engine("llama"), requests)
    got = run(run_cli, eagle, requests)
    assert [r["output_text"] for r in got] == [r["output_text"] for r in plain]
    for ours, theirs in zip(got[0]["prompt_token_logprobs"][1:], plain[0]["prompt_token_logprobs"][1:]):
        assert ours["token_id"] == theirs["token_id"] and abs(ours["logprob"] - theirs["logprob"]) < 1e-5
    assert error(ckpt, eagle, got[0], 2) < ATOL


def test_samples_with_nothing_to_generate_end_as_their_scorer(tiny_engine, monkeypatch):
    """n samples and max_generate_length 0: the first scores the prompt for all, the others have
    nothing to do; when the scoring is cancelled, they are cancelled too, not finished without scores."""
    from trtllm.runtime import input_format as fmt
    from trtllm.runtime.chat_template import ChatTemplate
    from trtllm.runtime.engine import load_engine
    from trtllm.runtime.runner import Runner
    from trtllm.runtime.tokenizer import Tokenizer

    path = tiny_engine("llama")
    engine = load_engine(path)
    runner = Runner(engine, Tokenizer.from_engine_dir(path, engine.manifest.files),
                    ChatTemplate.from_engine_dir(path, engine.manifest.files))
    inp = fmt.parse_input({"max_generate_length": 0, "requests": [chat(TEXTS[0], prompt_logprobs=1, n=3)]})
    assert [r["finish_reason"] for r in runner.run(inp)] == ["max-length"] * 3

    def interrupted(row, start, logits):
        raise KeyboardInterrupt

    monkeypatch.setattr(prompt_scores, "record", interrupted)
    responses = Runner(engine, runner.tokenizer, runner.template).run(inp)
    assert [r["finish_reason"] for r in responses] == ["cancelled"] * 3
    assert not any("prompt_token_logprobs" in r for r in responses)


def test_logits_that_overflow_fail_the_scored_request_alone(tiny_engine, monkeypatch):
    """NaN logits at a scored position (a float16 overflow) would make every score NaN, written as
    null like a token the model rules out: the request fails instead, saying why; its neighbour runs."""
    from trtllm.runtime.engine import load_engine
    from trtllm.runtime.generate import RowState, run_rows
    from trtllm.runtime.sampling import SamplingParams

    engine = load_engine(tiny_engine("llama"))
    step = engine.step

    def overflowing(inputs, kv, want_logits=False):
        out = step(inputs, kv, want_logits)
        if out.verify_logits is not None and out.verify_logits.shape[1] > 3:
            out.verify_logits[0, 3, 7] = np.nan
        return out

    monkeypatch.setattr(engine, "step", overflowing)
    rows = [RowState(prompt_ids=list(range(5, 25)), params=SamplingParams(temperature=0.0, max_new_tokens=4),
                     rng=np.random.default_rng(0), eos_ids=frozenset()) for _ in range(2)]
    rows[0].prompt_logprobs = 1
    run_rows(engine, rows)
    assert rows[0].finish_reason == "error" and "not finite" in rows[0].error
    assert rows[1].finish_reason == "max-length" and len(rows[1].output_ids) == 4
