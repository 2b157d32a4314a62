"""Per-row output text: incremental detokenisation, stop strings, and what is safe to stream.

Streaming holds back the last (longest stop string - 1) characters, so text that a later token
turns into a stop string is never printed; the decoder itself holds back incomplete UTF-8.

    text:    "The answer is 42.\n\nUs"      stop = ["\n\nUser:"] (7 chars) -> hold back 6
    emitted: "The answer is 4"              the rest waits until it cannot start a match
"""
from __future__ import annotations

import copy

from trtllm.runtime.tokenizer import IncrementalDecoder, Tokenizer


class TextStream:
    def __init__(self, tokenizer: Tokenizer, stops: tuple[str, ...] = (), include_stop: bool = False,
                 skip_special_tokens: bool = True):
        """`include_stop`: the text keeps the stop string it ends at (vLLM's include_stop_str_in_output);
        `skip_special_tokens` False: special tokens' text is part of it (vLLM's)."""
        self.decoder = IncrementalDecoder(tokenizer, skip_special_tokens)
        self.stops, self.include_stop = stops, include_stop
        self.hold = max((len(s) for s in stops), default=1) - 1
        self.text = ""
        self.stop_at: int | None = None
        self.stopped_by: str | None = None  # the stop string found at stop_at (the first given, of several)
        self.emitted = 0
        self.floor = 0  # where a stop string may end past: the first min_new_tokens tokens' text, held or not

    def fork(self) -> TextStream:
        """A copy that goes on apart from this one (runtime/beam.py: a beam's text, from its parent's)."""
        new = copy.copy(self)
        new.decoder = self.decoder.fork()
        return new

    def push(self, token_id: int, check_stops: bool = True) -> bool:
        """Add one generated token; True when a stop string now appears (earliest match wins).

        The decoder holds text back (the start of a character the next token may complete, a
        byte-fallback run, a clean-up's last characters); a stop string that this token completes
        within that text is found now too, as transformers' StopStringCriteria finds it in the
        tokens' bytes, not tokens later: the text is then flushed (the row ends here). A token
        pushed with check_stops False (min_new_tokens) moves `floor` past its text, held or not: a
        stop string must end after it, whenever that text comes out."""
        old = len(self.text)
        self.text += self.decoder.push(token_id)
        if not self.stops:
            return False
        if not check_stops:
            self.floor = len(self.text) + len(self.decoder.peek().rstrip("\ufffd"))
            return False
        if self.check(old):
            return True
        held = self.decoder.peek().rstrip("\ufffd")
        start = max(0, old - self.hold)  # (only the text a new match could start in: not all of it)
        if held and self.find(self.text[start:] + held, old - start, shift=start):
            self.text += self.decoder.flush()
            return self.check(old)
        return False

    def find(self, text: str, old: int, end: int | None = None, shift: int = 0) -> tuple[int, str] | None:
        """The earliest stop string that ends in text[old:end] and past `floor` (where it starts in
        the whole text, `text` being the whole text's from `shift` on; which), or None."""
        # A match must end in the new text: each stop string starts at most len(s) - 1 characters
        # back (one start for all would find a short stop that ended before, e.g. before min_new_tokens).
        floor = self.floor - shift
        hits = [(i + shift, s) for s, i in ((s, text.find(s, max(0, old - len(s) + 1, floor - len(s) + 1), end))
                                            for s in self.stops) if i >= 0]
        return min(hits, key=lambda hit: hit[0]) if hits else None  # (min: the first given of those at one place)

    def check(self, old: int, end: int | None = None) -> bool:
        """Whether a stop string ends in text[old:end] (then stop_at is where the earliest starts)."""
        if not self.stops:
            return False
        hit = self.find(self.text, old, end)
        if hit:
            self.stop_at, self.stopped_by = hit
            return True
        return False

    def finish(self, check_stops: bool = True) -> bool:
        """The row has ended: the text held back comes out. True when a stop string is in it (a
        tokenizer that cleans up spaces holds back a few characters, not only a broken one)."""
        if self.stop_at is not None:
            return False
        old = len(self.text)
        flushed = self.decoder.flush()
        self.text += flushed
        # the U+FFFD of a character the row's end cut off is not text the model wrote: no stop
        # string matches it (vLLM never shows it to its stop check either). A byte-fallback
        # tokenizer makes one per byte token of it: the flush's trailing run goes
        cut = len(flushed) - len(flushed.rstrip("\ufffd")) if self.decoder.cut_short else 0
        end = len(self.text) - cut
        return self.check(old, end) if check_stops else False

    def stop_end(self) -> int:
        """Where the text ends once a stop string is found: before it, or after it (include_stop)."""
        return self.stop_at + (len(self.stopped_by) if self.include_stop else 0)

    def final_text(self) -> str:
        return self.text if self.stop_at is None else self.text[: self.stop_end()]

    def take(self, final: bool = False) -> str:
        """The text not yet handed out that can no longer become part of a stop string."""
        if self.stop_at is not None:
            end = self.stop_end()
        elif final:
            end = len(self.text)
        else:
            end = len(self.text) - self.hold
        if end <= self.emitted:
            return ""
        out, self.emitted = self.text[self.emitted:end], end
        return out
