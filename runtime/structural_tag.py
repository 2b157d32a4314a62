"""`guided_decoding.structural_tag`: free text in which tool calls are held to their schemas. Once a
trigger appears in the text (`<function=`), the answer must go on with one of the tags that begin
with it (`<function=get_weather>`), then JSON valid against that tag's schema, then its end
(`</function>`); then free text again. Two spellings are read, both as an object or a string of
JSON holding one:

- vLLM's (and SGLang's): {"type": "structural_tag", "structures": [{"begin", "schema", "end"}],
  "triggers": [...]};
- XGrammar's, which TensorRT Edge-LLM takes: {"type": "structural_tag", "format": {"type":
  "triggered_tags", "triggers": [...], "tags": [{"begin", "content": {"type": "json_schema",
  "json_schema": {...}}, "end"}]}}, with its `at_least_one` (the answer begins with a tag: no text
  before it) and `stop_after_first` (the answer ends with the first tag's end).

Both become a list of (trigger, begin, schema, end) and the two flags, which `lark` turns into an
llguidance grammar of lazy lexemes. Stdlib only, as runtime/guided.py.
"""
from __future__ import annotations

import json
import re

from trtllm.runtime.strict_json import array, boolean, check_keys, choice, fail, json_object, key_path, string

MAX_TAGS = 64


def parse(value: object, path: str, read_json, check_schema) -> dict:
    """{"tags", "at_least_one", "stop_after_first"}: the tags, each {"begin", "schema", "end",
    "trigger", "at"} (at: its schema's JSON path, where an error that only compiling finds is
    named), and XGrammar's two flags (false in vLLM's spelling); `read_json(text, path, what)` reads a
    string of JSON as strictly as the file, `check_schema(schema, path)` checks a schema's values."""
    what = "a structural tag (an object, or a string of JSON holding one)"
    if isinstance(value, str):
        value = read_json(value, path, what)
    obj = json_object(value, path, what)
    flags = {"at_least_one": False, "stop_after_first": False}
    if "format" in obj:
        check_keys(obj, path, ("type", "format"), "a structural tag")
        tags, triggers, flags = _triggered_tags(obj["format"], key_path(path, "format"))
    else:
        check_keys(obj, path, ("type", "structures", "triggers"), "a structural tag")
        for key in ("structures", "triggers"):
            if key not in obj:
                fail(key_path(path, key), "given (vLLM's structural tag needs it; or give XGrammar's `format`)",
                     None, shown="nothing")
        tags = [_tag(s, f"{path}.structures[{i}]")
                for i, s in enumerate(_items(obj["structures"], key_path(path, "structures"), "structures"))]
        triggers = _triggers(obj["triggers"], key_path(path, "triggers"))
    if "type" in obj:
        choice(("structural_tag",))(obj["type"], key_path(path, "type"))
    for tag in tags:
        at, schema = tag["at"], tag["schema"]  # (at: where a schema that does not compile is named)
        if isinstance(schema, str):  # a schema as a string of JSON, as for json_schema
            schema = tag["schema"] = read_json(schema, at, "a JSON schema")
        if not isinstance(schema, (dict, bool)):
            fail(at, "a JSON schema (an object or a boolean, or a string of JSON holding one)", schema)
        check_schema(schema, at)
        # the shortest trigger it begins with: the text that appears first on the way into this tag
        # (a longer one, "<f=w" beside "<f", is never reached: "<f" has fired by then)
        tag["trigger"] = min((t for t in triggers if tag["begin"].startswith(t)), key=len, default=None)
        if tag["trigger"] is None:
            fail(tag.pop("begin_at"), f"a string that begins with one of the triggers ({_shown(triggers)})",
                 tag["begin"])
        tag.pop("begin_at")
    return {"tags": tags, **flags}


def _triggered_tags(value: object, path: str) -> tuple[list[dict], list[str], dict[str, bool]]:
    fmt = json_object(value, path, "XGrammar's triggered_tags format")
    check_keys(fmt, path, ("type", "triggers", "tags", "at_least_one", "stop_after_first"), "a triggered_tags format")
    for key in ("type", "triggers", "tags"):
        if key not in fmt:
            fail(key_path(path, key), "given (a triggered_tags format needs it)", None, shown="nothing")
    choice(("triggered_tags",))(fmt["type"], key_path(path, "type"))
    flags = {key: fmt[key] if key in fmt and boolean(fmt[key], key_path(path, key)) else False
             for key in ("at_least_one", "stop_after_first")}
    tags = []
    for i, t in enumerate(_items(fmt["tags"], key_path(path, "tags"), "tags")):
        at = f"{path}.tags[{i}]"
        obj = json_object(t, at, "a tag")
        check_keys(obj, at, ("type", "begin", "content", "end"), "a tag")
        if "content" not in obj:
            fail(key_path(at, "content"), "given (a tag needs it)", None, shown="nothing")
        content = json_object(obj["content"], key_path(at, "content"), "a tag's content")
        check_keys(content, key_path(at, "content"), ("type", "json_schema"), "a tag's content")
        kind_at = key_path(key_path(at, "content"), "type")
        if content.get("type") != "json_schema":
            fail(kind_at, "'json_schema' (the one content kind implemented)", content.get("type"),
                 shown="" if "type" in content else "nothing")
        if "json_schema" not in content:
            fail(key_path(key_path(at, "content"), "json_schema"), "given", None, shown="nothing")
        flat = {k: v for k, v in obj.items() if k != "content"}
        tags.append(_tag({**flat, "schema": content["json_schema"]}, at,
                         schema_at=key_path(key_path(at, "content"), "json_schema")))
    return tags, _triggers(fmt["triggers"], key_path(path, "triggers")), flags


def _tag(value: object, path: str, schema_at: str | None = None) -> dict:
    """{"begin", "schema", "end"} read; `schema_at`: where the schema was written, if not beside them."""
    obj = json_object(value, path, "a tag: begin, schema, end")
    check_keys(obj, path, ("type", "begin", "schema", "end"), "a tag")
    if "type" in obj:
        choice(("tag",))(obj["type"], key_path(path, "type"))
    for key in ("begin", "schema", "end"):
        if key not in obj:
            fail(key_path(path, key), "given (a tag needs it)", None, shown="nothing")
    return {"begin": string(obj["begin"], key_path(path, "begin"), nonempty=True), "schema": obj["schema"],
            "end": string(obj["end"], key_path(path, "end")), "at": schema_at or key_path(path, "schema"),
            "begin_at": key_path(path, "begin")}


def _items(value: object, path: str, what: str) -> list:
    items = array(value, path, what, MAX_TAGS)
    if not items:
        fail(path, f"a non-empty array of at most {MAX_TAGS} {what}", value)
    return items


def _triggers(value: object, path: str) -> list[str]:
    return [string(t, f"{path}[{i}]", nonempty=True) for i, t in enumerate(_items(value, path, "triggers"))]


def _shown(triggers: list[str]) -> str:
    return ", ".join(repr(t) for t in triggers[:8]) + (", ..." if len(triggers) > 8 else "")


def lark(spec: dict, special: dict[str, int] | None = None) -> str:
    """llguidance's grammar for parse()'s tags (as its StructTag writes it): free text, in which a
    trigger is a lazy lexeme (the text before it ends where it first appears) that must go on as one
    of its tags; with at_least_one a tag first (its begin whole, no text before it), with
    stop_after_first nothing after the first tag. `special`: the tokenizer's special tokens (text ->
    id): one in a trigger, a begin or an end is matched as that token (<[id]>), not as its characters."""
    tags = spec["tags"]
    special = special or {}
    longest_first = sorted(special, key=len, reverse=True)
    split = re.compile("(" + "|".join(map(re.escape, longest_first)) + ")") if special else None

    def quoted(text: str) -> str:
        parts = split.split(text) if split else [text]  # (odd places: the special tokens)
        return " ".join(f"<[{special[p]}]>" if i % 2 else json.dumps(p) for i, p in enumerate(parts) if p)

    rules = []
    for i, tag in enumerate(tags):
        schema = {} if tag["schema"] is True else tag["schema"]  # (%json takes an object; false fails before)
        rest = f'%json {json.dumps(schema)} {quoted(tag["end"])}'
        body = f'{quoted(tag["begin"][len(tag["trigger"]):])} {rest}'
        rules.append(f'first_{i}: {quoted(tag["begin"])} {rest}')
        if tag["trigger"] in special:
            rules.append(f"tag_{i}: TAG_TEXT {quoted(tag['trigger'])} {body}")
        else:
            rules += [f"tag_{i}_trigger[lazy]: TAG_TEXT {quoted(tag['trigger'])}", f"tag_{i}: tag_{i}_trigger {body}"]
    options = "(" + " | ".join(f"tag_{i}" for i in range(len(tags))) + ")"
    first = "(" + " | ".join(f"first_{i}" for i in range(len(tags))) + ")"
    starts = {(False, False): f"{options}* TAG_TEXT", (True, False): f"{first} {options}* TAG_TEXT",
              (False, True): f"{options} | TAG_TEXT", (True, True): first}
    start = starts[spec["at_least_one"], spec["stop_after_first"]]
    return "\n".join(["%llguidance {}", f"start: {start}", r"TAG_TEXT: /(.|\n)*/", *rules]) + "\n"
