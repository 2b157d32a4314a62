"""OpenAI's chat completions and completions APIs in trtllm-serve: a request body becomes a
one-request input document (docs/input_format.md) that input_format checks, and the run's
responses and stream lines become OpenAI's objects (`chat.completion`, `chat.completion.chunk`,
`text_completion`). A completions body is a chat body of one user message, its prompt, without
the chat template.

A body takes OpenAI's names (`max_tokens`, `max_completion_tokens`, `logprobs` with
`top_logprobs`, `response_format`, `stream_options`), vLLM's extras (`top_k`, `min_p`,
`repetition_penalty`, `min_tokens`, `guided_json` ...) and any field of a request of ours as it
is. OpenAI's defaults replace ours where they differ: `top_p` 1, no `top_k`, and no limit on the
answer's length but the engine's KV capacity (a completion's: 16 tokens). An error names the body's
field as the client wrote it.
"""
from __future__ import annotations

import re
import time
import uuid

from trtllm.runtime import input_format as fmt
from trtllm.runtime.strict_json import InputError, check_duplicates

# OpenAI's (and vLLM's) name -> ours, where they differ
RENAMED = {"max_tokens": "max_generate_length", "max_completion_tokens": "max_generate_length",
           "min_tokens": "min_new_tokens"}
GUIDES = {"guided_json": "json_schema", "guided_regex": "regex", "guided_choice": "choice",
          "guided_grammar": "ebnf"}  # vLLM's older guided decoding fields -> guided_decoding's key
# Informational fields of OpenAI's that change nothing here
IGNORED = frozenset({"user", "metadata", "store", "service_tier"})
# Input-file fields that apply to a document's top level
TOP_ONLY = frozenset({"apply_chat_template", "add_generation_prompt", "enable_thinking", "default_system_prompt"})
# ... and those that are the server's to set, not a request's
SERVER_ONLY = {"batch_size": "trtllm-serve runs every request it has as one batch (its --batch-size)",
               "available_lora_weights": "adapters are given with trtllm-serve --lora NAME=PATH",
               "requests": "a body is one request"}
MAX_TOP_LOGPROBS = 20  # OpenAI's limit
# Settings of a chat's template and answer that a completion (a prompt as it is) has no use for
CHAT_ONLY = frozenset({"apply_chat_template", "add_generation_prompt", "enable_thinking", "default_system_prompt",
                       "chat_template_kwargs", "continue_final_message", "tools", "tool_choice", "tool_call_parser",
                       "parallel_tool_calls", "reasoning_parser"})


class ApiError(Exception):
    """A request the server refuses: the HTTP status, OpenAI's error type and the field (param)."""

    def __init__(self, message: str, param: str | None = None, status: int = 400,
                 kind: str = "invalid_request_error", code: str | None = None):
        super().__init__(message)
        self.param, self.status, self.kind, self.code = param, status, kind, code

    def body(self) -> dict:
        return {"error": {"message": str(self), "type": self.kind, "param": self.param, "code": self.code}}


class Translated:
    """A body as an input document, and what the server itself reads from it."""

    def __init__(self, document: dict, stream: bool, include_usage: bool, top_logprobs: int | None,
                 names: dict[str, str], model: str, text: bool = False, echo: bool = False):
        self.document, self.stream, self.include_usage = document, stream, include_usage
        self.top_logprobs = top_logprobs  # None: no logprobs asked for
        self.names = names  # our field (or path) -> the body's name for it, where they differ
        self.model = model
        self.text, self.echo = text, echo  # /v1/completions; its answers open with their prompts
        self.prompts = len(document["requests"])  # (a completion's prompts: a request each)
        self.token_strs = False  # /tokenize: each id's vocabulary piece too

    def error(self, e: fmt.InputError) -> ApiError:
        """input_format's error about the document, in the body's names."""
        return ApiError(self.rename(str(e)), self.rename_path(e.json_path))

    def refused(self, message: str, status: int = 400) -> ApiError:
        """A message of ours (a request check's, a failed run's) as the body's error; the field is
        the path it starts with, where it names one."""
        text = self.rename(message)
        named = re.match(r"`([^`]+)`", text)
        kind = {400: "invalid_request_error", 503: "ServiceUnavailableError"}.get(status, "InternalServerError")
        return ApiError(text, named.group(1) if named and status == 400 else None, status, kind)

    def failure(self, responses: list[dict]) -> ApiError | None:
        """The 500 of an answer with a sample that failed while it ran (the first one's error), else None."""
        failed = next((r for r in responses if r["finish_reason"] == "error"), None)
        return None if failed is None else self.refused(failed.get("error", ""), 500)

    def prompt(self, i: str) -> str:
        """The body's name for request i's prompt: `prompt`, or `prompt[i]` of several."""
        return "prompt" if self.prompts == 1 else f"prompt[{i}]"

    def rename(self, text: str) -> str:
        if self.text:  # a completion's prompt, as text or token ids (item by item)
            text = re.sub(r"`requests\[(\d+)\]\.(?:prompt_token_ids|messages\[0\]\.content|messages)(?!\w)",
                          lambda m: f"`{self.prompt(m[1])}", text)
            if self.prompts > 1:
                text = re.sub(r"`requests\[(\d+)\]`", lambda m: f"`{self.prompt(m[1])}`", text)
        text = re.sub(r"`requests\[\d+\]\.", "`", text).replace("`requests[0]`", "the request")
        for ours, theirs in self.names.items():
            text = re.sub(rf"`{re.escape(ours)}(?![\w\[])", f"`{theirs}", text)
        return text

    def rename_path(self, path: str | None) -> str | None:
        if not path:
            return None
        at = re.match(r"requests\[(\d+)\]\.?", path)
        i, path = (at[1], path[at.end():]) if at else ("0", path)
        if self.text and path.startswith(("prompt_token_ids", "messages")):
            return self.prompt(i) + (path.removeprefix("prompt_token_ids") if path.startswith("prompt_") else "")
        if not path:
            return self.prompt(i) if self.text and self.prompts > 1 else None
        if path in self.names:
            return path and self.names[path]
        head, sep, rest = path.partition(".")
        return self.names.get(head, head) + sep + rest


def _flag(body: dict, name: str, default: bool = False) -> bool:
    value = body.get(name, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ApiError(f"`{name}` must be true or false, got {value!r}", name)
    return value


def _image_parts(message: object, index: int) -> object:
    """OpenAI's `{"type": "image_url", "image_url": {"url": ...}}` content parts as our image items
    (the url a data: URL, media.place checks); anything else as it is, for input_format to check."""
    content = message.get("content") if isinstance(message, dict) else None
    if not isinstance(content, list):
        return message
    items = []
    for j, part in enumerate(content):
        if isinstance(part, dict) and part.get("type") == "image_url":
            where = f"messages[{index}].content[{j}].image_url"
            image = part.get("image_url")
            url = image.get("url") if isinstance(image, dict) else image
            if not isinstance(url, str) or not url.startswith("data:"):
                raise ApiError(f"`{where}` must be a data: URL (data:image/png;base64,...), or an object whose `url` "
                               f"is one: the server fetches nothing, got {str(url)[:60]!r}", where)
            part = {"type": "image", "image": url}
        items.append(part)
    return {**message, "content": items}


def translate(body: object, served: str, adapters: frozenset[str], defaults: dict, capacity: int,
              text: bool = False) -> Translated:
    """A chat completions body as an input document. `served`: the model name the server answers
    to; `adapters`: LoRA adapter names, which `model` may name instead (vLLM's); `defaults`:
    trtllm-serve --set's settings, which the body's own replace; `capacity`: the engine's KV
    capacity, the answer's length unless the body bounds it. `text`: a completions body instead
    (/v1/completions: a `prompt`, no chat template, `logprobs` a number, 16 tokens unless told)."""
    if not isinstance(body, dict):
        raise ApiError("the body must be a JSON object")
    try:  # (a key given twice: input_format checks the objects inside, this copy loses the mark)
        check_duplicates(body, lambda key: key)
    except InputError as e:
        raise ApiError(str(e), e.json_path) from None
    # null is "not given" in OpenAI's API, for every field
    body, names, prompts = {k: v for k, v in body.items() if v is not None}, {}, [{}]
    if text:
        body, prompts = _text_body(body)
    elif not isinstance(body.get("messages"), list) or not body["messages"]:
        raise ApiError(f"`messages` must be a non-empty array of messages, got {body.get('messages')!r:.60}",
                       "messages")
    else:  # OpenAI's newer name for the system role; its image parts as our image items
        body["messages"] = [_image_parts({**m, "role": "system"} if isinstance(m, dict) and m.get("role") == "developer"
                                         else m, i) for i, m in enumerate(body["messages"])]
    model = body.pop("model", None)
    if model is not None and not isinstance(model, str):
        raise ApiError(f"`model` must be a string, got {model!r}", "model")
    if model is not None and model != served and model not in adapters:
        known = ", ".join(sorted({served, *adapters}))
        raise ApiError(f"the model `{model}` does not exist here (served: {known})", "model", 404,
                       "NotFoundError", "model_not_found")
    stream, echo = _flag(body, "stream"), text and _flag(body, "echo")
    body.pop("stream", None)
    if text:  # (a chat body's echo is no field of ours: refused as any unknown one)
        body.pop("echo", None)
    if echo and stream:
        raise ApiError("`echo` with `stream` is not supported: ask for the whole answer", "echo")
    options = body.pop("stream_options", None)
    if options is not None and not (stream and isinstance(options, dict) and set(options) <= {"include_usage"}):
        raise ApiError("`stream_options` must be an object with `include_usage`, and only with `stream`: true",
                       "stream_options")
    include_usage = _flag(options or {}, "include_usage")
    if not text and "prompt_logprobs" in body:  # (computed, the answer would have no place for them)
        raise ApiError("`prompt_logprobs`: a chat completion does not give them here; /v1/completions gives a "
                       "prompt's logprobs with `echo` and `logprobs`", "prompt_logprobs")
    for name in IGNORED:
        body.pop(name, None)
    for name, why in SERVER_ONLY.items():
        if name in body:
            raise ApiError(f"`{name}` cannot be given in a request: {why}", name)
    request: dict = {}
    if model is not None and model != served:
        request["lora_name"] = model
    if text:  # (its logprobs: how many top ones, as top_logprobs says it for chat)
        top = body.pop("logprobs", None)
        logprobs, body["top_logprobs"] = top is not None, top
        names["top_logprobs"] = "logprobs"
    logprobs, top = logprobs if text else _flag(body, "logprobs"), body.pop("top_logprobs", None)
    body.pop("logprobs", None)
    if top is not None and (not isinstance(top, int) or isinstance(top, bool) or not 0 <= top <= MAX_TOP_LOGPROBS):
        field = names.get("top_logprobs", "top_logprobs")
        raise ApiError(f"`{field}` must be an integer from 0 to {MAX_TOP_LOGPROBS}, got {top!r}", field)
    if top is not None and not logprobs:
        raise ApiError("`top_logprobs` needs `logprobs`: true", "top_logprobs")
    if logprobs:  # (each token's own logprob comes with the top ones: at least one)
        request["num_logprobs"], names["num_logprobs"] = max(top or 0, 1), names.get("top_logprobs", "top_logprobs")
        if echo:  # the prompt's too: each token's, and as many top ones
            request["prompt_logprobs"], names["prompt_logprobs"] = top or 0, "logprobs"
    guide = _guide(body)
    if guide is not None:
        request["guided_decoding"], names["guided_decoding"] = guide
    for name, ours in RENAMED.items():
        if name in body:
            if ours in request or ours in body:
                other = names.get(ours, ours)
                raise ApiError(f"give one of `{name}` and `{other}` (the same setting)", name)
            request[ours], names[ours] = body.pop(name), name
    if isinstance(body.get("stop"), str):  # (OpenAI's one stop string)
        body["stop"] = [body["stop"]]
    if body.get("top_k") == -1:  # vLLM's "off"
        body["top_k"] = 0
    request.update(body)
    if text:  # (a server's chat settings: its prompt goes to the model as it is)
        defaults = {k: v for k, v in defaults.items() if k not in CHAT_ONLY}
    top_level = {k: v for k, v in defaults.items() if k in fmt.TOP_LEVEL and k not in request}
    own = {k: v for k, v in defaults.items() if k not in fmt.TOP_LEVEL and k not in request}
    # OpenAI's defaults where ours differ (a --set default still wins over them)
    openai = {"top_p": 1.0, "top_k": 0, "max_generate_length": 16 if text else capacity}
    for k, v in openai.items():
        if k not in request and k not in top_level and k not in own:
            own[k] = v
    top_level.update({k: request.pop(k) for k in list(request) if k in TOP_ONLY})
    if text:
        top_level["apply_chat_template"] = False
    return Translated({**top_level, "requests": [{**own, **request, **prompt} for prompt in prompts]}, stream,
                      include_usage, (top or 0) if logprobs else None, names, model or served, text, echo)


MAX_PROMPTS = 256  # prompts of one completions request


def _text_body(body: dict) -> tuple[dict, list[dict]]:
    """A completions body without its prompts, and each prompt as a request's: one user message, its
    text as it is (no template), or its token ids (OpenAI's array of integers: `prompt_token_ids`).
    `prompt` is one prompt, or an array of them (each a string or an array of ids)."""
    for name in ("messages", "prompt_token_ids"):
        if name in body:
            raise ApiError(f"`{name}`: /v1/completions takes a `prompt` (a string or an array of token ids)", name)
    prompt = body.pop("prompt", None)
    if isinstance(prompt, str) or _token_ids(prompt):
        prompt = [prompt]
    if not isinstance(prompt, list) or not 1 <= len(prompt) <= MAX_PROMPTS:
        raise ApiError(f"`prompt` must be a string, an array of token ids, or an array of 1 to {MAX_PROMPTS} of "
                       f"those, got {prompt!r:.60}", "prompt")
    prompts = []
    for i, p in enumerate(prompt):
        where = "prompt" if len(prompt) == 1 else f"prompt[{i}]"
        if not isinstance(p, str) and not _token_ids(p):
            raise ApiError(f"`{where}` must be a string or a non-empty array of token ids, got {p!r:.60}", where)
        prompts.append({"prompt_token_ids": p} if _token_ids(p) else {"messages": [{"role": "user", "content": p}]})
    if body.pop("suffix", ""):
        raise ApiError("`suffix` is not supported (no fill-in-the-middle)", "suffix")
    if body.get("best_of", body.get("n", 1)) != body.get("n", 1):
        raise ApiError("`best_of` must equal `n` (each sample is returned)", "best_of")
    body.pop("best_of", None)
    if "top_logprobs" in body:
        raise ApiError("`top_logprobs`: /v1/completions takes `logprobs` as the number of top tokens", "top_logprobs")
    if "prompt_logprobs" in body:  # (a completion's answer has no place for them but echo's)
        raise ApiError("`prompt_logprobs`: /v1/completions gives the prompt's logprobs with `echo` and `logprobs`",
                       "prompt_logprobs")
    if body.get("echo") and body.get("truncate_prompt_tokens") is not None:
        raise ApiError("`truncate_prompt_tokens` with `echo`: the echoed prompt would be the whole one, its tokens the "
                       "kept ones", "truncate_prompt_tokens")
    for name in CHAT_ONLY:
        if name in body:
            raise ApiError(f"`{name}`: /v1/completions sends its prompt as it is, with no chat template "
                           "(/v1/chat/completions takes it)", name)
    return body, prompts


def _token_ids(value: object) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(t, int) and not isinstance(t, bool)
                                                           for t in value)


# A body's fields that make its prompt's ids (/tokenize reads these)
PROMPT_FIELDS = frozenset({"prompt", "messages", "model", "tools", "chat_template_kwargs", "add_generation_prompt",
                           "continue_final_message", "enable_thinking", "default_system_prompt", "truncate_prompt_tokens",
                           "apply_chat_template"})


def counting_body(body: object) -> tuple[dict, bool, bool]:
    """vLLM's /tokenize body as a completions body (`prompt`) or a chat body (`messages`), whether the
    first, and its `return_token_strs`; without its own fields (`add_special_tokens`: the
    default of each, a completion's prompt with the tokenizer's own special tokens and a chat's
    with the template's, is all there is)."""
    if not isinstance(body, dict):
        raise ApiError("the body must be a JSON object")
    body = dict(body)
    text = "messages" not in body
    strs = body.pop("return_token_strs", None)
    if strs is not None and not isinstance(strs, bool):
        raise ApiError(f"`return_token_strs` must be true or false, got {strs!r}", "return_token_strs")
    special = body.pop("add_special_tokens", None)
    if special is not None and special is not text:
        raise ApiError(f"`add_special_tokens` must be {str(text).lower()} (or absent): "
                       f"{'a prompt is encoded with' if text else 'the chat template writes'} the special tokens, "
                       "as a request of the same body runs", "add_special_tokens")
    # what makes the prompt's ids; the rest (sampling, streaming, n, ...) changes none of them: left out
    # unread, so that a generation body counts as it is
    return {k: v for k, v in body.items() if k in PROMPT_FIELDS}, text, bool(strs)


def tokenized(ids: list[int], capacity: int, strs: bool, tokenizer) -> dict:
    """vLLM's /tokenize answer."""
    return {"count": len(ids), "max_model_len": capacity, "tokens": ids,
            "token_strs": [tokenizer.id_to_token(i) for i in ids] if strs else None}


def detokenize_ids(body: object, served: str, adapters: frozenset[str], vocab_size: int) -> list[int]:
    """vLLM's /detokenize body's `tokens`, each below the vocabulary size."""
    if not isinstance(body, dict):
        raise ApiError("the body must be a JSON object")
    unknown = set(body) - {"tokens", "model"}
    if unknown:
        raise ApiError(f"`{sorted(unknown)[0]}` is not a field of /detokenize (tokens, model)", sorted(unknown)[0])
    model = body.get("model")
    if model is not None and model != served and model not in adapters:
        raise ApiError(f"the model `{model}` does not exist here (served: {served})", "model", 404, "NotFoundError",
                       "model_not_found")
    ids = body.get("tokens")
    if ids != [] and not _token_ids(ids):  # (none: an empty text)
        raise ApiError(f"`tokens` must be an array of token ids, got {ids!r:.60}", "tokens")
    bad = next((j for j, t in enumerate(ids) if not 0 <= t < vocab_size), None)
    if bad is not None:
        raise ApiError(f"`tokens[{bad}]` must be a token id below the vocabulary size {vocab_size}, got {ids[bad]}",
                       f"tokens[{bad}]")
    return ids


def _guide(body: dict) -> tuple[dict, str] | None:
    """guided_decoding from response_format or vLLM's guided_* fields, and the field it came from."""
    given = [name for name in ("response_format", *GUIDES, "guided_decoding") if body.get(name) is not None]
    if len(given) > 1:
        raise ApiError(f"give one of {', '.join(f'`{n}`' for n in given)}", given[1])
    if not given:
        for name in ("response_format", *GUIDES):
            body.pop(name, None)
        return None
    name = given[0]
    if name == "guided_decoding":
        return None  # (ours, as it is)
    value = body.pop(name)
    if name in GUIDES:
        return {GUIDES[name]: value}, name
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"json_object": True}, "response_format"
    if kind == "json_schema" and isinstance(value.get("json_schema"), dict):
        return {"json_schema": value["json_schema"]}, "response_format.json_schema"
    raise ApiError("`response_format` must be {\"type\": \"text\"}, {\"type\": \"json_object\"} or "
                   "{\"type\": \"json_schema\", \"json_schema\": {\"name\", \"schema\"}}", "response_format")


# --- answers -------------------------------------------------------------------------------------

FINISH = {"end-of-sequence": "stop", "stop-words": "stop", "max-length": "length", "cancelled": "abort"}


def completion_id(t: Translated) -> str:
    return f"{'cmpl' if t.text else 'chatcmpl'}-{uuid.uuid4().hex}"


def finish_reason(response: dict) -> str:
    reason = FINISH.get(response["finish_reason"], response["finish_reason"])
    return "tool_calls" if reason == "stop" and response.get("tool_calls") else reason


def message(response: dict) -> dict:
    """A finished sample's message: its content, and where they were read, its reasoning and calls."""
    out = {"role": "assistant", "content": response.get("content", response["output_text"])}
    if "reasoning_content" in response:
        out["reasoning_content"] = response["reasoning_content"]
    if response.get("tool_calls"):
        out["tool_calls"] = response["tool_calls"]
    return out


def logprobs(steps: list, own: list, top: int | None) -> dict | None:
    """OpenAI's `logprobs` of the tokens whose top entries are `steps` and own entries `own`."""
    if top is None:
        return None
    return {"content": [{**_entry(mine), "top_logprobs": [_entry(e) for e in step[:top]]}
                        for mine, step in zip(own, steps)]}


def _entry(e: dict) -> dict:
    return {"token": e["token"], "logprob": e["logprob"] if e["logprob"] is not None else -9999.0,
            "bytes": e["bytes"]}


def usage(responses: list[dict], cached: int) -> dict:
    """Each prompt's tokens once (its n samples share it), and every generated one."""
    prompt = sum(r.get("prompt_tokens", 0) for r in responses if r.get("sample_idx", 0) == 0)
    generated = sum(r.get("output_tokens", 0) for r in responses)
    return {"prompt_tokens": prompt, "completion_tokens": generated, "total_tokens": prompt + generated,
            "prompt_tokens_details": {"cached_tokens": cached}}


def text_logprobs(steps: list, own: list, top: int | None, before: bytearray | None = None) -> dict | None:
    """The completions API's `logprobs`: tokens, their logprobs, the top ones as {token: logprob}
    and each token's offset in the text, in characters. `before`: the bytes of the tokens given
    before these (a stream's earlier chunks), to which these are added. An offset counts the
    characters whole before the token (a character split across tokens counts once, at its end)."""
    if top is None:
        return None
    before = bytearray() if before is None else before
    offsets = []
    for e in own:
        offsets.append(len(before.decode("utf-8", errors="ignore")))
        before += bytes(e["bytes"])
    return {"tokens": [e["token"] for e in own],
            "token_logprobs": [None if e.get("unscored") else _entry(e)["logprob"] for e in own],
            "top_logprobs": [None if step is None else {e["token"]: _entry(e)["logprob"] for e in step[:top]}
                             for step in steps],
            "text_offset": offsets}


def echoed(r: dict) -> tuple[str, list, list, bytearray | None]:
    """An echoed completion's text, its logprobs' top entries and own entries: the prompt's, then the
    answer's (the prompt's first token has none: null, as OpenAI gives it); and the bytes before them
    (None: none; the prompt's where it was not scored, a request ended before its prompt was)."""
    prompt_text = r.get("formatted_complete_request") or ""
    text = prompt_text + r["output_text"]
    if "prompt_first" not in r or "prompt_token_logprobs" not in r:
        return text, r.get("logprobs", []), r.get("token_logprobs", []), bytearray(prompt_text.encode())
    prompt = r["prompt_token_logprobs"][1:]
    steps = [None] + (r.get("prompt_logprobs") or [None, *([[]] * len(prompt))])[1:] + r.get("logprobs", [])
    return text, steps, [{**r["prompt_first"], "unscored": True}, *prompt, *r.get("token_logprobs", [])], None


def completion(cid: str, created: int, t: Translated, responses: list[dict], cached: int) -> dict:
    if t.text:
        choices = []
        for i, r in enumerate(responses):  # (a prompt's n choices after the one's before it: OpenAI's order)
            text, steps, own, before = echoed(r) if t.echo else (r["output_text"], r.get("logprobs", []),
                                                                  r.get("token_logprobs", []), None)
            choices.append({"index": i, "text": text, "finish_reason": finish_reason(r),
                            "logprobs": text_logprobs(steps, own, t.top_logprobs, before),
                            **({"stop_reason": r["stop_reason"]} if "stop_reason" in r else {})})
        return {"id": cid, "object": "text_completion", "created": created,
                "model": t.model, "choices": choices, "usage": usage(responses, cached)}
    choices = []
    for i, r in enumerate(responses):
        choice = {"index": i, "message": message(r), "logprobs": logprobs(r.get("logprobs", []),
                                                                           r.get("token_logprobs", []),
                                                                           t.top_logprobs),
                  "finish_reason": finish_reason(r)}
        if "stop_reason" in r:  # (vLLM's: the stop string or token id that ended it)
            choice["stop_reason"] = r["stop_reason"]
        choices.append(choice)
    return {"id": cid, "object": "chat.completion", "created": created, "model": t.model, "choices": choices,
            "usage": usage(responses, cached)}


def chunk(cid: str, created: int, t: Translated, choices: list[dict], usage_of: dict | None = None) -> dict:
    out = {"id": cid, "object": "text_completion" if t.text else "chat.completion.chunk", "created": created,
           "model": t.model, "choices": choices}
    if usage_of is not None:
        out["usage"] = usage_of
    return out


def delta_choice(index: int, text: str, fields: dict, t: Translated, finish: str | None = None,
                 sent: bytearray | None = None) -> dict | None:
    """A stream line of one sample as a chunk's choice (None: nothing to send). `sent`: the bytes of
    this choice's tokens in the chunks before (completions' text offsets go on from them)."""
    if t.text:
        lp = text_logprobs(fields.get("logprobs", []), fields.get("token_logprobs", []), t.top_logprobs, sent) \
            if fields.get("token_logprobs") else None
        if not text and lp is None and finish is None:
            return None
        return {"index": index, "text": text, "logprobs": lp, "finish_reason": finish}
    delta: dict = {}
    if "reasoning_text" in fields:
        delta["reasoning_content"] = fields["reasoning_text"]
    split = "content_text" in fields or "reasoning_text" in fields or "tool_call_deltas" in fields
    content = fields.get("content_text", "" if split else text)
    if content:
        delta["content"] = content
    if fields.get("tool_call_deltas"):
        delta["tool_calls"] = fields["tool_call_deltas"]
    lp = logprobs(fields.get("logprobs", []), fields.get("token_logprobs", []), t.top_logprobs) \
        if fields.get("token_logprobs") else None
    if not delta and lp is None and finish is None:
        return None
    return {"index": index, "delta": delta, "logprobs": lp, "finish_reason": finish}


def now() -> int:
    return int(time.time())
