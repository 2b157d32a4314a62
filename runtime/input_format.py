"""Strict reader for the `trtllm-run` input JSON (TensorRT Edge-LLM 0.9.1 `llm_inference` format).

Every field is type- and range-checked, unknown and duplicate keys are refused, and each error is
an `InputError` whose `json_path` names the bad value (`requests[2].messages[0].role`). Nothing is
clamped or silently defaulted. Checks that need the engine (token id < vocab size) live in
runtime/input_checks.py. The format is documented in docs/input_format.md, the
sampling settings' semantics in docs/sampling.md. Stdlib only: this runs on the device.

Sampling settings (`SAMPLING_FIELDS`) may be given at the top level, as the default for every
request, and in a request, where they replace the top-level value. Each `Request` holds them
resolved, and `Request.own_fields` remembers which keys the request gave itself, so that a later
check can name the path where the user wrote the value.

Unlike the upstream reader, JSON NaN/Infinity (and overflowing numbers such as 1e400) parse to
non-finite floats and are then refused by the field that holds them, so the error names its path.
"""

from __future__ import annotations

import dataclasses
import os
import re
import sys
from dataclasses import dataclass, field

from trtllm.runtime import beam_rules, files, guided, reasoning, tool_calls
from trtllm.runtime.generation_config import CONFIG_NAMES
from trtllm.runtime.input_fields import (MAX_N, SAMPLING_FIELDS, SAMPLING_FIELDS_READ, lora_weights, prompt_token_ids,
                                         stop)
from trtllm.runtime.messages import (  # noqa: F401 - ContentItem: part of this module's API
    MEDIA_TYPES,
    ContentItem,
    Message,
    parse_messages as _messages,
    parse_template_kwargs as _template_kwargs,
    parse_text as _text,
    readable_messages as _readable_messages,
    parse_tools as _tools,
)
from trtllm.runtime.strict_json import (  # the parsers, under this module's private names
    InputError,  # noqa: F401 - part of this module's API
    JsonObject,
    fail as _fail,
    decode as _decode,
    did_you_mean as _did_you_mean,
    one_of as _one_of,
    number as _number,
    boolean as _bool,
    string as _string,
    choice as _choice,
    fields as _fields,
    key_path as _key_path,
    without_nulls as _without_nulls,
)

MAX_BATCH_SIZE = 16
MAX_REQUEST_TEXT_BYTES = 1024 * 1024  # all text of one request, UTF-8 bytes


@dataclass(frozen=True, slots=True)
class Request:
    """One request. The sampling fields are resolved: the request's own value, else the top-level
    one, else the default below (the Edge-LLM defaults; docs/sampling.md has their meaning)."""

    messages: tuple[Message, ...]  # () where prompt_token_ids gives the prompt
    lora_name: str | None
    save_system_prompt_kv_cache: bool
    disable_spec_decode: bool
    stop: tuple[str, ...]
    logit_bias: dict[int, float]  # read-only: requests that inherit it share the top-level dict
    num_logprobs: int
    prompt_logprobs: int | None = None  # vLLM's: score the prompt, with this many top tokens (None: not)
    continue_final_message: bool = False  # the prompt ends inside the last message, which the answer continues
    tools: tuple[dict, ...] | None = None  # the tool definitions its chat template shows (its own, else the file's)
    tool_choice: tool_calls.ToolChoice | None = None  # None: not given ("auto" where there are tools)
    tool_call_parser: str | None = None  # how "auto" reads calls out of the answer (None: it does not)
    chat_template_kwargs: dict | None = None  # more variables for its chat template (its own, else the file's)
    reasoning_parser: str | None = None  # splits the answer into reasoning_content and content (vLLM's)
    parallel_tool_calls: bool = True  # False: one call at most (OpenAI's)
    # --context-reuse (Edge-LLM's policies): restore earlier requests' KV; keep this one's, and its answer's
    context_cache_lookup_policy: str = "use_cache"
    context_cache_commit_policy: str = "including_generated_tokens"
    temperature: float = 1.0  # [0, 100]; 0 = greedy
    top_k: int = 50  # >= 0; 0 = off
    top_p: float = 0.8  # (0, 1]; 1 = off
    max_generate_length: int = 256  # >= 0
    seed: int | None = None  # [0, 2**64 - 1]; None = a fresh random seed
    min_p: float = 0.0  # [0, 1]; 0 = off
    repetition_penalty: float = 1.0  # [0.01, 10]; 1 = off
    presence_penalty: float = 0.0  # [-2, 2]; 0 = off
    frequency_penalty: float = 0.0  # [-2, 2]; 0 = off
    stop_token_ids: tuple[int, ...] = ()  # at most 64 ids; () = none
    ignore_eos: bool = False
    min_new_tokens: int = 0  # <= max_generate_length; 0 = off
    n: int = 1  # [1, 16] independent samples
    guided_decoding: guided.Guide | None = None  # None = unconstrained
    include_stop_str_in_output: bool = False  # the stop string stays in the text (vLLM's)
    skip_special_tokens: bool = True  # False: special tokens' text is in it (vLLM's)
    spec_proposal_sampling: str = "auto"  # EAGLE drafts of a sampled row: "greedy" the head's argmax (Edge-LLM's)
    num_beams: int = 1  # > 1: beam search (runtime/beam.py), its best n beams the n responses
    length_penalty: float = 1.0  # beam search: a hypothesis' score is its log-probability / length ** this
    early_stopping: bool | str = False  # beam search: transformers' (False, True or "never")
    bad_words: tuple[str, ...] = ()  # vLLM's: words it may not generate (runtime/bans.py)
    allowed_token_ids: tuple[int, ...] | None = None  # vLLM's: the only ids it may generate (None: all)
    truncate_prompt_tokens: int | None = None  # vLLM's: keep the prompt's last k tokens (-1: max_input_len)
    no_repeat_ngram_size: int = 0  # transformers' (and TensorRT-LLM's): no n tokens in a row twice; 0 = off
    prompt_token_ids: tuple[int, ...] | None = None  # vLLM's tokens prompt: the prompt itself (no template)
    # the keys it gave itself (parse_input fills it): errors about others name the top level's path
    own_fields: frozenset[str] = field(default=frozenset(), compare=False)

    def where(self, index: int, name: str) -> str:
        """The JSON path of a setting as it applies to this request (requests[index]): its own, or
        the top level's it inherited (an error names the value to fix)."""
        return f"requests[{index}].{name}" if name in self.own_fields else name

    def media_types(self) -> set[str]:
        """The media kinds ("image", "audio", "video") present in this request's messages."""
        return {item.type for m in self.messages if not isinstance(m.content, str)
                for item in m.content if item.type in MEDIA_TYPES}


@dataclass(frozen=True, slots=True)
class InputFile:
    requests: tuple[Request, ...]
    batch_size: int = 1
    temperature: float = 1.0
    top_p: float = 0.8
    top_k: int = 50
    max_generate_length: int = 256
    apply_chat_template: bool = True
    add_generation_prompt: bool = True
    enable_thinking: bool = False
    default_system_prompt: str | None = None
    tools: tuple[dict, ...] | None = None
    tool_choice: tool_calls.ToolChoice | None = None
    tool_call_parser: str | None = None
    chat_template_kwargs: dict | None = None
    reasoning_parser: str | None = None
    parallel_tool_calls: bool = True
    context_cache_lookup_policy: str = "use_cache"
    context_cache_commit_policy: str = "including_generated_tokens"
    available_lora_weights: dict[str, str] = field(default_factory=dict)
    num_logprobs: int = 0
    prompt_logprobs: int | None = None
    logit_bias: dict[int, float] = field(default_factory=dict)
    seed: int | None = None
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    min_new_tokens: int = 0
    n: int = 1
    guided_decoding: guided.Guide | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    spec_proposal_sampling: str = "auto"
    num_beams: int = 1
    length_penalty: float = 1.0
    early_stopping: bool | str = False
    bad_words: tuple[str, ...] = ()
    allowed_token_ids: tuple[int, ...] | None = None
    truncate_prompt_tokens: int | None = None
    no_repeat_ngram_size: int = 0
    # isolate=True (trtllm-run): request index -> the error of a request that could not be read;
    # its entry in `requests` is a placeholder that never runs (PLACEHOLDER)
    invalid: dict[int, str] = field(default_factory=dict)


def _lora_name(value: object, path: str) -> str | None:
    """null and "" are the base model, as upstream reads them."""
    return None if value is None or value == "" else _string(value, path)


# Keys other readers write for a setting of ours (Edge-LLM after 0.10): read as ours (not both).
_ALIASES = {"sampling_seed": "seed"}


# Keys whose null leaves the setting unset (the request then takes the top level's, the top level
# the default), as Edge-LLM after 0.10 reads these; OpenAI clients write null for an unset option too.
NULL_IS_UNSET = frozenset({"sampling_seed", "seed", "logit_bias", "guided_decoding", "context_cache_lookup_policy",
                           "context_cache_commit_policy", "spec_proposal_sampling", "tools", "tool_choice",
                           "tool_call_parser", "chat_template_kwargs", "reasoning_parser", "parallel_tool_calls"})


def _resolve_aliases(f: dict, path: str) -> dict:
    for alias, name in _ALIASES.items():
        if alias in f:
            if name in f:
                _fail(_key_path(path, alias), f"absent when `{_key_path(path, name)}` is given (the same "
                      "setting under its Edge-LLM name)", f[alias])
            f[name] = f.pop(alias)
    return f


INHERITED = ("chat_template_kwargs", "reasoning_parser", "parallel_tool_calls")  # (a request's own, else the top's)
# Edge-LLM's (after 0.10) context reuse policies, which apply with trtllm-run --context-reuse
CONTEXT_FIELDS = {"context_cache_lookup_policy": _choice(("use_cache", "bypass")),
                   "context_cache_commit_policy": _choice(("including_generated_tokens", "prefill_state_only"))}

_REQUEST_FIELDS = {
    "messages": _messages,
    "prompt_token_ids": prompt_token_ids,
    "lora_name": _lora_name,
    # upstream's test fixtures carry the expected answer for scoring; it takes no part in generation
    "reference": _string,
    "save_system_prompt_kv_cache": _bool,
    "disable_spec_decode": _bool,
    "stop": stop,
    "continue_final_message": _bool,
    "tools": _tools,
    "tool_choice": tool_calls.parse_choice,
    "tool_call_parser": tool_calls.parse_parser,
    "chat_template_kwargs": _template_kwargs,
    "reasoning_parser": reasoning.parse_parser,
    "parallel_tool_calls": _bool,
    **CONTEXT_FIELDS,
    **SAMPLING_FIELDS_READ,
}


def _request(value: object, path: str, top: InputFile, bundled: tuple[str, ...] | None = ()) -> Request:
    value = _without_nulls(value, NULL_IS_UNSET)
    ids = isinstance(value, dict) and "prompt_token_ids" in value  # the prompt as ids: no messages
    f = _resolve_aliases(_fields(value, path, _REQUEST_TABLE, "a request"), path)
    if not ids and "messages" not in f:
        _fail(f"{path}.messages", "given (or `prompt_token_ids`: a request needs a prompt)", None, shown="nothing")
    if ids and "messages" in f:
        _fail(f"{path}.prompt_token_ids", "absent when `messages` is given (the prompt is one or the other)",
              f["prompt_token_ids"], shown="both")
    if ids and f.get("continue_final_message"):
        _fail(f"{path}.continue_final_message", "false with `prompt_token_ids` (there is no message to continue)",
              True)
    f.setdefault("messages", ())
    loras = {**dict.fromkeys(bundled or (), ""), **top.available_lora_weights}
    lora_name = f.get("lora_name")
    if lora_name is not None and lora_name not in loras:
        hint = _did_you_mean(lora_name, loras) or ("the engine takes no adapters: rebuild it with trtllm-build "
                                                   "--max-lora-rank N" if bundled is None else
                                                   "add it to `available_lora_weights`")
        _fail(f"{path}.lora_name", "a key of `available_lora_weights` or an adapter in the engine "
              f"({_one_of(loras) or 'none are given'})", lora_name, hint)
    total = sum(m.text_bytes() for m in f["messages"])
    if total > MAX_REQUEST_TEXT_BYTES:
        _fail(f"{path}.messages", f"at most {MAX_REQUEST_TEXT_BYTES} UTF-8 bytes (1 MiB) of "
              "text (content and reasoning_content) in total", None, shown=f"{total} bytes")
    if f.get("continue_final_message") and not f["messages"]:
        _fail(f"{path}.continue_final_message", "false when `messages` is empty (there is no message to continue)",
              True)
    def own(name: str):  # the request's value, else the top level's (the object itself: one shared logit_bias)
        return f[name] if name in f else getattr(top, name)

    def where(name: str) -> str:
        return f"{path}.{name}" if name in f else name
    sampling = {name: own(name) for name in SAMPLING_FIELDS}
    if sampling["min_new_tokens"] > sampling["max_generate_length"]:
        _fail(where("min_new_tokens"), f"<= `{where('max_generate_length')}` "
              f"({sampling['max_generate_length']})", sampling["min_new_tokens"])
    tools, choice, parser = own("tools"), own("tool_choice"), own("tool_call_parser")
    guide_at, parallel = where("guided_decoding"), own("parallel_tool_calls")
    forced = tool_calls.guide_for(choice, parser, tools, sampling["guided_decoding"], where, parallel)
    if forced:  # "required" or a named function: the answer is held to a JSON schema of calls
        sampling["guided_decoding"], guide_at = forced, where("tool_choice")
    if sampling["num_beams"] > 1:
        beam_rules.check_request(sampling, where)
    if sampling["guided_decoding"] is not None:  # the grammar says where the answer may end, alone
        for name, off in (("min_new_tokens", 0), ("ignore_eos", False)):
            if sampling[name] != off:
                _fail(where(name), f"{off!r}".lower() + f" with `{guide_at}` (the grammar decides "
                      "where the answer ends)", sampling[name])
    return Request(
        messages=f["messages"],
        lora_name=lora_name,
        save_system_prompt_kv_cache=f.get("save_system_prompt_kv_cache", False),
        disable_spec_decode=f.get("disable_spec_decode", False),
        stop=f.get("stop", ()),
        continue_final_message=f.get("continue_final_message", False),
        tools=tools,
        tool_choice=choice,
        tool_call_parser=parser,
        **{name: own(name) for name in (*INHERITED, *CONTEXT_FIELDS)},
        **sampling,
        prompt_token_ids=f.get("prompt_token_ids"),
        own_fields=frozenset(f),
    )


_TOP_FIELDS = {
    "batch_size": _number(int, 1, MAX_BATCH_SIZE),
    **SAMPLING_FIELDS_READ,
    "apply_chat_template": _bool,
    "add_generation_prompt": _bool,
    "enable_thinking": _bool,
    "default_system_prompt": _text,  # (each request's system message: a message's limit)
    "tools": _tools,
    "tool_choice": tool_calls.parse_choice,
    "tool_call_parser": tool_calls.parse_parser,
    "chat_template_kwargs": _template_kwargs,
    "reasoning_parser": reasoning.parse_parser,
    "parallel_tool_calls": _bool,
    **CONTEXT_FIELDS,
    "available_lora_weights": lora_weights,
    "requests": lambda v, p: v,  # parsed below, once the LoRA names and defaults are known
}

TOP_LEVEL = frozenset(_TOP_FIELDS)  # the fields the file's top level takes (the others are a request's own)


def _top_only(key: str):
    """A top-level setting given in a request: not an unknown key, a misplaced one (reported with the
    request's other errors)."""
    def refuse(value: object, path: str):
        _fail(path, f"set at the top level (`{key}`: it applies to the whole file)", value, shown="it in a request")
    return refuse


_REQUEST_TABLE = {**_REQUEST_FIELDS, **{key: _top_only(key) for key in _TOP_FIELDS
                                        if key not in _REQUEST_FIELDS and key != "requests"}}


def parse_input(obj: object, bundled_loras: tuple[str, ...] | None = (), isolate: bool = False) -> InputFile:
    """Validate a decoded input document; raise `InputError` naming its bad values (fields). With
    `isolate`, a bad value inside a request fails that request alone: its error goes to
    `InputFile.invalid` and PLACEHOLDER takes its place, so its neighbours still run (what
    trtllm-run does); the file and its top level still raise. `bundled_loras`: adapter names the
    engine carries, which `lora_name` may use as well (None: the engine takes no adapters)."""
    for key in obj if isinstance(obj, dict) else ():
        if key in _REQUEST_FIELDS and key not in _TOP_FIELDS:  # not an unknown key: a misplaced one
            _fail(key, f"set in each request (`requests[i].{key}`)", obj[key], shown="it at the top level")
    obj = _without_nulls(obj, NULL_IS_UNSET)
    top = _resolve_aliases(_fields(obj, "", _TOP_FIELDS, "the input file", ("requests",)), "")
    raw_requests = top.pop("requests")
    if not isinstance(raw_requests, list) or not raw_requests:
        _fail("requests", "a non-empty array of request objects", raw_requests)
    settings = InputFile(requests=(), **top)  # the top level with its defaults filled in
    requests, invalid = [], {}
    for i, r in enumerate(raw_requests):
        try:
            requests.append(_request(r, f"requests[{i}]", settings, bundled_loras))
        except Exception as e:  # noqa: BLE001 - not only InputError: one request never takes down the rest
            if not isolate:
                raise
            if not isinstance(e, InputError):
                e = InputError(f"requests[{i}]", f"`requests[{i}]` could not be read ({type(e).__name__}: {e}; a bug "
                               "in trtllm-edge: please report it with this request)")
            # as many error responses as samples asked for, where its `n` reads (one where `n` is what
            # is wrong: given twice, {"n": 1, "n": 3} read as 3)
            n = r.get("n", settings.n) if isinstance(r, dict) else settings.n
            ok = isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= MAX_N and e.json_path != f"requests[{i}].n"
            requests.append(dataclasses.replace(PLACEHOLDER, n=n if ok else 1, messages=_readable_messages(r, i)))
            invalid[i] = str(e)
    return dataclasses.replace(settings, requests=tuple(requests), invalid=invalid)


# What stands for a request that could not be read (parse_input's isolate): it never runs (its
# n is the request's own where that reads, for one error response per sample; its messages too).
PLACEHOLDER = Request(messages=(), lora_name=None, save_system_prompt_kv_cache=False, disable_spec_decode=False,
                      stop=(), logit_bias={}, num_logprobs=0)


class RefusedDefault(InputError):
    """A default (--sampling-defaults model) that would apply and is refused: `message` says so."""

    def __init__(self, name: str, message: str):
        super().__init__(name, message)
        self.message = message


def read_input(path: str | os.PathLike, bundled_loras: tuple[str, ...] | None = (), isolate: bool = False,
               overrides: dict | None = None, defaults: dict | None = None,
               refused: dict[str, str] | None = None) -> InputFile:
    """Read and validate an input JSON file; every failure is an `InputError`, but, with `isolate`,
    a bad request's (parse_input). `overrides`: trtllm-run's --batch-size and --max-generate-length
    (apply_overrides); `defaults`: top-level settings where the file gives none
    (generation_config.model_defaults), `refused`: those of them that cannot be used, name -> why
    (RefusedDefault where one would apply)."""
    name = os.fspath(path)
    label = "the input on stdin (`-`)" if name == "-" else f"input file `{files.shown(name)}`"
    try:
        if name == "-":  # (as other tools read `-`; a file of that name is ./-)
            if sys.stdin is None:  # (`<&-`)
                raise OSError(0, "stdin is closed")
            data = sys.stdin.buffer.read()
        else:
            with open(name, "rb") as f:
                data = f.read()
    except OSError as e:
        _fail("", "a readable file", None, shown=e.strerror or type(e).__name__, label=label)
    obj = _decode(data, label)
    injected = [name for name in defaults or () if name not in obj and name not in (overrides or {})
                ] if isinstance(obj, dict) else []
    for name in injected:
        if name in (refused or {}):
            raise RefusedDefault(name, refused[name])
    if injected:
        obj = _replaced(obj, {name: defaults[name] for name in injected})

    def origin(message: str) -> str:  # a value the file does not hold says where it came from
        for name in injected:
            theirs = CONFIG_NAMES.get(name, name)
            message = message.replace(f"`{name}`", f"`{name}` (generation_config.json's `{theirs}`)")
        for name in overrides or ():  # (at the top level, and in each request that gave its own)
            option = "--" + name.replace("_", "-")
            message = re.sub(rf"`((?:requests\[\d+\]\.)?{name})`", rf"`\1` (set by {option})", message)
        return message
    try:
        inp = parse_input(apply_overrides(obj, overrides or {}), bundled_loras, isolate)
    except InputError as e:
        raise InputError(e.json_path, origin(str(e))) from None
    changed = injected or overrides
    return dataclasses.replace(inp, invalid={i: origin(m) for i, m in inp.invalid.items()}) if changed else inp


def apply_overrides(obj: object, overrides: dict) -> object:
    """The document with top-level settings replaced, as Edge-LLM's --batchSize and
    --maxGenerateLength do; a setting requests may give themselves is replaced in each that does.
    The values are checked as if the file held them."""
    if not overrides or not isinstance(obj, dict):
        return obj  # (a file that is not an object fails as it is)
    out = _replaced(obj, overrides)
    own = [name for name in overrides if name in _REQUEST_FIELDS]
    if own and isinstance(obj.get("requests"), list):
        out["requests"] = [_replaced(r, {n: overrides[n] for n in own if n in r}) if isinstance(r, dict) else r
                           for r in obj["requests"]]
    return out


def _replaced(obj: dict, values: dict) -> dict:
    """A copy of a decoded object with `values` set, that still knows its duplicate keys."""
    out = JsonObject(obj)
    out.update(values)
    out.duplicates = getattr(obj, "duplicates", ())
    return out
