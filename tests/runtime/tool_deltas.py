"""The calls --stream's tool_call_deltas make, as a vLLM client puts them together."""
from __future__ import annotations


def assemble(lines: list[list[dict]]) -> tuple[list[dict], list[int]]:
    """(the calls, the line each opened on) from each line's deltas: a call opens once, with its
    index, id, type and name (arguments ""), then adds only arguments; shapes are asserted."""
    calls, opened = [], []
    for n, deltas in enumerate(lines):
        for delta in deltas:
            if delta["index"] == len(calls):
                assert set(delta) == {"index", "id", "type", "function"}, delta
                calls.append({"id": delta["id"], "type": delta["type"], "function": dict(delta["function"])})
                opened.append(n)
            else:
                assert delta["index"] < len(calls) and set(delta) == {"index", "function"}, (delta, calls)
                assert list(delta["function"]) == ["arguments"], delta
                calls[delta["index"]]["function"]["arguments"] += delta["function"]["arguments"]
    return calls, opened
