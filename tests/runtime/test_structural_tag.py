"""Structural tags (runtime/structural_tag.py): vLLM's and XGrammar's spellings read as one tree,
each trigger goes under its tag and is text or the special token it names, XGrammar's flags and
formats hold the answer to what they say (answers accepted and refused by the grammar's matcher on
the tiny engine's tokenizer), and a schema that does not compile is named by its path."""
from __future__ import annotations

import json
import re

import pytest

from tests.runtime.test_guided import request
from trtllm.runtime import guided
from trtllm.runtime.input_format import parse_input


def test_both_structural_tag_spellings_read_as_one():
    """vLLM's structures + triggers and XGrammar's triggered_tags (Edge-LLM's) give the same tags, each
    under the shortest trigger it begins with; a string of JSON holding one reads as the object."""
    schema = {"type": "object", "properties": {"city": {"type": "string"}}}
    vllm = {"type": "structural_tag", "triggers": ["<f", "<f=w"],
            "structures": [{"begin": "<f=get>", "schema": schema, "end": "</f>"},
                           {"begin": "<f=weather>", "schema": True, "end": "</f>"}]}
    xgrammar = {"type": "structural_tag", "format": {"type": "triggered_tags", "triggers": ["<f", "<f=w"], "tags": [
        {"type": "tag", "begin": "<f=get>", "content": {"type": "json_schema", "json_schema": schema}, "end": "</f>"},
        {"begin": "<f=weather>", "content": {"type": "json_schema", "json_schema": True}, "end": "</f>"}]}}
    read = [json.loads(parse_input({"requests": [request(guided_decoding={"structural_tag": v})]})
                       .requests[0].guided_decoding.text)["format"]["tags"] for v in (vllm, xgrammar, json.dumps(vllm))]
    assert read[1][0]["content"]["at"] == "requests[0].guided_decoding.structural_tag.format.tags[0].content.json_schema"
    assert read[0][1]["content"]["at"] == "requests[0].guided_decoding.structural_tag.structures[1].schema"
    for r in read:
        for t in r:
            del t["content"]["at"]  # (where each was written)
    tags = read
    assert tags[0] == tags[1] == tags[2]
    assert [(t["trigger"], t["begin"]) for t in tags[0]] == [("<f", "<f=get>"), ("<f", "<f=weather>")]


@pytest.mark.parametrize("trigger, end", [("<b>", "</b>"), ("<|im_start|>", "</b>"), ("<fn=", "</b>"),
                                          ("[TC]", "</b>"), ("<fn=", "<|im_start|>")])
def test_a_structural_tag_trigger_is_text_or_the_special_token_it_names(tiny_engine, trigger, end):
    """A trigger (or an end) that is one of the tokenizer's special tokens is matched as that
    token, whatever its spelling ([TC], a Mistral-style one, added here); one that only looks like
    one (<b>) is text. Either way, what follows it is held to its tag."""
    pytest.importorskip("torch")
    import tokenizers

    from trtllm.runtime import grammar
    from trtllm.runtime.tokenizer import Tokenizer

    tok = tokenizers.Tokenizer.from_str(Tokenizer.from_engine_dir(tiny_engine("llama")).to_json())
    tok.add_special_tokens(["[TC]"])
    grammars = grammar.Grammars(tok.to_str(), tok.get_vocab_size(), [tok.token_to_id("<|im_end|>")])
    tag = {"structures": [{"begin": f"{trigger}get", "schema": {"enum": [1, 2]}, "end": end}], "triggers": [trigger]}
    guide = guided.parse({"structural_tag": tag}, "g")

    def errors(text: str) -> list:
        m = grammars.matcher(guide)
        return [e for e in (m.consume(t) for t in tok.encode(text, add_special_tokens=False).ids) if e]

    assert errors(f"hi {trigger}get2{end} bye") == []
    assert errors(f"hi {trigger}got2{end}") and errors(f"hi {trigger}get3{end}")
    assert (trigger in grammars.special) == (trigger in ("<|im_start|>", "[TC]"))


def test_each_tag_goes_under_the_first_trigger_to_appear(tiny_engine):
    """Triggers "<f" and "<f=w": "<f" appears first on the way into <f=weather>, so both tags go
    under it; under "<f=w", <f=weather> could never be written (the answer would be forced into
    <f=get>)."""
    pytest.importorskip("torch")
    from trtllm.runtime import grammar
    from trtllm.runtime.tokenizer import Tokenizer

    tok = Tokenizer.from_engine_dir(tiny_engine("llama"))
    grammars = grammar.Grammars(tok.to_json(), tok.vocab_size, [tok.token_to_id("<|im_end|>")])
    tag = {"triggers": ["<f", "<f=w"], "structures": [{"begin": "<f=get>", "schema": {"enum": [1]}, "end": "</f>"},
                                                      {"begin": "<f=weather>", "schema": {"enum": [2]}, "end": "</f>"}]}
    for text in ("a <f=weather>2</f> b", "a <f=get>1</f> b"):
        m = grammars.matcher(guided.parse({"structural_tag": tag}, "g"))
        assert [e for e in (m.consume(t) for t in tok.encode(text)) if e] == [], text


@pytest.mark.parametrize("at_least_one, stop_after_first, accepted, refused", [
    (False, False, ["", "hi", "a <f=get>1</f> b <f=get>1</f>", "<f=get>1</f>"], ["a <f=got>"]),
    (True, False, ["<f=get>1</f>", "<f=get>1</f> b <f=get>1</f> c"], ["", "hi", "a <f=get>1</f>"]),
    (False, True, ["", "hi", "a <f=get>1</f>"], ["a <f=get>1</f> b", "a <f=get>1</f><f=get>1</f>"]),
    (True, True, ["<f=get>1</f>"], ["", "a <f=get>1</f>", "<f=get>1</f> b"]),
])
def test_xgrammars_tag_flags_hold_the_answer(tiny_engine, at_least_one, stop_after_first, accepted, refused):
    """at_least_one: the answer begins with a tag (XGrammar: "disallows leading free text");
    stop_after_first: it ends with the first tag's end. An answer is accepted when every token is
    and the grammar may end there (EOS allowed)."""
    pytest.importorskip("torch")
    from trtllm.runtime import grammar
    from trtllm.runtime.tokenizer import Tokenizer

    tok = Tokenizer.from_engine_dir(tiny_engine("llama"))
    eos = tok.token_to_id("<|im_end|>")
    grammars = grammar.Grammars(tok.to_json(), tok.vocab_size, [eos])
    tag = {"format": {"type": "triggered_tags", "triggers": ["<f"], "at_least_one": at_least_one,
                      "stop_after_first": stop_after_first,
                      "tags": [{"begin": "<f=get>", "content": {"type": "json_schema", "json_schema": {"enum": [1]}},
                                "end": "</f>"}]}}

    def accepts(text: str) -> bool:
        m = grammars.matcher(guided.parse({"structural_tag": tag}, "g"))
        return not any(m.consume(t) for t in tok.encode(text)) and bool(m.allowed()[eos])
    assert [t for t in accepted if not accepts(t)] == []
    assert [t for t in refused if accepts(t)] == []


THINK = {"type": "tag", "begin": "<think>", "content": {"type": "any_text"}, "end": "</think>"}
CALLS = {"type": "triggered_tags", "triggers": ["<f"],
         "tags": [{"begin": "<f=get>", "content": {"type": "json_schema", "json_schema": {"enum": [1]}}, "end": "</f>"}]}


@pytest.mark.parametrize("fmt, accepted, refused", [
    # XGrammar's recipe for a reasoning model with tools: a thought first, then text with calls
    ({"type": "sequence", "elements": [THINK, CALLS]},
     ["<think>why</think>ok <f=get>1</f> done", "<think></think>"], ["no thought", "<think>a</think><f=got>"]),
    # free text inside a tag ends where its end (either of its ends) first appears
    ({"type": "tag", "begin": "<a>", "content": {"type": "any_text"}, "end": ["</a>", "</b>"]},
     ["<a>x y</a>", "<a>x</b>"], ["<a>x</a>y", "<a>x"]),
    ({"type": "tag", "begin": "<r>", "content": CALLS, "end": "</r>"},
     ["<r>hi <f=get>1</f> bye</r>", "<r></r>"], ["<r>hi <f=get>2</f></r>", "<r>x</r>y"]),
    ({"type": "tags_with_separator", "separator": ",", "at_least_one": True,
      "tags": [{"begin": "<n>", "content": {"type": "regex", "pattern": "[0-9]+"}, "end": "</n>"}]},
     ["<n>1</n>", "<n>1</n>,<n>22</n>"], ["", "<n>1</n> ,<n>2</n>", "<n>x</n>"]),
    ({"type": "sequence", "elements": [{"type": "const_string", "value": "A:"},
                                       {"type": "or", "elements": [{"type": "const_string", "value": "yes"},
                                                                   {"type": "const_string", "value": "no"}]},
                                       {"type": "optional", "content": {"type": "const_string", "value": "!"}},
                                       {"type": "repeat", "min": 1, "max": 2,
                                        "content": {"type": "const_string", "value": "."}}]},
     ["A:yes.", "A:no!..", "A:yes!."], ["A:maybe.", "A:yes", "A:no..."]),
    ({"type": "tag", "begin": "<t>", "content": {"type": "optional", "content": {"type": "any_text"}}, "end": "</t>"},
     ["<t></t>", "<t>abc</t>"], ["<t>abc</t>x", "<t>abc"]),
    ({"type": "sequence", "elements": [{"type": "any_text", "excludes": ["no", "x y"]},
                                       {"type": "const_string", "value": "!"}]},
     ["yes!", "x!"], ["no!", "a x y!"]),  # free text without the excluded texts
    ({**CALLS, "excludes": ["<g"]}, ["hi <f=get>1</f>"], ["hi <g"]),
    ({"type": "plus", "content": {"type": "const_string", "value": "ab"}}, ["ab", "abab"], ["", "aba"]),
    ({"type": "star", "content": {"type": "const_string", "value": "ab"}}, ["", "abab"], ["a"]),
    # a special token as a tag's begin or end is that token, by its text or its id
    ({"type": "tag", "begin": {"type": "token", "token": "<|im_start|>"}, "content": {"type": "any_text"},
      "end": {"type": "token", "token": "<|im_end|>"}}, ["<|im_start|>hi<|im_end|>"], ["hi", "<|im_start|>hi"]),
])
def test_xgrammars_formats_hold_the_answer(tiny_engine, fmt, accepted, refused):
    pytest.importorskip("torch")
    from trtllm.runtime import grammar
    from trtllm.runtime.tokenizer import Tokenizer

    tok = Tokenizer.from_engine_dir(tiny_engine("llama"))
    eos = tok.token_to_id("<|im_end|>")
    grammars = grammar.Grammars(tok.to_json(), tok.vocab_size, [eos])

    def accepts(text: str, end: bool = True) -> bool:
        m = grammars.matcher(guided.parse({"structural_tag": {"format": fmt}}, "g"))
        return not any(m.consume(t) for t in tok.encode(text)) and (not end or bool(m.allowed()[eos]))
    assert [t for t in accepted if not accepts(t)] == []
    assert [t for t in refused if accepts(t)] == []
    if fmt["type"] == "tag" and isinstance(fmt["begin"], dict):  # the tokens, not their spelling
        start = tok.token_to_id("<|im_start|>")
        m = grammars.matcher(guided.parse({"structural_tag": {"format": fmt}}, "g"))
        assert m.allowed()[start] and m.allowed().sum() == 1
        assert not m.consume(start) and not any(m.consume(t) for t in tok.encode("hi"))


def test_a_structural_tags_schema_that_does_not_compile_is_named(tiny_engine):
    pytest.importorskip("torch")
    from trtllm.runtime import grammar
    from trtllm.runtime.tokenizer import Tokenizer

    tok = Tokenizer.from_engine_dir(tiny_engine("llama"))
    grammars = grammar.Grammars(tok.to_json(), tok.vocab_size, [tok.token_to_id("<|im_end|>")])
    for schema, says in ((False, "Unsatisfiable schema: schema is false"), ({"type": "nope"}, "nope")):
        tag = {"structures": [{"begin": "<f=a>", "schema": {}, "end": ""}, {"begin": "<f=b>", "schema": schema, "end": ""}],
               "triggers": ["<f"]}
        with pytest.raises(ValueError) as e:
            grammars.matcher(guided.parse({"structural_tag": tag}, "g"))
        assert "`g.structural_tag.structures[1].schema`: " in str(e.value) and says in str(e.value), str(e.value)



def test_free_text_that_could_never_end_is_refused_and_the_rest_reads(tiny_engine):
    """Free text stops at a tag's end, a following const_string or tag begin, a special token, or
    the answer's end; anywhere else (before a JSON value, inside a repetition, before an end that
    mixes text and special tokens) it would never end, and compiling says where. A trigger holding a
    special token among text, a regex with an escaped backslash before a slash, deep nesting."""
    pytest.importorskip("torch")
    from trtllm.runtime import grammar
    from trtllm.runtime.strict_json import InputError
    from trtllm.runtime.tokenizer import Tokenizer

    tok = Tokenizer.from_engine_dir(tiny_engine("llama"))
    eos = tok.token_to_id("<|im_end|>")
    grammars = grammar.Grammars(tok.to_json(), tok.vocab_size, [eos])
    free, number = {"type": "any_text"}, {"type": "json_schema", "json_schema": {"enum": [1]}}

    def accepts(fmt: dict, text: str) -> bool:
        m = grammars.matcher(guided.parse({"structural_tag": {"format": fmt}}, "g"))
        return not any(m.consume(t) for t in tok.encode(text)) and bool(m.allowed()[eos])

    text_then_tag = {"type": "sequence", "elements": [free, {"type": "tag", "begin": "<a>", "content": number,
                                                             "end": "</a>"}]}
    assert accepts(text_then_tag, "hi <a>1</a>") and not accepts(text_then_tag, "hi <a>2</a>")
    closed = {"type": "tag", "begin": "<a>", "content": free, "end": "<|im_start|>"}  # a token ends it
    assert accepts(closed, "<a>x y<|im_start|>") and not accepts(closed, "<a>x")
    never = [({"type": "sequence", "elements": [free, number]}, "g.structural_tag.format.elements[0]"),
             ({"type": "tag", "begin": "<a>", "content": {"type": "star", "content": free}, "end": "</a>"},
              "g.structural_tag.format.content.content")]
    for fmt, at in never:
        with pytest.raises(ValueError, match=re.escape(f"`{at}`: free text here would never end")):
            grammars.matcher(guided.parse({"structural_tag": {"format": fmt}}, "g"))
    for fmt, says in (({"type": "tag", "begin": "<a>", "content": free, "end": "</a><|im_start|>"}, "mixes"),
                      ({"type": "tag", "begin": "<a>", "content": free, "end": ["</a>", "<|im_start|>"]}, "mixes"),
                      ({"type": "triggered_tags", "triggers": ["x<|im_start|>"], "tags": [
                          {"begin": "x<|im_start|>a", "content": number, "end": ""}]}, "that token alone")):
        with pytest.raises(ValueError, match=says):
            grammars.matcher(guided.parse({"structural_tag": {"format": fmt}}, "g"))
    assert accepts({"type": "regex", "pattern": "a\\\\/b"}, "a\\/b")  # (an escaped backslash, then a slash)
    deep = free
    for _ in range(70):
        deep = {"type": "optional", "content": deep}
    with pytest.raises(InputError, match="at most 64 format objects deep"):
        guided.parse({"structural_tag": {"format": deep}}, "g")


def test_a_regex_stops_where_what_follows_it_first_appears_and_parts_are_named(tiny_engine):
    """A regex followed by text it could match too (a tag's end, a const_string) stops where that
    text first follows it (else the greedy lexeme would take the text and the answer never end);
    free text before a token stops at it; a tag with an empty end leaves its content last. A part
    that does not compile is named by its path."""
    pytest.importorskip("torch")
    from trtllm.runtime import grammar
    from trtllm.runtime.tokenizer import Tokenizer

    tok = Tokenizer.from_engine_dir(tiny_engine("llama"))
    eos = tok.token_to_id("<|im_end|>")
    grammars = grammar.Grammars(tok.to_json(), tok.vocab_size, [eos])

    def accepts(fmt: dict, text: str) -> bool:
        m = grammars.matcher(guided.parse({"structural_tag": {"format": fmt}}, "g"))
        return not any(m.consume(t) for t in tok.encode(text)) and bool(m.allowed()[eos])

    name = {"type": "tag", "begin": "<n>", "content": {"type": "regex", "pattern": "[^\\n]+"}, "end": "</n>"}
    assert accepts(name, "<n>Bob</n>") and not accepts(name, "<n>Bob</n>x")
    word = {"type": "sequence", "elements": [{"type": "regex", "pattern": "[a-z]+"}, {"type": "const_string",
                                                                                     "value": "z"}]}
    assert accepts(word, "abz") and accepts(word, "az")
    before_token = {"type": "sequence", "elements": [{"type": "any_text"}, {"type": "token", "token": "<|im_start|>"}]}
    assert accepts(before_token, "hi<|im_start|>")
    open_end = {"type": "tag", "begin": "A: ", "content": {"type": "any_text"}, "end": ""}
    assert accepts(open_end, "A: anything")
    for fmt, at in (({"type": "sequence", "elements": [{"type": "const_string", "value": "a"},
                                                       {"type": "regex", "pattern": "[a-"}]}, "format.elements[1].pattern"),
                    ({"type": "token", "token": 10**6}, "format.token"),
                    ({"type": "token", "token": "<b>"}, "format.token")):
        with pytest.raises(ValueError, match=re.escape(f"`g.structural_tag.{at}`: ")):
            grammars.matcher(guided.parse({"structural_tag": {"format": fmt}}, "g"))
