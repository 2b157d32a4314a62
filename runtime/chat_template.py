"""Chat templates rendered exactly like transformers' `apply_chat_template(..., tokenize=False)`.

Only jinja2 and the stdlib: this runs on the device. The environment mirrors transformers 5
(`transformers/utils/chat_template_utils.py`): an immutable sandbox with trim_blocks, lstrip_blocks,
loop controls and the `{% generation %}` tag, the `raise_exception`/`strftime_now` globals, a
`tojson` that does not HTML-escape, and a `namespace` that refuses underscore attributes. The
template sees `messages`, `add_generation_prompt`, `tools`/`documents` (None), the named special
tokens that are set (unset ones stay undefined, as in transformers) and any extra kwargs such as
`enable_thinking`.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import jinja2
import jinja2.ext
import jinja2.meta
import jinja2.nodes
import jinja2.utils
from jinja2.sandbox import ImmutableSandboxedEnvironment

# Names a message's reasoning may come under; transformers copies it to all of them.
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")
# Private-use characters: no real prompt starts with them and no template trims them away.
_USER_A, _USER_B = "\ue000user-a", "\ue001user-b"
_SYSTEM, _ASSISTANT, _USER_C = "\ue002system", "\ue003assistant", "\ue004user-c"


class ChatTemplateError(ValueError):
    """The chat template failed to compile or refused to render a conversation."""


class TemplateRaised(jinja2.TemplateError):
    """What the template's own `raise_exception(...)` throws."""


@dataclass(frozen=True)
class FormattedPrompt:
    text: str
    """The whole prompt, ready to tokenize (it already holds its special tokens)."""
    system_prefix: str
    """The part of `text` before the first user turn; always a prefix of `text`."""


def special_tokens_from_config(config: dict) -> dict[str, str]:
    """Named special tokens of a tokenizer_config.json, as transformers 5 collects them.

    Every "*_token" key (bos_token, eos_token, ... and model-specific ones like image_token) plus
    the dicts "extra_special_tokens" and "model_specific_special_tokens"; values are strings or
    AddedToken dicts with "content".
    """
    items = [(k, v) for k, v in config.items() if k.endswith("_token")]
    for key in ("extra_special_tokens", "model_specific_special_tokens"):
        if isinstance(config.get(key), dict):
            items += config[key].items()
    tokens = {}
    for name, value in items:
        if isinstance(value, dict):
            value = value.get("content")
        if isinstance(value, str):
            tokens[name] = value
    return tokens


def raw_prompt(messages: list[dict]) -> FormattedPrompt:
    """The prompt used without a chat template: message contents joined by newlines."""
    return FormattedPrompt(text="\n".join(str(m.get("content", "")) for m in messages), system_prefix="")


class _GenerationTag(jinja2.ext.Extension):
    # transformers tracks `{% generation %}` spans for assistant masks; for rendering the tag only
    # has to parse and output its body, or templates that use it would not compile.
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller):
        return caller()


class _Namespace(jinja2.utils.Namespace):
    # Same guard as transformers: underscore attributes would reach CPython internals.
    def __init__(*args, **kwargs):
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _Namespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name, value):
        _Namespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name):
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"namespace attribute must not start with '_', got {name!r}")


class _Dict:
    # A callable stand-in for `dict` that exposes no class internals to the template.
    def __call__(self, *args, **kwargs):
        return dict(*args, **kwargs)

    def fromkeys(self, *args, **kwargs):
        return dict.fromkeys(*args, **kwargs)


def _raise_exception(message):
    raise TemplateRaised(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # jinja's own tojson HTML-escapes `<>&'`, which would change what the model sees.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format):
    return datetime.now().strftime(format)


def _compile(source: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now, dict=_Dict(),
                       namespace=_Namespace)
    try:
        return env.from_string(source)
    except jinja2.TemplateError as e:
        raise ChatTemplateError(f"chat template does not compile: {e}") from e


def _normalize(messages: list[dict]) -> list[dict]:
    """Copies of the messages as transformers hands them to the template.

    Keys whose value is None are dropped (templates handle a missing key but print "None"), and a
    message's reasoning is copied under every name templates read it by.
    """
    out = []
    for message in messages:
        if not isinstance(message, dict):
            raise ChatTemplateError(f"messages must be dicts, got {message!r}")
        message = {k: v for k, v in message.items() if v is not None}
        reasoning = next((message[k] for k in _REASONING_FIELDS if k in message), None)
        if reasoning is not None:
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        out.append(message)
    return out


def _common_prefix_len(a: str, b: str) -> int:
    """By bisection over slice comparisons, which run in C: a character loop in Python took 28 ms
    per call on a 120,000-character system prompt, two or three calls per request."""
    lo, hi = 0, min(len(a), len(b))  # a[:lo] == b[:lo]; the answer is <= hi
    if a[:hi] == b[:hi]:
        return hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def _common_suffix(a: str, b: str) -> str:
    n = _common_prefix_len(a[::-1], b[::-1])
    return a[len(a) - n:] if n else ""


def _with_content(messages: list[dict], index: int, content: str) -> list[dict]:
    return [dict(m, content=content) if i == index else m for i, m in enumerate(messages)]


class ChatTemplate:
    """A compiled chat template plus the special tokens it may print."""

    def __init__(self, source: str, special_tokens: dict[str, str | None]):
        self.source = source
        self.special_tokens = {k: v for k, v in special_tokens.items() if v is not None}
        self._template = _compile(source)
        # A template that loops over a message's content takes a list of typed parts (Gemma 3 trims
        # each text part and reads only a system message's first): such content goes to it as the
        # list, as transformers passes it. Others get the text joined (_TAKES_PARTS).
        self.takes_parts = bool(_TAKES_PARTS.search(source))
        self._headers: dict = {}  # _user_header's, per (add_generation_prompt, kwargs): the same for every request
        # the variables it reads from the caller (tools, enable_thinking, ...), found in its syntax tree
        self._reads = frozenset(jinja2.meta.find_undeclared_variables(self._template.environment.parse(source)))
        self.tool_use: ChatTemplate | None = None  # a tokenizer's template named "tool_use" (for_tools)
        self.tools_only = False  # the tokenizer's one template is named "tool_use": no default one

    def for_tools(self, tools) -> ChatTemplate:
        """The template a request renders with: the one named "tool_use" where the request gives
        tools and the tokenizer has one (Hermes 2 Pro/3, Command R), as transformers chooses; a
        tokenizer with no default template has none for a request without tools (transformers
        raises there too)."""
        if tools is None and self.tools_only:
            raise ChatTemplateError("the engine's one chat template is named 'tool_use' and has no default: give "
                                    "tools, or apply_chat_template false")
        return self.tool_use if tools is not None and self.tool_use is not None else self

    def reads(self, name: str) -> bool:
        """Whether the template reads the variable `name` (a template that never reads `tools`
        would leave a request's tools unseen)."""
        return name in self._reads

    @classmethod
    def from_engine_dir(cls, engine_dir, files: dict | None = None) -> ChatTemplate | None:
        """Loads chat_template.jinja, else tokenizer_config.json's "chat_template"; None if neither.
        `files`: the manifest's (the names the build wrote); the usual names without one."""
        engine_dir, files = Path(engine_dir), files or {}
        config_path = engine_dir / files.get("tokenizer_config", "tokenizer_config.json")
        config = json.loads(config_path.read_text(encoding="utf-8")) if config_path.exists() else {}
        jinja_path = engine_dir / files.get("chat_template", "chat_template.jinja")
        # (save_pretrained writes a named template to additional_chat_templates/NAME.jinja; older
        # tokenizer_config.json files hold a list of {name, template})
        tool_use = engine_dir / "additional_chat_templates" / "tool_use.jinja"
        tools_source = tool_use.read_text(encoding="utf-8") if tool_use.is_file() else \
            _named(config.get("chat_template"), "tool_use")
        if jinja_path.exists():
            source = jinja_path.read_text(encoding="utf-8")
        else:
            source = _template_from_config(config.get("chat_template"), config_path, tools_source is not None)
        if source is None and tools_source is None:
            return None
        template = cls(source or tools_source, special_tokens_from_config(config))
        template.tools_only = source is None  # (a GGUF's tokenizer.chat_template.tool_use alone)
        if tools_source is not None:
            template.tool_use = template if source is None else cls(tools_source, special_tokens_from_config(config))
        return template

    def render(self, messages: list[dict], add_generation_prompt: bool = True, **kwargs) -> str:
        """The prompt text, exactly as transformers' apply_chat_template(tokenize=False) gives it.

        Unlike transformers an empty `messages` list is rendered, not refused, when the template
        allows it.
        """
        # kwargs win, as in transformers (`tools`: the tool definitions, none by default)
        variables = {**self.special_tokens, "tools": None, "documents": None, **kwargs}
        messages = _normalize(messages)
        try:
            return self._template.render(messages=messages, add_generation_prompt=add_generation_prompt, **variables)
        except TemplateRaised as e:
            raise ChatTemplateError(f"chat template rejected the conversation: {e.message}") from e
        except MemoryError:
            raise
        except Exception as e:  # noqa: BLE001 - a 1 / 0, a RecursionError: as much the template's as a TypeError
            # A template is someone else's code: any failure in it is this request's error.
            raise ChatTemplateError(f"chat template failed to render: {type(e).__name__}: {e}") from e

    def format(self, messages: list[dict], add_generation_prompt: bool = True,
               default_system_prompt: str | None = None, continue_final_message: bool = False,
               **kwargs) -> FormattedPrompt:
        """Renders `messages` and finds the system prefix (see `_system_prefix` for the rule).

        `default_system_prompt` is prepended as a system message when `messages` has none.
        `continue_final_message`: the text ends inside the last message (`render_continued`), and
        no generation prompt follows it.
        """
        if default_system_prompt is not None and not any(m.get("role") == "system" for m in messages):
            messages = [{"role": "system", "content": default_system_prompt}, *messages]
        if continue_final_message:
            add_generation_prompt = False
            text = self.render_continued(messages, **kwargs)
        else:
            text = self.render(messages, add_generation_prompt, **kwargs)
        prefix = self._system_prefix(messages, text, add_generation_prompt, kwargs)
        if continue_final_message and not text.startswith(prefix):  # (the message continued is a system one)
            prefix = ""
        assert text.startswith(prefix), (prefix, text)
        return FormattedPrompt(text=text, system_prefix=prefix)

    def render_continued(self, messages: list[dict], **kwargs) -> str:
        """The conversation rendered up to the end of its last message's text, so that the answer
        continues that message (an assistant turn begun by the caller), exactly as transformers'
        apply_chat_template(continue_final_message=True): the text gets a marker, and the render is
        cut where the marker is (before the spaces the template trimmed, if it trimmed any)."""
        if not messages:
            raise ChatTemplateError("continue_final_message: the conversation is empty")
        if "content" not in self.source:
            raise ChatTemplateError("continue_final_message: the chat template does not read a message's content")
        last = dict(messages[-1])
        content = last.get("content")
        if isinstance(content, str):
            final, last["content"] = content, content + CONTINUE_TAG
        else:
            parts = [dict(p) if isinstance(p, dict) else p for p in content or []]
            at = next((i for i in reversed(range(len(parts))) if isinstance(parts[i], dict) and "text" in parts[i]),
                      None)
            if at is None:
                raise ChatTemplateError("continue_final_message: the last message has no text to continue")
            final = parts[at]["text"]
            parts[at]["text"] = final + CONTINUE_TAG
            last["content"] = parts
        text = self.render([*messages[:-1], last], add_generation_prompt=False, **kwargs)
        if final.strip() not in text or CONTINUE_TAG.strip() not in text:
            raise ChatTemplateError("continue_final_message: the chat template drops part of the last message, "
                                    "so the prompt cannot end inside it")
        at = text.rindex(CONTINUE_TAG.strip())
        return text[:at] if text[at:at + len(CONTINUE_TAG)] == CONTINUE_TAG else text[:at].rstrip()

    def _try_render(self, messages, add_generation_prompt, kwargs) -> str | None:
        try:
            return self.render(messages, add_generation_prompt, **kwargs)
        except ChatTemplateError:
            return None

    def _system_prefix(self, messages, text, add_generation_prompt, kwargs) -> str:
        """The text before the first user turn.

        P is the text before the first user message's content: the common prefix of two renders
        that differ only in that content. Then, with R the render of the messages before it alone:
          1. system text given and R (a prefix of P) holds all of it: R (ChatML, Llama-3, Qwen3);
          2. system text given and merged into the user turn (it lies in P but not in R): P, less
             the user header if P ends with it and the system text survives the cut (Gemma,
             Llama-2 `<<SYS>>`; also templates whose R differs, e.g. ends with an eos);
          3. no system text before the user turn (none given, a default injected by the template,
             or moved to a later turn): P less the user-turn header H (`_user_header`), the cut
             moved past any special token it would split. "" when that cannot be found.
        Without a user message (e.g. only an assistant turn to continue) it is the prefix the
        leading system messages would get before a user turn, so that a template's injected default
        system prompt counts the same with or without one; if `text` does not start with that, it
        is the render of the leading system messages alone.
        """
        first_user = next((i for i, m in enumerate(messages) if m.get("role") == "user"), None)
        if first_user is None:
            num_system = next((i for i, m in enumerate(messages) if m.get("role") != "system"), len(messages))
            probe = [*messages[:num_system], {"role": "user", "content": _USER_A}]
            probe_text = self._try_render(probe, add_generation_prompt, kwargs)
            if probe_text is not None:
                prefix = self._system_prefix(probe, probe_text, add_generation_prompt, kwargs)
                if prefix and text.startswith(prefix):
                    return prefix
            alone = self._try_render(messages[:num_system], False, kwargs) or ""
            return text[:_common_prefix_len(alone, text)]
        render_a = self._try_render(_with_content(messages, first_user, _USER_A), add_generation_prompt, kwargs)
        render_b = self._try_render(_with_content(messages, first_user, _USER_B), add_generation_prompt, kwargs)
        if render_a is None or render_b is None:
            return ""
        before = render_a[:_common_prefix_len(render_a, render_b)]
        before = before[:_common_prefix_len(before, text)]
        leading = messages[:first_user]
        system_texts = [m["content"].strip() for m in leading
                        if isinstance(m.get("content"), str) and m["content"].strip()]
        if system_texts:
            alone = self._try_render(leading, False, kwargs)
            if alone and before.startswith(alone) and all(t in alone for t in system_texts):
                return alone
            if all(t in before for t in system_texts):
                header = self._user_header(add_generation_prompt, kwargs)
                trimmed = before[:len(before) - len(header)] if before.endswith(header) else before
                return trimmed if all(t in trimmed for t in system_texts) else before
        header = self._user_header(add_generation_prompt, kwargs)
        if not header or not before.endswith(header):
            return ""
        return before[:self._snap(before, len(before) - len(header))]

    def _user_header(self, add_generation_prompt, kwargs) -> str:
        try:
            key = (add_generation_prompt, tuple(sorted(kwargs.items())))
            hash(key)
        except TypeError:  # (a value that is not hashable: found again)
            return self._find_user_header(add_generation_prompt, kwargs)
        if key not in self._headers:
            self._headers[key] = self._find_user_header(add_generation_prompt, kwargs)
        return self._headers[key]

    def _find_user_header(self, add_generation_prompt, kwargs) -> str:
        """The text a user turn starts with, e.g. "<|im_start|>user\\n"; "" if not found.

        First from [system, user]: what lies between the system turn rendered alone and the user
        content. Templates without a system turn of their own: the common end of the text before
        the first and before a later user content, which may overreach into the previous turn's
        closing text (`_snap` repairs the cases where that splits a special token).
        """
        pair = [{"role": "system", "content": _SYSTEM}, {"role": "user", "content": _USER_A}]
        render_a = self._try_render(pair, add_generation_prompt, kwargs)
        render_b = self._try_render(_with_content(pair, 1, _USER_B), add_generation_prompt, kwargs)
        alone = self._try_render(pair[:1], False, kwargs)
        if render_a and render_b and alone and _SYSTEM in alone:
            before = render_a[:_common_prefix_len(render_a, render_b)]
            if before.startswith(alone):
                return before[len(alone):]
        chat = [{"role": "user", "content": _USER_A}, {"role": "assistant", "content": _ASSISTANT},
                {"role": "user", "content": _USER_C}]
        rendered = self._try_render(chat, add_generation_prompt, kwargs)
        if not rendered or _USER_A not in rendered or _USER_C not in rendered:
            return ""
        return _common_suffix(rendered[:rendered.index(_USER_A)], rendered[:rendered.index(_USER_C)])

    def _snap(self, text: str, cut: int) -> int:
        """Moves `cut` to the end of a special token it would fall inside."""
        for token in self.special_tokens.values():
            # An occurrence starting in [cut - len + 1, cut - 1] straddles the cut.
            start = text.find(token, max(0, cut - len(token) + 1), cut + len(token) - 1) if token else -1
            if start >= 0:
                cut = start + len(token)
        return cut


CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "  # transformers' marker for continue_final_message
# A loop over a message's content (SmolVLM's, LLaVA's, Gemma 3's, Llama 4's), as vLLM detects the
# templates that take parts: a test of its type alone does not say the template reads a list (Qwen3
# and SmolLM3 make a list '', Llama 3.1 prints it as Python text)
_TAKES_PARTS = re.compile(r"""for\s+\w+\s+in\s+\w+(?:\[['"]content['"]\]|\.content\b)""")


def _named(value, name: str) -> str | None:
    """A template of that name in tokenizer_config.json's list of {name, template}, else None."""
    named = {item.get("name"): item.get("template") for item in value if isinstance(item, dict)} \
        if isinstance(value, list) else {}
    return named.get(name) if isinstance(named.get(name), str) else None


def _template_from_config(value, config_path: Path, tool_use: bool = False) -> str | None:
    """tokenizer_config.json's "chat_template": a string or a list of {name, template} (without a
    default one, None where a "tool_use" one is there)."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list):
        if (default := _named(value, "default")) is not None or tool_use:
            return default
        names = {item.get("name") for item in value if isinstance(item, dict)}
        raise ChatTemplateError(f"{config_path}: chat_template must have a template named 'default', "
                                f"got names {sorted(map(str, names))}")
    raise ChatTemplateError(f"{config_path}: chat_template must be a string or a list of "
                            f"{{name, template}}, got {type(value).__name__}")
