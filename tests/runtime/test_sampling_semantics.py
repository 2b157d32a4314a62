"""Every sampling parameter end to end on a tiny engine, through trtllm-run; penalties are
token-exact against transformers (repetition) or a numpy re-implementation (frequency/presence)."""
from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from trtllm.runtime.tokenizer import Tokenizer  # noqa: E402

pytestmark = pytest.mark.hf


def chat(text, **extra):
    return {"messages": [{"role": "user", "content": text}], **extra}


def texts(out):
    return [r["output_text"] for r in out["responses"]]


@pytest.fixture(scope="module")
def eos_id(tiny_engine):
    return json.loads((tiny_engine("llama") / "manifest.json").read_text())["eos_token_ids"][0]


def test_seed_reproducible_and_fresh_without(run_cli, tiny_engine):
    engine = tiny_engine("llama")
    payload = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "max_generate_length": 16,
               "requests": [chat("Hello", seed=7), chat("Hello", seed=7), chat("Hello", seed=8), chat("Hello")]}
    _, a = run_cli(engine, payload)
    _, b = run_cli(engine, payload)
    assert texts(a)[0] == texts(a)[1] == texts(b)[0]
    assert texts(a)[0] != texts(a)[2]
    assert texts(a)[3] != texts(b)[3]  # no seed: a fresh one each run


def test_sample_i_draws_from_seed_plus_i(run_cli, tiny_engine):
    """sampling.md: sample i of a request draws from numpy's default_rng(seed + i), so a request of
    seed 5's sample 1 is one of seed 6's sample 0 (the same prompt and settings), and that stream is
    the one numpy gives."""
    from types import SimpleNamespace

    import numpy as np

    from trtllm.runtime.runner import sample_rng

    payload = {"batch_size": 3, "temperature": 1.0, "top_k": 0, "top_p": 1.0, "max_generate_length": 12,
               "requests": [chat("Hello", n=2, seed=5), chat("Hello", seed=6)]}
    _, out = run_cli(tiny_engine("llama"), payload)
    rs = out["responses"]
    assert rs[1]["output_text"] == rs[2]["output_text"] != rs[0]["output_text"]
    want = np.random.default_rng(6).random(8, dtype=np.float32)
    assert (sample_rng(SimpleNamespace(seed=5), 1).random(8, dtype=np.float32) == want).all()


def test_n_samples(run_cli, tiny_engine):
    payload = {"batch_size": 4, "temperature": 1.0, "top_k": 0, "top_p": 1.0, "max_generate_length": 12,
               "requests": [chat("Hello", n=3, seed=1), chat("Paris")]}
    result, out = run_cli(tiny_engine("llama"), payload)
    assert result.exit_code == 0
    rs = out["responses"]
    assert [(r["request_idx"], r.get("sample_idx")) for r in rs] == [(0, 0), (0, 1), (0, 2), (1, None)]
    assert len({r["output_text"] for r in rs[:3]}) == 3
    _, again = run_cli(tiny_engine("llama"), payload)
    assert texts(again)[:3] == texts(out)[:3]


def test_per_request_sampling_in_one_batch(run_cli, tiny_engine):
    """A greedy request answers the same alone and next to a hot sampled neighbour."""
    engine = tiny_engine("llama")
    greedy = chat("The quick brown fox", temperature=0)
    _, alone = run_cli(engine, {"max_generate_length": 16, "requests": [greedy]})
    hot = chat("Hello", temperature=2.0, top_k=0, top_p=1.0, min_p=0.0, seed=3)
    _, mixed = run_cli(engine, {"batch_size": 2, "max_generate_length": 16, "requests": [hot, greedy]})
    assert texts(mixed)[1] == texts(alone)[0]


def test_logit_bias_and_eos_controls(run_cli, tiny_engine, eos_id):
    engine = tiny_engine("llama")
    tok = Tokenizer.from_engine_dir(engine)
    x = tok.encode("fox")[0]
    payload = {"temperature": 0, "max_generate_length": 6, "logit_bias": {str(x): 100},
               "requests": [chat("a"), chat("b", logit_bias={str(eos_id): 100}),
                            chat("c", logit_bias={str(eos_id): 100}, ignore_eos=True),
                            chat("d", logit_bias={str(eos_id): 100}, min_new_tokens=3, num_logprobs=1),
                            chat("e", stop_token_ids=[x])]}
    result, out = run_cli(engine, payload)
    assert result.exit_code == 0
    rs = out["responses"]
    assert rs[0]["output_text"] == tok.decode([x] * 6) and rs[0]["finish_reason"] == "max-length"
    assert rs[1]["output_text"] == "" and rs[1]["finish_reason"] == "end-of-sequence"
    assert rs[2]["finish_reason"] == "max-length"
    # three tokens while EOS is banned, then EOS as soon as it is allowed
    assert rs[3]["finish_reason"] == "end-of-sequence"
    assert [step[0]["token_id"] for step in rs[3]["logprobs"]][3:] == [eos_id]
    assert rs[4]["output_text"] == "" and rs[4]["finish_reason"] == "stop-words"
    assert rs[4]["stop_reason"] == x and rs[4]["output_ids"] == [x]  # the stop token, kept in the ids
    assert rs[1]["output_ids"] == [eos_id] and "stop_reason" not in rs[1]
    stopped = run_cli(engine, {**payload, "requests": [chat("a", stop=["q", tok.decode([x])])]})[1]["responses"][0]
    assert stopped["stop_reason"] == tok.decode([x]) and stopped["output_ids"] == [x]
    kept = run_cli(engine, {**payload, "requests": [chat("a", stop=[tok.decode([x])], include_stop_str_in_output=True)]})
    assert kept[1]["responses"][0]["output_text"] == tok.decode([x])  # vLLM's include_stop_str_in_output
    special = tok.encode("<|im_start|>")[0]  # a special token, forced: in the text only without skip_special_tokens
    forced = {**payload, "max_generate_length": 2, "logit_bias": {str(special): 100}}
    texts = [run_cli(engine, {**forced, "requests": [chat("a", skip_special_tokens=skip)]})[1]["responses"][0]["output_text"]
             for skip in (True, False)]
    assert texts == ["", "<|im_start|><|im_start|>"]


@pytest.mark.parametrize("stream", [False, True])
def test_include_stop_str_in_output_keeps_the_stop_tokens_text(run_cli, tiny_engine, eos_id, tmp_path, stream):
    """vLLM's include_stop_str_in_output keeps the text of the EOS or stop token that ended the
    answer (its detokenizer drops that token only without the flag): a stop token id's text, and
    EOS's where skip_special_tokens is false (a skipped special token's text is nothing). It was
    left out of output_text and of the stream."""
    engine = tiny_engine("llama")
    tok = Tokenizer.from_engine_dir(engine)
    x = tok.encode("fox")[0]
    payload = {"temperature": 0, "max_generate_length": 6, "requests": [
        chat("a", logit_bias={str(x): 100}, stop_token_ids=[x], include_stop_str_in_output=True),
        chat("b", logit_bias={str(x): 100}, stop_token_ids=[x]),
        chat("c", logit_bias={str(eos_id): 100}, include_stop_str_in_output=True, skip_special_tokens=False),
        chat("d", logit_bias={str(eos_id): 100}, include_stop_str_in_output=True),
        chat("e", logit_bias={str(eos_id): 100}, skip_special_tokens=False)]}
    want = [tok.decode([x]), "", tok.decode([eos_id], skip_special_tokens=False), "", ""]
    assert want[0] and want[2]
    options = ("--stream",) if stream else ()
    result, out = run_cli(engine, payload, *options)
    assert result.exit_code == 0
    assert texts(out) == want
    assert [r["finish_reason"] for r in out["responses"]] == ["stop-words"] * 2 + ["end-of-sequence"] * 3
    if stream:
        pieces = {}
        for line in result.output.splitlines():
            d = json.loads(line) if line.startswith("{") else {}  # (the CLI's other lines are mixed in)
            if "text" in d:
                pieces[d["request_idx"]] = pieces.get(d["request_idx"], "") + d["text"]
        assert [pieces.get(i, "") for i in range(5)] == want


def hf_penalised_greedy(model, prompt, n, rep=1.0, freq=0.0, pres=0.0, swapped=False):
    """Greedy decoding with the vLLM penalty formulas applied to transformers' logits (float64).
    `swapped`: the wrong variant, each penalty over the other's tokens (repetition over the output
    only, frequency and presence over the prompt too)."""
    ids = list(prompt)
    for _ in range(n):
        with torch.no_grad():
            x = model(torch.tensor([ids])).logits[0, -1].double().numpy()
        seen = np.zeros_like(x, bool)
        seen[ids[len(prompt):] if swapped else ids] = True
        x = np.where(seen, np.where(x > 0, x / rep, x * rep), x)
        out = ids if swapped else ids[len(prompt):]
        counts = np.bincount(out, minlength=x.size) if out else np.zeros(x.size)
        x = x - freq * counts - pres * (counts > 0)
        ids.append(int(np.argmax(x)))
    return ids[len(prompt):]


@pytest.mark.parametrize("rep, freq, pres", [(1.5, 0, 0), (1, 1.0, 0), (1, 0, 1.5), (1.2, 0.4, 0.3)])
def test_penalties_match_reference(rep, freq, pres, tiny_checkpoint, tiny_engine):
    from trtllm.runtime.engine import load_engine
    from trtllm.runtime.generate import RowState, run_batch
    from trtllm.runtime.sampling import SamplingParams

    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_checkpoint("llama"), dtype=torch.float32).eval()
    prompt = [5, 17, 42, 5, 17, 99]
    want = hf_penalised_greedy(model, prompt, 24, rep, freq, pres)
    params = SamplingParams(temperature=0, repetition_penalty=rep, frequency_penalty=freq, presence_penalty=pres,
                            max_new_tokens=24)
    row = RowState(prompt_ids=prompt, params=params, rng=np.random.default_rng(0), eos_ids=frozenset())
    run_batch(load_engine(tiny_engine("llama")), [row])
    assert row.output_ids == want
    if (rep != 1) + (freq != 0) + (pres != 0) == 1:  # the wrong variant must miss (mixed, their effects blur)
        assert row.output_ids != hf_penalised_greedy(model, prompt, 24, rep, freq, pres, swapped=True)
    if rep != 1:  # and transformers' own processor agrees for the repetition penalty
        with torch.no_grad():
            hf = model.generate(torch.tensor([prompt]), max_new_tokens=24, min_new_tokens=24, do_sample=False,
                                repetition_penalty=rep, eos_token_id=None) if freq == pres == 0 else None
        if hf is not None:
            assert hf[0, len(prompt):].tolist() == want


def test_edge_cases(run_cli, tiny_engine):
    engine = tiny_engine("llama")
    payload = {"temperature": 0, "max_generate_length": 8,
               "requests": [{"messages": []}, chat("x", max_generate_length=0), chat("y", max_generate_length=5000, ignore_eos=True, num_logprobs=1),
                            chat("Héllo 🙂 中文"), chat("z", top_k=100000, temperature=1.0)]}
    result, out = run_cli(engine, payload)
    assert result.exit_code == 0, result.output
    rs = out["responses"]
    assert rs[0]["finish_reason"] != "error"
    assert rs[1]["output_text"] == "" and rs[1]["finish_reason"] == "max-length"
    # capped by the engine's KV capacity: 512 positions for the prompt and every output token but the last
    prompt_len = len(Tokenizer.from_engine_dir(engine).encode(rs[2]["formatted_complete_request"]))
    assert rs[2]["finish_reason"] == "max-length" and len(rs[2]["logprobs"]) == 512 + 1 - prompt_len
    assert "🙂" in rs[3]["formatted_complete_request"]
    assert rs[4]["finish_reason"] != "error"


def test_stop_strings_of_multibyte_characters(run_cli, tiny_engine):
    """A grammar makes the tiny model write characters of several bytes (each one byte-level token
    per byte): a stop string of one ends the answer before it, and the earliest of two stop strings
    wins; kept with include_stop_str_in_output. Without the stop strings the answer holds them."""
    engine = tiny_engine("llama")
    guide = {"regex": "ab中cd🙂ef"}
    payload = {"temperature": 0, "max_generate_length": 24, "requests": [
        chat("Héllo", guided_decoding=guide), chat("Héllo", guided_decoding=guide, stop=["🙂", "中c"]),
        chat("Héllo", guided_decoding=guide, stop=["🙂"], include_stop_str_in_output=True)]}
    result, out = run_cli(engine, payload)
    assert result.exit_code == 0, result.output
    free, stopped, kept = out["responses"]
    assert free["output_text"] == "ab中cd🙂ef" and free["finish_reason"] != "stop-words"
    assert stopped["output_text"] == "ab" and stopped["finish_reason"] == "stop-words"
    assert stopped["stop_reason"] == "中c"
    assert kept["output_text"] == "ab中cd🙂" and kept["stop_reason"] == "🙂"


def test_stream_matches_output(tiny_engine, tmp_path):
    import subprocess
    import sys

    payload = {"batch_size": 2, "temperature": 0, "max_generate_length": 24,
               "requests": [chat("Hello", num_logprobs=3), chat("The quick", stop=[" the", "."]),
                            chat("Paris", n=2, temperature=1.0, num_logprobs=1),
                            chat("Nothing", max_generate_length=0)]}  # never runs, yet its stream ends
    (tmp_path / "in.json").write_text(json.dumps(payload))
    proc = subprocess.run([sys.executable, "-m", "trtllm.runtime", str(tmp_path / "in.json"), "--engine",
                           str(tiny_engine("llama")), "--stream", "--output", str(tmp_path / "out.json")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    out = json.loads((tmp_path / "out.json").read_text())["responses"]
    for r in out:
        key = (r["request_idx"], r.get("sample_idx", 0))
        mine = [ln for ln in lines if (ln["request_idx"], ln["sample_idx"]) == key]
        assert "".join(ln["text"] for ln in mine) == r["output_text"]
        assert mine[-1]["finish_reason"] == r["finish_reason"]
        assert all("finish_reason" not in ln for ln in mine[:-1])
        # the ids of each line are those generated since the last (its text may lag them): together, the answer's
        assert [t for ln in mine for t in ln["token_ids"]] == r["output_ids"]
        # and their logprobs, where asked: the output file's, line by line (none on a line without ids)
        for key in ("logprobs", "token_logprobs"):
            assert [e for ln in mine for e in ln.get(key, [])] == r.get(key, [])
            assert all(len(ln[key]) == len(ln["token_ids"]) for ln in mine if key in ln)
    assert sum("logprobs" in ln for ln in lines) > 20

