"""`guided_decoding.structural_tag`: an answer of free text and structured parts, as XGrammar's
structural tags (which TensorRT Edge-LLM takes) and vLLM's describe one. Two spellings are read,
both as an object or a string of JSON holding one:

- vLLM's (and SGLang's): {"type": "structural_tag", "structures": [{"begin", "schema", "end"}],
  "triggers": [...]}: free text in which, once a trigger appears (`<function=`), the answer goes on
  as one of the tags that begin with it (`<function=get_weather>`), JSON valid against its schema,
  its end; then free text again. It reads as XGrammar's `triggered_tags` of those tags.
- XGrammar's: {"type": "structural_tag", "format": F}, F a tree of format objects: `const_string`,
  `json_schema` (style "json"), `regex`, `any_text`, `sequence`, `or`, `optional`, `plus`, `star`,
  `repeat`, `tag`, `triggered_tags` (with `at_least_one`: a tag first, no text before it, and
  `stop_after_first`: nothing after the first tag), `tags_with_separator` and `token` (a special
  token). Others (`grammar`, `dispatch`, the token-level dispatchers) are refused by name.

As in XGrammar, free text inside a tag (`any_text`, a `triggered_tags`'s text) ends where the
tag's end first appears. `parse` checks the tree (errors name their JSON path) and `lark` turns it
into an llguidance grammar, whose lazy lexemes are those ends and triggers. Stdlib only, as
runtime/guided.py.
"""
from __future__ import annotations

import json
import re

from trtllm.runtime.strict_json import (array, boolean, check_keys, choice, fail, json_object, key_path, number,
                                        string)

MAX_TAGS = 64      # tags, triggers or elements in one list
MAX_NODES = 1024   # format objects in one structural tag
MAX_DEPTH = 64     # format objects inside each other
MAX_REPEAT = 1024
FORMATS = ("const_string", "json_schema", "regex", "any_text", "sequence", "or", "optional", "plus", "star",
           "repeat", "tag", "triggered_tags", "tags_with_separator", "token")
REFUSED = ("grammar", "dispatch", "exclude_token", "any_tokens", "token_triggered_tags", "token_dispatch")
KEYS = {"const_string": ("value",), "json_schema": ("json_schema", "style", "any_order"), "regex": ("pattern",),
        "any_text": ("excludes", "max_tokens", "max_chars"), "sequence": ("elements",), "or": ("elements",),
        "optional": ("content",), "plus": ("content",), "star": ("content",), "repeat": ("min", "max", "content"),
        "tag": ("begin", "content", "end"),
        "triggered_tags": ("triggers", "tags", "at_least_one", "stop_after_first", "excludes"),
        "tags_with_separator": ("tags", "separator", "at_least_one", "stop_after_first"), "token": ("token",)}
OPTIONAL = {"style", "any_order", "excludes", "max_tokens", "max_chars", "at_least_one", "stop_after_first"}


def parse(value: object, path: str, read_json, check_schema) -> dict:
    """{"format": the tree}, each node checked, and a json_schema node's "at" the JSON path of its
    schema (where an error only compiling finds is named). `read_json(text, path, what)` reads a
    string of JSON as strictly as the file, `check_schema(schema, path)` checks a schema's values."""
    what = "a structural tag (an object, or a string of JSON holding one)"
    if isinstance(value, str):
        value = read_json(value, path, what)
    obj = json_object(value, path, what)
    reader = _Reader(read_json, check_schema)
    if "format" in obj:
        check_keys(obj, path, ("type", "format"), "a structural tag")
        root = reader.node(obj["format"], key_path(path, "format"))
    else:
        check_keys(obj, path, ("type", "structures", "triggers"), "a structural tag")
        for key in ("structures", "triggers"):
            if key not in obj:
                fail(key_path(path, key), "given (vLLM's structural tag needs it; or give XGrammar's `format`)",
                     None, shown="nothing")
        at = key_path(path, "structures")
        tags = [reader.structure(s, f"{at}[{i}]") for i, s in enumerate(_items(obj["structures"], at, "structures"))]
        root = reader.triggered({"triggers": obj["triggers"], "tags": tags}, path, tags_read=True)
    if "type" in obj:
        choice(("structural_tag",))(obj["type"], key_path(path, "type"))
    return {"format": root}


def parts(spec: dict):
    """The nodes that compile alone (json_schema, regex, token), each with its "at" path: where a
    tree that does not compile is named, by the part that does not alone."""
    stack = [spec["format"]]
    while stack:
        node = stack.pop()
        if node["type"] in ("json_schema", "regex", "token"):
            yield node
        stack += [*node.get("elements", ()), *node.get("tags", ()), *([node["content"]] if "content" in node else []),
                  *(node[k] for k in ("begin", "end") if isinstance(node.get(k), dict))]


def _items(value: object, path: str, what: str) -> list:
    items = array(value, path, what, MAX_TAGS)
    if not items:
        fail(path, f"a non-empty array of at most {MAX_TAGS} {what}", value)
    return items


def _shown(triggers: list[str]) -> str:
    return ", ".join(repr(t) for t in triggers[:8]) + (", ..." if len(triggers) > 8 else "")


class _Reader:
    def __init__(self, read_json, check_schema):
        self.read_json, self.check_schema, self.count, self.depth = read_json, check_schema, 0, 0

    def node(self, value: object, path: str, kind: str | None = None) -> dict:
        """One format object (`kind`: the type it must be, which it may then leave out)."""
        self.count += 1
        if self.count > MAX_NODES:
            fail(path, f"within a structural tag of at most {MAX_NODES} format objects", None, shown="more")
        if self.depth >= MAX_DEPTH:
            fail(path, f"at most {MAX_DEPTH} format objects deep", None, shown="deeper")
        self.depth += 1
        try:
            return self.read(value, path, kind)
        finally:
            self.depth -= 1

    def read(self, value: object, path: str, kind: str | None) -> dict:
        obj = json_object(value, path, 'a format object: {"type": ...}')
        if kind is None and "type" not in obj:
            fail(key_path(path, "type"), "given (a format object needs it)", None, shown="nothing")
        want, kind = kind, obj.get("type", kind)
        if kind in REFUSED and want is None:
            fail(key_path(path, "type"), f"a format implemented here ({', '.join(FORMATS)})", kind)
        choice((want,) if want else FORMATS)(kind, key_path(path, "type"))
        check_keys(obj, path, ("type", *KEYS[kind]), f"a {kind} format")
        for key in KEYS[kind]:
            if key not in obj and key not in OPTIONAL:
                fail(key_path(path, key), f"given (a {kind} format needs it)", None, shown="nothing")
        return getattr(self, kind)(obj, path)

    def const_string(self, obj, path):
        return {"type": "const_string", "value": string(obj["value"], key_path(path, "value"))}

    def json_schema(self, obj, path, at: str | None = None):
        at = at or key_path(path, "json_schema")
        if obj.get("style", "json") != "json":
            fail(key_path(path, "style"), "'json' (the one style implemented)", obj["style"])
        if "any_order" in obj and boolean(obj["any_order"], key_path(path, "any_order")):
            fail(key_path(path, "any_order"), "false (`any_order` is not implemented)", True)
        schema = obj["json_schema"]
        if isinstance(schema, str):  # a schema as a string of JSON, as for json_schema
            schema = self.read_json(schema, at, "a JSON schema")
        if not isinstance(schema, (dict, bool)):
            fail(at, "a JSON schema (an object or a boolean, or a string of JSON holding one)", schema)
        self.check_schema(schema, at)
        return {"type": "json_schema", "json_schema": schema, "at": at}

    def regex(self, obj, path):
        at = key_path(path, "pattern")
        return {"type": "regex", "pattern": string(obj["pattern"], at, nonempty=True), "at": at}

    def any_text(self, obj, path):
        for key in ("max_tokens", "max_chars"):
            if obj.get(key) is not None:
                fail(key_path(path, key), f"absent (`{key}` is not implemented)", obj[key])
        return {"type": "any_text", "excludes": self.excludes(obj, path), "at": path}

    def excludes(self, obj, path) -> list[str]:
        """Texts the free text may not contain (XGrammar's `excludes`)."""
        at = key_path(path, "excludes")
        items = array(obj.get("excludes", []), at, "texts", MAX_TAGS)
        return [string(e, f"{at}[{i}]", nonempty=True) for i, e in enumerate(items)]

    def sequence(self, obj, path, kind="sequence"):
        at = key_path(path, "elements")
        return {"type": kind, "elements": [self.node(e, f"{at}[{i}]") for i, e in
                                           enumerate(_items(obj["elements"], at, "format objects"))]}

    def or_(self, obj, path):
        return self.sequence(obj, path, "or")

    def optional(self, obj, path, kind="optional"):
        return {"type": kind, "content": self.node(obj["content"], key_path(path, "content"))}

    def plus(self, obj, path):
        return self.optional(obj, path, "plus")

    def star(self, obj, path):
        return self.optional(obj, path, "star")

    def repeat(self, obj, path):
        low = number(int, 0, MAX_REPEAT)(obj["min"], key_path(path, "min"))
        high = number(int, -1, MAX_REPEAT)(obj["max"], key_path(path, "max"))
        if 0 <= high < low:
            fail(key_path(path, "max"), f">= `min` ({low}), or -1 (no limit)", high)
        return {"type": "repeat", "min": low, "max": high, "content": self.node(obj["content"], key_path(path, "content"))}

    def tag(self, obj, path, text_begin: bool = False):
        begin, end = obj["begin"], obj["end"]
        if text_begin or isinstance(begin, str):
            begin = string(begin, key_path(path, "begin"), nonempty=True)
        else:
            begin = self.node(begin, key_path(path, "begin"), "token")
        if isinstance(end, list):
            end = [string(e, f"{key_path(path, 'end')}[{i}]", nonempty=True)
                   for i, e in enumerate(_items(end, key_path(path, "end"), "ends"))]
        elif isinstance(end, str):
            end = string(end, key_path(path, "end"))  # ("" as vLLM's: what the content is ends it)
        else:
            end = self.node(end, key_path(path, "end"), "token")
        return {"type": "tag", "begin": begin, "content": self.node(obj["content"], key_path(path, "content")),
                "end": end}

    def structure(self, value, path):
        """vLLM's {"begin", "schema", "end"}: a tag of a JSON schema."""
        obj = json_object(value, path, "a tag: begin, schema, end")
        check_keys(obj, path, ("type", "begin", "schema", "end"), "a tag")
        if "type" in obj:
            choice(("tag",))(obj["type"], key_path(path, "type"))
        for key in ("begin", "schema", "end"):
            if key not in obj:
                fail(key_path(path, key), "given (a tag needs it)", None, shown="nothing")
        content = self.json_schema({"json_schema": obj["schema"]}, path, key_path(path, "schema"))
        return {"type": "tag", "begin": string(obj["begin"], key_path(path, "begin"), nonempty=True),
                "content": content, "end": string(obj["end"], key_path(path, "end"))}

    def flags(self, obj, path) -> dict:
        return {key: bool(key in obj and boolean(obj[key], key_path(path, key)))
                for key in ("at_least_one", "stop_after_first")}

    def triggered(self, obj, path, tags_read: bool = False):
        """Each tag goes under the shortest trigger its begin starts with: the text that appears first
        on the way into it (a longer one, "<f=w" beside "<f", is never reached: "<f" has fired)."""
        excludes = self.excludes(obj, path)
        at = key_path(path, "triggers")
        triggers = [string(t, f"{at}[{i}]", nonempty=True) for i, t in enumerate(_items(obj["triggers"], at, "triggers"))]
        where = key_path(path, "structures" if tags_read else "tags")
        tags = obj["tags"] if tags_read else [self.node(t, f"{where}[{i}]", "tag") for i, t in
                                              enumerate(_items(obj["tags"], where, "tags"))]
        for i, tag in enumerate(tags):
            if not isinstance(tag["begin"], str):
                fail(f"{where}[{i}].begin", "a string (a triggered tag begins with text)", None, shown="a token")
            tag["trigger"] = min((t for t in triggers if tag["begin"].startswith(t)), key=len, default=None)
            if tag["trigger"] is None:
                fail(f"{where}[{i}].begin", f"a string that begins with one of the triggers ({_shown(triggers)})",
                     tag["begin"])
        return {"type": "triggered_tags", "tags": tags, "excludes": excludes, "at": path, **self.flags(obj, path)}

    def triggered_tags(self, obj, path):
        return self.triggered(obj, path)

    def tags_with_separator(self, obj, path):
        at = key_path(path, "tags")
        tags = [self.node(t, f"{at}[{i}]", "tag") for i, t in enumerate(_items(obj["tags"], at, "tags"))]
        return {"type": "tags_with_separator", "tags": tags,
                "separator": string(obj["separator"], key_path(path, "separator")), **self.flags(obj, path)}

    def token(self, obj, path):
        token = obj["token"]
        if not isinstance(token, str):
            token = number(int, 0)(token, key_path(path, "token"))
        elif not token:
            fail(key_path(path, "token"), "a token id or a special token's text", token)
        return {"type": "token", "token": token, "at": key_path(path, "token")}


setattr(_Reader, "or", _Reader.or_)


class _Writer:
    """The lark rules of one tree: `expr(node, end)` is the node's expression and whether it took
    the enclosing tag's `end` (free text up to it is a lazy lexeme that ends with it)."""

    def __init__(self, special: dict[str, int]):
        self.special, self.rules = special, []
        longest_first = sorted(special, key=len, reverse=True)
        self.split = re.compile("(" + "|".join(map(re.escape, longest_first)) + ")") if special else None

    def quoted(self, text: str) -> str:
        """A special token of the tokenizer inside is matched as that token (<[id]>), not as text."""
        parts = self.split.split(text) if self.split else [text]  # (odd places: the special tokens)
        return " ".join(f"<[{self.special[p]}]>" if i % 2 else json.dumps(p) for i, p in enumerate(parts) if p) \
            or '""'

    def closing(self, end, at: str = "") -> str:
        """How free text before `end` can stop: "lazy" (the end is text: the text stops where it first
        appears), "token" (every alternative begins with a special token, which no text holds),
        "" (no end). An end that mixes the two is refused: neither way stops before it."""
        if end is None:
            return ""
        alternatives = end if isinstance(end, list) else [end]
        kinds = {"token" if not isinstance(e, str) or (self.split and self.split.match(e)) else
                 "mixed" if self.split and self.split.search(e) else "lazy" if e else "" for e in alternatives}
        if len(kinds) > 1 or "mixed" in kinds:
            raise ValueError(f"`{at}`: an end {json.dumps(end)} that mixes text and special tokens cannot close "
                             "the free text before it")
        return kinds.pop()

    def piece(self, item) -> str:
        """A begin or end: text, texts (one of them) or a token."""
        if isinstance(item, list):
            return "(" + " | ".join(map(self.quoted, item)) + ")"
        if isinstance(item, str):
            return self.quoted(item)
        token = item["token"]
        if isinstance(token, str):
            if token not in self.special:
                raise ValueError(f"`{item['at']}`: {token!r} is not a special token of the tokenizer; give its id")
            token = self.special[token]
        return f"<[{token}]>"

    def rule(self, body: str, lazy: bool = False) -> str:
        name = f"r{len(self.rules)}"
        self.rules.append(f"{name}{'[lazy]' if lazy else ''}: {body}")
        return name

    def text(self, excludes: list[str]) -> str:
        """The lexeme of free text: any, or any that holds none of `excludes`."""
        if not excludes:
            return "TAG_TEXT"
        name = f"TEXT_{len(self.rules)}"
        banned = " | ".join(json.dumps(e) for e in excludes)
        anything = r"/(.|\n)*/"
        self.rules.append(f"{name}: {anything} & ~({anything} ({banned}) {anything})")
        return name

    def until(self, end, text: str = "TAG_TEXT") -> str:
        """Free text up to the end's first appearance, the end included."""
        return self.rule(f"{text} {self.piece(end)}", lazy=True)

    def free(self, node: dict, end, tail: bool) -> tuple[str, bool] | None:
        """How free text (`any_text`, a `triggered_tags`'s) ends: lazily at a text end (taking it),
        at a special-token end or the answer's end (greedy); elsewhere it would never end."""
        how = self.closing(end, node["at"])
        if how == "lazy":
            return self.until(end, self.text(node.get("excludes", []))), True
        if how == "token" or tail:
            return self.text(node.get("excludes", [])), False
        raise ValueError(f"`{node['at']}`: free text here would never end (it is not last, and what follows "
                         "it is not a tag's end, a const_string or a tag's text begin)")

    def expr(self, node: dict, end=None, tail: bool = False) -> tuple[str, bool]:
        """(lark, whether it took `end`): `end` is the text or token that follows it (a tag's end,
        or in a sequence the next const_string or tag begin), `tail` that nothing follows it."""
        kind = node["type"]
        if kind == "const_string":
            return self.quoted(node["value"]), False
        if kind == "json_schema":
            schema = {} if node["json_schema"] is True else node["json_schema"]  # (%json takes an object)
            return f"%json {json.dumps(schema)}", False
        if kind == "regex":  # (a match followed by text stops where that text first follows it)
            regex = "/" + slashes(node["pattern"]) + "/"
            textual = isinstance(end, (str, list)) and all(e and not (self.split and self.split.search(e))
                                                            for e in (end if isinstance(end, list) else [end]))
            return (self.rule(f"{regex} {self.piece(end)}", lazy=True), True) if textual else (regex, False)
        if kind == "any_text":
            return self.free(node, end, tail)
        if kind == "sequence":
            return self.sequence(node["elements"], end, tail)
        if kind == "or":
            alts = [self.expr(e, end, tail) for e in node["elements"]]
            took = any(t for _, t in alts)
            return "(" + " | ".join(e if t or not took else f"{e} {self.piece(end)}" for e, t in alts) + ")", took
        if kind == "optional":
            content, took = self.expr(node["content"], end, tail)
            return (f"({content} | {self.piece(end)})", True) if took else (f"({content})?", False)
        if kind in ("plus", "star"):
            return f"({self.expr(node['content'])[0]}){'+' if kind == 'plus' else '*'}", False
        if kind == "repeat":
            high = "" if node["max"] < 0 else node["max"]
            return f"({self.expr(node['content'])[0]}){{{node['min']},{high}}}", False
        if kind == "tag":
            return f"{self.piece(node['begin'])} {self.tag_rest(node, tail)}", False
        if kind == "token":
            return self.piece(node), False
        if kind == "tags_with_separator":
            one = "(" + " | ".join(self.expr(t)[0] for t in node["tags"]) + ")"
            many = one if node["stop_after_first"] else f"{one} ({self.quoted(node['separator'])} {one})*"
            return (many if node["at_least_one"] else f"({many})?"), False
        return self.triggered(node, end, tail)

    def tag_rest(self, tag: dict, tail: bool = False) -> str:
        """A tag after its begin: its content and end (an empty end leaves its content last, if the
        tag is)."""
        content, took = self.expr(tag["content"], tag["end"], tail and tag["end"] == "")
        return content + ("" if took else f" {self.piece(tag['end'])}")

    def sequence(self, elements: list, end, tail: bool) -> tuple[str, bool]:
        """Free text before a const_string or a tag with a text begin stops at it (lazily, taking it),
        as before a tag's end."""
        parts, took = [], False
        for i, node in enumerate(elements):
            after = elements[i + 1] if i + 1 < len(elements) else None
            if after is None:
                part, took = self.expr(node, end, tail)
                parts.append(part)
                break
            stop = {"const_string": lambda: after["value"], "tag": lambda: after["begin"],
                    "token": lambda: after}.get(after["type"], lambda: None)()
            part, took = self.expr(node, stop or None)
            parts.append(part)
            if took:  # (what follows began with the stop: its rest, or nothing of a const_string)
                elements[i + 1] = {"type": "const_string", "value": ""} if after["type"] == "const_string" else {
                    **after, "begin": ""}
        return " ".join(p for p in parts if p != '""'), took

    def triggered(self, node: dict, end, tail: bool) -> tuple[str, bool]:
        """Free text in which a trigger is a lazy lexeme (the text before it ends where it first
        appears) that must go on as one of its tags; with at_least_one a tag first (its begin whole,
        no text before it), with stop_after_first nothing after the first tag."""
        options, firsts, free = [], [], self.text(node.get("excludes", []))
        for tag in node["tags"]:
            rest = self.tag_rest(tag)
            trigger, after = tag["trigger"], self.quoted(tag["begin"][len(tag["trigger"]):])
            if trigger not in self.special and self.split and self.split.search(trigger):
                raise ValueError(f"`{node['at']}`: a trigger {trigger!r} that holds a special token must be that "
                                 "token alone")
            if self.split and any(m.start() < len(trigger) < m.end() for m in self.split.finditer(tag["begin"])):
                raise ValueError(f"`{node['at']}`: the trigger {trigger!r} ends inside a special token of the begin "
                                 f"{tag['begin']!r} (make the trigger that token, or end before it)")
            if trigger in self.special:
                options.append(self.rule(f"{free} {self.quoted(trigger)} {after} {rest}"))
            else:
                options.append(self.rule(f"{self.rule(f'{free} {self.quoted(trigger)}', lazy=True)} {after} {rest}"))
            firsts.append(self.rule(f"{self.quoted(tag['begin'])} {rest}"))
        tags, first = "(" + " | ".join(options) + ")", "(" + " | ".join(firsts) + ")"
        text, lazy = self.free(node, end, tail)
        close = self.piece(end) if lazy else ""
        start = {(False, False): f"{tags}* {text}", (True, False): f"{first} {tags}* {text}",
                 (False, True): f"({tags} {close} | {text})", (True, True): f"{first} {close}"}
        return start[node["at_least_one"], node["stop_after_first"]], lazy


def slashes(pattern: str) -> str:
    """The pattern inside lark's /.../: each slash escaped that is not already (as `\\/`)."""
    out, escaped = [], False
    for c in pattern:
        out.append("\\/" if c == "/" and not escaped else c)
        escaped = c == "\\" and not escaped
    return "".join(out)


def lark(spec: dict, special: dict[str, int] | None = None) -> str:
    """llguidance's grammar for parse()'s tree. `special`: the tokenizer's special tokens (text ->
    id): one in a trigger, a begin, an end or a const_string is matched as that token, not as its
    characters; a `token` format names one, or an id. Raises ValueError for a token it cannot find."""
    writer = _Writer(special or {})
    start, _ = writer.expr(json.loads(json.dumps(spec["format"])), tail=True)  # (a copy: sequence edits it)
    return "\n".join(["%llguidance {}", f"start: {start}", r"TAG_TEXT: /(.|\n)*/", *writer.rules]) + "\n"
