"""The strict input JSON reader's errors (runtime/input_format.py): each bad field named by its JSON
path, in the house form, with hints. Fast, no model."""

import copy
import math

import pytest

from tests.runtime.input_samples import FULL
from trtllm.runtime.input_format import InputError, parse_input


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
    (_set(*R0, "messages", 0, "nmae", "x"), "requests[0].messages[0].nmae"),
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
    (_set("top_p", 1e-46), "top_p"),  # 0 in float32, where the sampler computes
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
    # sampling settings, top level (the default for every request)
    (_set("seed", -1), "seed"),
    (_set("seed", 2**64), "seed"),
    (_set("seed", 1.5), "seed"),
    (_set("seed", None), None),  # unset, as Edge-LLM reads a null sampling_seed
    (_set("seed", 2**64 - 1), None),  # valid: the largest seed (Edge-LLM's is a u64)
    (_set("sampling_seed", 2**64), "sampling_seed"),  # Edge-LLM's later name, checked as seed
    (_rename("seed", "sampling_seed"), None),
    (_rename(*R1, "seed", "sampling_seed"), None),
    (_set("sampling_seed", 7), "sampling_seed"),  # beside `seed`
    (_set(*R1, "sampling_seed", -1), "requests[1].sampling_seed"),
    (_set("min_p", -0.1), "min_p"),
    (_set("min_p", 1.01), "min_p"),
    (_set("repetition_penalty", 0), "repetition_penalty"),
    (_set("repetition_penalty", 1e-39), "repetition_penalty"),  # would overflow a divided logit
    (_set("repetition_penalty", 0.01), None),  # valid: the lower bound is included
    (_set("repetition_penalty", 10.01), "repetition_penalty"),
    (_set("repetition_penalty", math.inf), "repetition_penalty"),
    (_set("repetition_penalty", 10), None),  # valid: the upper bound is included
    (_set("presence_penalty", 2.01), "presence_penalty"),
    (_set("presence_penalty", "0"), "presence_penalty"),
    (_set("frequency_penalty", -2.5), "frequency_penalty"),
    (_set("frequency_penalty", math.nan), "frequency_penalty"),
    (_set("stop_token_ids", 2), "stop_token_ids"),
    (_set("stop_token_ids", [2, -1]), "stop_token_ids[1]"),
    (_set("stop_token_ids", [2.0]), "stop_token_ids[0]"),
    (_set("stop_token_ids", list(range(65))), "stop_token_ids"),
    (_set("stop_token_ids", list(range(64))), None),  # valid: 64 ids
    (_set("ignore_eos", 0), "ignore_eos"),
    (_set("min_new_tokens", -1), "min_new_tokens"),
    (_set("min_new_tokens", 65), "min_new_tokens"),  # > max_generate_length 64
    (_set("n", 0), "n"),
    (_set("n", 17), "n"),
    (_set("n", True), "n"),
    # sampling settings, per request (replacing the top-level value)
    (_set(*R0, "temperature", -1), "requests[0].temperature"),
    (_set(*R0, "temperature", 100.5), "requests[0].temperature"),
    (_set(*R0, "temperature", math.inf), "requests[0].temperature"),
    (_set(*R0, "top_k", 1.5), "requests[0].top_k"),
    (_set(*R0, "top_k", -1), "requests[0].top_k"),
    (_set(*R0, "top_p", 0), "requests[0].top_p"),
    (_set(*R0, "top_p", 1.5), "requests[0].top_p"),
    (_set(*R0, "max_generate_length", -1), "requests[0].max_generate_length"),
    (_set(*R0, "max_generate_length", "64"), "requests[0].max_generate_length"),
    (_set(*R0, "max_generate_length", 3), "min_new_tokens"),  # the inherited 4 is now too big
    (_set(*R0, "seed", True), "requests[0].seed"),
    (_set(*R0, "seed", -5), "requests[0].seed"),
    (_set(*R0, "min_p", math.nan), "requests[0].min_p"),
    (_set(*R0, "min_p", 2), "requests[0].min_p"),
    (_set(*R0, "repetition_penalty", -1), "requests[0].repetition_penalty"),
    (_set(*R0, "repetition_penalty", 11), "requests[0].repetition_penalty"),
    (_set(*R0, "presence_penalty", -2.01), "requests[0].presence_penalty"),
    (_set(*R0, "frequency_penalty", 3), "requests[0].frequency_penalty"),
    (_set(*R0, "frequency_penalty", False), "requests[0].frequency_penalty"),
    (_set(*R0, "stop_token_ids", [True]), "requests[0].stop_token_ids[0]"),
    (_set(*R0, "stop_token_ids", {"1": 2}), "requests[0].stop_token_ids"),
    (_set(*R0, "stop_token_ids", [1, None]), "requests[0].stop_token_ids[1]"),
    (_set(*R0, "ignore_eos", "yes"), "requests[0].ignore_eos"),
    (_set(*R0, "min_new_tokens", 1.5), "requests[0].min_new_tokens"),
    (_set(*R0, "min_new_tokens", 65), "requests[0].min_new_tokens"),
    (_set(*R1, "min_new_tokens", 9), "requests[1].min_new_tokens"),  # its own limit is 8
    (_set(*R1, "max_generate_length", 7), "requests[1].min_new_tokens"),
    (_set(*R0, "n", 0), "requests[0].n"),
    (_set(*R0, "n", 16.0), "requests[0].n"),
    (_set(*R0, "n", 17), "requests[0].n"),
    (_set(*R0, "n", None), "requests[0].n"),
    # stop strings: at most 16, each 1 to 256 characters
    (_set(*R1, "stop", ["a"] * 17), "requests[1].stop"),
    (_set(*R1, "stop", ["a", "b" * 257]), "requests[1].stop[1]"),
    (_set(*R2, "stop", "b" * 257), "requests[2].stop"),
    (_set(*R1, "stop", ["a"] * 16), None),  # valid: 16 strings
    # requests
    (_set("requests", []), "requests"),
    (_set("requests", {}), "requests"),
    (_delete("requests"), "requests"),
    (_set("requests", 2, "hi"), "requests[2]"),
    (_delete(*R2, "messages"), "requests[2].messages"),
    (_set(*R2, "messages", "hi"), "requests[2].messages"),
    (_set(*R2, "messages", [{"role": "user", "content": "a"}] * 65), "requests[2].messages"),
    (_set(*R1, "lora_name", "maths"), "requests[1].lora_name"),
    (_set(*R1, "lora_name", 5), "requests[1].lora_name"),
    (_set(*R2, "lora_name", "math"), None),  # valid: a sanity row
    (_set(*R1, "save_system_prompt_kv_cache", 0), "requests[1].save_system_prompt_kv_cache"),
    (_set(*R1, "disable_spec_decode", "no"), "requests[1].disable_spec_decode"),
    (_set(*R2, "stop", ""), "requests[2].stop"),
    (_set(*R1, "stop", ["a", ""]), "requests[1].stop[1]"),
    (_set(*R1, "stop", 5), "requests[1].stop"),
    (_set(*R1, "stop", None), None),  # valid: none, as upstream reads it
    (_set(*R1, "reference", "Paris"), None),  # valid: upstream fixtures' expected answer, ignored
    (_set(*R1, "reference", 5), "requests[1].reference"),
    (_set("reference", "Paris"), "reference"),  # a request's key, misplaced
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
    # another engine's name for a setting: ours, not the closest spelling (min_new_tokens: the opposite)
    assert "did you mean 'max_generate_length' (this format's name for it)?" in error(_set(*R0, "max_new_tokens", 8))
    assert "did you mean 'max_generate_length'" in error(_set("max_tokens", 8))
    assert "did you mean 'max_generate_length'" in error(_set(*R0, "max_completion_tokens", 8))  # (OpenAI's now)
    assert "did you mean 'guided_decoding'" in error(_set(*R0, "structured_outputs", {}))  # (vLLM's now)
    # no counterpart here: said so, not a near name that means another thing
    says = error(_set(*R0, "spaces_between_special_tokens", False))
    assert "no such setting" in says and "skip_special_tokens" not in says
    assert "write 0 for no top-k (vLLM's -1)" in error(_set("top_k", -1))
    # llama.cpp's: its names, and where the same name means something else here
    assert "did you mean 'max_generate_length'" in error(_set(*R0, "n_predict", 8))
    assert "not llama.cpp's last repeat_last_n tokens" in error(_set(*R0, "repeat_penalty", 1.1))
    for key in ("repeat_last_n", "min_keep", "cache_prompt"):
        says = error(_set(*R0, key, 1))
        assert "no such setting" in says and "did you mean" not in says, says
    assert "leave it out (or null) for a fresh seed (llama.cpp's -1)" in error(_set("seed", -1))
    # a float past 2**53 is not the integer written: no hint (1e23 is 99999999999999991611392)
    assert "write" not in error(_set("max_generate_length", 1e23)) and "write" not in error(_set("top_k", 1e300))
    assert error(_set("requests", 0, "messages", 0, "role", "bot")) == (
        "`requests[0].messages[0].role` must be one of 'system', 'user', 'assistant', 'tool', got 'bot'")
