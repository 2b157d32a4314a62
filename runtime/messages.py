"""The messages of a request (runtime/input_format.py reads the rest of the file): a role, content
(a string or typed items), and the fields tool use adds (an assistant's `tool_calls` and
`reasoning_content`, a tool result's `tool_call_id`, a `name`), which chat templates read as
transformers hands them over. Each is checked as strictly as the rest of the file and every error
names its JSON path. Stdlib only."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass

from trtllm.runtime.strict_json import (
    array as _array,
    boolean as _bool,
    check_keys as _check_keys,
    check_duplicates,
    check_value,
    choice as _choice,
    compact,
    InputError,
    each as _each,
    fail as _fail,
    raise_all,
    json_object as _object,
    key_path,
    number as _number,
    one_of as _one_of,
    read_json,
    string as _string,
)

MAX_MESSAGES = 64
MAX_CONTENT_ITEMS = 18
MAX_CONTENT_BYTES = 128 * 1024  # one text content, UTF-8 bytes
MAX_NAME_BYTES = 256  # a message's name or tool_call_id, UTF-8 bytes (OpenAI's names are 64 characters)
ROLES = ("system", "user", "assistant", "tool")
CONTENT_TYPES = ("text", "image", "audio", "video")
MEDIA_TYPES = frozenset({"image", "audio", "video"})
MAX_FRAMES = 1024  # a video's frames
MAX_TOOLS = 128
MAX_TOOL_CALLS = 64
MAX_TOOLS_BYTES = 128 * 1024  # a request's tools, or a message's tool calls, as compact JSON in UTF-8


@dataclass(frozen=True, slots=True)
class ContentItem:
    type: str  # one of CONTENT_TYPES
    value: str  # the text, or the media file path (as written; not checked here); "" for frames
    do_resize: bool | None = None  # images and videos; None = not given
    frames: tuple[str, ...] = ()  # a video as Edge-LLM (after 0.10) gives one: its frames' paths, in order
    fps: float | None = None      # with frames; None = not given (Edge-LLM's default 1.0)

    def to_json(self) -> dict:
        out: dict = {"type": self.type, **({"frames": list(self.frames)} if self.frames else {self.type: self.value})}
        for key in ("fps", "do_resize"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        return out


@dataclass(frozen=True, slots=True)
class Message:
    role: str  # one of ROLES
    content: str | tuple[ContentItem, ...]
    extra: tuple[tuple[str, object], ...] = ()  # (key, value) of EXTRA_FIELDS it gives, in its order

    def fields(self) -> dict:
        """Its tool-use fields, as a chat template reads them: a tool call's `arguments` given as a
        string of JSON (OpenAI's shape) as the value it holds, none or empty as {}, as vLLM hands them
        over (templates write them with `tojson`, which would quote a string)."""
        out = dict(self.extra)
        if "tool_calls" in out:
            out["tool_calls"] = [_template_call(call) for call in out["tool_calls"]]
        return out

    def text_bytes(self) -> int:
        """The UTF-8 bytes of its text and its reasoning_content: what a request's total counts."""
        reasoning = dict(self.extra).get("reasoning_content")
        return len(self.text().encode("utf-8")) + (len(reasoning.encode("utf-8")) if isinstance(reasoning, str) else 0)

    def text(self) -> str:
        """The text parts joined with "" (string content returned as is)."""
        if isinstance(self.content, str):
            return self.content
        return "".join(item.value for item in self.content if item.type == "text")

    def parts(self) -> str | list[dict]:
        """The content as a chat template that takes typed parts reads it: a string as is, else the
        list of {"type": "text", "text": ...} items."""
        return self.content if isinstance(self.content, str) else [item.to_json() for item in self.content]

    def to_json(self) -> dict:
        """Echo form for the output file: content is always an array of typed items."""
        if isinstance(self.content, str):
            items = [{"type": "text", "text": self.content}]
        else:
            items = [item.to_json() for item in self.content]
        return {"role": self.role, "content": items, **dict(self.extra)}


def parse_text(value: object, path: str) -> str:
    text = _string(value, path)
    num_bytes = len(text.encode("utf-8"))
    if num_bytes > MAX_CONTENT_BYTES:
        _fail(path, f"at most {MAX_CONTENT_BYTES} UTF-8 bytes (128 KiB)", value,
              shown=f"{num_bytes} bytes")
    return text


def _short_name(value: object, path: str) -> str:
    text = _string(value, path, nonempty=True)
    num_bytes = len(text.encode("utf-8"))
    if num_bytes > MAX_NAME_BYTES:
        _fail(path, f"at most {MAX_NAME_BYTES} UTF-8 bytes", value, shown=f"{num_bytes} bytes")
    return text


_fps = _number(float, 0, lo_open=True)


def _content_item(value: object, path: str) -> ContentItem:
    obj = _object(value, path, "a content item")
    _check_keys(obj, path, ("type", *CONTENT_TYPES, "do_resize", "frames", "fps"), "a content item")
    if "type" not in obj:
        _fail(f"{path}.type", "given (a content item needs it)", None, shown="nothing")
    kind = _choice(CONTENT_TYPES)(obj["type"], f"{path}.type")
    allowed = {"image": ("type", kind, "do_resize"), "video": ("type", kind, "frames", "fps", "do_resize")}.get(
        kind, ("type", kind))
    for key in obj:
        if key not in allowed:
            _fail(f"{path}.{key}", f"absent from an item of type {kind!r} (it takes only "
                  f"{_one_of(allowed)})", obj[key])
    frames = kind == "video" and "frames" in obj
    if frames == (kind in obj):  # a video is a file or its frames (Edge-LLM's), one of them
        need = "one of `video` (a file) and `frames` (its frames' files)" if kind == "video" else "it"
        _fail(f"{path}.{kind}", f"given (an item of type {kind!r} needs {need})", None,
              shown="`frames` too" if frames else "nothing")
    if "fps" in obj and not frames:
        _fail(f"{path}.fps", "absent without `frames` (the frame rate of a video given as frames)", obj["fps"])
    if frames:
        paths = _array(obj["frames"], f"{path}.frames", "frame paths", MAX_FRAMES)
        paths = tuple(_each(paths, f"{path}.frames", lambda v, p: _string(v, p, nonempty=True))) or _fail(
            f"{path}.frames", "a non-empty array of frame paths", [])
        fps = _fps(obj["fps"], f"{path}.fps") if "fps" in obj else None
    parse = parse_text if kind == "text" else lambda v, p: _string(v, p, nonempty=True)
    item_value = "" if frames else parse(obj[kind], f"{path}.{kind}")
    do_resize = _bool(obj["do_resize"], f"{path}.do_resize") if "do_resize" in obj else None
    return ContentItem(kind, item_value, do_resize, *((paths, fps) if frames else ()))


def _content(value: object, path: str) -> str | tuple[ContentItem, ...]:
    if isinstance(value, str):
        return parse_text(value, path)
    if not isinstance(value, list) or len(value) > MAX_CONTENT_ITEMS:
        _fail(path, f"a string or an array of at most {MAX_CONTENT_ITEMS} content items", value)
    return tuple(_each(value, path, _content_item))


def _tool_calls(value: object, path: str) -> list:
    calls = _array(value, path, "tool calls (objects)", MAX_TOOL_CALLS)
    _each(calls, path, lambda call, at: check_value(
        _object(call, at, 'a tool call: {"type": "function", "function": {"name", "arguments"}}'), at))
    for i, call in enumerate(calls):  # (a template gets the value a string of JSON holds: _template_call)
        args = call["function"].get("arguments") if isinstance(call.get("function"), dict) else None
        if isinstance(args, str) and args:
            at = f"{path}[{i}].function.arguments"  # (held to what the file's own values are held to)
            check_value(read_json(args, at, "an object, or a string of JSON (OpenAI's shape)"), at)
    _sized(calls, path, "tool calls")
    return calls


def _template_call(call: dict) -> dict:
    """A tool call as vLLM hands it to a chat template: `arguments` as the value its string of JSON
    holds, and {} where it is missing, null or empty."""
    function = call.get("function")
    if not isinstance(function, dict):
        return call
    args = function.get("arguments")
    if not args:
        args = {}
    elif isinstance(args, str):
        args = json.loads(args)  # (read_json checked it when the file was read)
    return {**call, "function": {**function, "arguments": args}}


def _sized(value: list, path: str, what: str) -> None:
    """At most MAX_TOOLS_BYTES of compact JSON (text is held to its limits; this is text too)."""
    size = len(compact(value, path, what).encode("utf-8"))
    if size > MAX_TOOLS_BYTES:
        _fail(path, f"at most {MAX_TOOLS_BYTES} UTF-8 bytes (128 KiB) of JSON", None, shown=f"{size} bytes")


# name -> (parser, the roles that may give it)
EXTRA_FIELDS = {
    "tool_calls": (_tool_calls, ("assistant",)),
    "reasoning_content": (parse_text, ("assistant",)),
    "tool_call_id": (_short_name, ("tool",)),
    "name": (_short_name, ROLES),
}


def _message(value: object, path: str) -> Message:
    """Every bad part of the message is reported (raise_all), not only the first."""
    obj = _object(value, path, "a message")
    _check_keys(obj, path, ("role", "content", *EXTRA_FIELDS), "a message")
    errors: list[InputError] = []

    def part(parse, *args):
        try:
            return parse(*args)
        except InputError as e:
            errors.append(e)

    for key in ("role", "content"):
        if key not in obj and not (key == "content" and "tool_calls" in obj):  # (a turn that only calls tools)
            errors.append(InputError(f"{path}.{key}", f"`{path}.{key}` must be given (a message needs it), "
                                                      "got nothing"))
    role = part(_choice(ROLES), obj["role"], f"{path}.role") if "role" in obj else None
    extra = []
    for key, value in obj.items():
        if key in EXTRA_FIELDS:
            parse, roles = EXTRA_FIELDS[key]
            if role is not None and role not in roles:
                part(_fail, f"{path}.{key}", f"absent from a message of role {role!r} (a field of "
                     f"{_one_of(roles)} ones)", value)
            else:
                extra.append((key, part(parse, value, f"{path}.{key}")))
    content = obj.get("content")
    if content is None and "tool_calls" in obj:  # OpenAI's shape of a turn that only calls tools
        content = ""
    content = part(_content, content, f"{path}.content") if content is not None or "content" in obj else None
    raise_all(errors)
    return Message(role, content, tuple(extra))


def parse_messages(value: object, path: str) -> tuple[Message, ...]:
    return tuple(_each(_array(value, path, "messages", MAX_MESSAGES), path, _message))


def parse_tools(value: object, path: str) -> tuple[dict, ...]:
    """`tools`: the tool definitions a chat template shows the model (OpenAI's
    {"type": "function", "function": {"name", "description", "parameters"}}), passed as given."""
    tools = _array(value, path, "tool definitions (objects)", MAX_TOOLS)
    _each(tools, path, lambda tool, at: check_value(
        _object(tool, at, 'a tool: {"type": "function", "function": {"name", "parameters"}}'), at))
    _sized(tools, path, "tool definitions")
    return tuple(tools)


# What the runtime itself passes a chat template, which chat_template_kwargs may not replace
RESERVED_KWARGS = ("messages", "add_generation_prompt", "tools", "documents", "continue_final_message")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def parse_template_kwargs(value: object, path: str) -> dict:
    """`chat_template_kwargs` (vLLM's): more variables for the chat template (`enable_thinking`,
    `reasoning_effort`, ...), name -> any JSON value, as transformers' apply_chat_template(**kwargs)."""
    obj = _object(value, path, "variable name -> value, for the chat template")
    check_duplicates(obj, lambda key: key_path(path, key))
    for key, item in obj.items():
        at = key_path(path, key)
        if not isinstance(key, str) or not _NAME.fullmatch(key):
            _fail(at, "keyed by a template variable's name (letters, digits, _)", key)
        if key in RESERVED_KWARGS:
            _fail(at, f"a variable other than {_one_of(RESERVED_KWARGS)} (the runtime passes those; `{key}` has a field "
                  "of its own or none)", key)
        check_value(item, at)
    _sized([obj], path, "chat template variables")
    return dict(obj)


def readable_messages(request: object, i: int) -> tuple[Message, ...]:
    """A request that could not be read still echoes its conversation where that reads (its error
    is elsewhere), so that its error response says which it was; else none."""
    try:
        return parse_messages(request["messages"], f"requests[{i}].messages") if isinstance(request, dict) else ()
    except Exception:  # noqa: BLE001 - only the echo: its request's own error says what is wrong
        return ()
