"""Reading tool calls out of answers (runtime/tool_calls.py): each parser's format, what is not a
call, `tool_choice` and the JSON schema a forced choice holds the answer to."""
from __future__ import annotations

import json

import pytest

from tests.runtime.tool_deltas import assemble
from trtllm.runtime.strict_json import InputError
from trtllm.runtime.tool_calls import ToolChoice, extract, forced_guide, parse_choice

TOOLS = ({"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}},
         {"type": "function", "function": {"name": "now"}})


def calls(text: str, parser: str | None = None, choice: ToolChoice | None = None, tools=TOOLS):
    got = extract(text, choice, parser, tools, key="r0")
    return got and (got[0], [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in got[1]])


def test_hermes_reads_every_call_and_the_text_before_them():
    text = ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
            '<tool_call>{"name": "now", "arguments": {}}')  # the last one unclosed: the answer ended first
    assert calls(text, "hermes") == ("Let me check.\n", [("get_weather", {"city": "Paris"}), ("now", {})])
    assert calls('<tool_call>{"name": "now", "arguments": {}}</tool_call>', "hermes") == (None, [("now", {})])
    deep = "[" * 100_000 + "]" * 100_000  # deeper than json goes: no call, not a crash
    for text in ("No call here.", '<tool_call>{"name": "now"}</tool_call>',  # no arguments
                 '<tool_call>{"name": "now", "arguments": {"a": "\\ud800"}}</tool_call>',  # not writable as UTF-8
                 f'<tool_call>{{"name": "now", "arguments": {deep}}}</tool_call>',
                 "<tool_call>{not json}</tool_call>", '<tool_call>["now"]</tool_call>',
                 '<tool_call>{"name": "", "arguments": {}}</tool_call>'):
        assert calls(text, "hermes") is None, text


def test_llama3_json_reads_calls_that_are_the_whole_answer():
    assert calls('<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": "now", '
                 '"parameters": {}}', "llama3_json") == (None, [("get_weather", {"city": "Paris"}), ("now", {})])
    assert calls(' {"name": "now", "arguments": {}}\n', "llama3_json") == (None, [("now", {})])
    assert calls('{"name": "now", "arguments": {}}; ', "llama3_json") == (None, [("now", {})])  # a last `;`
    for text in ('Here is JSON: {"name": "now", "parameters": {}}',  # quoting JSON is not calling
                 '{"name": "now", "parameters": {}} and more', '{"name": "now", "parameters": {}}; x',
                 '{"name": "now", "parameters": ' + "[" * 100_000 + "]" * 100_000 + "}",
                 '{"name": "now", "parameters": {}, "arguments": {}}', '{"name": "now"}'):
        assert calls(text, "llama3_json") is None, text


def test_pythonic_reads_literal_keyword_calls_and_evaluates_nothing():
    assert calls('[get_weather(city="Paris", days=[1, 2], opts={"metric": True, "x": None}), now()]',
                 "pythonic") == (None, [("get_weather", {"city": "Paris", "days": [1, 2],
                                                          "opts": {"metric": True, "x": None}}), ("now", {})])
    assert calls("<|python_start|>[now()]<|python_end|>", "pythonic") == (None, [("now", {})])
    for text in ('[os.system("rm")]', "[now(1)]", "[now(x='\\ud800')]", "[now(x=y)]", "[now(x={1, 2})]", "[now(**k)]",
                 "[now(x=1 + 2)]", "now()", "[1]", "[now(]", "[]", "[now(x=" + "-" * 100_000 + "1)]"):
        assert calls(text, "pythonic") is None, text


def test_lfm2_reads_python_call_lists_between_its_markers_and_the_text_before_them():
    """LFM2 and LFM3's format: pythonic lists inside <|tool_call_start|> ... <|tool_call_end|>, any number
    (the last may be unclosed); the text before the first marker is the content."""
    text = ('Checking.<|tool_call_start|>[get_weather(city="Paris"), now()]<|tool_call_end|>'
            '<|tool_call_start|>[now()]')  # (the last unclosed: the answer ended first)
    assert calls(text, "lfm2") == ("Checking.", [("get_weather", {"city": "Paris"}), ("now", {}), ("now", {})])
    assert calls("<|tool_call_start|>[now()]<|tool_call_end|>", "lfm2") == (None, [("now", {})])
    for text in ("[now()]", "No call.", "<|tool_call_start|>now()<|tool_call_end|>",  # (the markers, a list)
                 '<|tool_call_start|>[now()]<|tool_call_end|><|tool_call_start|>[os.system("rm")]<|tool_call_end|>',
                 "<|tool_call_start|>[now(]<|tool_call_end|>", "<|tool_call_start|>[]<|tool_call_end|>"):
        assert calls(text, "lfm2") is None, text


def test_forced_choices_read_their_json_and_choice_none_or_no_parser_read_nothing():
    required = ToolChoice("required")
    assert calls('[{"name": "now", "parameters": {}}]', choice=required) == (None, [("now", {})])
    assert calls('[{"name": "now", "parameters": {}', choice=required) is None  # cut short
    assert calls('{"city": "Rome"}', choice=ToolChoice("function", "get_weather")) == (
        None, [("get_weather", {"city": "Rome"})])
    text = '<tool_call>{"name": "now", "arguments": {}}</tool_call>'
    assert calls(text) is None and calls(text, "hermes", ToolChoice("none")) is None
    assert calls(text, "hermes", tools=None) is None and calls(text, "hermes", tools=()) is None


def test_call_ids_follow_the_request_and_the_answer():
    text = '<tool_call>{"name": "now", "arguments": {}}</tool_call>' * 2
    first = extract(text, None, "hermes", TOOLS, key="r0")[1]
    assert [c["id"] for c in first] == [c["id"] for c in extract(text, None, "hermes", TOOLS, key="r0")[1]]
    assert first[0]["id"] != first[1]["id"] and all(c["id"].startswith("call_") and len(c["id"]) == 29
                                                     for c in first)
    assert first[0]["id"] != extract(text, None, "hermes", TOOLS, key="r1")[1][0]["id"]
    assert list(first[0]) == ["id", "type", "function"]  # OpenAI's order


def test_mistral_call_ids_are_the_nine_alphanumerics_its_templates_take_back():
    """Mistral's chat templates refuse a tool_call_id that is not 9 letters and digits ("Tool call
    IDs should be alphanumeric strings with length 9!"), so a call read by the mistral parser gets
    such an id, as vLLM's does; still the same for the same request and answer."""
    import re

    text = '[TOOL_CALLS][{"name": "now", "arguments": {}}, {"name": "now", "arguments": {"tz": "UTC"}}]'
    first = extract(text, None, "mistral", TOOLS, key="r0")[1]
    assert len(first) == 2 and all(re.fullmatch(r"[A-Za-z0-9]{9}", c["id"]) for c in first)
    assert first[0]["id"] != first[1]["id"]
    assert [c["id"] for c in first] == [c["id"] for c in extract(text, None, "mistral", TOOLS, key="r0")[1]]


def test_required_schema_lists_the_tools_each_resolving_its_own_refs(tiny_engine):
    """"required": an array of calls, each tool's parameters a schema resource of its own (an `$id`),
    so its `#`, `#/$defs/...` and draft-7 `#/definitions/...` point inside it, not at the array
    (a review found a tree's `"$ref": "#"` children forced to be arrays of calls, and `definitions`
    not compiling); two tools may define one name differently."""
    pytest.importorskip("torch")  # (the tiny engine's tokenizer)
    from trtllm.runtime import grammar
    from trtllm.runtime.tokenizer import Tokenizer

    point = {"type": "object", "properties": {"x": {"type": "number"}}}
    tree = {"type": "object", "properties": {"n": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#"}}},
            "required": ["n", "kids"], "additionalProperties": False}
    tools = ({"type": "function", "function": {"name": "a", "parameters": {
        "type": "object", "properties": {"p": {"$ref": "#/$defs/Point"}}, "$defs": {"Point": point}}}},
             {"type": "function", "function": {"name": "b", "parameters": {
                 "type": "object", "properties": {"p": {"$ref": "#/definitions/Point"}},
                 "definitions": {"Point": {"type": "string"}}}}},
             {"type": "function", "function": {"name": "t", "parameters": tree}})
    guide = forced_guide(ToolChoice("required"), tools, "tool_choice", "tools")
    schema = json.loads(guide.text)
    assert schema["minItems"] == 1 and "$defs" not in schema
    assert [o["properties"]["name"] for o in schema["items"]["anyOf"]] == [{"const": "a"}, {"const": "b"}, {"const": "t"}]
    assert schema["x-guidance"]["whitespace_flexible"] is False
    tok = Tokenizer.from_engine_dir(tiny_engine("llama"))
    grammars = grammar.Grammars(tok.to_json(), tok.vocab_size, [tok.token_to_id("<|im_end|>")])

    def errors(text: str) -> list:
        m = grammars.matcher(guide)
        return [e for e in (m.consume(t) for t in tok.encode(text)) if e]
    assert errors('[{"name": "a", "parameters": {"p": {"x": 1}}}, {"name": "b", "parameters": {"p": "q"}}, '
                  '{"name": "t", "parameters": {"n": 1, "kids": [{"n": 2, "kids": []}]}}]') == []
    for wrong in ('[{"name": "c", "parameters": {}}]', '[{"name": "a", "parameters": {"p": {"x": "1"}}}]',
                  '[{"name": "b", "parameters": {"p": {"x": 1}}}]', '[]', '[ {"name": "b", "parameters": {}}]',
                  '[{"name":"b", "parameters": {}}]',
                  '[{"name": "t", "parameters": {"n": 1, "kids": [[{"name": "t", "parameters": {"n": 2, "kids": []}}]]}}]'):
        assert errors(wrong), wrong  # not a tool, not its schema, no call, not json.dumps' spacing, `#` the array
    named = json.loads(forced_guide(ToolChoice("function", "a"), tools, "t", "tools").text)
    assert named["$defs"] == {"Point": point} and "$id" not in named  # a named function's own schema, as it is


@pytest.mark.parametrize("tools, message", [
    ((), "`tool_choice` must be \"auto\" or \"none\" when the request has no `tools`"),
    (({"type": "code"},), "`tools[0].type` must be \"function\""),
    (({"type": "function", "function": {"parameters": {}}},), "`tools[0].function.name` must be given"),
    (({"type": "function", "function": {"name": 3}},), "`tools[0].function.name` must be a non-empty string"),
    (({"function": {"name": "a"}},), "`tools[0].type` must be given (a forced tool choice reads each tool), got nothing"),
    (({"type": "function", "function": {"name": "a", "parameters": {"$defs": [1]}}},),
     '`tools[0].function.parameters["$defs"]` must be a JSON object'),
    (({"type": "function", "function": {"name": "a", "parameters": {"$defs": None}}},),
     '`tools[0].function.parameters["$defs"]` must be a JSON object'),
    (({"type": "function", "function": {"name": "a", "parameters": 3}},), "`tools[0].function.parameters` must be"),
])
def test_forced_choices_need_function_tools(tools, message):
    with pytest.raises(InputError) as e:
        forced_guide(ToolChoice("required"), tools, "tool_choice", "tools")
    assert str(e.value).startswith(message)


@pytest.mark.parametrize("value, message", [
    ("any", "`c` must be one of 'auto', 'none', 'required', got 'any'"),
    ({"type": "function"}, "`c.function` must be given"),
    ({"function": {"name": "a"}}, "`c.type` must be \"function\", got nothing"),
    ({"type": "function", "function": {"name": "a", "strict": True}}, "`c.function.strict` must be a known key"),
    ({"type": "function", "function": {"name": ""}}, "`c.function.name` must be a non-empty string"),
    (["auto"], "`c` must be a JSON object"),
])
def test_tool_choice_errors_name_the_part(value, message):
    with pytest.raises(InputError) as e:
        parse_choice(value, "c")
    assert str(e.value).startswith(message)
    assert parse_choice({"type": "function", "function": {"name": "a"}}, "c") == ToolChoice("function", "a")


@pytest.mark.parametrize("parser, text, thinking, want", [
    ("qwen3", "<think>a b</think>\n\nHi", False, ("a b", "\n\nHi")),
    ("qwen3", "Hi", False, (None, "Hi")),                      # thinking off: all content
    ("qwen3", "<think>\ncut short", False, (None, "\ncut short")),  # (the <think> it wrote dropped)
    ("qwen3", "<think>\ncut short", True, ("\ncut short", None)),  # thinking on: a thought cut short
    ("qwen3", "cut short", True, ("cut short", None)),         # a Thinking model's (<think> in the prompt)
    ("qwen3", "a b</think>Hi", False, ("a b", "Hi")),          # a Thinking model: <think> was in the prompt
    ("qwen3", "<think></think>", False, (None, None)),
    ("deepseek_r1", "a b</think>Hi", False, ("a b", "Hi")),   # the template opened the thought
    ("deepseek_r1", "<think>a</think>", False, ("a", None)),
    ("deepseek_r1", "still thinking", False, ("still thinking", None)),
    ("deepseek_r1", "x<think>a</think>b", False, ("a", "b")),  # text before a <think> is dropped (vLLM's)
])
def test_reasoning_parsers_split_as_vllms_do(parser, text, thinking, want):
    from trtllm.runtime.reasoning import split

    assert split(text, parser, thinking) == want


@pytest.mark.parametrize("parser, thinking", [("qwen3", True), ("qwen3", False), ("deepseek_r1", False)])
def test_a_streamed_split_gives_the_whole_ones_pieces(parser, thinking):
    """Each answer cut into pieces every way (up to 3 cuts): the pieces of reasoning and of content
    concatenate to split's fields of the whole, a tag cut anywhere (pieces without one take a short
    way: the field the text's end is in); and a line gives no part of a tag that may still come (the
    wrong variant, a piece split as it stands, gives "hm</thi")."""
    import itertools

    from trtllm.runtime.reasoning import Stream, split

    answers = ["a b</think>\n\nHi <b>", "<think>a<b</think>c</th", "still < thinking", "</think>x", "hm</think>",
               "</think><think>b c>t"]
    if parser == "qwen3" and not thinking:  # (its split makes text before a `</think>` reasoning: see Stream)
        answers = ["Hi <b> there", "a < b <thin", "", "<think>a b</think>\n\nHi", "<think>\ncut <short"]
    for text in answers:
        for cuts in itertools.chain.from_iterable(itertools.combinations(range(len(text) + 1), k) for k in range(4)):
            bounds = [0, *cuts, len(text)]
            stream, got = Stream(parser, thinking), ["", ""]
            for i, (a, b) in enumerate(zip(bounds, bounds[1:])):
                for field, piece in enumerate(stream.push(text[a:b], final=i == len(bounds) - 2)):
                    got[field] += piece
            assert (got[0] or None, got[1] or None) == split(text, parser, thinking), (text, cuts)
    stream = Stream("deepseek_r1")
    assert stream.push("hm</thi") == ("hm", "") and stream.push("nk>ok") == ("", "ok")
    moved = Stream("qwen3")  # thinking off: content, until a `</think>` makes it reasoning
    assert moved.push("a b") == ("", "a b") and moved.push("</think>c") == ("", "")
    assert moved.push("d", final=True) == ("", "")  # (the last line's whole fields say what it is)


def test_parallel_tool_calls_false_allows_one_call():
    """OpenAI's parallel_tool_calls false: "required" takes one call at most, a parser keeps the first."""
    one = json.loads(forced_guide(ToolChoice("required"), TOOLS, "t", "tools", parallel=False).text)
    assert (one["minItems"], one["maxItems"]) == (1, 1)
    assert "maxItems" not in json.loads(forced_guide(ToolChoice("required"), TOOLS, "t", "tools").text)
    text = '<tool_call>{"name": "now", "arguments": {}}</tool_call><tool_call>{"name": "get_weather", "arguments": {}}'
    got = extract(text, None, "hermes", TOOLS, key="r0", parallel=False)
    assert [c["function"]["name"] for c in got[1]] == ["now"]
    assert [c["function"]["name"] for c in extract(text, None, "hermes", TOOLS, key="r0")[1]] == ["now", "get_weather"]


def test_mistral_reads_both_of_its_formats():
    """v3 tokenizers: [TOOL_CALLS] then a JSON array; v11 on: [TOOL_CALLS]name[ARGS]{...} per call."""
    assert calls('Sure. [TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "now", '
                 '"arguments": {}}]', "mistral") == ("Sure. ", [("get_weather", {"city": "Paris"}), ("now", {})])
    assert calls('[TOOL_CALLS]get_weather[ARGS]{"city": "Rome"}[TOOL_CALLS]now[ARGS]{}', "mistral") == (
        None, [("get_weather", {"city": "Rome"}), ("now", {})])
    for text in ("no calls", '[TOOL_CALLS] [{"name": "now"}]', "[TOOL_CALLS]now{}", '[TOOL_CALLS]now[ARGS]{} x',
                 '[TOOL_CALLS] [{"name": "now", "arguments": {}}] more'):
        assert calls(text, "mistral") is None, text


STREAMED = [  # (parser, tool choice, answer): calls, calls after content, no calls, calls then a broken one
    ("hermes", None, 'Hi.<tool_call>{"name": "now", "arguments": {}}</tool_call>\n<tool_call>{"name": '
                     '"get_weather", "arguments": {"city": "Rome"}}</tool_call>'),
    ("hermes", None, "Just text, <tool at the end"),
    ("hermes", None, '<tool_call>{"name": "now", "arguments": {}}</tool_call><tool_call>{bad}</tool_call>'),
    ("llama3_json", None, '<|python_tag|>{"name": "now", "parameters": {}}; {"name": "get_weather", '
                          '"parameters": {"city": "Rome"}}'),
    ("llama3_json", None, "<b>{not a call}</b>"),
    ("llama3_json", None, '{"name": "now", "parameters": {}} and then text'),
    ("mistral", None, 'Sure. [TOOL_CALLS][{"name": "now", "arguments": {}}, {"name": "get_weather", '
                      '"arguments": {"city": "Rome"}}]'),
    ("mistral", None, '[TOOL_CALLS]now[ARGS]{}[TOOL_CALLS]get_weather[ARGS]{"city": "Rome"}'),
    ("pythonic", None, '[now(), get_weather(city="Rome")]'),
    ("pythonic", None, "It is (about) [noon]."),
    ("lfm2", None, 'Sure.<|tool_call_start|>[now(), get_weather(city="Rome")]<|tool_call_end|><|tool_call_start|>'
                   '[now()]<|tool_call_end|>'),
    ("lfm2", None, "Just text, <|tool_call at the end"),
    (None, ToolChoice("required"), '[{"name": "now", "parameters": {}}, {"name": "get_weather", '
                                   '"parameters": {"city": "Rome"}}]'),
    (None, ToolChoice("function", "get_weather"), '{"city": "Rome"}'),
    # calls, then text that breaks the answer: the rest still comes as content (a review's cases)
    ("pythonic", None, '[now(), get_weather(city="Rome")]\nDone, bye.'),
    ("mistral", None, '[TOOL_CALLS][{"name": "now", "arguments": {}}, {"name": "now", "arguments": {}}] Done, bye.'),
    # arguments that are not an object: a number, a list, which a shorter text also reads as
    ("mistral", None, '[TOOL_CALLS]get_weather[ARGS][1, 2][TOOL_CALLS]now[ARGS]12'),
    # JSON not as json.dumps writes it (blanks, escapes, 1E2, the name after the arguments): the
    # streamed pieces are json.dumps' text all the same
    ("hermes", None, '<tool_call> {"arguments":{"city":"R\\u00f3ma\\n\\"x\\"","n":1E2,"l":[ true,-0, 1.50 ],'
                     '"e": "\\ud83d\\ude00"},\n"name":"get_weather"}</tool_call>'),
    ("llama3_json", None, '{"name":"now","parameters":{"a":{"b":[]} , "c":null}};{"parameters":{},"name":"now"}'),
    (None, ToolChoice("function", "get_weather"), ' {"city":"\u00e9"} '),
    # a key written twice in the arguments (json.loads keeps the last value): its pieces as written
    ("hermes", None, '<tool_call>{"name": "now", "arguments": {"a": 1, "a": 2}}</tool_call>'
                     '<tool_call>{"name": "now", "arguments": {"b": 3}}</tool_call>'),
]


@pytest.mark.parametrize("parser, choice, text", STREAMED)
def test_streamed_calls_and_content_make_the_answers(parser, choice, text):
    """--stream's tool calls (vLLM's deltas, a call at a time): whatever the pieces, the content pieces
    concatenate to the response's content (the answer, where it reads as no calls), the calls given
    are its tool_calls (ids too) in order with their index, and a call comes as soon as it reads
    whole, before the answer ends where another follows. Where the answer ends up broken after a
    call was given (the third hermes answer), the call stays given and `moved` says so."""
    import random

    from trtllm.runtime.tool_stream import Stream

    want = extract(text, choice, parser, TOOLS, key="r0")
    rng = random.Random(text)
    for trial in range(61):
        cuts = sorted(rng.sample(range(1, len(text)), min(trial % 6, len(text) - 1)))
        if trial == 60:  # a character a line: a call comes with the character that ends it
            cuts = list(range(1, len(text)))
        bounds = [0, *cuts, len(text)]
        stream, said, given, early, deltas = Stream(choice, parser, TOOLS, "r0"), "", [], 0, []
        for i, (a, b) in enumerate(zip(bounds, bounds[1:])):
            final = i == len(bounds) - 2
            piece, new = stream.push(text[a:b], final)
            said, given, early = said + piece, given + new, early + (len(new) if not final else 0)
            deltas += stream.take_deltas()
        pieces = assemble([deltas])[0]
        if want is None:
            assert said == text and stream.moved == bool(given or pieces), (cuts, given)
            continue
        assert said == (want[0] or "") and not stream.moved, cuts
        assert [call.pop("index") for call in given] == list(range(len(want[1]))) and given == want[1], cuts
        twice = '"a": 1, "a"' in text  # (the first call's arguments come as written: the key twice)
        assert pieces[twice:] == want[1][twice:] and [c["id"] for c in pieces] == [c["id"] for c in want[1]], cuts
        if twice:  # (which json.loads reads as the call's value)
            args = pieces[0]["function"]["arguments"]
            assert args == '{"a": 1, "a": 2}' and json.loads(args) == json.loads(want[1][0]["function"]["arguments"])
        if trial == 60 and len(want[1]) > 1:
            assert early >= 1  # the first call came before the answer ended


def test_streamed_calls_wait_for_text_that_may_begin_a_call():
    """Content stops before a suffix that may begin hermes' marker, and before an answer that may be
    llama3_json calls; the wrong variant, text given as it stands, would give '<tool' as content."""
    from trtllm.runtime.tool_stream import Stream

    stream = Stream(None, "hermes", TOOLS, "r0")
    assert stream.push("Hi <tool") == ("Hi ", []) and stream.push("box>") == ("<toolbox>", [])
    assert stream.push("<tool_call>") == ("", [])
    llama = Stream(None, "llama3_json", TOOLS, "r0")
    assert llama.push("  <|py") == ("", []) and llama.push("thon_tag|>{") == ("", [])
    assert llama.push('"name": "now", "parameters": {}}') == ("", [])  # (text could still follow it)
    got = llama.push('; {"name"')
    assert got[0] == "" and [c["function"]["name"] for c in got[1]] == ["now"]
    plain = Stream(None, "llama3_json", TOOLS, "r0")
    assert plain.push(" ") == ("", []) and plain.push("Sure") == (" Sure", [])


def test_a_streamed_answer_is_read_only_where_a_call_may_have_ended(monkeypatch):
    """A line costs little: the answer is read where a call may have ended (here at each
    `</tool_call>`) and at its end, not at every line (a 50-call answer a character a line)."""
    from trtllm.runtime import tool_stream

    reads = []
    monkeypatch.setattr(tool_stream, "extract_or_none", lambda text, *args: reads.append(len(text)) or extract(text, *args))
    call = '<tool_call>{"name": "get_weather", "arguments": {"city": "Rome, or Paris}"}}</tool_call>\n'
    text = "Hi." + call * 50
    stream, given = tool_stream.Stream(None, "hermes", TOOLS, "r0"), []
    for i, char in enumerate(text):
        given += stream.push(char, final=i == len(text) - 1)[1]
    assert len(given) == 50 and len(reads) == 51


def test_a_call_ends_where_a_later_possible_end_in_its_piece_does_not_read():
    """One piece holding a call's end and a later `},` / `),` inside the next call's arguments: the
    call still comes with that piece (the possible ends are tried last first until one reads)."""
    from trtllm.runtime.tool_stream import Stream

    mistral = Stream(None, "mistral", TOOLS, "r0")
    assert mistral.push('[TOOL_CALLS]now[ARGS]{"a": 1}') == ("", [])
    got = mistral.push('[TOOL_CALLS]get_weather[ARGS]{"b": {"c": 1},')[1]
    assert [(c["index"], c["function"]["name"]) for c in got] == [(0, "now")]
    pythonic = Stream(None, "pythonic", TOOLS, "r0")
    assert pythonic.push("[now()") == ("", [])
    got = pythonic.push(', get_weather(city=(1, 2),')[1]
    assert [(c["index"], c["function"]["name"]) for c in got] == [(0, "now")]


@pytest.mark.parametrize("parser, choice, text", [
    ("hermes", None, '<tool_call>{"name": "f", "arguments": {"city": "Paris"}, "arguments": {}}</tool_call>'),
    ("hermes", None, '<tool_call>{"name": "f", "arguments": {"a": 1}, "name": "g"}</tool_call>'),
    ("llama3_json", None, '{"name": "f", "name": "g", "parameters": {}}'),
    ("mistral", None, '[TOOL_CALLS][{"name": "f", "arguments": {}, "arguments": {"a": 1}}]'),
    (None, ToolChoice("required"), '[{"name": "f", "parameters": {}, "name": "g"}]'),
])
def test_a_call_object_with_its_name_or_arguments_written_twice_is_no_call(parser, choice, text):
    """Which one was meant? json.loads keeps the last, --stream would have given the first (a review
    found the deltas contradicting the final call); a key twice inside the arguments is their own."""
    assert extract(text, choice, parser, TOOLS, key="r0") is None
    inner = '<tool_call>{"name": "f", "arguments": {"a": 1, "a": 2}}</tool_call>'
    assert [c["function"]["arguments"] for c in extract(inner, None, "hermes", TOOLS, key="r0")[1]] == ['{"a": 2}']


def test_two_tools_parameters_of_one_id_are_refused_under_required():
    """"required" puts every tool's parameters in one schema: two resources of one `$id` would take
    each other's references (a review found a's `#/$defs/P` read as b's)."""
    tools = tuple({"type": "function", "function": {"name": name, "parameters": {
        "$id": "urn:same", "type": "object", "properties": {"p": {"$ref": "#/$defs/P"}}, "$defs": {"P": {"type": t}}}}}
        for name, t in (("a", "string"), ("b", "integer")))
    with pytest.raises(InputError, match=r'`tools\[1\].function.parameters\["\$id"\]` must be an `\$id` no other'):
        forced_guide(ToolChoice("required"), tools, "tool_choice", "tools")
    same = (tools[0], {"type": "function", "function": {"name": "b", "parameters": tools[0]["function"]["parameters"]}})
    assert forced_guide(ToolChoice("required"), same, "tool_choice", "tools")  # (one schema twice: fine)
