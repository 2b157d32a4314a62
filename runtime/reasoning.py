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
