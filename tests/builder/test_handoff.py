"""The int4 codes an ONNX Runtime build's first graph leaves for its second wait in a scratch file
(builder/handoff.py), not in memory."""
from __future__ import annotations

import numpy as np
import pytest

from trtllm.builder.handoff import Handoff, Spilled

MADE = ((np.arange(24, dtype=np.uint8).reshape(4, 6), (8, 6)), np.linspace(0, 1, 8, dtype=np.float32).reshape(2, 4),
        None, [np.array([], np.float32), np.array(2.5, np.float16)])


def same(a, b) -> None:
    if isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
        return
    if isinstance(a, (tuple, list)):
        assert type(a) is type(b) and len(a) == len(b)
        for x, y in zip(a, b):
            same(x, y)
        return
    assert a == b


def arrays_in(value) -> int:
    if isinstance(value, np.ndarray):
        return 1
    return sum(arrays_in(v) for v in value) if isinstance(value, (tuple, list)) else 0


def test_what_is_handed_on_comes_back_as_it_was_and_waits_on_disk(tmp_path):
    handoff = Handoff(tmp_path / ".handoff")
    handoff[("a", (4, 6))], handoff[("b", (2,))] = (MADE, True), (np.ones((3, 5), np.float32), False)
    assert arrays_in(list(handoff._entries.values())) == 0 and isinstance(handoff._entries[("b", (2,))][0], Spilled)
    same(handoff.pop(("a", (4, 6))), (MADE, True))
    assert (tmp_path / ".handoff").stat().st_size == 24 + 32 + 2 + 60  # (every byte: read back, flushed)
    assert ("a", (4, 6)) not in handoff and ("b", (2,)) in handoff and len(handoff) == 1
    taken, kept = handoff[("b", (2,))]
    taken[0, 0] = 7.0  # (an array of its own: the writer may work on it)
    assert kept is False and handoff[("b", (2,))][0][0, 0] == 1.0
    handoff.close()
    assert not (tmp_path / ".handoff").exists() and len(handoff) == 0


def test_a_handoff_file_left_there_is_not_written_over(tmp_path):
    (tmp_path / ".handoff").write_bytes(b"x")
    with pytest.raises(FileExistsError):
        Handoff(tmp_path / ".handoff")
