"""What a request with num_beams > 1 may set (runtime/beam.py runs it), read with the input file
(runtime/input_format.py): the settings beam search does not take are refused with their JSON path."""
from __future__ import annotations

from trtllm.runtime.strict_json import fail

MAX_LENGTH_PENALTY = 10.0
# What a request with num_beams > 1 may not set, and why: its settings' values that leave them off
OFF = {"temperature": 0.0, "presence_penalty": 0.0, "frequency_penalty": 0.0}
OFF_WHY = {"temperature": "beam search does not sample",
           **dict.fromkeys(("presence_penalty", "frequency_penalty"), "transformers' beam search has no such penalty")}


def parse_early_stopping(value: object, path: str) -> bool | str:
    if isinstance(value, bool) or value == "never":
        return value
    fail(path, 'true, false or "never"', value)


def check_request(values: dict, where) -> None:
    """A request with num_beams > 1 (`values`: its resolved settings; `where(name)`: a setting's
    JSON path): nothing of OFF set, and n at most num_beams."""
    beams = f"`{where('num_beams')}` {values['num_beams']}"
    for name, off in OFF.items():
        if values[name] != off:
            fail(where(name), f"{off!r} with {beams} ({OFF_WHY[name]})", values[name])
    if values["n"] > values["num_beams"]:
        fail(where("n"), f"at most {beams} (the responses are its best beams)", values["n"])
