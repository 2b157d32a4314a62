"""Context reuse (`trtllm-run --context-reuse`, Edge-LLM's --enableContextReuse): a finished
request's KV, its prompt's and its answer's, is kept so that a later prompt that begins with the
same tokens (the next turn of its conversation, another question on the same document) restores
it and computes only the rest.

Entries live in the saved-KV store (runtime/prefix_cache.py: on disk under --kv-cache-dir, bounded
by --kv-cache-size, with this process's copies in RAM), so a later trtllm-run process finds them
too. Each is the KV of one whole token sequence; a prompt reuses the longest prefix it shares with
any entry of its engine and adapter, also a part of one (a conversation whose history the template
renders differently from what was generated shares what it does render the same). To find it
without reading every entry, the index maps each entry's block prefixes (BLOCK tokens at a time,
chained hashes) to the entry; a match is then checked token by token and extended past the last
whole block. Entries other processes wrote are indexed from their headers at the first lookup.
"""
from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass, field

import numpy as np

from trtllm.runtime.prefix_cache import ENTRY_NAME, MAGIC, PrefixStore, open_entry

BLOCK = 16          # tokens per indexed block: a match is found to the block, then extended token by token
MIN_TOKENS = BLOCK  # shorter sequences are not worth an entry
MAX_HEADER_BYTES = 1 << 24  # an entry's header is its token ids as JSON: far less


def _chain(tokens, adapter: str | None, blocks: int) -> list[bytes]:
    """The hash of each whole-block prefix: [h(block 0), h(h0, block 1), ...], `blocks` of them."""
    ids = np.asarray(tokens[: blocks * BLOCK], np.int64)
    h, out = hashlib.blake2b((adapter or "").encode(), digest_size=16).digest(), []
    for k in range(blocks):
        h = hashlib.blake2b(h + ids[k * BLOCK:(k + 1) * BLOCK].tobytes(), digest_size=16).digest()
        out.append(h)
    return out


@dataclass
class ContextCache:
    """The index over the store's entries: the hash of each whole-block prefix of an entry's tokens
    (per adapter) -> the entries that have that prefix,

        entry A = t0..t39 (2 whole blocks)   index: h(b0) -> {A, B}, h(b0, b1) -> {A, B}
        entry B = t0..t55 (3 whole blocks)          h(b0, b1, b2) -> {B}

    so a prompt's longest whole-block match is one dict look-up per block, from its longest
    prefix down; each entry there is then followed token by token past that block, and the one
    that goes furthest is restored."""

    store: PrefixStore
    index: dict[bytes, set[tuple[tuple[int, ...], str | None]]] = field(default_factory=dict)
    keys: dict[tuple[tuple[int, ...], str | None], str] = field(default_factory=dict)  # each entry's store key
    scanned: bool = False
    lookups: int = 0
    hits: int = 0
    reused_tokens: int = 0  # what the scheduler restored from hits (beyond a saved system prompt's)
    commits: int = 0

    def add(self, tokens: tuple[int, ...], adapter: str | None) -> None:
        self.keys[tokens, adapter] = self.store.key(tokens, adapter)
        for h in _chain(tokens, adapter, len(tokens) // BLOCK):
            self.index.setdefault(h, set()).add((tokens, adapter))

    def scan(self) -> None:
        """Index the entries of this engine that are in the store's directory (other processes'). A
        file that does not read as an entry is passed over: the store discards a damaged entry when
        a load meets it, and a bad file costs reuse, never a request."""
        self.scanned = True
        try:
            paths = [p for p in self.store.dir.iterdir() if ENTRY_NAME.fullmatch(p.name)]
        except OSError:
            return
        for path in paths:
            try:
                with open_entry(path, self.store.max_bytes) as f:
                    head = f.read(len(MAGIC) + 8)
                    if not head.startswith(MAGIC) or len(head) < len(MAGIC) + 8:
                        continue
                    (size,) = struct.unpack("<Q", head[len(MAGIC):])
                    header = json.loads(f.read(min(size, MAX_HEADER_BYTES)))
                tokens, adapter = header["prefix_ids"], header.get("adapter")
                if header.get("engine") != self.store.engine_id or not (adapter is None or isinstance(adapter, str)):
                    continue
                # (a prompt's image tokens are keyed by negative ids of their own: runtime/media.py)
                if not all(type(t) is int and -2**63 <= t < 2**63 for t in tokens):
                    continue
                self.add(tuple(tokens), adapter)
            except (OSError, ValueError, TypeError, KeyError, OverflowError, RecursionError):
                continue

    def lookup(self, prompt: list[int], adapter: str | None, limit: int, layout,
               lag: int = 0) -> np.ndarray | None:
        """The KV of the longest prefix of `prompt`, at most `limit` tokens, that an entry holds
        ([2 * layers, kv_heads, n, kv_row]), or None. `layout(n)`: the KV (shape, dtype) of an
        entry of n tokens. `lag`: an entry's position p depends on its tokens up to p + lag (an
        EAGLE head's KV: its pair at p holds the token after p), so a match of n tokens gives n - lag
        positions (and an entry of n tokens holds n - lag); only lookups without lag are counted."""
        if limit < BLOCK:
            return None
        if not self.scanned:
            self.scan()
        self.lookups += lag == 0
        chain = _chain(prompt, adapter, limit // BLOCK)
        k = len(chain)
        while k > 0:
            best, n = None, k * BLOCK
            for tokens, _ in self.index.get(chain[k - 1], ()):
                if list(tokens[: k * BLOCK]) != prompt[: k * BLOCK]:
                    continue  # (a hash collision)
                m, most = k * BLOCK, min(len(tokens), limit)
                while m < most and tokens[m] == prompt[m]:
                    m += 1
                if best is None or m > n:
                    best, n = tokens, m
            if best is None:
                k -= 1
                continue
            kv = self.store.load(best, adapter, layout(len(best)))
            if kv is None:  # evicted (by this process or another), or damaged: forget it, look on
                self.forget(best, adapter)
                continue
            self.hits += lag == 0
            return kv[:, :, :n - lag] if n > lag else None
        return None

    def forget(self, tokens: tuple[int, ...], adapter: str | None) -> None:
        """An entry that is gone."""
        self.keys.pop((tokens, adapter), None)
        for h in _chain(tokens, adapter, len(tokens) // BLOCK):
            held = self.index.get(h, set())
            held.discard((tokens, adapter))
            if not held:
                self.index.pop(h, None)

    def commit(self, tokens: tuple[int, ...], adapter: str | None, read) -> None:
        """Keep the KV of `tokens` (`read(n)` gives it, for n tokens: lookup's lag less) unless an
        entry the store still has holds them all."""
        if len(tokens) < MIN_TOKENS:
            return
        if not self.scanned:
            self.scan()
        last = _chain(tokens, adapter, len(tokens) // BLOCK)[-1]
        for held in list(self.index.get(last, ())):
            if held[0][: len(tokens)] == tokens:
                if self.store.has(*held):
                    return
                self.forget(*held)  # (evicted: it holds nothing now)
        self.store.save(tokens, read(len(tokens)), adapter)
        self.commits += 1
        self.add(tokens, adapter)
        self.prune()

    def prune(self) -> None:
        """Forget the entries the store no longer holds (a save evicts the least recently used):
        the index stays the size of the store, however many requests a run commits."""
        for entry, key in list(self.keys.items()):
            if not self.store.holds(key):
                self.forget(*entry)

    def profile(self) -> dict:
        return {"lookups": self.lookups, "hits": self.hits, "reused_tokens": self.reused_tokens,
                "committed_entries": self.commits, "indexed_entries": len(self.keys)}
