"""A tool call's arguments as --stream gives them while the model writes them (vLLM's tool-call
deltas): the call's first delta once its name is read, `{"index", "id", "type", "function": {"name",
"arguments": ""}}`, then `{"index", "function": {"arguments": piece}}` as they come, the pieces
making the call's final `arguments` (the JSON the model wrote, as json.dumps writes it: a number or
literal once whole, runtime/json_pieces.py). Read for the JSON call formats: hermes, mistral (both
forms), llama3_json, a "required" or named tool choice; pythonic calls come whole (tool_stream.py).
Anything that would not read as a call (a marker not followed by JSON, a key given twice) stops the
pieces; the calls then come whole as they end. Stdlib only: this runs on the device."""
from __future__ import annotations

import json

from trtllm.runtime.json_pieces import BLANKS, Reader
from trtllm.runtime.tool_calls import HERMES, MISTRAL, PYTHON_TAG, ToolChoice, call_id

ARGS = "[ARGS]"  # mistral v11: `name[ARGS]{...}`


class Pieces:
    """An answer read for its calls' arguments as it comes: `push` each piece of its content, get
    the deltas it makes. Formats without JSON calls (pythonic) have no pieces: `active` False."""

    def __init__(self, tc: ToolChoice | None, parser: str | None, key: str, parallel: bool = True):
        self.key, self.parser, self.parallel = key, parser, parallel
        self.name = tc.name if tc is not None and tc.mode == "function" else None  # (known: the answer is its arguments)
        self.form = ("function" if self.name else "required" if tc is not None and tc.mode == "required"
                     else parser)
        self.active = self.form in ("function", "required", "hermes", "mistral", "llama3_json")
        self.arg_keys = ("parameters",) if self.form == "required" else ("arguments", "parameters")
        self.phase = {"hermes": "marker", "mistral": "marker", "required": "list", "function": "value"}.get(
            self.form, "tag")
        self.text, self.pos = "", 0
        self.scan = 0          # where the search for mistral's [ARGS] goes on from
        self.reader: Reader | None = None
        self.reader_at = 0     # where in the text the reader began
        self.index = 0         # the call being read
        self.opened = False    # its first delta given
        self.given = ""        # its arguments given so far
        self.all_given: dict[int, str] = {}  # each opened call's arguments given (tool_stream reconciles)
        self.call_name: str | None = None

    def stop(self) -> bool:
        """Give no more pieces (False: for `advance`)."""
        self.active = False
        return False

    def push(self, piece: str, final: bool = False) -> list[dict]:
        if not self.active:
            return []
        self.text += piece
        deltas: list[dict] = []
        while self.active and self.advance(deltas, final):
            pass
        return deltas

    def advance(self, deltas: list, final: bool) -> bool:
        """One step of the reading; False where it waits for more text (or has stopped)."""
        if self.phase == "call":
            return self.read_call(deltas, final)
        at = self.skip_blanks()
        if self.phase == "marker":  # (hermes, mistral: the next call's marker, anywhere)
            marker = HERMES if self.form == "hermes" else MISTRAL
            found = self.text.find(marker, self.pos)
            if found < 0:
                self.pos = max(self.pos, len(self.text) - len(marker) + 1)
                return False
            self.pos, self.phase, self.call_name = found + len(marker), "opened", None
            return True
        if at >= len(self.text):
            return False
        c = self.text[at]
        if self.phase == "opened":
            if self.form == "mistral" and c != "[":  # (v11: the name, then [ARGS])
                self.phase = "name"
                return True
            if self.form == "mistral":
                self.pos, self.phase = at + 1, "item"
                return True
            return self.begin(at, c == "{")
        if self.phase == "name":
            found = self.text.find(ARGS, max(self.pos, self.scan))
            if found < 0:
                self.scan = len(self.text) - len(ARGS) + 1  # (a line does not search the name again)
                return False
            self.call_name, self.pos, self.phase = self.text[self.pos:found].strip(), found + len(ARGS), "value"
            return True
        if self.phase == "value":  # (the arguments alone: a named tool choice, mistral v11)
            return self.begin(at, True)
        if self.phase == "tag":  # (llama3_json: an optional <|python_tag|> first)
            rest = self.text[at:at + len(PYTHON_TAG)]
            if PYTHON_TAG.startswith(rest) and len(rest) < len(PYTHON_TAG):
                return False
            self.phase = "object"
            self.pos = at + len(PYTHON_TAG) if rest == PYTHON_TAG else at
            return True
        if self.phase in ("list", "item"):  # "required"'s list, mistral v3's: its items
            if self.phase == "list":
                return self.step_over(at, c == "[", "item")
            return self.begin(at, c == "{")
        if self.phase == "object":
            return self.begin(at, c == "{")
        if self.phase == "next":  # after a list's item
            if c == ",":
                self.pos, self.phase = at + 1, "item"
                return True
            self.pos, self.phase = at + 1, "marker" if self.form == "mistral" else "end"
            return c == "]" or self.stop()  # (mistral: the next marker may begin more calls)
        if self.phase == "separator":  # llama3_json: `;` between calls
            return self.step_over(at, c == ";", "object")
        self.stop()  # "end": anything after the calls is no answer of calls
        return False

    def skip_blanks(self) -> int:
        at = self.pos
        while at < len(self.text) and self.text[at] in BLANKS:
            at += 1
        if self.phase not in ("marker", "name"):
            self.pos = at
        return at

    def step_over(self, at: int, ok: bool, phase: str) -> bool:
        if not ok:
            return self.stop()
        self.pos, self.phase = at + 1, phase
        return True

    def begin(self, at: int, ok: bool) -> bool:
        """A call's JSON begins at `at` (ok: it does)."""
        if not ok or (self.index >= 1 and not self.parallel):  # (parallel_tool_calls false: the first call only)
            return self.stop()
        self.reader, self.reader_at, self.pos, self.phase = Reader(), at, at, "call"
        self.opened, self.given = False, ""
        return True

    def read_call(self, deltas: list, final: bool) -> bool:
        reader = self.reader
        reader.feed(self.text[self.pos:])
        self.pos = len(self.text)
        if final:
            reader.finish()
        if reader.bad:
            return self.stop()
        whole = self.args_alone()
        name, args = self.parts(reader, whole)
        if name is False:
            return self.stop()
        if name is not None and not self.opened:
            self.opened = True
            deltas.append({"index": self.index, "id": call_id(self.key, self.index, name, self.parser),
                           "type": "function", "function": {"name": name, "arguments": ""}})
        if self.opened and args is not None and len(args) > len(self.given):
            deltas.append({"index": self.index, "function": {"arguments": args[len(self.given):]}})
            self.given = args
        if self.opened:
            self.all_given[self.index] = self.given
        if not reader.done:
            return False
        self.pos = self.reader_at + reader.end
        self.index += 1
        self.phase = {"hermes": "marker", "mistral": "next" if not whole else "marker", "required": "next",
                      "llama3_json": "separator", "function": "end"}[self.form]
        return True

    def args_alone(self) -> bool:
        """Whether the reader reads the arguments alone (a named tool choice, mistral v11), not a
        {"name", "arguments"} object."""
        return self.form == "function" or (self.form == "mistral" and self.call_name is not None)

    def parts(self, reader: Reader, whole: bool) -> tuple:
        """(the call's name once read, None before; False: no call), (its arguments so far, or None)."""
        if whole:
            name = self.name or self.call_name
            return (name if name else False), reader.text()
        members = reader.members
        if sum(k in members for k in self.arg_keys) > 1:  # (both: no call, as tool_calls reads it)
            return False, None
        name = None
        if "name" in members and members["name"][1] is not None:
            start, end = members["name"]
            name = json.loads(reader.text()[start:end])
            if not isinstance(name, str) or not name:
                return False, None
        arg = next((members[k] for k in self.arg_keys if k in members), None)
        if arg is None:
            return name, None
        text = reader.text()
        return name, text[arg[0]:len(text) if arg[1] is None else arg[1]]
