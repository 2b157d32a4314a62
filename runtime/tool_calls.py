"""Tool calls in the answer: `tool_choice` and `tool_call_parser`, as vLLM's chat API reads them.

- `tool_choice: "auto"` (with tools, the default) leaves the answer free; with a
  `tool_call_parser` the calls the model wrote in its own format are read out of `output_text`
  into the response's `tool_calls`, and the text around them into `content`.
- `"none"`: the tools still reach the chat template (vLLM's default), nothing is parsed.
- `"required"` and a named function (`{"type": "function", "function": {"name": ...}}`) hold the
  answer to a JSON schema (guided decoding), as vLLM does: a non-empty array of
  `{"name", "parameters"}` over the request's tools, or the named function's parameters. No parser
  is needed; the calls are read from that JSON.

An answer that does not read as calls (a malformed call, one cut short by max_generate_length)
keeps its text and gets no `tool_calls`: as in vLLM, the text is the answer then.
Stdlib only: this runs on the device.
"""
from __future__ import annotations

import ast
import hashlib
import json
import re
from collections import Counter
from dataclasses import dataclass

from trtllm.runtime import guided
from trtllm.runtime.strict_json import (check_keys, choice, compact, did_you_mean, fail, json_object, key_path, one_of,
                                        string)

MODES = ("auto", "none", "required")
PARSERS = ("hermes", "lfm2", "llama3_json", "mistral", "pythonic")
HERMES, MISTRAL = "<tool_call>", "[TOOL_CALLS]"  # the markers before each call (the text before the first: content)
PYTHON_TAG, PYTHON_START, PYTHON_END = "<|python_tag|>", "<|python_start|>", "<|python_end|>"
LFM_START, LFM_END = "<|tool_call_start|>", "<|tool_call_end|>"  # (LFM2's and LFM3's, around Python calls)


@dataclass(frozen=True, slots=True)
class ToolChoice:
    mode: str               # one of MODES, or "function": the one named
    name: str | None = None  # the function, with mode "function"

    @property
    def forced(self) -> bool:
        """"required" or a named function: the answer is JSON calls alone."""
        return self.mode in ("required", "function")


def forced(tc: ToolChoice | None) -> bool:
    """A request's tool choice forces calls (the answer is JSON calls alone)."""
    return tc is not None and tc.forced


def parse_choice(value: object, path: str) -> ToolChoice:
    if isinstance(value, str):
        return ToolChoice(choice(MODES)(value, path))
    shape = 'one of "auto", "none", "required" or {"type": "function", "function": {"name": ...}}'
    obj = json_object(value, path, shape)
    check_keys(obj, path, ("type", "function"), "a named tool choice")
    if obj.get("type") != "function":
        fail(f"{path}.type", '"function"', obj.get("type"), shown="" if "type" in obj else "nothing")
    if "function" not in obj:
        fail(f"{path}.function", 'given ({"name": ...})', None, shown="nothing")
    function = json_object(obj["function"], f"{path}.function", '{"name": ...}')
    check_keys(function, f"{path}.function", ("name",), "a named tool choice's function")
    return ToolChoice("function", string(function.get("name"), f"{path}.function.name", nonempty=True))


parse_parser = choice(PARSERS)


def guide_for(tc: ToolChoice | None, parser: str | None, tools: tuple[dict, ...] | None,
              guide: guided.Guide | None, where, parallel: bool = True) -> guided.Guide | None:
    """A request's forced_guide, checked against its other settings (`guide`: its guided_decoding;
    `where(name)`: the JSON path where the request got a setting, its own or the top level's)."""
    forced = tc and forced_guide(tc, tools, where("tool_choice"), where("tools"), parallel)
    if forced and guide is not None:
        fail(where("tool_choice"), f'"auto" or "none" with `{where("guided_decoding")}` (a forced call has a '
             "grammar of its own)", tc.name or tc.mode)
    if tools and tc and tc.mode == "auto" and parser is None:
        fail(where("tool_choice"), 'given with `tool_call_parser` when "auto" (to read the calls out of the '
             f"answer: {one_of(PARSERS)}); omit both to get the answer's text alone", "auto")
    return forced or None


def _functions(tools: tuple[dict, ...], path: str) -> list[tuple[str, dict]]:
    """(name, parameters schema) of each tool, which must be OpenAI's function shape."""
    out = []
    for i, tool in enumerate(tools):
        at = f"{path}[{i}]"
        for key in ("type", "function"):  # (in this order: a tool of another type is named by its type)
            if key not in tool:
                fail(f"{at}.{key}", "given (a forced tool choice reads each tool)", None, shown="nothing")
            if key == "type" and tool["type"] != "function":
                fail(f"{at}.type", '"function" (a forced tool choice reads each tool)', tool["type"])
        function = json_object(tool["function"], f"{at}.function", '{"name", "parameters"}')
        if "name" not in function:
            fail(f"{at}.function.name", "given (a forced tool choice names each tool)", None, shown="nothing")
        name = string(function["name"], f"{at}.function.name", nonempty=True)
        # a function without parameters takes none (vLLM lets it take any)
        params = function.get("parameters", {"type": "object", "properties": {}, "additionalProperties": False})
        if not isinstance(params, (dict, bool)):
            fail(f"{at}.function.parameters", "a JSON schema (an object or a boolean)", params)
        out.append((name, params))
    return out


def forced_guide(tc: ToolChoice, tools: tuple[dict, ...] | None, at: str, tools_at: str,
                 parallel: bool = True) -> guided.Guide | None:
    """The JSON schema a "required" or named tool choice holds the answer to (None: the answer is free)."""
    if not tc.forced:
        return None
    if not tools:
        fail(at, '"auto" or "none" when the request has no `tools` (a forced call needs one to call)',
             tc.name or tc.mode)
    functions = _functions(tools, tools_at)
    if tc.mode == "function":
        names = [name for name, _ in functions]
        if tc.name not in names:
            fail(f"{at}.function.name", f"the name of one of the request's tools ({one_of(names)})", tc.name,
                 did_you_mean(tc.name, names))
        schema = dict(functions)[tc.name]
    else:
        schema = _required_schema(functions, tools_at, parallel)
    if isinstance(schema, dict) and "x-guidance" not in schema:
        # JSON as json.dumps writes it, which is what models learnt calls from; any whitespace
        # would let a small model run on in blanks until max_generate_length cuts the call short
        schema = {"x-guidance": {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "},
                  **schema}
    return guided.Guide("json_schema", compact(schema, at, "a tool schema"), at)


def _required_schema(functions: list[tuple[str, dict]], tools_at: str, parallel: bool = True) -> dict:
    """vLLM's schema for "required": an array of at least one {"name", "parameters"} of a tool.
    Each tool's parameters keep their own `#` (its `$ref`s: "#", "#/$defs/...", draft-7's
    "#/definitions/..."): an `$id` of their own, where they have none, makes them a schema resource
    whose references resolve inside it, not in the array of calls they are nested in."""
    options, ids = [], {}
    for i, (name, params) in enumerate(functions):
        if isinstance(params, dict) and isinstance(params.get("$id"), str):  # (two resources of one $id: one wins)
            at = key_path(f"{tools_at}[{i}].function.parameters", "$id")
            if ids.setdefault(params["$id"], params) != params:
                fail(at, "an `$id` no other tool's parameters hold (\"required\" puts them in one schema, where "
                     "one would take the other's references)", params["$id"])
        if isinstance(params, dict) and "$defs" in params:  # (said here, by its path, not as the grammar's error)
            json_object(params["$defs"], key_path(f"{tools_at}[{i}].function.parameters", "$defs"),
                        "definitions: name -> schema")
        if isinstance(params, dict) and "$id" not in params:
            params = {"$id": f"urn:trtllm:tool:{i}", **params}
        options.append({"type": "object", "properties": {"name": {"const": name}, "parameters": params},
                        "required": ["name", "parameters"], "additionalProperties": False})
    return {"type": "array", "minItems": 1, **({} if parallel else {"maxItems": 1}), "items": {"anyOf": options}}


# --- reading the calls out of an answer ---------------------------------------------------------

CALL_KEYS = frozenset({"name", "arguments", "parameters"})


class _Pairs(dict):
    """A JSON object that remembers the keys written more than once (json.loads keeps the last)."""
    repeated: frozenset = frozenset()


def _pairs(pairs: list) -> dict:
    obj = _Pairs(pairs)
    if len(obj) < len(pairs):
        obj.repeated = frozenset(k for k, n in Counter(k for k, _ in pairs).items() if n > 1)
    return obj


# json.loads' reading, with each object's repeated keys known: a call object whose name or arguments
# are written twice is no call (which one was meant? --stream would have given the first)
_JSON = json.JSONDecoder(object_pairs_hook=_pairs)


def _repeats_call_keys(obj: object) -> bool:
    return bool(getattr(obj, "repeated", frozenset()) & CALL_KEYS)

def _call(name: object, arguments: object) -> dict | None:
    if not isinstance(name, str) or not name:
        return None
    try:  # arguments as OpenAI gives them: a string of JSON, which the output file can write
        text = json.dumps(arguments, ensure_ascii=False, allow_nan=False)
        (name + text).encode("utf-8")  # (a lone surrogate escape, "\ud800", decodes to what UTF-8 cannot hold)
    except (TypeError, ValueError, RecursionError):
        return None
    return {"type": "function", "function": {"name": name, "arguments": text}}


def _from_object(obj: object) -> dict | None:
    """{"name", "arguments"} (or Llama's "parameters", not both) -> a call."""
    if not isinstance(obj, dict) or ("arguments" in obj) == ("parameters" in obj) or _repeats_call_keys(obj):
        return None
    return _call(obj.get("name"), obj["arguments"] if "arguments" in obj else obj["parameters"])


def _marked(start: str, end: str) -> re.Pattern:
    """Blocks of calls between two markers, the last block possibly unclosed (the answer ended first)."""
    s, e = re.escape(start), re.escape(end)
    return re.compile(f"{s}(.*?){e}|{s}(.*)", re.DOTALL)


def _blocks(text: str, start: str, blocks: re.Pattern, read) -> tuple[str | None, list] | None:
    """The calls `read` gives of each block (None: a block it cannot read), with the text before the first
    block as content; None where there is no block."""
    first = text.find(start)
    if first < 0:
        return None
    calls = []
    for closed, open_ in blocks.findall(text):
        got = read(closed or open_)
        if got is None:
            return None
        calls += got
    return text[:first] or None, calls


_HERMES = _marked(HERMES, "</tool_call>")


def _hermes(text: str) -> tuple[str | None, list] | None:
    """Hermes, Qwen 2.5/3, SmolLM3: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, any
    number; the last may be unclosed (the answer ended first). Content: the text before the first."""
    def read(block: str) -> list | None:
        try:
            return [_from_object(_JSON.decode(block))]
        except (ValueError, RecursionError):
            return None

    return _blocks(text, HERMES, _HERMES, read)


_LFM2 = _marked(LFM_START, LFM_END)


def _lfm2(text: str) -> tuple[str | None, list] | None:
    """LFM2, LFM2.5 and LFM3: a Python list of calls (as pythonic's) between `<|tool_call_start|>` and
    `<|tool_call_end|>`, any number of them; the last may be unclosed (the answer ended first). Content:
    the text before the first. The markers are special tokens: the answer needs skip_special_tokens
    false."""
    return _blocks(text, LFM_START, _LFM2, lambda block: None if (got := _pythonic(block)) is None else got[1])


def _llama3_json(text: str) -> tuple[str | None, list] | None:
    """Llama 3.1/3.2's JSON calls: the answer is `{"name": ..., "parameters": {...}}` (after an
    optional `<|python_tag|>`), several joined by `;`. Unlike vLLM, which takes the first JSON
    object anywhere in the text, the answer must begin with it: an answer that merely quotes JSON
    is not a call."""
    rest = text.lstrip().removeprefix(PYTHON_TAG)  # (tool_pieces.LOOSE skips the blanks str.strip does)
    decoder, calls = _JSON, []
    while True:
        try:
            obj, end = decoder.raw_decode(rest := rest.lstrip())
        except (ValueError, RecursionError):
            return None
        calls.append(_from_object(obj))
        rest = rest[end:].lstrip()
        if rest.startswith(";"):
            rest = rest[1:].lstrip()
            if not rest:  # a last separator with nothing after it
                return None, calls
        elif rest:
            return None  # text after the calls: not an answer of calls alone
        else:
            return None, calls


def _pythonic(text: str) -> tuple[str | None, list] | None:
    """Llama 3.2/4's Python calls: `[get_weather(city="Paris", unit="celsius"), ...]`, keyword
    arguments with literal values only (nothing is evaluated)."""
    s = text.strip().removeprefix(PYTHON_START).removesuffix(PYTHON_END).strip()
    if not (s.startswith("[") and s.endswith("]")):
        return None
    try:
        tree = ast.parse(s, mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):  # (MemoryError: some deep nestings)
        return None
    if not isinstance(tree, ast.List):
        return None
    calls = []
    for node in tree.elts:
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.args
                and all(k.arg is not None for k in node.keywords)):
            return None
        try:
            calls.append(_call(node.func.id, {k.arg: ast.literal_eval(k.value) for k in node.keywords}))
        except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
            return None
    return None, calls


def _required(text: str) -> tuple[str | None, list] | None:
    try:
        items = _JSON.decode(text)
    except (ValueError, RecursionError):
        return None
    if not isinstance(items, list) or not items:
        return None
    return None, [_from_object({"name": i.get("name"), "arguments": i.get("parameters")})
                  if isinstance(i, dict) and not _repeats_call_keys(i) else None for i in items]


def _mistral(text: str) -> tuple[str | None, list] | None:
    """Mistral's: `[TOOL_CALLS]` (a special token: the answer needs skip_special_tokens false), then
    a JSON array of {"name", "arguments"} (v3 tokenizers) or `name[ARGS]{...}`, each call after its
    own `[TOOL_CALLS]` (v11 and later). Content: the text before the first."""
    start = text.find(MISTRAL)
    if start < 0:
        return None
    calls, decoder = [], _JSON
    for part in text[start:].split(MISTRAL)[1:]:
        part = part.strip()  # (tool_pieces.LOOSE skips the blanks str.strip does)
        try:
            if part.startswith("["):
                items, end = decoder.raw_decode(part)
                if not isinstance(items, list) or part[end:].strip():
                    return None
                calls += [_from_object(item) for item in items]
            else:
                name, found, args = part.partition("[ARGS]")
                value, end = decoder.raw_decode(args.strip())
                if not found or args.strip()[end:].strip():
                    return None
                calls.append(_call(name.strip(), value))
        except (ValueError, RecursionError):
            return None
    return text[:start] or None, calls


ALPHANUMERIC = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
_READERS = {"hermes": _hermes, "lfm2": _lfm2, "llama3_json": _llama3_json, "mistral": _mistral,
            "pythonic": _pythonic}


def reads_calls(tc: ToolChoice | None, parser: str | None, tools: tuple[dict, ...] | None) -> bool:
    """Whether an answer is read for tool calls (`extract`): with tools, unless tool_choice is
    "none", where calls are forced or a parser reads them."""
    return bool(tools) and not (tc is not None and tc.mode == "none") and (
        parser is not None or forced(tc))


def extract(text: str, tc: ToolChoice | None, parser: str | None, tools: tuple[dict, ...] | None,
            key: str, parallel: bool = True) -> tuple[str | None, list[dict]] | None:
    """(content, calls) read from an answer, or None where it holds no calls (or none were asked
    for). `key` makes the calls' ids (it should name the request and sample): the same answer to
    the same request gets the same ids, so a run's output is reproducible."""
    if not reads_calls(tc, parser, tools):
        return None
    if tc is not None and tc.mode == "function":
        try:
            got = None, [_call(tc.name, json.loads(text))]
        except (ValueError, RecursionError):
            return None
    elif tc is not None and tc.mode == "required":
        got = _required(text)
    else:
        got = _READERS[parser](text)
    if got is None or not got[1] or None in got[1]:
        return None
    content, calls = got[0], got[1] if parallel else got[1][:1]  # (OpenAI's parallel_tool_calls false: the first)

    return content, [{"id": call_id(key, k, call["function"]["name"], parser), **call} for k, call in enumerate(calls)]


def call_id(key: str, k: int, name: str, parser: str | None) -> str:
    """The id of an answer's k-th call: of the request and sample (`key`), k and the function's name,
    so that --stream gives it with the call's first delta, before its arguments are written."""
    digest = hashlib.sha256(f"{key}\0{k}\0{name}".encode("utf-8", "surrogatepass"))
    if parser == "mistral":  # (Mistral's templates take back only 9 letters and digits, as vLLM makes them)
        return "".join(ALPHANUMERIC[b % 62] for b in digest.digest()[:9])
    return "call_" + digest.hexdigest()[:24]


def extract_or_none(text: str, tc: ToolChoice | None, parser: str | None, tools: tuple[dict, ...] | None,
                    key: str, parallel: bool = True) -> tuple[str | None, list[dict]] | None:
    """`extract`, where an answer a parser cannot take (an error of its own) is no calls, not a lost run."""
    try:
        return extract(text, tc, parser, tools, key, parallel)
    except Exception:  # noqa: BLE001 - each reader's library has its own error types
        return None
