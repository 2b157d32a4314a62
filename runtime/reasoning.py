"""vLLM's reasoning parsers: a thinking model's answer split into its reasoning (`reasoning_content`)
and the rest (`content`), which a tool-call parser then reads. Stdlib only: this runs on the device.

- `deepseek_r1`: DeepSeek-R1 and its distills, whose template opens the thought itself: the answer
  is the reasoning up to `</think>`, then the content (text up to a `<think>` is dropped); without
  a `</think>` it is all reasoning (the thought was cut short).
- `qwen3`: Qwen3 (and SmolLM3), as vLLM's parser reads it now: with a `</think>` the reasoning is
  the text before it (after a `<think>` the model wrote; the Thinking models' templates write that
  one into the prompt), the content what follows; without one (a `<think>` the model wrote
  dropped) it is all reasoning where the request's template had thinking on (the thought was cut
  short), else all content (thinking off).
"""
from __future__ import annotations

from trtllm.runtime.strict_json import choice

PARSERS = ("deepseek_r1", "qwen3")
START, END = "<think>", "</think>"

parse_parser = choice(PARSERS)


def split(text: str, parser: str, thinking: bool = False) -> tuple[str | None, str | None]:
    """(reasoning, content), each None where there is none (vLLM's). `thinking`: the request's
    template had `enable_thinking` on (qwen3's answer without `</think>`)."""
    ended = END in text
    before, start, after = text.partition(START)
    text = after if start else before
    if parser == "qwen3" and not ended:
        return (text or None, None) if thinking else (None, text or None)
    reasoning, found, content = text.partition(END)
    if not found:  # (deepseek_r1: a thought cut short)
        return reasoning or None, None
    return reasoning or None, content or None


class Stream:
    """A sample's answer split as --stream gives it: `push` each piece of its text (they concatenate
    to the answer), and get the part of the text that the split makes reasoning, and the part it
    makes content, since the last piece ((reasoning, content), "" where none). A suffix that may be
    the start of a tag waits for the next piece, and so does a qwen3 thought opened with thinking off
    (its text is reasoning if a `</think>` ends it, else content). The pieces concatenate to
    `split`'s fields of the whole answer unless a later tag moves text already given: text before a
    `<think>` the model wrote, which the split drops; a qwen3 answer with thinking off that writes
    `</think>` without opening the thought, whose text before it becomes reasoning. Once text moves,
    nothing more is given (no text twice): the last line's whole fields say what the answer is."""

    def __init__(self, parser: str, thinking: bool = False):
        self.parser, self.thinking = parser, thinking
        self.text, self.given, self.moved = "", ("", ""), False  # all pushed; what was given of each field
        self.split_text, self.tail = "", self.tail_field("")  # the text `given` is the split of; its end's field

    def push(self, piece: str, final: bool = False) -> tuple[str, str]:
        self.text += piece
        if self.moved:
            return "", ""
        text = self.text if final else self.decided()
        new = text[len(self.split_text):]
        if "<" not in new and text.startswith(self.split_text):  # no tag in it: it goes where the text's end went
            # (a split of the whole text per line made a long answer's lines cost its length each)
            self.split_text = text
            self.given = (self.given[0], self.given[1] + new) if self.tail else (self.given[0] + new, self.given[1])
            return ("", new) if self.tail else (new, "")
        wholes = [w or "" for w in split(text, self.parser, self.thinking)]
        if not all(w.startswith(g) for w, g in zip(wholes, self.given)):
            self.moved = True
            return "", ""
        out = tuple(w[len(g):] for w, g in zip(wholes, self.given))
        self.given, self.split_text, self.tail = tuple(wholes), text, self.tail_field(text)
        return out

    def tail_field(self, text: str) -> int:
        """Which field `split` puts text added at the end of this text in (one with no tag): 0
        reasoning, 1 content."""
        before, start, after = text.partition(START)
        if self.parser == "qwen3" and END not in text:
            return 0 if self.thinking else 1
        return 1 if END in (after if start else before) else 0

    def decided(self) -> str:
        text = undecided_cut(self.text)
        if self.parser == "qwen3" and not self.thinking and START in text and END not in text:
            return text[:text.index(START)]
        return text


def undecided_cut(text: str) -> str:
    """The text without a suffix that may begin a tag (`<`, `</thi`)."""
    start = text.rfind("<", max(0, len(text) - len(END) + 1))
    if start >= 0 and any(tag.startswith(text[start:]) and tag != text[start:] for tag in (START, END)):
        return text[:start]
    return text
