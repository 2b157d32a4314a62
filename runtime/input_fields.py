"""The input file's value fields: the sampling settings (given at the top level as every request's
default, or in a request), `stop`, and the LoRA weight paths, each read and bounded with its JSON path
in any error (runtime/input_format.py reads the file and its requests)."""
from __future__ import annotations

import re
import struct

from trtllm.runtime import bans, beam_rules, guided
from trtllm.runtime.strict_json import (
    LongNumber,
    array as _array,
    boolean as _bool,
    check_duplicates as _check_duplicates,
    choice as _choice,
    entry_path as _entry_path,
    fail as _fail,
    json_object as _object,
    number as _number,
    string as _string,
)

MAX_LOGIT_BIAS_ENTRIES = 1024
MAX_ABS_LOGIT_BIAS = 100
MAX_NUM_LOGPROBS = 50
MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 256  # one stop string, in characters (code points)
MAX_STOP_TOKEN_IDS = 64
MAX_TEMPERATURE = 100
MAX_REPETITION_PENALTY = 10
# Below this a positive logit divided by it could overflow float32 (the draw would then be garbage).
MIN_REPETITION_PENALTY = 0.01
MAX_ABS_PENALTY = 2  # presence_penalty and frequency_penalty (the OpenAI range)
MAX_SEED = 2**64 - 1  # Edge-LLM's sampling_seed is a u64
MAX_N = 16

_TOKEN_ID_KEY = re.compile(r"0|[1-9][0-9]*")
MAX_TOKEN_ID_DIGITS = 18



def _logit_bias(value: object, path: str) -> dict[int, float]:
    obj = _object(value, path, "token id string -> bias")
    if len(obj) > MAX_LOGIT_BIAS_ENTRIES:
        _fail(path, f"an object of at most {MAX_LOGIT_BIAS_ENTRIES} entries", value,
              shown=f"{len(obj)} entries")
    _check_duplicates(obj, lambda key: _entry_path(path, key))
    bias = {}
    for key, v in obj.items():
        key_path = _entry_path(path, key)
        if not isinstance(key, str) or not _TOKEN_ID_KEY.fullmatch(key):
            _fail(key_path, "keyed by a token id in decimal without sign or leading zeros",
                  key, 'e.g. "123"')
        if len(key) > MAX_TOKEN_ID_DIGITS:  # no vocabulary is that large (and int() refuses 4300+)
            _fail(key_path, "keyed by a token id", key, shown=f"a token id of {len(key)} digits")
        bias[int(key)] = _bias_value(v, key_path)
    return bias


def _top_p(value: object, path: str) -> float:
    top_p = _number(float, 0, 1, lo_open=True)(value, path)
    if struct.unpack("f", struct.pack("f", top_p))[0] == 0:  # the sampler computes in float32
        _fail(path, "a finite number in (0, 1]", value, "it is 0 in float32; any value that is not keeps the top token")
    return top_p


_bias_value = _number(float, -MAX_ABS_LOGIT_BIAS, MAX_ABS_LOGIT_BIAS)
_num_logprobs = _number(int, 0, MAX_NUM_LOGPROBS)


def lora_weights(value: object, path: str) -> dict[str, str]:
    obj = _object(value, path, "adapter name -> path")
    _check_duplicates(obj, lambda key: _entry_path(path, key))
    out = {}
    for name, weights_path in obj.items():
        entry = _entry_path(path, name)
        if not isinstance(name, str) or not name:
            _fail(entry, "keyed by a non-empty adapter name", name)
        _string(name, entry)  # valid Unicode, as every other string of the file
        out[name] = _string(weights_path, entry, nonempty=True)
    return out


def _stop_string(value: object, path: str) -> str:
    text = _string(value, path, nonempty=True)
    if len(text) > MAX_STOP_CHARS:
        _fail(path, f"at most {MAX_STOP_CHARS} characters", value, shown=f"{len(text)} characters")
    return text


def stop(value: object, path: str) -> tuple[str, ...]:
    if value is None:  # as upstream reads it: none
        return ()
    if isinstance(value, str):
        return (_stop_string(value, path),)
    if not isinstance(value, list) or len(value) > MAX_STOP_STRINGS:
        _fail(path, f"a non-empty string or an array of at most {MAX_STOP_STRINGS} non-empty "
              "strings", value)
    return tuple(_stop_string(s, f"{path}[{i}]") for i, s in enumerate(value))


_nonnegative_int = _number(int, 0)


def _token_id(value: object, path: str) -> int:
    if isinstance(value, LongNumber):  # ("must be an integer >= 0" would not say what is wrong with it)
        _fail(path, "a token id below the engine's vocabulary size", value)
    return _nonnegative_int(value, path)


def _stop_token_ids(value: object, path: str) -> tuple[int, ...]:
    items = _array(value, path, "token ids", MAX_STOP_TOKEN_IDS)
    return tuple(_token_id(v, f"{path}[{i}]") for i, v in enumerate(items))


MAX_PROMPT_TOKEN_IDS = 1 << 18  # (the engine's max_input_len is the real limit, checked when it runs)


def prompt_token_ids(value: object, path: str) -> tuple[int, ...]:
    """vLLM's tokens prompt: the prompt as token ids, non-empty (each below the vocabulary size: checked
    against the engine, input_checks)."""
    items = _array(value, path, "token ids", MAX_PROMPT_TOKEN_IDS)
    if not items:
        _fail(path, "a non-empty array of token ids (the prompt)", value)
    return tuple(_token_id(v, f"{path}[{i}]") for i, v in enumerate(items))


_penalty = _number(float, -MAX_ABS_PENALTY, MAX_ABS_PENALTY)


# Given at the top level (the default for every request) or in a request (replacing it).
SAMPLING_FIELDS = {
    "temperature": _number(float, 0, MAX_TEMPERATURE),
    "top_k": _number(int, 0, outside={-1: "write 0 for no top-k (vLLM's -1)"}),
    "top_p": lambda v, p: _top_p(v, p),
    "max_generate_length": _number(int, 0),
    "seed": _number(int, 0, MAX_SEED, outside={-1: "leave it out (or null) for a fresh seed (llama.cpp's -1)"}),
    "min_p": _number(float, 0, 1),
    "repetition_penalty": _number(float, MIN_REPETITION_PENALTY, MAX_REPETITION_PENALTY),
    "presence_penalty": _penalty,
    "frequency_penalty": _penalty,
    "stop_token_ids": _stop_token_ids,
    "ignore_eos": _bool,
    "min_new_tokens": _number(int, 0),
    "n": _number(int, 1, MAX_N),
    "num_logprobs": _num_logprobs,
    "prompt_logprobs": lambda v, p: None if v is None else _num_logprobs(v, p),  # null: off (vLLM's)
    "logit_bias": _logit_bias,
    "guided_decoding": guided.parse,
    "include_stop_str_in_output": _bool,
    "skip_special_tokens": _bool,
    "spec_proposal_sampling": _choice(("auto", "greedy", "probabilistic")),
    "num_beams": _number(int, 1, MAX_N),
    "length_penalty": _number(float, -beam_rules.MAX_LENGTH_PENALTY, beam_rules.MAX_LENGTH_PENALTY),
    "early_stopping": beam_rules.parse_early_stopping,
    "bad_words": bans.parse_bad_words,
    "allowed_token_ids": bans.parse_allowed,
    "truncate_prompt_tokens": lambda v, p: None if v is None else _truncation(v, p),
    "no_repeat_ngram_size": _number(int, 0),
}
SAMPLING_FIELDS_READ = {**SAMPLING_FIELDS, "sampling_seed": SAMPLING_FIELDS["seed"]}

def _truncation(value: object, path: str) -> int:
    """vLLM's truncate_prompt_tokens: k >= 1, or -1 for the engine's max_input_len."""
    if isinstance(value, int) and not isinstance(value, bool) and (value == -1 or value >= 1):
        return value
    _fail(path, "an integer >= 1 (keep the prompt's last k tokens) or -1 (its last max_input_len)", value)
