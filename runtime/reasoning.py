"""vLLM's reasoning parsers: a thinking model's answer split into its reasoning (`reasoning_content`)
and the rest (`content`), which a tool-call parser then reads. Stdlib only: this runs on the device.

- `deepseek_r1`: DeepSeek-R1 and its distills, whose template opens the thought itself: the answer
  is the reasoning up to `</think>` (a leading `<think>` is dropped), then the content; without a
  `</think>` it is all reasoning (the thought was cut short).
- `qwen3`: Qwen3 (and SmolLM3), which writes `<think>...</think>` itself when it thinks: the text
  between them is the reasoning, after them the content; without both it is all content (an
  answer with thinking off).
"""
from __future__ import annotations

from trtllm.runtime.strict_json import choice

PARSERS = ("deepseek_r1", "qwen3")
START, END = "<think>", "</think>"

parse_parser = choice(PARSERS)


def split(text: str, parser: str) -> tuple[str | None, str | None]:
    """(reasoning, content), each None where there is none (vLLM's)."""
    if parser == "qwen3":
        if START not in text or END not in text:
            return None, text or None
        reasoning, _, content = text.partition(START)[2].partition(END)
    else:
        reasoning, found, content = text.removeprefix(START).partition(END)
        if not found:
            return reasoning or None, None
    return reasoning or None, content or None
