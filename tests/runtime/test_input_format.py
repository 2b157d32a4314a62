"""Tests for the strict input JSON reader (runtime/input_format.py). Fast, no model."""

import copy
import dataclasses
import json
import math
import pathlib
import subprocess
import sys

import pytest

from trtllm.runtime.input_format import (
    ContentItem,
    InputError,
    InputFile,
    Message,
    Request,
    check_against_engine,
    parse_input,
    read_input,
)

REPO = pathlib.Path(__file__).resolve().parents[2]

MINIMAL = {"requests": [{"messages": [{"role": "user", "content": "Hi"}]}]}

FULL = {
    "batch_size": 2,
    "temperature": 0.7,
    "top_p": 0.9,
    "top_k": 40,
    "max_generate_length": 64,
    "apply_chat_template": True,
    "add_generation_prompt": False,
    "enable_thinking": True,
    "default_system_prompt": "You are terse.",
    "available_lora_weights": {"math": "/loras/math"},
    "num_logprobs": 3,
    "logit_bias": {"5": -100, "7": 2.5},
    "requests": [
        {"messages": [{"role": "system", "content": "Be brief."},
                      {"role": "user", "content": "Hi"}]},
        {
            "messages": [{"role": "user", "content": [
                {"type": "text", "text": "Describe "},
                {"type": "image", "image": "cat.png", "do_resize": True},
                {"type": "text", "text": "this."},
            ]}],
            "lora_name": "math",
            "save_system_prompt_kv_cache": True,
            "disable_spec_decode": True,
            "stop": ["\n\n", "END"],
            "logit_bias": {"9": 1},
            "num_logprobs": 0,
        },
        {"messages": [], "stop": "x"},
    ],
}


def test_minimal_file_gets_the_defaults():
    inp = parse_input(copy.deepcopy(MINIMAL))
    assert (inp.batch_size, inp.temperature, inp.top_p, inp.top_k) == (1, 1.0, 0.8, 50)
    assert inp.max_generate_length == 256
    assert (inp.apply_chat_template, inp.add_generation_prompt, inp.enable_thinking) == (
        True, True, False)
    assert inp.default_system_prompt is None
    assert inp.available_lora_weights == {} and inp.logit_bias == {} and inp.num_logprobs == 0
    (req,) = inp.requests
    assert req == Request(
        messages=(Message("user", "Hi"),), lora_name=None, save_system_prompt_kv_cache=False,
        disable_spec_decode=False, stop=(), logit_bias={}, num_logprobs=0)


def test_full_file_overrides_and_resolves_request_defaults():
    inp = parse_input(copy.deepcopy(FULL))
    assert (inp.batch_size, inp.temperature, inp.top_p, inp.top_k) == (2, 0.7, 0.9, 40)
    assert isinstance(inp.temperature, float) and isinstance(inp.top_k, int)
    assert inp.max_generate_length == 64
    assert (inp.apply_chat_template, inp.add_generation_prompt, inp.enable_thinking) == (
        True, False, True)
    assert inp.default_system_prompt == "You are terse."
    assert inp.available_lora_weights == {"math": "/loras/math"}
    assert inp.logit_bias == {5: -100.0, 7: 2.5}
    first, second, third = inp.requests
    # requests without their own logit_bias / num_logprobs inherit the top-level ones
    assert first.logit_bias == {5: -100.0, 7: 2.5} and first.num_logprobs == 3
    assert first.messages[0] == Message("system", "Be brief.")
    # a request's own values replace (not merge with) the top-level ones
    assert second.logit_bias == {9: 1.0} and second.num_logprobs == 0
    assert second.lora_name == "math"
    assert second.save_system_prompt_kv_cache and second.disable_spec_decode
    assert second.stop == ("\n\n", "END")
    assert second.messages[0].content == (
        ContentItem("text", "Describe "), ContentItem("image", "cat.png", True),
        ContentItem("text", "this."))
    assert third.messages == () and third.stop == ("x",)


def test_ints_are_accepted_where_floats_are_expected():
    doc = {**MINIMAL, "temperature": 0, "top_p": 1, "logit_bias": {"0": 3}}
    inp = parse_input(doc)
    assert inp.temperature == 0.0 and type(inp.temperature) is float
    assert type(inp.top_p) is float and type(inp.logit_bias[0]) is float


def test_dataclasses_are_frozen():
    inp = parse_input(copy.deepcopy(MINIMAL))
    with pytest.raises(dataclasses.FrozenInstanceError):
        inp.batch_size = 3


def test_message_text_and_media_types():
    inp = parse_input(copy.deepcopy(FULL))
    assert inp.requests[0].messages[1].text() == "Hi"
    assert inp.requests[1].messages[0].text() == "Describe this."
    assert inp.requests[0].media_types() == set()
    assert inp.requests[1].media_types() == {"image"}
    media = (ContentItem("audio", "a.wav"), ContentItem("video", "v.mp4"))
    req = Request((Message("user", media),), None, False, False, (), {}, 0)
    assert req.media_types() == {"audio", "video"}


def test_to_json_echoes_content_as_an_array():
    inp = parse_input(copy.deepcopy(FULL))
    assert inp.requests[0].messages[1].to_json() == {
        "role": "user", "content": [{"type": "text", "text": "Hi"}]}
    assert inp.requests[1].messages[0].to_json() == {"role": "user", "content": [
        {"type": "text", "text": "Describe "},
        {"type": "image", "image": "cat.png", "do_resize": True},
        {"type": "text", "text": "this."},
    ]}
    # the echo form is itself valid input content
    echo = {"requests": [{"messages": [m.to_json() for m in inp.requests[1].messages]}]}
    assert parse_input(echo).requests[0].messages == inp.requests[1].messages


# --- errors: (mutation of FULL, expected json_path) -------------------------------------------

def _set(*keys_and_value):
    *keys, value = keys_and_value

    def mutate(doc):
        for key in keys[:-1]:
            doc = doc[key]
        doc[keys[-1]] = value(doc[keys[-1]]) if callable(value) else value
    return mutate


def _delete(*keys):
    def mutate(doc):
        for key in keys[:-1]:
            doc = doc[key]
        del doc[keys[-1]]
    return mutate


def _rename(*keys_and_new):
    *keys, new = keys_and_new

    def mutate(doc):
        for key in keys[:-1]:
            doc = doc[key]
        doc[new] = doc.pop(keys[-1])
    return mutate


R0, R1, R2 = ("requests", 0), ("requests", 1), ("requests", 2)
ITEMS = (*R1, "messages", 0, "content")
BIG = "x" * (128 * 1024 + 1)
CHUNK = "é" * (60 * 1024)  # 120 KiB of UTF-8, under the per-content limit

ERROR_CASES = [
    # unknown keys at every level (with the closest known key as a hint)
    (_rename("batch_size", "batchsize"), "batchsize"),
    (_set("foo bar", 1), '["foo bar"]'),
    (_rename(*R0, "messages", "mesages"), "requests[0].mesages"),
    (_set(*R0, "messages", 0, "name", "x"), "requests[0].messages[0].name"),
    (_set(*ITEMS, 0, "url", "x"), "requests[1].messages[0].content[0].url"),
    # top-level numbers
    (_set("batch_size", True), "batch_size"),
    (_set("batch_size", 0), "batch_size"),
    (_set("batch_size", 17), "batch_size"),
    (_set("batch_size", 2.0), "batch_size"),
    (_set("temperature", "0.5"), "temperature"),
    (_set("temperature", -0.1), "temperature"),
    (_set("temperature", 100.5), "temperature"),
    (_set("temperature", math.nan), "temperature"),
    (_set("temperature", math.inf), "temperature"),
    (_set("top_p", 0), "top_p"),
    (_set("top_p", 1.01), "top_p"),
    (_set("top_k", 2.0), "top_k"),
    (_set("top_k", -1), "top_k"),
    (_set("top_k", False), "top_k"),
    (_set("max_generate_length", -1), "max_generate_length"),
    (_set("max_generate_length", None), "max_generate_length"),
    (_set("num_logprobs", 51), "num_logprobs"),
    (_set("num_logprobs", -1), "num_logprobs"),
    (_set("num_logprobs", 1.5), "num_logprobs"),
    # top-level bools and strings
    (_set("apply_chat_template", 1), "apply_chat_template"),
    (_set("add_generation_prompt", "true"), "add_generation_prompt"),
    (_set("enable_thinking", None), "enable_thinking"),
    (_set("default_system_prompt", None), "default_system_prompt"),
    (_set("default_system_prompt", 5), "default_system_prompt"),
    (_set("default_system_prompt", "\ud800"), "default_system_prompt"),
    # maps
    (_set("available_lora_weights", ["math"]), "available_lora_weights"),
    (_set("available_lora_weights", "math", 3), 'available_lora_weights["math"]'),
    (_set("available_lora_weights", "math", ""), 'available_lora_weights["math"]'),
    (_set("logit_bias", [1, 2]), "logit_bias"),
    (_set("logit_bias", "-1", 1), 'logit_bias["-1"]'),
    (_set("logit_bias", "abc", 1), 'logit_bias["abc"]'),
    (_set("logit_bias", "05", 1), 'logit_bias["05"]'),
    (_set("logit_bias", "5", 100.5), 'logit_bias["5"]'),
    (_set("logit_bias", "5", True), 'logit_bias["5"]'),
    (_set("logit_bias", "5", math.nan), 'logit_bias["5"]'),
    (_set("logit_bias", {str(i): 1 for i in range(1025)}), "logit_bias"),
    # requests
    (_set("requests", []), "requests"),
    (_set("requests", {}), "requests"),
    (_delete("requests"), "requests"),
    (_set("requests", 2, "hi"), "requests[2]"),
    (_delete(*R2, "messages"), "requests[2].messages"),
    (_set(*R2, "messages", "hi"), "requests[2].messages"),
    (_set(*R2, "messages", [{"role": "user", "content": "a"}] * 65), "requests[2].messages"),
    (_set(*R1, "lora_name", "maths"), "requests[1].lora_name"),
    (_set(*R1, "lora_name", None), "requests[1].lora_name"),
    (_set(*R2, "lora_name", "math"), None),  # valid: a sanity row
    (_set(*R1, "save_system_prompt_kv_cache", 0), "requests[1].save_system_prompt_kv_cache"),
    (_set(*R1, "disable_spec_decode", "no"), "requests[1].disable_spec_decode"),
    (_set(*R2, "stop", ""), "requests[2].stop"),
    (_set(*R1, "stop", ["a", ""]), "requests[1].stop[1]"),
    (_set(*R1, "stop", 5), "requests[1].stop"),
    (_set(*R1, "logit_bias", {"x": 1}), 'requests[1].logit_bias["x"]'),
    (_set(*R1, "num_logprobs", True), "requests[1].num_logprobs"),
    # messages
    (_set(*R0, "messages", 0, "x"), "requests[0].messages[0]"),
    (_set(*R0, "messages", 0, "role", "bot"), "requests[0].messages[0].role"),
    (_delete(*R0, "messages", 0, "role"), "requests[0].messages[0].role"),
    (_delete(*R0, "messages", 0, "content"), "requests[0].messages[0].content"),
    (_set(*R0, "messages", 0, "content", 5), "requests[0].messages[0].content"),
    (_set(*R0, "messages", 1, "content", BIG), "requests[0].messages[1].content"),
    (_set(*R0, "messages", lambda _: [{"role": "user", "content": CHUNK}] * 9),
     "requests[0].messages"),
    # content items
    (_set(*ITEMS, lambda items: items * 7), "requests[1].messages[0].content"),
    (_set(*ITEMS, 0, "x"), "requests[1].messages[0].content[0]"),
    (_delete(*ITEMS, 0, "type"), "requests[1].messages[0].content[0].type"),
    (_set(*ITEMS, 1, "type", "img"), "requests[1].messages[0].content[1].type"),
    (_delete(*ITEMS, 0, "text"), "requests[1].messages[0].content[0].text"),
    (_set(*ITEMS, 0, "text", BIG), "requests[1].messages[0].content[0].text"),
    (_set(*ITEMS, 1, "text", "hi"), "requests[1].messages[0].content[1].text"),
    (_set(*ITEMS, 0, "do_resize", True), "requests[1].messages[0].content[0].do_resize"),
    (_set(*ITEMS, 1, "do_resize", "yes"), "requests[1].messages[0].content[1].do_resize"),
    (_set(*ITEMS, 1, "image", ""), "requests[1].messages[0].content[1].image"),
]


@pytest.mark.parametrize("mutate, path", ERROR_CASES, ids=[p or "valid" for _, p in ERROR_CASES])
def test_each_bad_field_names_its_json_path(mutate, path):
    doc = copy.deepcopy(FULL)
    mutate(doc)
    if path is None:
        parse_input(doc)
        return
    with pytest.raises(InputError) as info:
        parse_input(doc)
    assert info.value.json_path == path
    message = str(info.value)
    assert message.startswith(f"`{path}` must be "), message
    assert ", got " in message
    assert len(message) < 400  # bad values are shortened, never dumped whole


def test_hints():
    def error(mutate):
        doc = copy.deepcopy(FULL)
        mutate(doc)
        with pytest.raises(InputError) as info:
            parse_input(doc)
        return str(info.value)

    assert "did you mean 'messages'?" in error(_rename(*R0, "messages", "mesages"))
    assert "did you mean 'math'?" in error(_set(*R1, "lora_name", "maths"))
    assert "did you mean 'image'?" in error(_set(*ITEMS, 1, "type", "img"))
    assert "write 2" in error(_set("top_k", 2.0))
    assert error(_set("requests", 0, "messages", 0, "role", "bot")) == (
        "`requests[0].messages[0].role` must be one of 'system', 'user', 'assistant', got 'bot'")


def test_top_level_must_be_an_object():
    with pytest.raises(InputError) as info:
        parse_input([MINIMAL])
    assert info.value.json_path == "" and "JSON object" in str(info.value)


def test_input_error_is_a_value_error():
    assert issubclass(InputError, ValueError)


# --- files ------------------------------------------------------------------------------------

def _write(tmp_path, text, name="input.json"):
    path = tmp_path / name
    path.write_bytes(text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text)
    return path


def test_read_input_reads_a_file(tmp_path):
    assert read_input(_write(tmp_path, json.dumps(FULL))) == parse_input(copy.deepcopy(FULL))
    minimal = read_input(str(_write(tmp_path, json.dumps(MINIMAL))))
    assert minimal.requests[0].messages[0].text() == "Hi"


def test_bad_json_syntax_reports_line_and_column(tmp_path):
    path = _write(tmp_path, '{\n  "batch_size": 2\n  "requests": []\n}')
    with pytest.raises(InputError) as info:
        read_input(path)
    assert info.value.json_path == ""
    assert "line 3 column 3" in str(info.value) and "input.json" in str(info.value)


def test_invalid_utf8_reports_line_and_column(tmp_path):
    path = _write(tmp_path, b'{"requests":\n [\xff]}')
    with pytest.raises(InputError, match="line 2 column 3"):
        read_input(path)


def test_missing_file(tmp_path):
    with pytest.raises(InputError) as info:
        read_input(tmp_path / "nope.json")
    assert info.value.json_path == "" and "nope.json" in str(info.value)


def test_a_directory_is_not_a_file(tmp_path):
    with pytest.raises(InputError):
        read_input(tmp_path)


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e400"])
def test_non_finite_json_numbers_are_refused_at_their_path(tmp_path, literal):
    path = _write(tmp_path, '{"temperature": %s, "requests": [{"messages": []}]}' % literal)
    with pytest.raises(InputError) as info:
        read_input(path)
    assert info.value.json_path == "temperature"


@pytest.mark.parametrize("text, path", [
    ('{"top_k": 1, "top_k": 2, "requests": [{"messages": []}]}', "top_k"),
    ('{"requests": [{"messages": [], "stop": "a", "stop": "b"}]}', "requests[0].stop"),
    ('{"logit_bias": {"3": 1, "3": 2}, "requests": [{"messages": []}]}', 'logit_bias["3"]'),
])
def test_duplicate_keys_are_refused(tmp_path, text, path):
    with pytest.raises(InputError) as info:
        read_input(_write(tmp_path, text))
    assert info.value.json_path == path and "more than once" in str(info.value)


def test_lone_surrogate_escape_is_refused(tmp_path):
    text = '{"requests": [{"messages": [{"role": "user", "content": "\\ud800"}]}]}'
    path = _write(tmp_path, text)
    with pytest.raises(InputError) as info:
        read_input(path)
    assert info.value.json_path == "requests[0].messages[0].content"


def test_example_input_parses():
    inp = read_input(REPO / "examples" / "input.json")
    assert inp.batch_size == 2 and inp.temperature == 0.0 and inp.max_generate_length == 64
    assert len(inp.requests) == 4
    assert any(m.role == "system" for r in inp.requests for m in r.messages)
    assert any(len(r.messages) >= 3 for r in inp.requests)
    assert any(r.stop for r in inp.requests)


# --- engine checks ----------------------------------------------------------------------------

def test_check_against_engine():
    doc = copy.deepcopy(FULL)
    doc["logit_bias"] = {"5": 1, "60000": 2}
    doc["requests"][1]["logit_bias"] = {"49151": 1, "49152": -1}
    inp = parse_input(doc)
    problems = check_against_engine(inp, vocab_size=49152)
    assert [i for i, _ in problems] == [0, 1, 2]
    # an inherited bias is reported where the user wrote it
    assert problems[0][1].startswith('`logit_bias["60000"]` must be a token id below')
    assert problems[1][1] == ('`requests[1].logit_bias["49152"]` must be a token id below the '
                              "vocabulary size 49152, got 49152")
    assert check_against_engine(inp, vocab_size=100_000) == []
    with pytest.raises(ValueError, match="vocab_size"):
        check_against_engine(inp, vocab_size=0)


def test_imports_only_the_standard_library():
    code = ("import sys, trtllm.runtime.input_format; "
            "print([m for m in ('torch', 'transformers', 'onnx', 'numpy') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_input_file_defaults_match_the_dataclass():
    inp = InputFile(requests=())
    assert inp.available_lora_weights == {} and inp.logit_bias == {}
    assert InputFile(requests=()).logit_bias is not inp.logit_bias


def test_json_examples_in_the_doc_parse():
    text = (REPO / "docs" / "input_format.md").read_text(encoding="utf-8")
    blocks = text.split("```json\n")[1:]
    assert len(blocks) >= 2
    for block in blocks:
        parse_input(json.loads(block.split("```")[0]))
    example = json.loads((REPO / "examples" / "input.json").read_text(encoding="utf-8"))
    assert json.loads(blocks[0].split("```")[0]) == example  # the doc shows the real file
