"""Tests for reading input files (syntax, encoding, duplicates, the nulls upstream writes) and the
checks that need the engine's limits (runtime/input_format.py). Fast, no model."""

import copy
import json
import pathlib
import subprocess
import sys

import pytest

from tests.runtime.input_samples import FULL, MINIMAL
from trtllm.runtime.input_checks import check_against_engine, check_limits
from trtllm.runtime.input_format import InputError, InputFile, parse_input, read_input

REPO = pathlib.Path(__file__).resolve().parents[2]


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


def test_a_byte_order_mark_is_read_past(tmp_path):
    """Editors on Windows start UTF-8 files with one; RFC 8259 lets a reader ignore it."""
    path = _write(tmp_path, b"\xef\xbb\xbf" + json.dumps(MINIMAL).encode())
    assert read_input(path) == parse_input(copy.deepcopy(MINIMAL))


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
    # (a review found this one taken silently, the last value kept: thinking turned off unnoticed)
    ('{"chat_template_kwargs": {"enable_thinking": true, "enable_thinking": false}, "requests": [{"messages": []}]}',
     "chat_template_kwargs.enable_thinking"),
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
    assert len(inp.requests) == 5
    assert any(m.role == "system" for r in inp.requests for m in r.messages)
    assert any(len(r.messages) >= 3 for r in inp.requests)
    assert any(r.stop for r in inp.requests)
    assert inp.requests[4].guided_decoding.kind == "json_schema"


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


def test_check_against_engine_stop_token_ids():
    doc = copy.deepcopy(FULL)
    doc["stop_token_ids"] = [2, 49152]
    doc["requests"][1]["stop_token_ids"] = [49151, 60000, 3]
    inp = parse_input(doc)
    problems = check_against_engine(inp, vocab_size=49152)
    assert problems == [
        (0, "`stop_token_ids[1]` must be a token id below the vocabulary size 49152, got 49152"),
        (1, "`requests[1].stop_token_ids[1]` must be a token id below the vocabulary size 49152, "
            "got 60000"),
        (2, "`stop_token_ids[1]` must be a token id below the vocabulary size 49152, got 49152"),
    ]


def _top_k_doc(top, *own):
    """A file with top-level top_k `top` and one request per entry of `own` (None = inherit)."""
    requests = [{"messages": []} if k is None else {"messages": [], "top_k": k} for k in own]
    return parse_input({"top_k": top, "requests": requests})


def test_check_limits():
    inp = _top_k_doc(2000, None, 2000, 40, 1025, 1024, 0, 49151, 49152, 10**6)
    assert check_limits(inp, max_top_k=1024, vocab_size=49152) == [
        (0, "`top_k` must be <= 1024 (the engine's sampler limit) or >= the vocabulary size "
            "49152 (all tokens), got 2000"),
        # the request repeats the top-level value but wrote it itself: its own path
        (1, "`requests[1].top_k` must be <= 1024 (the engine's sampler limit) or >= the "
            "vocabulary size 49152 (all tokens), got 2000"),
        (3, "`requests[3].top_k` must be <= 1024 (the engine's sampler limit) or >= the "
            "vocabulary size 49152 (all tokens), got 1025"),
        (6, "`requests[6].top_k` must be <= 1024 (the engine's sampler limit) or >= the "
            "vocabulary size 49152 (all tokens), got 49151"),
    ]
    assert check_limits(inp, max_top_k=1024, vocab_size=1025) == []  # 1025 = all tokens
    assert check_limits(_top_k_doc(50, None), max_top_k=1024, vocab_size=49152) == []


def test_check_limits_leave_greedy_and_beam_requests_alone():
    """top_k plays no part where nothing is sampled (input_format.md): not refused there."""
    inp = parse_input({"top_k": 2000, "requests": [{"messages": [], "temperature": 0},
                                                   {"messages": [], "temperature": 0, "num_beams": 2},
                                                   {"messages": []}]})
    assert [i for i, _ in check_limits(inp, max_top_k=1024, vocab_size=49152)] == [2]
    from trtllm.runtime import sampling

    batch = sampling.make_batch([sampling.SamplingParams(temperature=0, top_k=2000)], 49152, 1024)
    assert batch.top_k[0] == 0  # (a greedy row's top_k reaches the sampler as 0, none: it was refused there)
    with pytest.raises(ValueError, match="top_k"):
        sampling.make_batch([sampling.SamplingParams(temperature=1.0, top_k=2000)], 49152, 1024)


def test_check_limits_small_values_keep_their_paths():
    # small ints are shared objects in CPython: the path must not depend on object identity
    inp = _top_k_doc(100, None, 100)
    problems = check_limits(inp, max_top_k=64, vocab_size=49152)
    assert [p.split("`")[1] for _, p in problems] == ["top_k", "requests[1].top_k"]


@pytest.mark.parametrize("max_top_k, vocab_size, name", [
    (0, 49152, "max_top_k"),
    (1024.0, 49152, "max_top_k"),
    (1024, True, "vocab_size"),
])
def test_check_limits_refuses_bad_engine_values(max_top_k, vocab_size, name):
    with pytest.raises(ValueError, match=f"`{name}` must be a positive integer"):
        check_limits(parse_input(copy.deepcopy(MINIMAL)), max_top_k, vocab_size)


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
    assert example in [json.loads(b.split("```")[0]) for b in blocks]  # the doc shows the real file


MESSAGE = '{"messages": [{"role": "user", "content": "hi"}]}'


@pytest.mark.parametrize("text, path, needle", [
    # nesting past what json.loads recurses into (it raised RecursionError), and past our limit below it
    ('{"requests": [{"messages": [], "stop": ' + "[" * 5000 + "]" * 5000 + "}]}", "",
     "must be JSON whose arrays and objects nest at most 512 deep, got 5003 deep (the deepest at line 1 column 5039)"),
    ('{"requests": [{"messages": [{"content": "[[[["}], "stop":\n ' + "[" * 5000 + "]" * 5000 + "}]}", "",
     "nest at most 512 deep, got 5003 deep (the deepest at line 2 column 5001)"),
    ('{"requests": [{"messages": [], "chat_template_kwargs": {"x": ' + "[" * 600 + "]" * 600 + "}}]}", "",
     "nest at most 512 deep, got 604 deep"),
    # integers of more digits than Python converts (json.loads raised ValueError)
    ('{"top_k": ' + "1" * 4301 + ', "requests": [%s]}' % MESSAGE, "top_k", "an integer of 4301 digits"),
    ('{"requests": [{"messages": [{"role": "user", "content": ' + "9" * 5000 + "}]}]}",
     "requests[0].messages[0].content", "an integer of 5000 digits"),
    # a logit_bias key of 5000 digits passed the pattern, then int() refused it
    ('{"logit_bias": {"' + "1" * 5000 + '": 1}, "requests": [%s]}' % MESSAGE, None, "a token id of 5000 digits"),
    # a stop token id of 5000 digits: "must be an integer >= 0" did not say what was wrong with it
    ('{"requests": [{"messages": [], "stop_token_ids": [' + "1" * 5000 + "]}]}", "requests[0].stop_token_ids[0]",
     "must be a token id below the engine's vocabulary size, got an integer of 5000 digits"),
    # a request's own field at the top level is named as such, not "did you mean 'top_p'?"
    ('{"stop": ["x"], "requests": [%s]}' % MESSAGE, "stop", "must be set in each request (`requests[i].stop`)"),
    # and a top-level setting in a request (it was "did you mean 'chat_template_kwargs'?")
    ('{"requests": [{"messages": [], "apply_chat_template": false}]}', "requests[0].apply_chat_template",
     "must be set at the top level (`apply_chat_template`: it applies to the whole file), got it in a request"),
])
def test_pathological_files_are_usage_errors(tmp_path, text, path, needle):
    with pytest.raises(InputError) as info:
        read_input(_write(tmp_path, text))
    assert needle in str(info.value)
    if path is not None:
        assert info.value.json_path == path


def test_a_huge_key_is_shortened_in_its_path(tmp_path):
    text = '{"%s": 1, "requests": [%s]}' % ("a" * 100_000, MESSAGE)
    with pytest.raises(InputError) as info:
        read_input(_write(tmp_path, text))
    assert len(str(info.value)) < 500 and "(100000 chars)" in info.value.json_path


@pytest.mark.parametrize("field, value, hint", [("n", "0.0", False), ("seed", "2e19", False), ("seed", "1e19", False), ("seed", "1e15", True), ("top_k", "-3.0", False),
                                               ("top_k", "3.0", True)])
def test_write_n_hints_only_a_valid_value(tmp_path, field, value, hint):
    """`write N` is offered for an integer written as a float only when N itself is allowed."""
    with pytest.raises(InputError) as info:
        read_input(_write(tmp_path, '{"%s": %s, "requests": [%s]}' % (field, value, MESSAGE)))
    assert ("; write" in str(info.value)) == hint


def test_a_null_leaves_upstreams_optional_settings_unset():
    """Edge-LLM after 0.10 reads a null sampling_seed, logit_bias, guided_decoding and context-cache
    policy as absent (OpenAI clients write null for unset options too): the request takes the top
    level's value. A null anywhere else stays an error."""
    inp = parse_input({"logit_bias": {"5": 1}, "seed": 3, "guided_decoding": None, "requests": [
        {"messages": [], "logit_bias": None, "sampling_seed": None, "guided_decoding": None, "tools": None,
         "tool_choice": None, "context_cache_lookup_policy": None, "spec_proposal_sampling": None}]})
    r = inp.requests[0]
    assert (r.logit_bias, r.seed, r.guided_decoding, r.tools, r.tool_choice) == ({5: 1.0}, 3, None, None, None)
    assert r.own_fields == {"messages"} and r.context_cache_lookup_policy == "use_cache"
    for key in ("temperature", "num_logprobs", "messages"):
        with pytest.raises(InputError) as e:
            parse_input({"requests": [{"messages": [], key: None}]})
        assert e.value.json_path == f"requests[0].{key}"


def test_a_top_level_setting_in_a_request_is_reported_with_its_other_errors():
    """Every bad key and value of a request at once (docs/input_format.md), a misplaced top-level
    setting among them; `requests` inside a request is an unknown key, not a top-level setting."""
    with pytest.raises(InputError) as info:
        parse_input({"requests": [{"messages": [], "enable_thinking": True, "temperature": -1}]})
    assert info.value.json_path == "requests[0].enable_thinking"
    assert "must be set at the top level" in str(info.value) and "`requests[0].temperature`" in str(info.value)
    with pytest.raises(InputError, match="a known key of a request"):
        parse_input({"requests": [{"messages": [], "requests": []}]})
