"""EntryMap: a dict whose values are stored one way and read another (checkpoint.Weights: a weight or
the function that makes it; handoff.Handoff: an array's place in a file)."""
from __future__ import annotations

from collections.abc import MutableMapping


class EntryMap(MutableMapping):
    """store(value) is what is kept, read(entry) what is given back; membership, order and deletion are
    the entries' own, and never read one (Mapping's `in` would)."""

    def __init__(self, entries: dict | None = None):
        self._entries = {} if entries is None else entries

    def store(self, value):
        return value

    def read(self, entry):
        return entry

    def __getitem__(self, key):
        return self.read(self._entries[key])

    def __setitem__(self, key, value) -> None:
        self._entries[key] = self.store(value)

    def __delitem__(self, key) -> None:
        del self._entries[key]

    def __contains__(self, key) -> bool:
        return key in self._entries

    def __iter__(self):
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)
