"""Saved system-prompt KV on disk, reused across requests and across trtllm-run processes.

An entry is the KV of one system-prompt prefix, keyed by everything that changes those values:

    key = sha256(engine identity, adapter name, prefix token ids)
    engine identity = sha256 of the engine's manifest.json (it carries a fresh build_id per build)

One file per entry, `<key>.kv`:

    b"TRTLLM-KV\\n" | header length (8 bytes, little endian) | header JSON | payload
    header: {"format", "key", "engine", "adapter", "prefix_ids", "shape", "dtype", "crc32"}
    payload: the engine's KV dtype (float32 or float16) [2 * layers, kv_heads, num_tokens, head_dim], C order

The payload checksum is CRC-32: it catches corruption and truncation at twice sha256's speed,
and the key already binds an entry to its engine and prefix (nothing here is adversarial).
Writes go to a temporary file in the same directory, fsync'd, then renamed: a crash mid-write
leaves no entry. A directory that cannot be written (read-only, full) is a warning: the entry is
still reused by this process, and the request goes on. A load checks magic, header, sizes, checksum
and that the stored key, engine and prefix ids are the asked-for ones; anything else is a warning,
the file is removed, and the KV is recomputed. The directory is bounded: after each save, least recently used entries (file mtime,
refreshed on every hit) are removed until the total is under max_bytes.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import struct
import tempfile
import warnings
import zlib
from pathlib import Path

import numpy as np

MAGIC = b"TRTLLM-KV\n"
FORMAT = 2
DEFAULT_MAX_BYTES = 2 << 30
TMP_PREFIX = ".tmp-"  # entries being written; eviction leaves them alone


class PrefixCacheWarning(UserWarning):
    """A cache entry was unusable and has been discarded."""


def engine_identity(engine_dir) -> str:
    return hashlib.sha256((Path(engine_dir) / "manifest.json").read_bytes()).hexdigest()


def parse_size(text: str) -> int:
    """'2G', '512M', '1000000' -> bytes (binary units)."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    scale = units.get(t[-1:], 1)
    number = t[:-1] if t[-1:] in units else t
    try:
        value = float(number) * scale
    except ValueError:
        value = math.nan
    if not math.isfinite(value):  # also "inf", "nan" and 1e400
        raise ValueError(f"--kv-cache-size must be a size like 2G, 512M or 1000000, got {text!r}")
    if value < 0:
        raise ValueError(f"--kv-cache-size must be >= 0, got {text!r}")
    return int(value)


class PrefixStore:
    def __init__(self, directory, engine_id: str, max_bytes: int = DEFAULT_MAX_BYTES):
        self.dir = Path(directory)
        self.engine_id, self.max_bytes = engine_id, max_bytes
        self.memory: dict[str, np.ndarray] = {}  # entries already read by this process
        self.hits = self.misses = self.saves = 0

    def key(self, prefix_ids: tuple[int, ...], adapter: str | None = None) -> str:
        """`adapter`: the LoRA adapter's digest (runtime/lora.py), None for the base model."""
        h = hashlib.sha256(f"{self.engine_id}\0{adapter or ''}\0".encode())
        h.update(np.asarray(prefix_ids, np.int64).tobytes())
        return h.hexdigest()

    def path(self, key: str) -> Path:
        return self.dir / f"{key}.kv"

    def load(self, prefix_ids: tuple[int, ...], adapter: str | None = None) -> np.ndarray | None:
        key = self.key(prefix_ids, adapter)
        kv = self.memory.get(key)
        if kv is None:
            kv = self.read(key, prefix_ids, adapter)
        if kv is None:
            self.misses += 1
            return None
        self.memory[key] = kv
        self.hits += 1
        try:
            os.utime(self.path(key))  # least-recently-used order is file mtime
        except OSError:
            pass
        return kv

    def read(self, key: str, prefix_ids: tuple[int, ...], adapter: str | None = None) -> np.ndarray | None:
        path = self.path(key)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as e:
            return self.discard(path, f"cannot be read ({e})")
        try:
            return self.decode(data, key, prefix_ids, adapter)
        except ValueError as e:
            return self.discard(path, str(e))

    def decode(self, data: bytes, key: str, prefix_ids: tuple[int, ...], adapter: str | None = None) -> np.ndarray:
        if not data.startswith(MAGIC) or len(data) < len(MAGIC) + 8:
            raise ValueError("is not a trtllm-edge KV entry")
        (size,) = struct.unpack("<Q", data[len(MAGIC):len(MAGIC) + 8])
        start = len(MAGIC) + 8 + size
        try:
            header = json.loads(data[len(MAGIC) + 8:start])
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise ValueError("has a corrupt header") from None
        expected = {"format": FORMAT, "key": key, "engine": self.engine_id, "adapter": adapter,
                    "prefix_ids": list(prefix_ids)}
        for name, value in expected.items():
            if header.get(name) != value:
                raise ValueError(f"header.{name} does not match")
        payload = memoryview(data)[start:]  # no copy of the (large) payload
        shape = tuple(header.get("shape", ()))
        if header.get("dtype") not in ("float32", "float16"):
            raise ValueError(f"has an unknown dtype {header.get('dtype')!r}")
        dtype = np.dtype(header["dtype"])
        if len(payload) != int(np.prod(shape, dtype=np.int64)) * dtype.itemsize or len(shape) != 4:
            raise ValueError(f"is truncated ({len(payload)} payload bytes for shape {shape})")
        if zlib.crc32(payload) != header.get("crc32"):
            raise ValueError("fails its checksum")
        return np.frombuffer(payload, dtype).reshape(shape)  # read-only view of `data`

    def discard(self, path: Path, why: str) -> None:
        warnings.warn(f"saved system-prompt KV {path} {why}; removed, it will be recomputed",
                      PrefixCacheWarning, stacklevel=3)
        try:
            path.unlink()
        except OSError:
            pass
        return None

    def save(self, prefix_ids: tuple[int, ...], kv: np.ndarray, adapter: str | None = None) -> None:
        key = self.key(prefix_ids, adapter)
        kv = np.ascontiguousarray(kv)
        payload = kv.tobytes()
        header = json.dumps({"format": FORMAT, "key": key, "engine": self.engine_id, "adapter": adapter,
                             "prefix_ids": list(prefix_ids), "shape": list(kv.shape), "dtype": kv.dtype.name,
                             "crc32": zlib.crc32(payload)}).encode()
        self.memory[key] = kv  # this process reuses it even if the disk will not take it
        if len(payload) > self.max_bytes:
            return  # would be evicted at once
        try:
            self.write(key, MAGIC + struct.pack("<Q", len(header)) + header + payload)
        except OSError as e:  # a read-only or full cache directory costs the reuse, not the request
            warnings.warn(f"saved system-prompt KV cannot be written to {self.dir} ({e}); later runs will "
                          "recompute it (see --kv-cache-dir)", PrefixCacheWarning, stacklevel=2)
            return
        self.saves += 1
        self.evict()

    def write(self, key: str, data: bytes) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.dir, prefix=TMP_PREFIX, suffix=".kv")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path(key))
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def evict(self) -> None:
        """Remove least recently used entries until the directory holds at most max_bytes."""
        entries = []
        for p in self.dir.glob("*.kv"):
            if p.name.startswith(TMP_PREFIX):  # another process's write in progress
                continue
            try:
                st = p.stat()
            except FileNotFoundError:  # another process evicted it first
                continue
            entries.append((st.st_mtime, st.st_size, p))
        total = sum(size for _, size, _ in entries)
        for _, size, p in sorted(entries):
            if total <= self.max_bytes:
                break
            try:
                p.unlink(missing_ok=True)
            except OSError:  # not ours to remove (permissions): it still counts, nothing else to do
                continue
            total -= size
