"""A tool call's arguments as --stream gives them while the model writes them (vLLM's tool-call
deltas): the call's first delta once its name is read, `{"index", "id", "type", "function": {"name",
"arguments": ""}}`, then `{"index", "function": {"arguments": piece}}` as they come, the pieces
making the call's final `arguments` (the JSON the model wrote, as json.dumps writes it: a number or
literal once whole, runtime/json_pieces.py). Read for the JSON call formats: hermes, mistral (both
forms), llama3_json, a "required" or named tool choice; pythonic calls come whole (tool_stream.py).
Text that cannot be calls (a marker not followed by JSON, a call without a name or with a flaw in
its name or arguments) stops the pieces for good; the calls then come whole as they end. A key
written twice inside the arguments comes as written (json.loads reads it as the call's value; the
call's `arguments` holds it once). Stdlib only: this runs on the device."""
from __future__ import annotations

from trtllm.runtime.json_pieces import BLANKS, Reader
from trtllm.runtime.tool_calls import HERMES, MISTRAL, PYTHON_TAG, ToolChoice, call_id

ARGS = "[ARGS]"  # mistral v11: `name[ARGS]{...}`
# Where tool_calls reads with str.strip (mistral's parts, llama3_json's text between calls), any
# blank may stand; elsewhere (inside a JSON list, hermes' json.loads) only JSON's
LOOSE = {"mistral": ("opened", "name", "value"), "llama3_json": ("tag", "object", "separator")}


class Pieces:
    """An answer read for its calls' arguments as it comes: `push` each piece of its content, get
    the deltas it makes. Formats without JSON calls (pythonic) have no pieces: `active` False.
    `index`: the calls whose JSON has ended; `given`: each call's arguments given (tool_stream
    records a call it gives whole)."""

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
        self.taken = (0, 0)    # the reader's pieces looked at: (how many, their length)
        self.index = 0
        self.call_name: str | None = None  # mistral v11's, read before its arguments
        self.given: dict[int, list[str]] = {}  # each call's arguments given, as pieces (here or whole)
        self.opened = False

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
        if self.phase == "marker":  # (hermes, mistral: the next call's marker, anywhere)
            marker = HERMES if self.form == "hermes" else MISTRAL
            found = self.text.find(marker, self.pos)
            if found < 0:
                self.pos = max(self.pos, len(self.text) - len(marker) + 1)
                return False
            self.pos, self.phase, self.call_name = found + len(marker), "opened", None
            return True
        if self.phase == "name":
            return self.read_name()
        at = self.skip_blanks()
        if at >= len(self.text):
            return False
        c = self.text[at]
        if self.phase == "opened":
            if self.form != "mistral":
                return self.begin(at, c == "{")
            self.phase = "item" if c == "[" else "name"  # (v3: a JSON list; v11: name[ARGS]...)
            self.pos = at + 1 if c == "[" else at
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
        if self.phase == "list":  # "required"'s
            return self.step_over(at, c == "[", "item")
        if self.phase in ("item", "object"):
            return self.begin(at, c == "{")
        if self.phase == "next":  # after a list's item
            if c == ",":
                return self.step_over(at, True, "item")
            return self.step_over(at, c == "]", "marker" if self.form == "mistral" else "end")
        if self.phase == "separator":  # llama3_json: `;` between calls
            return self.step_over(at, c == ";", "object")
        return self.stop()  # "end": anything after the calls is no answer of calls

    def skip_blanks(self) -> int:
        """Past the blanks at `pos`: any (str.isspace) where tool_calls strips them, else JSON's."""
        at, loose = self.pos, self.phase in LOOSE.get(self.form, ())
        while at < len(self.text) and (self.text[at].isspace() if loose else self.text[at] in BLANKS):
            at += 1
        self.pos = at
        return at

    def read_name(self) -> bool:
        """mistral v11: the name, up to [ARGS] (a next marker first: no call)."""
        found = self.text.find(ARGS, max(self.pos, self.scan))
        end = len(self.text) if found < 0 else found
        if MISTRAL in self.text[max(self.pos, self.scan - len(MISTRAL)):end]:
            return self.stop()
        if found < 0:
            self.scan = len(self.text) - len(ARGS) + 1  # (a line does not search the name again)
            return False
        self.call_name, self.pos, self.phase = self.text[self.pos:found].strip(), found + len(ARGS), "value"
        return True

    def step_over(self, at: int, ok: bool, phase: str) -> bool:
        if not ok:
            return self.stop()
        self.pos, self.phase = at + 1, phase
        return True

    def begin(self, at: int, ok: bool) -> bool:
        """A call's JSON begins at `at` (ok: it does)."""
        if not ok or (self.index >= 1 and not self.parallel):  # (parallel_tool_calls false: the first call only)
            return self.stop()
        self.reader, self.reader_at, self.pos, self.phase, self.taken = Reader(), at, at, "call", (0, 0)
        self.opened = False  # its first delta given
        return True

    def alone(self) -> bool:
        """Whether the reader reads the arguments alone (a named tool choice, mistral v11), not a
        {"name", "arguments"} object."""
        return self.form == "function" or (self.form == "mistral" and self.call_name is not None)

    def read_call(self, deltas: list, final: bool) -> bool:
        reader, alone = self.reader, self.alone()
        reader.feed(self.text[self.pos:])
        self.pos = len(self.text)
        if final:
            reader.finish()
        if reader.bad or (reader.flaws and any(kind == "value" or not alone for key, kind in reader.flaws.items()
                                               if alone or key in ("name", *self.arg_keys))):
            return self.stop()
        name = (self.name or self.call_name) if alone else self.read_name_member(reader)
        if name is False or (not alone and sum(k in reader.members for k in self.arg_keys) > 1):
            return self.stop()  # (a name not a string; arguments given twice over: no call)
        if name is not None and not self.opened:
            if self.index in self.given or not name:  # (given whole already, tool_stream.rest_of; no name)
                return self.stop()
            self.given[self.index], self.opened = [], True
            deltas.append({"index": self.index, "id": call_id(self.key, self.index, name, self.parser),
                           "type": "function", "function": {"name": name, "arguments": ""}})
        if self.opened:
            piece = self.new_arguments(reader, alone)
            if piece:
                self.given[self.index].append(piece)
                deltas.append({"index": self.index, "function": {"arguments": piece}})
        if not reader.done:
            return False
        if not self.opened or (not alone and self.form != "required"
                               and not any(k in reader.members for k in self.arg_keys)):
            return self.stop()  # (ended without a name, or without arguments: no call)
        self.pos = self.reader_at + reader.end
        self.index += 1
        self.phase = {"hermes": "marker", "mistral": "marker" if alone else "next", "required": "next",
                      "llama3_json": "separator", "function": "end"}[self.form]
        return True

    def read_name_member(self, reader: Reader):
        """The call object's name once read and followed by another member or the object's end (None
        before: a name written twice is refused when its second key comes, not given as the first;
        False: not a string)."""
        span = reader.members.get("name")
        if span is None or span[1] is None:
            return None
        if not reader.done and not any(start >= span[1] for start, _ in reader.members.values()):
            return None
        return reader.strings.get("name", False)

    def new_arguments(self, reader: Reader, alone: bool) -> str:
        """The arguments' canonical text since the last look (the reader's new pieces, cut to the
        arguments member): each piece looked at once."""
        if alone:
            span = (0, None)
        else:
            span = next((reader.members[k] for k in self.arg_keys if k in reader.members), None)
            if span is None:
                return ""
        count, at = self.taken
        start, end = span[0], reader.size if span[1] is None else span[1]
        parts = []
        for piece in reader.out[count:]:
            lo, hi = max(at, start), min(at + len(piece), end)
            if lo < hi:
                parts.append(piece[lo - at:hi - at])
            at += len(piece)
        self.taken = (len(reader.out), at)
        return "".join(parts)
