"""Tests for the strict input JSON reader (runtime/input_format.py). Fast, no model."""

import copy
import dataclasses

import pytest

from tests.runtime.input_samples import FULL, MINIMAL
from trtllm.runtime.input_format import (
    ContentItem,
    InputError,
    InputFile,
    Message,
    Request,
    parse_input,
)
from trtllm.runtime import input_format as fmt
from trtllm.runtime import input_checks


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


SAMPLING = ("temperature", "top_k", "top_p", "max_generate_length", "seed", "min_p",
            "repetition_penalty", "presence_penalty", "frequency_penalty", "stop_token_ids",
            "ignore_eos", "min_new_tokens", "n", "num_logprobs", "logit_bias")


def _sampling(obj):
    return {name: getattr(obj, name) for name in SAMPLING}


def test_request_sampling_defaults_are_the_input_file_defaults():
    (req,) = parse_input(copy.deepcopy(MINIMAL)).requests
    assert _sampling(req) == _sampling(InputFile(requests=())) == {
        "temperature": 1.0, "top_k": 50, "top_p": 0.8, "max_generate_length": 256, "seed": None,
        "min_p": 0.0, "repetition_penalty": 1.0, "presence_penalty": 0.0,
        "frequency_penalty": 0.0, "stop_token_ids": (), "ignore_eos": False,
        "min_new_tokens": 0, "n": 1, "num_logprobs": 0, "logit_bias": {}}
    # a Request built by hand with only the original fields gets the same defaults
    old = Request((Message("user", "Hi"),), None, False, False, (), {}, 0)
    assert _sampling(old) == _sampling(req) and old == req


def test_sampling_settings_are_inherited_or_overridden_per_request():
    inp = parse_input(copy.deepcopy(FULL))
    assert (inp.seed, inp.min_p, inp.repetition_penalty) == (7, 0.05, 1.1)
    assert (inp.presence_penalty, inp.frequency_penalty) == (0.5, -0.5)
    assert (inp.stop_token_ids, inp.ignore_eos, inp.min_new_tokens, inp.n) == ((2, 3), False, 4, 2)
    first, second, third = inp.requests
    # requests 0 and 2 set no sampling field: each holds the top-level value itself
    for req in (first, third):
        assert _sampling(req) == _sampling(inp)
        assert req.logit_bias is inp.logit_bias and req.stop_token_ids is inp.stop_token_ids
    assert _sampling(second) == {
        "temperature": 0.0, "top_k": 0, "top_p": 1.0, "max_generate_length": 8, "seed": 0,
        "min_p": 0.0, "repetition_penalty": 1.0, "presence_penalty": 2.0,
        "frequency_penalty": -2.0, "stop_token_ids": (), "ignore_eos": True,
        "min_new_tokens": 8, "n": 16, "num_logprobs": 0, "logit_bias": {9: 1.0}}
    for name in ("temperature", "top_p", "min_p", "repetition_penalty", "presence_penalty",
                 "frequency_penalty"):
        assert type(getattr(second, name)) is float, name
    # an empty array overrides a non-empty top-level one, it does not fall back to it
    assert second.stop_token_ids == () and first.stop_token_ids == (2, 3)


def test_own_fields_record_what_the_request_set_itself():
    inp = parse_input(copy.deepcopy(FULL))
    first, second, third = inp.requests
    assert first.own_fields == {"messages"} and third.own_fields == {"messages", "stop"}
    assert {"temperature", "n", "stop_token_ids", "logit_bias", "lora_name"} <= second.own_fields
    # own_fields is bookkeeping, not part of a request's value
    assert dataclasses.replace(second, own_fields=frozenset()) == second


def test_a_request_may_set_only_some_sampling_fields():
    doc = {"temperature": 0.5, "top_k": 20, "seed": 3, "requests": [
        {"messages": [], "top_k": 5},
        {"messages": [], "seed": 4, "temperature": 0},
    ]}
    first, second = parse_input(doc).requests
    assert (first.temperature, first.top_k, first.seed) == (0.5, 5, 3)
    assert (second.temperature, second.top_k, second.seed) == (0.0, 20, 4)


def test_an_upstream_file_reads_as_upstream_reads_it():
    """Edge-LLM's reader: a fixture's `reference` is ignored, null or "" `lora_name` is the base
    model, null `stop` is none, and the later `sampling_seed` (a u64) is `seed`, top level or per
    request. Giving both names in one object is refused: they could disagree."""
    doc = {"sampling_seed": 2**64 - 1, "requests": [
        {"messages": [], "reference": "Paris", "lora_name": None, "stop": None},
        {"messages": [], "lora_name": "", "sampling_seed": 3},
        {"messages": [], "seed": 4},
    ]}
    first, second, third = parse_input(doc).requests
    assert (first.seed, first.lora_name, first.stop) == (2**64 - 1, None, ())
    assert (second.seed, second.lora_name) == (3, None) and third.seed == 4
    assert first == dataclasses.replace(first, stop=()) and "reference" in first.own_fields
    for where in ({"seed": 1, "sampling_seed": 2, "requests": [{"messages": []}]},
                  {"requests": [{"messages": [], "seed": 1, "sampling_seed": 2}]}):
        with pytest.raises(InputError, match="must be absent when `(requests\\[0\\]\\.)?seed` is given"):
            parse_input(where)


def test_min_new_tokens_is_checked_against_each_requests_max_generate_length():
    ok = {"min_new_tokens": 4, "max_generate_length": 4, "requests": [{"messages": []}]}
    assert parse_input(ok).requests[0].min_new_tokens == 4

    def error(doc):
        with pytest.raises(InputError) as info:
            parse_input(doc)
        return info.value.json_path, str(info.value)

    # both inherited: the top-level pair is wrong
    both = {"min_new_tokens": 5, "max_generate_length": 4, "requests": [{"messages": []}]}
    assert error(both) == (
        "min_new_tokens", "`min_new_tokens` must be <= `max_generate_length` (4), got 5")
    # inherited min_new_tokens, the request's own max_generate_length
    assert error({"min_new_tokens": 5, "requests": [
        {"messages": []}, {"messages": [], "max_generate_length": 3}]}) == (
        "min_new_tokens",
        "`min_new_tokens` must be <= `requests[1].max_generate_length` (3), got 5")
    # the request's own min_new_tokens, the inherited (default 256) max_generate_length
    assert error({"requests": [{"messages": [], "min_new_tokens": 257}]}) == (
        "requests[0].min_new_tokens",
        "`requests[0].min_new_tokens` must be <= `max_generate_length` (256), got 257")
    # a top-level pair that no request uses is not an error
    unused = {"min_new_tokens": 5, "max_generate_length": 4,
              "requests": [{"messages": [], "max_generate_length": 5}]}
    assert parse_input(unused).requests[0].min_new_tokens == 5


def test_stop_string_limits():
    base = {"requests": [{"messages": [], "stop": ["x" * 256] * 16}]}
    assert parse_input(base).requests[0].stop == ("x" * 256,) * 16
    base["requests"][0]["stop"] = "é" * 256  # characters, not bytes
    assert parse_input(base).requests[0].stop == ("é" * 256,)


def test_unknown_keys_in_large_objects_point_to_the_doc():
    doc = copy.deepcopy(FULL)
    doc["requests"][0]["temprature"] = 0
    with pytest.raises(InputError) as info:
        parse_input(doc)
    assert str(info.value) == (
        "`requests[0].temprature` must be a known key of a request (see docs/input_format.md), "
        "got unknown key 'temprature'; did you mean 'temperature'?")


def test_dataclasses_are_frozen():
    inp = parse_input(copy.deepcopy(MINIMAL))
    with pytest.raises(dataclasses.FrozenInstanceError):
        inp.batch_size = 3


def test_top_level_must_be_an_object():
    with pytest.raises(InputError) as info:
        parse_input([MINIMAL])
    assert info.value.json_path == "" and "JSON object" in str(info.value)


def test_continue_final_message():
    doc = {"requests": [{"messages": [{"role": "assistant", "content": "Once"}], "continue_final_message": True},
                        {"messages": [{"role": "user", "content": "a"}]}]}
    inp = fmt.parse_input(doc)
    assert [r.continue_final_message for r in inp.requests] == [True, False]
    with pytest.raises(fmt.InputError, match=r"`requests\[0\]\.continue_final_message` must be false when `messages` is empty"):
        fmt.parse_input({"requests": [{"messages": [], "continue_final_message": True}]})
    with pytest.raises(fmt.InputError, match=r"requests\[0\]\.continue_final_message"):
        fmt.parse_input({"requests": [{"messages": [], "continue_final_message": "yes"}]})


def test_input_error_is_a_value_error():
    assert issubclass(InputError, ValueError)


def test_isolate_fails_a_bad_request_alone(tmp_path):
    """trtllm-run's reading (isolate=True): a bad value inside a request becomes that request's
    error, its place a placeholder that never runs; the strict reading raises it, and the file's top
    level raises either way."""
    doc = {"requests": [{"messages": [{"role": "user", "content": "a"}]},
                        {"messages": [{"role": "user", "content": "b"}], "top_k": -1},
                        {"messages": [{"role": "user"}]}],
           "temperature": 0.5}  # (sampled: top_k is checked against the engine's limit)
    inp = fmt.parse_input(doc, isolate=True)
    assert sorted(inp.invalid) == [1, 2] and inp.requests[1].messages == (fmt.Message("user", "b"),)
    assert inp.requests[2].messages == ()  # its conversation does not read: none echoed
    assert inp.invalid[1].startswith("`requests[1].top_k` must be an integer >= 0")
    assert inp.invalid[2].startswith("`requests[2].messages[0].content` must be")
    assert inp.requests[0].temperature == 0.5
    assert [i for i, _ in input_checks.check_limits(inp, 1, 100)] == [0]  # placeholders are not checked again
    assert inp.requests[1].n == inp.requests[2].n == 1
    two = fmt.parse_input({**doc, "n": 2, "requests": [{**doc["requests"][1], "n": 3}, doc["requests"][2],
                                                        {"messages": [], "n": 99, "top_k": -1}]}, isolate=True)
    assert [r.n for r in two.requests] == [3, 2, 1]  # an error response per sample, where its n reads
    with pytest.raises(fmt.InputError, match=r"requests\[1\]\.top_k"):
        fmt.parse_input(doc)
    # one error response where `n` is what is wrong: given twice, it read as its last value
    (tmp_path / "dup.json").write_text('{"requests": [{"messages": [], "n": 1, "n": 3}, {"messages": [], "n": 0}]}')
    dup = fmt.read_input(tmp_path / "dup.json", isolate=True)
    assert [r.n for r in dup.requests] == [1, 1] and "`requests[0].n` must be given once" in dup.invalid[0]
    # a number no float holds (10**400: float() raises OverflowError) in a field without an upper
    # bound fails its request alone, at its path; it took the whole run down (its echo too)
    video = {"messages": [{"role": "user", "content": [{"type": "video", "frames": ["f.jpg"], "fps": 10**400}]}]}
    big = fmt.parse_input({"requests": [doc["requests"][0], video]}, isolate=True)
    assert list(big.invalid) == [1] and "`requests[1].messages[0].content[0].fps` must be" in big.invalid[1]
    assert "beyond the largest float" in big.invalid[1] and big.requests[1].messages == ()
    with pytest.raises(fmt.InputError, match="temperature"):
        fmt.parse_input({**doc, "temperature": -1}, isolate=True)


def test_every_bad_value_of_an_object_is_reported_at_once():
    """A request with three mistakes says all three (fix them in one go), naming the first's path;
    past 8 the rest are counted. The wrong variant, stopping at the first, names one."""
    doc = {"requests": [{"messages": [], "temperature": -1, "top_kk": 5, "n": 0}]}
    inp = parse_input(doc, isolate=True)
    error = inp.invalid[0]
    assert error.count("`requests[0].") == 3 and "`requests[0].temperature`" in error
    assert "`requests[0].top_kk` must be a known key" in error and "`requests[0].n` must be" in error
    with pytest.raises(InputError) as e:
        parse_input({"temperature": -1, "top_k": -1, "requests": [{"messages": []}]})
    assert e.value.json_path == "temperature" and "`top_k`" in str(e.value)
    many = {"requests": [{"messages": [], **{f"x{i}": 1 for i in range(10)}}]}
    assert parse_input(many, isolate=True).invalid[0].endswith("; and 2 more")
