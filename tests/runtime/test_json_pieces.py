"""JSON read a piece at a time and written back as json.dumps writes it (runtime/json_pieces.py),
and a tool call's arguments streamed with it (runtime/tool_pieces.py)."""
from __future__ import annotations

import json
import random

import pytest

from tests.runtime.tool_deltas import assemble
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
            at = min(at + step, len(text))
            shown = reader.text()
            assert want.startswith(shown), (text, shown)
            # and nothing held that is certain: a value's string to its last character, a closed
            # container (the wrong variant, a reader that shows nothing until the value is whole, fails)
            if reader.string is not None and not reader.is_key and reader.escape is None and reader.high is None:
                assert shown.endswith('"' + json.dumps("".join(reader.string), ensure_ascii=False)[1:-1]), (text, shown)
            if text[at - 1] in "]}" and reader.string is None and not reader.scalar:
                assert shown.endswith(text[at - 1]), (text[:at], shown)
        reader.finish()
        assert reader.done and not reader.bad and reader.text() == want, text
        raw_differs += text != want
    assert raw_differs > 1000


@pytest.mark.parametrize("text", ['{"a" 1}', "[1,]", '"a\x01"', "[01]", '{"a": tru}', "[1 2]", "[" + "1" * 5000 + "]",
                                  '"\\x"', '"\\u12g4"', "[nan]", "{'a': 1}"])
def test_what_json_loads_refuses_makes_the_reader_bad(text):
    with pytest.raises(ValueError):
        json.loads(text)
    reader = Reader()
    reader.feed(text)
    reader.finish()
    assert reader.bad, text


@pytest.mark.parametrize("text, flaws", [
    ('{"a": NaN, "b": [1e400], "c": "\\ud800", "d": -Infinity}', {"a": "value", "b": "value", "c": "value", "d": "value"}),
    ('{"a": "\\ud800x", "b": "\\udc00", "c": "\\ud800\\n", "d": "\\ud83d\\ude00"}', {"a": "value", "b": "value", "c": "value"}),
    ('{"a": 1, "b": {"c": 1, "c": 2}, "a": 2}', {"a": "duplicate"}),
    ("[NaN]", {None: "value"}),
    ('{"name": "f", "x\\ud800": 1, "arguments": {}}', {None: "value"}),  # (a key's own: not the member before it)
])
def test_what_json_loads_takes_and_a_call_cannot_hold_is_a_flaw_of_its_member(text, flaws):
    """json.loads takes NaN, 1e400 (inf), lone surrogates and a key written twice; the reader goes on
    as written and notes each against its top-level member (a key twice deeper in is no flaw: given
    as written, json.loads reads the value it keeps), so a flaw outside a call's name and arguments
    costs its pieces nothing."""
    json.loads(text)
    reader = Reader()
    reader.feed(text)
    reader.finish()
    assert reader.done and not reader.bad and reader.flaws == flaws, reader.flaws


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


def deltas_of(stream_args: tuple, text: str) -> tuple[list[dict], list[dict] | None]:
    """(the calls tool_call_deltas make, a character a piece, each index opened once; extract's)."""
    from trtllm.runtime.tool_calls import extract
    from trtllm.runtime.tool_stream import Stream

    tools = ({"type": "function", "function": {"name": "f"}},)
    stream, lines = Stream(*stream_args[:2], tools, "r0"), []
    for at, c in enumerate(text):
        stream.push(c, at == len(text) - 1)
        lines.append(stream.take_deltas())
    calls, _ = assemble(lines)
    want = extract(text, *stream_args[:2], tools, "r0")
    return calls, want and want[1]


@pytest.mark.parametrize("parser, text", [
    # blanks tool_calls strips (str.strip: a no-break space, a form feed) where JSON has none: a
    # review found a mistral call opened twice, named after the text up to another call's [ARGS]
    ("mistral", '[TOOL_CALLS]\u00a0[{"name": "f", "arguments": {"a": 1}}][TOOL_CALLS]g[ARGS]\x0c{"b": 2}'),
    ("llama3_json", '\u3000{"name": "f", "parameters": {"a": 1}};\u00a0{"name": "g", "parameters": {}}'),
    # an extra key json.loads takes and no call could hold: the call is f's all the same
    ("hermes", '<tool_call>{"name": "f", "score": NaN, "x": "\\ud800", "arguments": {"city": "Paris"}}</tool_call>'),
])
def test_deltas_read_calls_as_tool_calls_reads_them(parser, text):
    calls, want = deltas_of((None, parser), text)
    assert want and calls == want


@pytest.mark.parametrize("parser, text", [
    ("hermes", '<tool_call>{"arguments": {}}</tool_call><tool_call>{"name": "g", "arguments": {}}</tool_call>'),
    ("hermes", '<tool_call>{"name": "f"}</tool_call><tool_call>{"name": "g", "arguments": {}}</tool_call>'),
    ("llama3_json", '{"parameters": {}}; {"name": "g", "parameters": {}}'),
    ("mistral", "[TOOL_CALLS]oops [TOOL_CALLS]g[ARGS]{}"),
    ("hermes", '<tool_call>{"name": "f", "arguments": {"a": NaN}}</tool_call>'),
    # a name written twice: no call (tool_calls), and no first delta under the first name (a review's)
    ("hermes", '<tool_call>{"name": "x", "name": "g", "arguments": {"a": 1}}</tool_call>'),
])
def test_a_call_that_cannot_be_one_stops_the_pieces(parser, text):
    """No name, no arguments, a name running into the next marker, a flaw in the arguments: no
    call (tool_calls reads none), and no later call opens past it (a review found index 1 opened
    with no index 0)."""
    calls, want = deltas_of((None, parser), text)
    assert want is None and all(c["function"]["name"] not in ("g", "x") for c in calls), calls


def test_the_answer_is_read_for_calls_only_where_one_has_ended(monkeypatch):
    """With the pieces reading the calls' JSON, a `},` or `;` inside a call's arguments is no place
    to read the answer (each read costs its length: a review measured seconds for 20,000 characters
    a character a piece): an answer of two calls is read a few times, not at each possible end."""
    from trtllm.runtime import tool_stream

    reads = []
    real = tool_stream.extract_or_none
    monkeypatch.setattr(tool_stream, "extract_or_none", lambda text, *a, **k: reads.append(len(text)) or real(text, *a, **k))
    text = ('[{"name": "f", "parameters": {"l": [' + ", ".join(["{}"] * 300) + '], "s": "' + "; " * 100 + '"}}, '
            '{"name": "g", "parameters": {}}]')
    calls, want = deltas_of((ToolChoice("required"), None), text)
    assert calls == want and len(want) == 2 and len(reads) <= 6, len(reads)  # (its arguments: 300 `},`, 100 `;`)
