"""What an ONNX Runtime build's first graph leaves for its second: each int4 weight's codes (two to a byte),
scales and offsets (WeightWriter.quantize_weight, MoEWriter), so that each weight is quantized once. They
wait in a scratch file beside the graphs, not in memory: 0.75 bytes a parameter held between the two
writers was a quarter of a held 16-bit build's peak (builder/held.py)."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trtllm.builder.entry_map import EntryMap

HANDOFF_NAME = ".handoff"  # (in the engine's staging directory; removed before the engine is finished)


@dataclass(frozen=True)
class Spilled:
    """An array's place in the file."""
    offset: int
    shape: tuple
    dtype: np.dtype


class Handoff(EntryMap):
    """key -> value, where a value is arrays in tuples and lists (and anything else, kept as it is): its
    arrays written to `path` when it is set, read back when it is read. close() removes the file."""

    def __init__(self, path: Path):
        super().__init__()
        self.path = Path(path)
        self._file = open(self.path, "x+b")

    def close(self) -> None:
        self._entries.clear()
        if not self._file.closed:
            self._file.close()
            self.path.unlink(missing_ok=True)

    def store(self, value):
        if isinstance(value, np.ndarray):
            array = np.asarray(value, order="C")  # (not ascontiguousarray, which makes a 0-d array 1-d)
            offset = self._file.seek(0, os.SEEK_END)
            self._file.write(memoryview(array.reshape(-1).view(np.uint8)))
            return Spilled(offset, array.shape, array.dtype)
        if isinstance(value, (tuple, list)):
            return type(value)(self.store(v) for v in value)
        return value

    def read(self, value):
        if isinstance(value, Spilled):
            self._file.flush()
            self._file.seek(value.offset)
            count = int(np.prod(value.shape, dtype=np.int64))
            return np.fromfile(self._file, value.dtype, count).reshape(value.shape)
        if isinstance(value, (tuple, list)):
            return type(value)(self.read(v) for v in value)
        return value
