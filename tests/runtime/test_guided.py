"""guided_decoding: the input reader's checks (each naming its JSON path), and trtllm-run on a tiny
engine: sampled answers stay inside their grammar, a guide that does not compile fails its request
alone, logprobs and logit_bias see the grammar's mask, and an EAGLE engine answers a guided request
as a plain engine does. Token-exact parity with transformers is tests/parity/test_guided_parity.py."""
from __future__ import annotations

import json
import re

import pytest

from trtllm.runtime import guided
from trtllm.runtime.input_format import InputError, parse_input


def request(**extra):
    return {"messages": [{"role": "user", "content": "hi"}], **extra}


def error_of(doc: dict) -> InputError:
    with pytest.raises(InputError) as e:
        parse_input(doc)
    return e.value


TAG = {"begin": "<f=get>", "schema": {"type": "object"}, "end": "</f>"}
TRIGGERED = {"type": "triggered_tags", "triggers": ["<f"],
             "tags": [{"begin": "<f=get>", "content": {"type": "json_schema", "json_schema": {}}, "end": "</f>"}]}


@pytest.mark.parametrize("guide, path, says", [
    ("[0-9]+", "requests[0].guided_decoding", "a JSON object"),
    ({}, "requests[0].guided_decoding", "exactly one of"),
    ({"regex": "a", "choice": ["a"]}, "requests[0].guided_decoding", "exactly one of"),
    ({"regx": "a"}, "requests[0].guided_decoding.regx", "did you mean 'regex'"),
    ({"structural_tag": {}}, "requests[0].guided_decoding.structural_tag.structures", "must be given"),
    ({"structural_tag": "{"}, "requests[0].guided_decoding.structural_tag", "invalid JSON"),
    ({"structural_tag": {"structures": [TAG], "triggers": ["<g"]}},
     "requests[0].guided_decoding.structural_tag.structures[0].begin", "begins with one of the triggers ('<g')"),
    ({"structural_tag": {"structures": [{**TAG, "schema": '{"a": 1, "a": 2}'}], "triggers": ["<f"]}},
     "requests[0].guided_decoding.structural_tag.structures[0].schema.a", "given once"),
    ({"structural_tag": {"structures": [{**TAG, "schema": 3}], "triggers": ["<f"]}},
     "requests[0].guided_decoding.structural_tag.structures[0].schema", "a JSON schema"),
    ({"structural_tag": {"structures": [TAG], "triggers": ["<f"], "tags": []}},
     "requests[0].guided_decoding.structural_tag.tags", "unknown key"),
    ({"structural_tag": {"type": "structural_tag", "format": {**TRIGGERED, "stop_after_first": 1}}},
     "requests[0].guided_decoding.structural_tag.format.stop_after_first", "true or false"),
    ({"structural_tag": {"format": {**TRIGGERED, "tags": [{"begin": "<f", "content": {"type": "grammar"}, "end": ""}]}}},
     "requests[0].guided_decoding.structural_tag.format.tags[0].content.type", "a format implemented here"),
    ({"structural_tag": {"format": {**TRIGGERED, "tags": [{"begin": "<f", "content": {"type": "regex"}, "end": ""}]}}},
     "requests[0].guided_decoding.structural_tag.format.tags[0].content.pattern", "must be given"),
    ({"structural_tag": {"format": {**TRIGGERED, "type": "dispatch"}}},
     "requests[0].guided_decoding.structural_tag.format.type", "a format implemented here"),
    ({"structural_tag": {"format": {"type": "tag", "begin": "<a>", "content": {"type": "any_text", "max_tokens": 9},
                                    "end": "</a>"}}},
     "requests[0].guided_decoding.structural_tag.format.content.max_tokens", "not implemented"),
    ({"structural_tag": {"format": {"type": "any_text", "excludes": ["x", ""]}}},
     "requests[0].guided_decoding.structural_tag.format.excludes[1]", "non-empty string"),
    ({"structural_tag": {"format": {"type": "repeat", "min": 3, "max": 2, "content": {"type": "const_string",
                                                                                      "value": "a"}}}},
     "requests[0].guided_decoding.structural_tag.format.max", ">= `min` (3)"),
    ({"structural_tag": {"format": {**TRIGGERED, "tags": [{"type": "json_schema", "json_schema": {}}]}}},
     "requests[0].guided_decoding.structural_tag.format.tags[0].type", "'tag'"),
    ({"json_object": False}, "requests[0].guided_decoding.json_object", "true"),
    ({"json_schema": "{not json"}, "requests[0].guided_decoding.json_schema", "invalid JSON"),
    ({"json_schema": [1]}, "requests[0].guided_decoding.json_schema", "an object or a boolean"),
    ({"choice": []}, "requests[0].guided_decoding.choice", "non-empty array"),
    ({"choice": ["a", ""]}, "requests[0].guided_decoding.choice[1]", "non-empty string"),
    ({"regex": ""}, "requests[0].guided_decoding.regex", "non-empty string"),
    ({"ebnf": "x" * (guided.MAX_GUIDE_BYTES + 1)}, "requests[0].guided_decoding.ebnf", "at most"),
])
def test_a_bad_guide_names_its_path(guide, path, says):
    e = error_of({"requests": [request(guided_decoding=guide)]})
    assert e.json_path == path and says in str(e), str(e)


def test_a_guide_is_inherited_from_the_top_level_and_names_where_it_was_written():
    inp = parse_input({"guided_decoding": {"regex": "[ab]+"},
                       "requests": [request(), request(guided_decoding={"choice": ["x", "y"]})]})
    first, second = inp.requests
    assert (first.guided_decoding.kind, first.guided_decoding.text, first.guided_decoding.path) == (
        "regex", "[ab]+", "guided_decoding.regex")
    assert (second.guided_decoding.kind, json.loads(second.guided_decoding.text)) == ("choice", ["x", "y"])
    assert second.guided_decoding.path == "requests[1].guided_decoding.choice"
    schema = parse_input({"requests": [request(guided_decoding={"json_schema": '{"type": "string"}'})]})
    assert json.loads(schema.requests[0].guided_decoding.text) == {"type": "string"}


def test_openais_json_schema_wrapper_is_read_as_its_schema():
    """OpenAI's response_format.json_schema object ({"name", "schema", "strict"}), moved into
    guided_decoding.json_schema as the hint for response_format says: its `schema` is the guide. Read
    as a schema itself it has no keyword and allowed any JSON (the answer went unconstrained)."""
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    for wrapped in ({"name": "city", "strict": True, "schema": schema}, {"name": "city", "schema": json.dumps(schema)}):
        guide = parse_input({"requests": [request(guided_decoding={"json_schema": wrapped})]}).requests[0].guided_decoding
        assert json.loads(guide.text) == schema and guide.path == "requests[0].guided_decoding.json_schema.schema"
    e = error_of({"requests": [request(guided_decoding={"json_schema": {"name": "x", "schema": '{"a": 1, "a": 2}'}})]})
    assert e.json_path == "requests[0].guided_decoding.json_schema.schema.a" and "given once" in str(e), str(e)
    # a schema that merely has a property called "schema" is left as it is
    own = {"type": "object", "properties": {"schema": {"type": "string"}}}
    assert json.loads(parse_input({"requests": [request(guided_decoding={"json_schema": own})]})
                      .requests[0].guided_decoding.text) == own


def test_a_schema_is_read_as_strictly_as_the_file():
    """Inside a schema, as everywhere in the file: repeated keys and non-finite numbers are refused by
    path, in a schema object and in a string holding one; a string too deep to parse fails its
    request alone; sizes count the UTF-8 written, not escapes."""
    deep = "[" * 3000 + "]" * 3000
    e = error_of({"requests": [request(guided_decoding={"json_schema": '{"type": "integer", "type": "string"}'})]})
    assert e.json_path == "requests[0].guided_decoding.json_schema.type" and "given once" in str(e), str(e)
    e = error_of({"requests": [request(guided_decoding={"json_schema": '{"maximum": NaN}'})]})
    assert e.json_path == "requests[0].guided_decoding.json_schema" and "NaN is not JSON" in str(e), str(e)
    e = error_of({"requests": [request(guided_decoding={"json_schema": {"maximum": float("inf")}})]})
    assert e.json_path == "requests[0].guided_decoding.json_schema.maximum" and "finite" in str(e), str(e)
    inp = parse_input({"requests": [request(guided_decoding={"json_schema": deep}), request()]}, isolate=True)
    assert "nest at most 512 deep, got 3000 deep" in inp.invalid[0] and 1 not in inp.invalid
    # what the file's own reader lets through inside an object fails that request alone, by path
    from trtllm.runtime.strict_json import LongNumber

    nested = {}
    for _ in range(980):  # (json.dumps recurses deeper than the reader did)
        nested = {"items": nested}
    for schema, path, says in [({"const": "\ud800"}, "json_schema.const", "valid Unicode"),
                               ({"\udc00": {}}, 'json_schema["\\udc00"]', "valid Unicode"),
                               ({"maximum": LongNumber("9" * 5000)}, "json_schema.maximum", "5000 digits"),
                               (nested, "json_schema", "nested deeper")]:
        inp = parse_input({"requests": [request(guided_decoding={"json_schema": schema}), request()]}, isolate=True)
        assert f"requests[0].guided_decoding.{path}" in inp.invalid[0] and says in inp.invalid[0], inp.invalid
        assert 1 not in inp.invalid
    emoji = ["\U0001F600" * 10 + str(i) for i in range(1000)]  # 41 UTF-8 bytes each: under 128 KiB
    assert parse_input({"requests": [request(guided_decoding={"choice": emoji})]}).requests[0].guided_decoding
    assert parse_input({"requests": [request(guided_decoding={"json_schema": True})]}).requests[0].guided_decoding


@pytest.mark.parametrize("field, value", [("min_new_tokens", 3), ("ignore_eos", True)])
def test_settings_that_decide_the_end_are_refused_with_a_guide(field, value):
    e = error_of({field: value, "requests": [request(guided_decoding={"regex": "a+"})]})
    assert e.json_path == field and "requests[0].guided_decoding" in str(e), str(e)
    e = error_of({"guided_decoding": {"regex": "a+"}, "requests": [request(**{field: value})]})
    assert e.json_path == f"requests[0].{field}" and "`guided_decoding`" in str(e), str(e)


# --- trtllm-run on a tiny engine ----------------------------------------------------------------

CHOICES = ["the quick fox", "a lazy dog", "hello"]


@pytest.mark.hf
def test_sampled_answers_stay_in_their_grammar_and_a_bad_one_fails_alone(run_cli, tiny_engine):
    pytest.importorskip("torch")
    requests = [request(guided_decoding={"choice": CHOICES}, n=4),
                request(guided_decoding={"regex": "[0-9"}),
                request(guided_decoding={"regex": "[a-e]{3}\\.[0-9]{2}"}, n=3),
                request(guided_decoding={"ebnf": 'root ::= "(" [xy] ")"'}, temperature=0)]
    result, out = run_cli(tiny_engine("llama"), {"requests": requests, "seed": 11, "batch_size": 4,
                                                 "max_generate_length": 32, "temperature": 1.5, "top_p": 1})
    assert result.exit_code == 1, result.output  # one request failed
    by = {}
    for r in out["responses"]:
        by.setdefault(r["request_idx"], []).append(r)
    assert all(r["finish_reason"] == "end-of-sequence" and r["output_text"] in CHOICES for r in by[0])
    (bad,) = by[1]
    assert bad["finish_reason"] == "error" and bad["error"].startswith(
        "`requests[1].guided_decoding.regex` does not compile:") and "\n" not in bad["error"]
    assert all(re.fullmatch(r"[a-e]{3}\.[0-9]{2}", r["output_text"]) and r["finish_reason"] == "end-of-sequence"
               for r in by[2])
    assert re.fullmatch(r"\([xy]\)", by[3][0]["output_text"])


@pytest.mark.hf
def test_logprobs_and_logit_bias_see_the_mask(run_cli, tiny_engine):
    pytest.importorskip("torch")
    from trtllm.runtime.tokenizer import Tokenizer

    engine = tiny_engine("llama")
    tok = Tokenizer.from_engine_dir(engine)
    guide = {"regex": "[ab]"}
    allowed = {i for i in range(tok.vocab_size) if tok.decode([i]) in ("a", "b")}
    result, out = run_cli(engine, {"temperature": 0, "num_logprobs": 5, "requests": [request(guided_decoding=guide)]})
    first = out["responses"][0]["logprobs"][0]
    # only the grammar's tokens have a probability at the first step: the rest are -inf (null)
    assert {e["token_id"] for e in first if e["logprob"] is not None} == allowed
    assert abs(sum(2.718281828 ** e["logprob"] for e in first if e["logprob"] is not None) - 1) < 1e-4
    # the request's own logit_bias still applies among them: push the one greedy did not take
    taken = out["responses"][0]["token_logprobs"][0]["token_id"]
    (other,) = allowed - {taken}
    result, out = run_cli(engine, {"temperature": 0, "requests": [
        request(guided_decoding=guide, logit_bias={str(other): 100})]})
    assert out["responses"][0]["output_text"] == tok.decode([other])


@pytest.mark.hf
def test_an_eagle_engine_answers_a_guided_request_as_a_plain_engine(run_cli, tiny_engine, tiny_checkpoint, tmp_path):
    pytest.importorskip("safetensors.numpy")
    from tests.eagle_drafts import random_draft
    from trtllm.builder.config import BuildConfig
    from trtllm.builder.export import build

    ckpt = tiny_checkpoint("llama")
    draft = random_draft(ckpt, tmp_path / "draft", seed=3, aux=[0, 1, 1])
    eagle = build(BuildConfig(model=str(ckpt), output=str(tmp_path / "eagle"), eagle=str(draft), max_batch_size=4,
                              max_input_len=256, max_kv_cache_capacity=512), log=lambda m: None)
    payload = {"temperature": 0, "max_generate_length": 24, "batch_size": 2, "requests": [
        request(guided_decoding={"regex": "[a-e]{2,5}(, [a-e]{2,5})*\\."}), request()]}
    answers = []
    for engine in (tiny_engine("llama"), eagle):
        result, out = run_cli(engine, payload)
        assert result.exit_code == 0, result.output
        answers.append([(r["output_text"], r["finish_reason"]) for r in out["responses"]])
    assert answers[0] == answers[1]
    assert re.fullmatch(r"[a-e]{2,5}(, [a-e]{2,5})*\.", answers[1][0][0])
    # alone, the guided rows draft (verified on the host, position by position; a sampled one's drawn
    # by the engine's own sampler code), as the unguided one does, and answer as on the plain engine
    drafted = []
    sampled = request(guided_decoding={"regex": "[a-e]{2,5}(, [a-e]{2,5})*\\."}, temperature=1.0, seed=4)
    for req in [*payload["requests"], sampled]:
        profile = tmp_path / "profile.json"
        result, out = run_cli(eagle, {**payload, "requests": [req]}, "--profile", str(profile))
        assert result.exit_code == 0 and out["responses"][0]["finish_reason"] != "error", result.output
        drafted.append(json.loads(profile.read_text())["eagle_generation"]["drafted_tokens"])
    assert min(drafted) > 0, drafted
    plain = run_cli(tiny_engine("llama"), {**payload, "requests": [sampled]})[1]["responses"][0]["output_text"]
    assert out["responses"][0]["output_text"] == plain and re.fullmatch(r"[a-e]{2,5}(, [a-e]{2,5})*\.", plain)
    # a guided row that does not speculate restores a saved system prompt as a plain row does
    system = {"role": "system", "content": "You answer with letters only, a to e, in short words."}
    saving = {**sampled, "messages": [system, *sampled["messages"]], "save_system_prompt_kv_cache": True}
    reused = []
    for _ in range(2):
        profile = tmp_path / "profile.json"
        result, _ = run_cli(eagle, {**payload, "requests": [saving]}, "--profile", str(profile),
                            "--kv-cache-dir", str(tmp_path / "kv"))
        assert result.exit_code == 0, result.output
        reused.append(json.loads(profile.read_text())["prefill"]["reused_tokens"])
    assert reused[0] == 0 < reused[1], reused


@pytest.mark.hf
def test_an_engine_without_eos_refuses_guides_alone(run_cli, tiny_engine, tmp_path):
    """A grammar's answer ends with EOS: an engine whose manifest has none fails its guided requests
    (naming the field and why), and answers the others."""
    import shutil

    pytest.importorskip("torch")
    engine = tmp_path / "engine"
    shutil.copytree(tiny_engine("llama"), engine)
    manifest = json.loads((engine / "manifest.json").read_text())
    (engine / "manifest.json").write_text(json.dumps({**manifest, "eos_token_ids": []}))
    result, out = run_cli(engine, {"temperature": 0, "max_generate_length": 4,
                                   "requests": [request(guided_decoding={"regex": "[ab]+"}), request()]})
    guided_row, plain = out["responses"]
    assert guided_row["error"] == ("`requests[0].guided_decoding.regex` cannot be used: the engine has no EOS token "
                                   "(its manifest's eos_token_ids is empty), where a grammar's answer would end")
    assert plain["finish_reason"] == "max-length" and result.exit_code == 1


@pytest.mark.hf
def test_guides_that_cannot_be_matched_fail_and_never_end_short(run_cli, tiny_engine):
    """A special token's text in a guide is read as that token by llguidance: EOS there would end the
    answer short of a match ("end-of-sequence" with "done" for "done<|im_end|>"). EOS comes only
    where the grammar is complete, so such a guide fails (at the start: the request, by path), as
    does one that matches no text at all."""
    pytest.importorskip("torch")
    requests = [request(guided_decoding={"choice": ["<|im_end|>"]}),
                request(guided_decoding={"ebnf": 'root ::= "done<|im_end|>"'}),
                request(guided_decoding={"regex": "[^\\s\\S]"}),
                request(guided_decoding={"json_schema": False}),
                request(guided_decoding={"choice": ["done", "d<|im_start|>"]}),
                request(guided_decoding={"regex": "a{0}"})]
    result, out = run_cli(tiny_engine("llama"), {"temperature": 0, "max_generate_length": 16, "requests": requests})
    r = out["responses"]
    assert r[0]["error"].startswith("`requests[0].guided_decoding.choice` leaves no token the answer can continue")
    assert r[1]["finish_reason"] == "error" and "`requests[1].guided_decoding.ebnf` leaves no token" in r[1]["error"]
    assert r[2]["error"].startswith("`requests[2].guided_decoding.regex` matches no text from here: ")
    assert r[3]["error"] == "`requests[3].guided_decoding.json_schema` does not compile: Unsatisfiable schema: schema is false"
    assert "<state>" not in r[2]["error"] and "\n" not in r[2]["error"]
    # whatever the greedy path takes, an answer that ends is a whole match
    assert r[4]["finish_reason"] == "error" or (r[4]["finish_reason"], r[4]["output_text"]) == ("end-of-sequence", "done")
    assert (r[5]["finish_reason"], r[5]["output_text"]) == ("end-of-sequence", "")  # the empty match is one


@pytest.mark.hf
def test_a_guide_that_does_not_compile_is_compiled_once(monkeypatch, tiny_engine):
    """A top-level guide every request inherits: its error is remembered, not recompiled per request."""
    pytest.importorskip("torch")
    from trtllm.runtime import grammar
    from trtllm.runtime.tokenizer import Tokenizer

    tok = Tokenizer.from_engine_dir(tiny_engine("llama"))
    grammars = grammar.Grammars(tok.to_json(), tok.vocab_size, [tok.token_to_id("<|im_end|>")])
    calls, compile_ = [], grammar.Grammars.compile
    monkeypatch.setattr(grammar.Grammars, "compile", lambda self, g, t: calls.append(g) or compile_(self, g, t))
    bad, good = guided.parse({"regex": "[0-9"}, "guided_decoding"), guided.parse({"regex": "[ab]"}, "x")
    for _ in range(3):
        with pytest.raises(ValueError, match="`guided_decoding.regex` does not compile"):
            grammars.matcher(bad)
        grammars.matcher(good)
    assert calls == [bad, good]


class CountingMatcher:
    """llguidance's matcher, counting the masks computed before any token was consumed."""

    def __init__(self, m, counts):
        self.m, self.counts, self.started = m, counts, False

    def deep_copy(self):
        other = CountingMatcher(self.m.deep_copy(), self.counts)
        other.started = self.started
        return other

    def compute_bitmask(self):
        self.counts["at start" if not self.started else "later"] += 1
        return self.m.compute_bitmask()

    def consume_token(self, token_id):
        self.started = True
        return self.m.consume_token(token_id)

    def __getattr__(self, name):
        return getattr(self.m, name)


@pytest.mark.hf
def test_a_requests_first_mask_is_computed_once_for_all_its_samples(monkeypatch, run_cli, tiny_engine):
    """The up-front check computes the first mask (a large schema's takes tens of ms); its samples
    start from it instead of computing it again, and each later mask is computed once per token."""
    pytest.importorskip("torch")
    from trtllm.runtime import grammar

    counts, compile_ = {"at start": 0, "later": 0}, grammar.Grammars.compile

    def counting(self, g, t):
        m = compile_(self, g, t)
        return m if isinstance(m, str) else CountingMatcher(m, counts)

    monkeypatch.setattr(grammar.Grammars, "compile", counting)
    result, out = run_cli(tiny_engine("llama"), {
        "requests": [request(guided_decoding={"regex": "[a-e]{3}"}, n=3)], "seed": 5, "temperature": 1.5,
        "top_p": 1, "max_generate_length": 16})
    assert result.exit_code == 0, result.output
    assert all(re.fullmatch("[a-e]{3}", r["output_text"]) for r in out["responses"])
    assert counts["at start"] == 1 and counts["later"] >= 3, counts  # (each sample's after its first token)


@pytest.mark.hf
def test_masks_computed_together_are_each_rows_own(tiny_engine):
    """grammar.fill (a step's guided rows in llguidance's thread pool) gives each matcher the mask it
    computes alone, at the start and after tokens, EOS held back until a grammar is complete."""
    pytest.importorskip("torch")
    import numpy as np

    from trtllm.runtime import grammar
    from trtllm.runtime.tokenizer import Tokenizer

    tok = Tokenizer.from_engine_dir(tiny_engine("llama"))
    eos = tok.token_to_id("<|im_end|>")
    grammars = grammar.Grammars(tok.to_json(), tok.vocab_size, [eos])
    specs = [{"regex": "[a-e]{2,5}"}, {"choice": CHOICES}, {"json_schema": {"type": "integer"}}, {"regex": "ab"}]
    matchers = [grammars.matcher(guided.parse(s, f"g{i}")) for i, s in enumerate(specs)]
    again = grammars.matcher(guided.parse(specs[0], "g9"))  # (2,000 requests of one schema: one mask, not 2,000)
    assert again.allowed() is matchers[0].allowed() and again.path == "g9.regex"
    for m, text in zip(matchers, ["ab", "", "1", "ab"]):
        for t in tok.encode(text, add_special_tokens=False):
            assert m.consume(t) is None
    alone = [m.copy() for m in matchers]
    for m in alone:
        m._allowed = None  # (copies share a computed mask: compute it again)
    grammar.fill(matchers)
    for m, a in zip(matchers, alone):
        assert not m.stale and np.array_equal(m.allowed(), a.allowed())
    assert matchers[0].allowed()[eos] and matchers[3].allowed()[eos]  # "ab" is complete
    assert matchers[3].allowed().sum() == 1 and not matchers[1].allowed()[eos]  # (no choice is empty)
    # --threads holds for the pool as for the engine (it took every core)
    import llguidance

    made, real = [], llguidance.LLExecutor
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(llguidance, "LLExecutor", lambda **kw: made.append(kw) or real(**kw))
            grammar.use_threads(1)
            for m in matchers:
                m._allowed = None
            grammar.fill(matchers)
    finally:
        grammar.use_threads(None)
    assert made == [{"num_threads": 1}]
    assert all(np.array_equal(m.allowed(), a.allowed()) for m, a in zip(matchers, alone))


@pytest.mark.parametrize("grammar, texts", [
    ('?start: pair\npair: "(" WORD ")"\nWORD: /[a-z]+/', ["(ab)"]),  # Lark's inline start (vLLM's docs' SQL one)
    ('root ::= "caf\\u00e9"', ["café"]),                           # llama.cpp's \u, \U escapes
    ('root ::= "\\U0001F600" [\\u00e0-\\u00ff]+', ["😀àé"]),
    ('root ::= "a" . "b" # a . comment', ["a\nb", "axb"]),           # llama.cpp's `.`: a newline too
    ('root ::= "a.b" [.]', ["a.b."]),                               # (a dot in a string or class is one)
])
def test_ebnf_reads_gbnf_as_llama_cpp_and_lark_as_lark(tiny_engine, grammar, texts):
    """A review found these refused or read otherwise (llguidance's converter: `?start:` taken for
    GBNF, \\u escapes without their leading zeros, `.` stopping at a newline)."""
    pytest.importorskip("torch")  # (the tiny engine's tokenizer)
    from trtllm.runtime.grammar import Grammars
    from trtllm.runtime.tokenizer import Tokenizer

    tok = Tokenizer.from_engine_dir(tiny_engine("llama"))
    grammars = Grammars(tok.to_json(), tok.vocab_size, [tok.token_to_id("<|im_end|>")])
    guide = guided.parse({"ebnf": grammar}, "guided_decoding")
    for text in texts:
        m = grammars.matcher(guide)
        assert [e for e in (m.consume(t) for t in tok.encode(text)) if e] == [], (grammar, text)
    m = grammars.matcher(guide)
    assert [e for e in (m.consume(t) for t in tok.encode("zz")) if e], grammar  # (and not anything)


def test_gbnf_escapes_and_dots_are_written_for_the_converter():
    from trtllm.runtime import gbnf

    src = 'root ::= "caf\\u00e9\\u0022" . [\\u0000-\\u001f\\U0001F600] "a.b" # c . d\nx ::= [.]'
    assert gbnf.llama_cpp(src) == ('root ::= "café\\x22" ' + gbnf.ANY + ' [\\x00-\\x1F😀] "a.b" # c . d\nx ::= [.]')
    assert gbnf.is_gbnf('root ::= "a"') and not gbnf.is_gbnf('?start: x\nx: "::=" // ::=')
