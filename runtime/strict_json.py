"""Strict JSON field parsing with paths: every error names the JSON path of the bad value.

Used by input_format.py (the trtllm-run input file). Stdlib only. A parser is `(value, path) ->
parsed value` and raises InputError(path, message); `fields` checks an object's keys against a
table of parsers (unknown and duplicate keys refused, with a "did you mean") and parses each one.
"""
from __future__ import annotations

import difflib
import json
import math
import re
import sys
from typing import Callable, NoReturn

MAX_LISTED_KEYS = 8  # an unknown-key error lists the known keys only when there are this few
IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class InputError(ValueError):
    """A bad input file; `json_path` names the bad value ("" for the file or the whole document)."""

    def __init__(self, json_path: str, message: str):
        super().__init__(message)
        self.json_path = json_path


class LongNumber:
    """A JSON integer of more digits than Python converts (4300, sys.get_int_max_str_digits): kept
    as this, which no field parser accepts, so the error names the field that holds it."""

    def __init__(self, digits: str):
        self.digits = len(digits.lstrip("-"))


def parse_int(digits: str) -> int | LongNumber:
    """json.loads' parse_int."""
    return LongNumber(digits) if len(digits) > MAX_INT_DIGITS else int(digits)


MAX_INT_DIGITS = 4000
# Arrays and objects nest at most this deep in the input file and in a string of JSON inside it
# (Python's parser itself stops near 1000, where its stack ends: a limit of ours, stated, instead)
MAX_DEPTH = 512
TOO_DEEP = object()  # (what the parser gave up on)
MAX_KEY_SHOWN = 60  # characters of a key shown in a path


# --- errors and paths ---------------------------------------------------------------------------

def _no_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def read_json(text: str, path: str, what: str) -> object:
    """A string of JSON inside the file (a schema, a tool call's arguments), read as strictly as the
    file: repeated keys found later, NaN and Infinity refused; an error names `path`."""
    try:
        value = json.loads(text, object_pairs_hook=object_hook, parse_constant=_no_constant, parse_int=parse_int)
    except ValueError as e:
        fail(path, what, None, shown=f"invalid JSON: {e}")
    except RecursionError:
        value = TOO_DEEP
    if value is TOO_DEEP or nesting(value) > MAX_DEPTH:
        fail(path, f"{what} whose arrays and objects nest at most {MAX_DEPTH} deep", None,
             shown=f"{deepest(text)[0]} deep")
    return value


def decode(data: bytes, label: str) -> object:
    """A file's bytes as JSON, read strictly (duplicate keys remembered, NaN/Infinity and overlong
    integers kept for the field that holds them to refuse, so its error names its path); an
    InputError says where the bytes stop being UTF-8 or JSON."""
    try:
        text = data.decode("utf-8").removeprefix("\ufeff")  # a byte order mark (Windows' editors) is no JSON
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        column = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        fail("", "UTF-8 text", None, label=label, shown=f"an invalid byte at line {line} column {column} (byte {e.start})")
    try:
        value = json.loads(text, object_pairs_hook=object_hook, parse_constant=float, parse_int=parse_int)
    except json.JSONDecodeError as e:
        fail("", "valid JSON", None, label=label,
             # some of json's messages end in "at" already ("Invalid control character at")
             shown=f"{e.msg.removesuffix(' at')} at line {e.lineno} column {e.colno}")
    except RecursionError:
        value = TOO_DEEP
    if value is TOO_DEEP or nesting(value) > MAX_DEPTH:
        depth, line, column = deepest(text)
        fail("", f"JSON whose arrays and objects nest at most {MAX_DEPTH} deep", None, label=label,
             shown=f"{depth} deep (the deepest at line {line} column {column})")
    return value


def nesting(value: object) -> int:
    """How deep a parsed value's arrays and objects nest (without recursion: no stack to run out of)."""
    most, todo = 0, [(value, 1)]
    while todo:
        v, depth = todo.pop()
        items = v.values() if isinstance(v, dict) else v if isinstance(v, list) else None
        if items is not None:
            most = max(most, depth)
            todo.extend((x, depth + 1) for x in items)
    return most


def deepest(text: str) -> tuple[int, int, int]:
    """How deep a JSON text's arrays and objects nest, and the line and column where they first
    nest that deep (brackets inside strings aside)."""
    depth = most = where = 0
    for match in re.finditer(r'"(?:[^"\\]|\\.)*"|[\[{]|[\]}]', text):
        bracket = match[0]
        if bracket in "[{":
            depth += 1
            if depth > most:
                most, where = depth, match.start()
        elif bracket in "]}":
            depth -= 1
    line = text.count("\n", 0, where) + 1
    return most, line, where - (text.rfind("\n", 0, where) + 1) + 1


def show(value: object) -> str:
    """A short, JSON-flavoured rendering of a bad value for an error message."""
    if value is True or value is False or value is None:
        return json.dumps(value)
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return f"an array of {len(value)} item{'' if len(value) == 1 else 's'}"
    if isinstance(value, LongNumber):
        return f"an integer of {value.digits} digits"
    text = repr(value)
    if len(text) <= 60:
        return text
    return f"{text[:50]}... ({len(value)} chars)" if isinstance(value, str) else text[:60] + "..."


def fail(path: str, constraint: str, value: object, hint: str = "", *, shown: str = "",
         label: str = "") -> NoReturn:
    label = label or (f"`{path}`" if path else "the top level")
    message = f"{label} must be {constraint}, got {shown or show(value)}"
    raise InputError(path, message + (f"; {hint}" if hint else ""))


def key_path(parent: str, key: object) -> str:
    if isinstance(key, str) and len(key) <= MAX_KEY_SHOWN and IDENTIFIER.fullmatch(key):
        return f"{parent}.{key}" if parent else key
    return entry_path(parent, key)


class JsonObject(dict):
    """A decoded JSON object that remembers keys it saw more than once (json keeps the last)."""

    __slots__ = ("duplicates",)


def object_hook(pairs: list[tuple[str, object]]) -> JsonObject:
    obj = JsonObject(pairs)
    obj.duplicates = ()
    if len(obj) < len(pairs):
        seen: set[str] = set()
        obj.duplicates = tuple(dict.fromkeys(k for k, _ in pairs if k in seen or seen.add(k)))
    return obj


def entry_path(parent: str, key: object) -> str:
    shown = json.dumps(key)  # a map entry: logit_bias["123"]
    if len(shown) > MAX_KEY_SHOWN:  # a key of a megabyte would make a megabyte of message
        shown = f"{shown[:MAX_KEY_SHOWN - 10]}...\" ({len(key)} chars)"
    return f"{parent}[{shown}]"


def check_duplicates(obj: dict, path_of: Callable[[object], str]) -> None:
    for key in getattr(obj, "duplicates", ()):
        fail(path_of(key), "given once", key, shown="it more than once")


# Other engines' names for a setting of ours: the hint names ours, not the closest spelling (which,
# for max_new_tokens, is min_new_tokens: the opposite)
OTHER_NAMES = {"max_new_tokens": "max_generate_length", "max_tokens": "max_generate_length",
               "max_length": "max_generate_length", "min_tokens": "min_new_tokens", "logprobs": "num_logprobs",
               "top_logprobs": "num_logprobs", "num_return_sequences": "n", "stop_sequences": "stop",
               "response_format": "guided_decoding", "random_seed": "seed", "repeat_penalty": "repetition_penalty",
               "max_completion_tokens": "max_generate_length", "structured_outputs": "guided_decoding",
               "guided_json": "guided_decoding", "guided_regex": "guided_decoding",
               "guided_choice": "guided_decoding", "guided_grammar": "guided_decoding",
               "n_predict": "max_generate_length", "n_probs": "num_logprobs", "grammar": "guided_decoding",
               "json_schema": "guided_decoding"}
# Where this format's field means something else than the other engine's of that name
OTHER_NOTES = {"repeat_penalty": "it covers the whole prompt and answer, not llama.cpp's last repeat_last_n tokens"}
# Other engines' settings this format has no counterpart for: said so, instead of a near name that
# means something else (spaces_between_special_tokens is not skip_special_tokens).
UNSUPPORTED = {"spaces_between_special_tokens": "the text is decoded as the tokenizer decodes it",
               "echo": "continue_final_message continues a turn you began; the prompt itself is never "
                       "part of output_text",
               "repeat_last_n": "repetition_penalty covers the whole prompt and answer",
               "penalty_last_n": "repetition_penalty covers the whole prompt and answer",
               "cache_prompt": "prompts are reused with trtllm-run --context-reuse and saved system prompts",
               "min_keep": "min_p and top_k keep at least the most likely token",
               "timings_per_token": "trtllm-run --profile writes the run's timings",
               "post_sampling_probs": "num_logprobs gives log_softmax of the biased logits",
               "parse_tool_calls": "tool calls are read with tool_call_parser"}


def did_you_mean(word: object, options) -> str:
    other = OTHER_NAMES.get(word) if isinstance(word, str) else None
    if other in options:
        note = OTHER_NOTES.get(word)
        return f"did you mean {other!r} (this format's name for it{'; ' + note if note else ''})?"
    if isinstance(word, str) and word in UNSUPPORTED:
        return f"this format has no such setting: {UNSUPPORTED[word]}"
    close = difflib.get_close_matches(word, list(options), n=1) if isinstance(word, str) else []
    return f"did you mean {close[0]!r}?" if close else ""


def one_of(options) -> str:
    return ", ".join(repr(o) for o in options)


def check_keys(obj: dict, path: str, known: tuple[str, ...], what: str) -> None:
    check_duplicates(obj, lambda key: key_path(path, key))
    listed = (f"one of {one_of(known)}" if len(known) <= MAX_LISTED_KEYS
              else "see docs/input_format.md")
    for key in obj:
        if key not in known:
            fail(key_path(path, key), f"a known key of {what} ({listed})", key,
                  did_you_mean(key, known), shown=f"unknown key {show(key)}")


# --- field parsers: (value, path) -> parsed value -----------------------------------------------

def fmt(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def number(kind: type, lo: float, hi: float | None = None, lo_open: bool = False,
           outside: dict | None = None) -> Callable:
    """A parser for an int or float field; ints are accepted for floats, never the reverse.
    `outside`: out-of-range values another engine gives a meaning -> the hint refusing them."""
    noun = "an integer" if kind is int else "a finite number"
    if hi is None:
        desc = f"{noun} {'>' if lo_open else '>='} {fmt(lo)}"
    else:
        desc = f"{noun} in {'(' if lo_open else '['}{fmt(lo)}, {fmt(hi)}]"

    def parse(value: object, path: str):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            hint = "JSON true/false are not numbers" if isinstance(value, bool) else ""
            fail(path, desc, value, hint)
        if isinstance(value, float) and not math.isfinite(value):
            fail(path, desc, value, "NaN and Infinity are not allowed")
        in_range = not (value < lo or (lo_open and value == lo) or (hi is not None and value > hi))
        if kind is int and isinstance(value, float):
            # the integer it spells, when that is allowed (and exactly what was written: past 2**53 a
            # float is not, 1e23 is 99999999999999991611392)
            hint = f"write {int(value)}" if value.is_integer() and in_range and abs(value) <= 2**53 else ""
            fail(path, desc, value, hint or (outside or {}).get(value, ""))
        if not in_range:
            fail(path, desc, value, (outside or {}).get(value, ""))
        if kind is float and isinstance(value, int) and abs(value) > sys.float_info.max:
            fail(path, desc, value, "it is beyond the largest float")  # (float() would raise OverflowError)
        return kind(value)

    return parse


def boolean(value: object, path: str) -> bool:
    if not isinstance(value, bool):
        fail(path, "true or false", value)
    return value


def string(value: object, path: str, nonempty: bool = False) -> str:
    desc = "a non-empty string" if nonempty else "a string"
    if not isinstance(value, str):
        fail(path, desc, value, "omit the key instead" if value is None else "")
    if nonempty and not value:
        fail(path, desc, value)
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        fail(path, "valid Unicode text", value, shown="a string with a lone surrogate escape")
    return value


def choice(options: tuple[str, ...]) -> Callable:
    def parse(value: object, path: str) -> str:
        if not isinstance(value, str) or value not in options:
            fail(path, f"one of {one_of(options)}", value, did_you_mean(value, options))
        return value
    return parse


def array(value: object, path: str, what: str, max_items: int) -> list:
    if not isinstance(value, list) or len(value) > max_items:
        fail(path, f"an array of at most {max_items} {what}", value)
    return value


def json_object(value: object, path: str, what: str) -> dict:
    if not isinstance(value, dict):
        fail(path, f"a JSON object ({what})", value)
    return value


MAX_ERRORS_SHOWN = 8


def fields(value: object, path: str, table: dict[str, Callable], what: str,
           required: tuple[str, ...] = ()) -> dict:
    """Check an object's keys against `table` and parse each present field, in document order.
    Every bad key and value of the object is reported (not only the first, to fix all in one go),
    in one InputError that names the first one's path."""
    obj = json_object(value, path, what)
    check_duplicates(obj, lambda key: key_path(path, key))
    out, errors = {}, []
    for key, v in obj.items():
        try:
            if key in table:
                out[key] = table[key](v, key_path(path, key))
            else:
                check_keys({key: v}, path, tuple(table), what)  # (raises: an unknown key, with a hint)
        except InputError as e:
            errors.append(e)
    for name in required:
        if name not in obj:
            errors.append(InputError(key_path(path, name), f"`{key_path(path, name)}` must be given ({what} needs "
                                                           "it), got nothing"))
    raise_all(errors)
    return out


def raise_all(errors: list[InputError]) -> None:
    """One InputError for all of them (none: nothing), named by the first one's path."""
    if len(errors) == 1:
        raise errors[0]
    if errors:
        shown = [str(e) for e in errors[:MAX_ERRORS_SHOWN]]
        more = len(errors) - len(shown)
        raise InputError(errors[0].json_path, "; ".join(shown) + (f"; and {more} more" if more else ""))


def each(items: list, path: str, parse: Callable) -> list:
    """parse(item, item_path) for every item of an array, every bad one reported (raise_all)."""
    out, errors = [], []
    for i, item in enumerate(items):
        try:
            out.append(parse(item, f"{path}[{i}]"))
        except InputError as e:
            errors.append(e)
    raise_all(errors)
    return out


def without_nulls(value: object, keys) -> object:
    """An object without those of `keys` whose value is null (a null that means "not given")."""
    if not isinstance(value, dict) or not any(value.get(k, 0) is None for k in keys):
        return value
    out = JsonObject((k, v) for k, v in value.items() if not (v is None and k in keys))
    out.duplicates = getattr(value, "duplicates", ())
    return out


def compact(value: object, path: str, what: str) -> str:
    """A value as compact JSON, not ASCII-escaped (its size is about the UTF-8 the user wrote); one
    nested deeper than json.dumps recurses (a few frames past json.loads) fails at `path`."""
    try:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    except RecursionError:
        fail(path, what, None, shown="arrays or objects nested deeper than the parser goes")


def check_value(value: object, path: str) -> None:
    """A free-form JSON value (a schema, a tool) held, anywhere inside, to what every other field of
    the file is, by path: no repeated keys, finite numbers, integers Python converts, valid Unicode
    (no lone surrogate escapes). Iteratively: a value may nest as deep as the reader goes."""
    stack = [(value, path)]
    while stack:
        item, at = stack.pop()
        if isinstance(item, dict):
            check_duplicates(item, lambda key, at=at: key_path(at, key))
            for k, v in item.items():
                string(k, key_path(at, k))
                stack.append((v, key_path(at, k)))
        elif isinstance(item, list):
            stack += [(v, f"{at}[{i}]") for i, v in enumerate(item)]
        elif isinstance(item, str):
            string(item, at)
        elif isinstance(item, LongNumber):
            fail(at, f"a number of at most {MAX_INT_DIGITS} digits", item, shown=f"an integer of {item.digits} digits")
        elif isinstance(item, float) and not math.isfinite(item):
            fail(at, "a finite number", item)
