"""JSON read a piece at a time and written back as `json.dumps(json.loads(text), ensure_ascii=False)`
writes it, as far as it is certain: what --stream gives of a tool call's arguments before the call
ends (runtime/tool_pieces.py), so that the pieces make the call's final `arguments`. Stdlib only:
this runs on the device.

A value's string is given a character at a time (a key once whole); a number once what follows
ends it (`1` may become `10`), then as Python writes it (`1E2` is `100.0`); a literal once whole.
Text that json.loads refuses makes the reader `bad`: it gives nothing more. What json.loads takes
but a call's arguments cannot hold (NaN, 1e400, a lone surrogate), and a key written twice
(json.loads keeps the last one's value at the first one's place), are `flaws`, noted against the
top-level member they are in; the text goes on as written, and the caller decides (a flaw in a
call's name or arguments stops its pieces; one in another member does not matter)."""
from __future__ import annotations

import json
import re

BLANKS = " \t\n\r"
ENDS_SCALAR = frozenset(BLANKS + ',:[]{}"')  # (a number or literal runs to one of these)
NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
LITERALS = ("true", "false", "null")
NON_FINITE = ("NaN", "Infinity", "-Infinity")  # (json.loads takes them; no call can hold them)
ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
HEX = frozenset("0123456789abcdefABCDEF")


class Frame:
    """An object or array being read: what it waits for next, and an object's keys so far."""
    __slots__ = ("kind", "wants", "keys", "key")

    def __init__(self, kind: str):
        self.kind = kind        # "{" or "["
        self.wants = "first"    # first (a key or value, or the end), key, colon, value, next (a comma or the end)
        self.keys: set[str] = set()
        self.key: str | None = None  # the member whose value is being read


class Reader:
    """One JSON value, fed as text comes (`feed`). `out` holds its canonical text so far as pieces
    (never joined in place: a caller takes what came since, `size` long in all). `done` once the value
    is whole (`end`: how much of the text fed it took), `bad` where json.loads would refuse it. For a
    top-level object: `members`, each member's key -> [start, end] of its value in the canonical
    text (end None while it is read), `strings` the members whose value is a string, decoded, and
    `flaws`, member key (None: the top level itself) -> "value" or "duplicate"."""

    def __init__(self):
        self.out: list[str] = []
        self.size = 0
        self.stack: list[Frame] = []
        self.started = self.done = self.bad = False
        self.end: int | None = None
        self.fed = 0
        self.members: dict[str, list] = {}
        self.strings: dict[str, str] = {}
        self.flaws: dict[str | None, str] = {}
        self.string: list[str] | None = None  # a string's decoded characters, while one is read
        self.is_key = False
        self.escape: str | None = None  # an escape being read: "\\", "\\uXX.."
        self.high: int | None = None    # a high surrogate's escape, waiting for its low one
        self.scalar: list[str] = []     # a number or literal being read, a character each

    def text(self) -> str:
        return "".join(self.out)

    def put(self, s: str) -> None:
        self.out.append(s)
        self.size += len(s)

    def feed(self, text: str) -> None:
        for c in text:
            if self.done or self.bad:
                return
            self.fed += 1
            self.step(c)
            if self.done and self.end is None:
                self.end = self.fed

    def finish(self) -> None:
        """The text has ended: a top-level number is whole."""
        if self.scalar and not self.stack and not self.done and not self.bad:
            self.close_scalar()
            if self.done:
                self.end = self.fed

    def fail(self) -> None:
        self.bad = True

    def flaw(self, kind: str, key: str | None = None) -> None:
        """A value json.loads takes and a call cannot hold, or a key written twice, in the top-level
        member being read (`key`: a key of the top level itself)."""
        reading_key = self.string is not None and self.is_key and len(self.stack) == 1
        if key is None and self.stack and self.stack[0].kind == "{" and not reading_key:
            key = self.stack[0].key  # (a top-level key's own flaw: the top level's, None; never a member's)
        self.flaws.setdefault(key, kind)

    # --- one character -----------------------------------------------------------------------

    def step(self, c: str) -> None:
        if self.string is not None:
            return self.string_char(c)
        if self.scalar:
            if c not in ENDS_SCALAR:
                self.scalar.append(c)
                if len(self.scalar) <= 5 and "".join(self.scalar) in LITERALS:  # (whole: more would be no JSON)
                    self.close_scalar()
                return
            self.close_scalar()
            if self.done:  # (a top-level number: c is not the value's)
                self.end = self.fed - 1
            if self.bad or self.done:
                return
        if c in BLANKS:
            return
        frame = self.stack[-1] if self.stack else None
        if frame is None:
            if self.started:
                return self.fail()
            self.started = True
            return self.value(c)
        if frame.wants in ("first", "key") and frame.kind == "{":
            if c == '"':
                self.string, self.is_key = [], True
            elif c == "}" and frame.wants == "first":
                self.close()
            else:
                self.fail()
        elif frame.wants == "colon":
            if c != ":":
                return self.fail()
            self.put(": ")
            frame.wants = "value"
        elif frame.wants in ("value", "first"):  # (an array's first: a value or its end)
            if c == "]" and frame.wants == "first":
                return self.close()
            self.value(c)
        elif frame.wants == "next":
            if c == ",":
                self.put(", ")
                frame.wants = "key" if frame.kind == "{" else "value"
            elif c == ("}" if frame.kind == "{" else "]"):
                self.close()
            else:
                self.fail()

    def value(self, c: str) -> None:
        """A value begins with c."""
        if len(self.stack) == 1 and self.stack[0].kind == "{":
            self.members[self.stack[0].key] = [self.size, None]
        if c in "{[":
            self.put(c)
            self.stack.append(Frame(c))
        elif c == '"':
            self.string, self.is_key = [], False
            self.put('"')
        elif c not in ENDS_SCALAR:
            self.scalar = [c]
        else:
            self.fail()

    def valued(self) -> None:
        """A value just ended: its container waits for the next member, or the whole is done."""
        if not self.stack:
            self.done = True
            return
        frame = self.stack[-1]
        if len(self.stack) == 1 and frame.kind == "{":
            self.members[frame.key][1] = self.size
        frame.wants = "next"

    def close(self) -> None:
        frame = self.stack.pop()
        self.put("}" if frame.kind == "{" else "]")
        self.valued()

    def close_scalar(self) -> None:
        s, self.scalar = "".join(self.scalar), []
        if s in LITERALS:
            self.put(s)
        elif s in NON_FINITE:
            self.flaw("value")
            self.put(s)
        elif NUMBER.fullmatch(s):
            try:
                number = json.loads(s)
            except ValueError:  # an integer of more digits than Python converts: json.loads refuses it
                return self.fail()
            if number in (float("inf"), float("-inf")):  # (1e400: json.loads takes it, a call cannot)
                self.flaw("value")
                self.put(s)
            else:
                self.put(json.dumps(number))
        else:
            return self.fail()
        self.valued()

    def string_char(self, c: str) -> None:
        if self.escape is not None:
            self.escape += c
            if len(self.escape) == 2 and c != "u":
                if c not in ESCAPES:
                    return self.fail()
                self.escape = None
                self.alone()
                return self.char(ESCAPES[c])
            if len(self.escape) > 2:
                if c not in HEX:
                    return self.fail()
                if len(self.escape) == 6:
                    code, self.escape = int(self.escape[2:], 16), None
                    return self.code_unit(code)
            return
        if c == "\\":
            self.escape = c
            return
        self.alone()  # (a high surrogate's escape, then no escape: it stands alone)
        if c == '"':
            self.end_string()
        elif ord(c) < 0x20:  # (json.loads refuses raw control characters in a string)
            self.fail()
        else:
            self.char(c)

    def alone(self) -> None:
        """A high surrogate not followed by its low one: json.loads keeps it alone, which no UTF-8
        text (and so no call) can hold."""
        if self.high is not None:
            code, self.high = self.high, None
            self.flaw("value")
            self.char(chr(code))

    def code_unit(self, code: int) -> None:
        """A \\uXXXX escape: a surrogate pair makes one character."""
        if self.high is not None and 0xDC00 <= code <= 0xDFFF:
            code, self.high = 0x10000 + ((self.high - 0xD800) << 10) + (code - 0xDC00), None
        else:
            self.alone()
            if 0xD800 <= code <= 0xDBFF:
                self.high = code
                return
            if 0xDC00 <= code <= 0xDFFF:
                self.flaw("value")
        self.char(chr(code))

    def char(self, c: str) -> None:
        self.string.append(c)
        if not self.is_key:  # (json.dumps writes all but quotes, backslashes and controls as they are)
            self.put(c if c not in '"\\' and c >= " " else json.dumps(c, ensure_ascii=False)[1:-1])

    def end_string(self) -> None:
        text, self.string = "".join(self.string), None
        if self.is_key:
            frame = self.stack[-1]
            if text in frame.keys and len(self.stack) == 1:  # (deeper in: given as written, which
                self.flaw("duplicate", text)                # json.loads reads as the value it keeps)
            frame.keys.add(text)
            frame.key, frame.wants = text, "colon"
            self.put(json.dumps(text, ensure_ascii=False))
            return
        self.put('"')
        if len(self.stack) == 1 and self.stack[0].kind == "{":
            self.strings[self.stack[0].key] = text
        self.valued()
