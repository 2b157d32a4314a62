"""Tool calls as --stream gives them: the content and each call of an answer read for calls, a call
on the line where it ends, and its arguments piece by piece (runtime/tool_pieces.py). Stdlib only: this runs on
the device."""
from __future__ import annotations

import re

from trtllm.runtime.tool_calls import (HERMES, LFM_START, MISTRAL, PYTHON_START, PYTHON_TAG, ToolChoice,
                                       extract_or_none, forced)
from trtllm.runtime.tool_pieces import Pieces

MARKERS = {"hermes": HERMES, "lfm2": LFM_START, "mistral": MISTRAL}  # the content is the text before the first
OPENERS = {"llama3_json": ("{", PYTHON_TAG), "pythonic": ("[", PYTHON_START)}  # how an answer of calls begins
# Where a call may just have ended, and the beginning of the answer that then holds the calls so far
# (group "keep": up to and with it; "list": a list's calls, closed after it; else up to the match):
# only there (and at the end) is the answer read, so a line does not cost the answer's length.
ENDS = {"hermes": re.compile(r"(?P<keep></tool_call>)"),
        "lfm2": re.compile(r"(?P<keep><\|tool_call_end\|>)"),
        "mistral": re.compile(r"\[TOOL_CALLS\]|(?P<list>\})\s*,|(?P<keep>\}\s*\])"),
        "llama3_json": re.compile(r";"),
        "pythonic": re.compile(r"(?P<list>\))\s*,|(?P<keep>\)\s*\])"),
        "required": re.compile(r"(?P<list>\})\s*,|(?P<keep>\}\s*\])")}
LONGEST_END = 64  # (a match cut across pieces is found from this far back: `}`, blanks, `,`)
TRIED_ENDS = 8  # the last possible ends of a piece tried, last first (one inside a call does not read)


class Stream:
    """An answer read for tool calls, as --stream gives it: `push` each piece of its content (its
    text, or what a reasoning split makes content); get the content since the last piece and the
    calls that ended in it, each with its `index`, with `extract`'s ids. The content is the text
    before the first call's marker (hermes, mistral: a suffix that may begin one waits), the answer
    where it does not begin as calls (llama3_json, pythonic: until then it waits), none for a forced
    call. A call is given once what follows it shows it ended (a closing tag, the separator or the
    next call's marker, the list's closing bracket) or the answer ends; a call given stays as it is.
    An answer that in the end reads as no calls gives the rest of its text as content, so the
    pieces make the answer; a call already given (or a piece of one) then stays given, and `moved`
    says so (the last line's fields say what the answer is). `take_deltas`: the calls piece by
    piece (tool_pieces.py)."""

    def __init__(self, tc: ToolChoice | None, parser: str | None, tools: tuple[dict, ...] | None, key: str,
                 parallel: bool = True):
        self.tc, self.parser, self.tools, self.key, self.parallel = tc, parser, tools, key, parallel
        self.marker = None if forced(tc) else MARKERS.get(parser)
        self.openers = ("",) if forced(tc) else OPENERS.get(parser, ())  # ("": any text may be calls)
        self.ends = ENDS.get("required" if tc is not None and tc.mode == "required" else
                             None if forced(tc) else parser)
        self.text, self.said, self.scanned, self.calls, self.moved = "", 0, 0, [], False
        self.marker_at = None  # where the first marker begins, once seen
        self.begins = None     # whether the answer begins as calls (llama3_json, pythonic), once known
        self.stopped = False
        self.pieces = Pieces(tc, parser, key, parallel)  # the calls' arguments as they come (tool_pieces.py)
        self.deltas: list[dict] = []

    def stop(self) -> None:
        """Give nothing more: the content the caller was giving is no longer known (its reasoning
        split moved text already given)."""
        self.stopped = True
        self.pieces.stop()

    def take_deltas(self) -> list[dict]:
        """The tool-call deltas (vLLM's) since the last take: a call's first, with its id and name,
        then its arguments piece by piece (tool_pieces.py); a call of a format without pieces
        (pythonic), or whose pieces stopped, comes as the rest of its arguments once it ends."""
        deltas, self.deltas = sorted(self.deltas, key=lambda d: d["index"]), []
        return deltas

    def push(self, piece: str, final: bool = False) -> tuple[str, list[dict]]:
        """(content since the last piece, calls that ended in this one) after `piece`; `final`: the
        answer's last piece, read whole."""
        if self.stopped:
            return "", []
        self.text += piece
        if not self.moved:
            self.deltas += self.pieces.push(piece, final)
        if final:
            got = self.read(self.text)
            new = self.take(got[1] if got else [])
            if got is None:  # no calls in the end: the answer is content (calls given stay given)
                self.moved = self.moved or bool(self.calls) or bool(self.pieces.given)
                cut = len(self.text)
            else:
                cut = self.content_end(final)
        elif self.moved:
            return "", []
        else:
            new = self.take(self.read_new_ends())
            if self.moved:  # (take found a reading that contradicts a call given)
                return "", []
            cut = self.content_end(final)
        said, self.said = self.text[self.said:cut], max(self.said, cut)
        return said, new

    def read(self, text: str) -> tuple[str | None, list[dict]] | None:
        return extract_or_none(text, self.tc, self.parser, self.tools, self.key, self.parallel)

    def read_new_ends(self) -> list[dict]:
        """The calls of the answer so far, read at the possible call ends the text since the last
        push brings (none where nothing ended); moves the scan past them."""
        if self.ends is None:
            return []
        seen, self.scanned = self.scanned, len(self.text)
        if self.pieces.active and self.pieces.index <= len(self.calls):
            return []  # (the pieces read the calls' JSON: none has ended since the last given, none can read)
        ends = [m for m in self.ends.finditer(self.text, max(0, seen - LONGEST_END)) if m.end() > seen]
        for end in reversed(ends[-TRIED_ENDS:]):
            groups = end.groupdict()
            if groups.get("keep"):
                text = self.text[:end.end()]
            elif groups.get("list"):
                if self.marker == MISTRAL and not _v3_list(self.text, end.start()):
                    continue  # (mistral v11: a list there is a call's arguments, not the calls)
                text = self.text[:end.start("list") + 1] + "]"
            else:
                text = self.text[:end.start()]
            if (got := self.read(text)) is not None:
                return got[1]
        return []

    def take(self, calls: list[dict]) -> list[dict]:
        """The calls not given yet, each with its index; a reading that contradicts one given: moved."""
        given = len(self.calls)
        if calls[:given] != self.calls[:len(calls)]:
            self.moved = True
        if self.moved:
            self.pieces.stop()
        if self.moved or len(calls) <= given:
            return []
        self.calls = calls
        new = [{"index": given + i, **call} for i, call in enumerate(calls[given:])]
        for call in new:
            self.deltas += self.rest_of(call)
        return new

    def rest_of(self, call: dict) -> list[dict]:
        """The deltas a call that ended still needs: all of it where no piece of it was given, else
        the rest of its arguments (none where the pieces given are not how they begin: a key written
        twice, given as written; the last line's tool_calls say what the call is)."""
        k, function = call["index"], call["function"]
        parts = self.pieces.given.get(k)
        if parts is None:
            self.pieces.given[k] = [function["arguments"]]
            return [{"index": k, "id": call["id"], "type": "function", "function": dict(function)}]
        given = "".join(parts)
        if len(function["arguments"]) > len(given) and function["arguments"].startswith(given):
            parts.append(function["arguments"][len(given):])
            return [{"index": k, "function": {"arguments": parts[-1]}}]
        return []

    def content_end(self, final: bool) -> int:
        """Where the content given so far may end: before a call's marker, or a suffix that may begin
        one. What is known once (the marker's place, how the answer begins) is not searched again."""
        if self.marker:
            if self.marker_at is None:
                start = self.text.find(self.marker, max(0, self.said - len(self.marker)))
                self.marker_at = start if start >= 0 else None
            if self.marker_at is not None:
                return self.marker_at
            return len(self.text) if final else len(self.text) - _marker_prefix(self.text, self.marker)
        if self.begins is None:
            begun = self.text.lstrip()
            if begun and not any(o.startswith(begun) for o in self.openers if o):  # (decided: more text
                self.begins = any(begun.startswith(o) for o in self.openers)       # cannot change it)
        if self.calls or self.begins is not False:
            return self.said  # (calls, or text that may begin them: no content yet)
        return len(self.text)


def _v3_list(text: str, at: int) -> bool:
    """Whether mistral's calls before `at` are a JSON list (v3 tokenizers), not `name[ARGS]...` ones."""
    start = text.rfind(MISTRAL, 0, at)
    return start >= 0 and text[start + len(MISTRAL):at].lstrip().startswith("[")


def _marker_prefix(text: str, marker: str) -> int:
    """The length of the longest end of text that begins marker (and is not all of it)."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0
