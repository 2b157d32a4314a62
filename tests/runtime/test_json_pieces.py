"""JSON read a piece at a time and written back as json.dumps writes it (runtime/json_pieces.py),
and a tool call's arguments streamed with it (runtime/tool_pieces.py)."""
from __future__ import annotations

import json
import random

import pytest

from trtllm.runtime.json_pieces import Reader
from trtllm.runtime.tool_calls import ToolChoice
from trtllm.runtime.tool_pieces import Pieces

CHARS = ["a", "é", "\n", '"', "\\", "/", "\u2028", "😀", "\x01", "\x7f", " ", "中"]


def random_value(rng: random.Random, depth: int = 0):
    r = rng.random()
    if depth > 3 or r < 0.3:
        return rng.choice([0, -0.0, 1, -12, 3.5, 1e20, 1.5e-7, 10**30, True, False, None,
                           "".join(rng.choice(CHARS) for _ in range(rng.randint(0, 6)))])
    if r < 0.65:
        return {f"k{i}" + rng.choice(["", "é", "\n"]): random_value(rng, depth + 1) for i in range(rng.randint(0, 4))}
    return [random_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]


def written(rng: random.Random, value) -> str:
    """JSON of value as a model might write it: other blanks, escapes and number spellings."""
    blank = lambda: rng.choice(["", "", " ", "\n  ", "\t"])  # noqa: E731
    if isinstance(value, dict):
        items = [string(rng, k) + blank() + ":" + blank() + written(rng, v) for k, v in value.items()]
        return "{" + blank() + ("," + blank()).join(items) + blank() + "}"
    if isinstance(value, list):
        return "[" + blank() + ("," + blank()).join(written(rng, v) for v in value) + blank() + "]"
    if isinstance(value, str):
        return string(rng, value)
    if value == 1e20 and not isinstance(value, bool):
        return rng.choice(["1E20", "1e+20", "100000000000000000000.0"])
    return json.dumps(value)


def string(rng: random.Random, text: str) -> str:
    out = '"'
    for c in text:
        r = rng.random()
        if c in '"\\' or ord(c) < 0x20:
            out += json.dumps(c)[1:-1] if r < 0.7 else "\\u%04x" % ord(c)
        elif ord(c) > 0xFFFF and r < 0.5:
            out += json.dumps(c)[1:-1]  # (a surrogate pair's two escapes)
        elif ord(c) <= 0xFFFF and r < 0.2:
            out += "\\u%04X" % ord(c)
        elif c == "/" and r < 0.5:
            out += "\\/"
        else:
            out += c
    return out + '"'


def test_pieces_are_json_dumps_text_as_far_as_it_is_certain():
    """Fed in random pieces, the text given is always a beginning of json.dumps(json.loads(text))
    and all of it at the end; the wrong variant, the text as written, is not (its blanks, 1E20)."""
    rng = random.Random(7)
    raw_differs = 0
    for _ in range(1500):
        text = written(rng, random_value(rng))
        want = json.dumps(json.loads(text), ensure_ascii=False)
        reader, at = Reader(), 0
        while at < len(text):
            step = rng.randint(1, 5)
            reader.feed(text[at:at + step])
            at += step
            assert want.startswith(reader.text()), (text, reader.text())
        reader.finish()
        assert reader.done and not reader.bad and reader.text() == want, text
        raw_differs += text != want
    assert raw_differs > 1000


@pytest.mark.parametrize("text", ['{"a": 1, "a": 2}', '{"a": NaN}', "[1e400]", '"\\ud800"', '"\\ud800x"',
                                  '"\\udc00"', '"\\ud800\\n"', '{"a" 1}', "[1,]", '"a\x01"', "[01]",
                                  '{"a": tru}', "-Infinity", "[1 2]", '{"a": 1}}'])
def test_what_would_not_read_as_a_call_makes_the_reader_bad(text):
    """json.loads refuses it, or a call cannot hold it (NaN, inf, a lone surrogate), or json.loads
    would give another value than the pieces began (a key twice). ('{"a": 1}}': the value ends at
    its first '}', read then: the caller decides about the rest.)"""
    reader = Reader()
    reader.feed(text)
    reader.finish()
    if text == '{"a": 1}}':
        assert reader.done and reader.end == 8 and reader.text() == '{"a": 1}'
        return
    assert reader.bad, text


def test_a_top_level_value_says_where_it_ended_and_where_its_members_are():
    number = Reader()
    number.feed("12 ")
    assert number.done and number.end == 2 and number.text() == "12"  # (the blank is not the number's)
    whole = Reader()
    whole.feed('{"a":[1,{"b":"x"}] ,"c":2} rest')
    assert whole.done and whole.end == 26 and whole.text() == '{"a": [1, {"b": "x"}], "c": 2}'
    assert whole.members == {"a": [6, 21], "c": [28, 29]}


CALLS = [  # (tool choice, parser, answer): a call to f with the city Paris
    (None, "hermes", 'Hi <tool_call>{"name": "f", "arguments": {"city": "Paris"}}</tool_call>'),
    (None, "mistral", '[TOOL_CALLS][{"name": "f", "arguments": {"city": "Paris"}}]'),
    (None, "mistral", '[TOOL_CALLS]f[ARGS]{"city": "Paris"}'),
    (None, "llama3_json", '<|python_tag|>{"name": "f", "parameters": {"city": "Paris"}}'),
    (ToolChoice("required"), None, '[{"name": "f", "parameters": {"city": "Paris"}}]'),
    (ToolChoice("function", "f"), None, '{"city": "Paris"}'),
]


@pytest.mark.parametrize("choice, parser, text", CALLS)
def test_each_json_form_opens_a_call_by_its_name_and_gives_its_arguments_as_written(choice, parser, text):
    """A character at a time: the call opens once its name is read, before its arguments, and
    `"Pa` of the city comes before `ris"` is written."""
    pieces, seen = Pieces(choice, parser, "r0"), []
    for at, c in enumerate(text):
        seen += [(at, d) for d in pieces.push(c, at == len(text) - 1)]
    opening, *rest = seen
    assert opening[1]["function"] == {"name": "f", "arguments": ""} and opening[1]["index"] == 0
    assert "".join(d["function"]["arguments"] for _, d in rest) == '{"city": "Paris"}'
    assert opening[0] <= text.index('{"city"')  # (opened by the time its arguments begin)
    paris = text.index("Paris")
    assert "".join(d["function"]["arguments"] for at, d in rest if at <= paris + 1).endswith('"Pa')


def test_pythonic_calls_and_parallel_false_get_no_pieces_past_what_is_read():
    assert not Pieces(None, "pythonic", "r0").active  # (its calls come whole: tool_stream)
    one = Pieces(None, "hermes", "r0", parallel=False)
    two = '<tool_call>{"name": "f", "arguments": {}}</tool_call><tool_call>{"name": "g", "arguments": {}}</tool_call>'
    got = one.push(two, final=True)
    assert [d["index"] for d in got] == [0, 0] and not one.active  # (the first call only, as tool_calls reads it)
