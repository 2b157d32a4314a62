"""Saved system-prompt KV on disk, reused across requests and across trtllm-run processes.

An entry is the KV of one system-prompt prefix, keyed by everything that changes those values:

    key = sha256(engine identity, adapter name, prefix token ids)
    engine identity = sha256 of the engine's manifest.json (it carries a fresh build_id per build)

One file per entry, `<key>.kv`:

    b"TRTLLM-KV\\n" | header length (8 bytes, little endian) | header JSON | payload
    header: {"format", "key", "engine", "adapter", "prefix_ids", "shape", "dtype", "crc32"}
    payload: the engine's KV dtype (float32, float16, bfloat16 bits or int8) [2 * layers, kv_heads, num_tokens,
             kv_row], C order (kv_row: head_dim, + 4 bytes of scale in an int8 cache)

The payload checksum is CRC-32: it catches corruption and truncation at twice sha256's speed,
and the key already binds an entry to its engine and prefix (nothing here is adversarial).
Writes go to a temporary file in the same directory, fsync'd, then renamed: a crash mid-write
leaves no entry. A directory that cannot be written (read-only, full) is a warning: the entry is
still reused by this process, and the request goes on. A load checks magic, header, sizes, checksum,
that the stored key, engine and prefix ids are the asked-for ones and that the shape and dtype are
those of the engine's KV for that many tokens; anything else is a warning,
the file is removed, and the KV is recomputed. The directory is bounded: after each save, least
recently used entries (file mtime, refreshed on every hit) are removed until the total is under
max_bytes (and before it, if the disk is full, until the new entry fits, when it can); so is this
process's copy of the entries it has used (the newest always kept: it is what a request is reusing). Entries are written with the mode the umask allows, so that a cache
directory can be shared.
"""
from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import re
import shutil
import stat
import struct
import tempfile
import time
import warnings
import zlib
from pathlib import Path

import numpy as np

from trtllm.runtime import files
from trtllm.runtime.kv_cache import kv_storage
from trtllm.runtime.manifest import KV_STORAGE

KV_NAMES = {held: name for name, held in KV_STORAGE.items()}  # uint16 holds bfloat16's bits

MAGIC = b"TRTLLM-KV\n"
FORMAT = 2
DEFAULT_MAX_BYTES = 2 << 30
# What a process keeps of the entries it used, beside the disk's copy, at most: --kv-cache-size
# (2 GiB by default) is a disk budget, and RAM beside the run's own KV buffer is scarcer on the
# devices this runs on. Reading an entry back costs a read and a checksum (47 MB: tens of ms).
DEFAULT_MEMORY_BYTES = 256 << 20
TMP_PREFIX = ".tmp-"  # entries being written; eviction leaves them alone
# What eviction may count and remove: our entries (a sha256 key) and our writes' temporary files
# (tempfile's 8 characters), never another file that happens to end in .kv (the directory is the user's)
ENTRY_NAME = re.compile(r"[0-9a-f]{64}\.kv")
TMP_NAME = re.compile(re.escape(TMP_PREFIX) + r"[a-z0-9_]{8}\.kv")
FULL_DISK_MARGIN = 1 << 20  # a full disk: room for an entry's blocks and metadata beyond its bytes
STALE_TMP_SECONDS = 3600  # unless they are this old: a process killed mid-write left them
SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*(?:([KMGT])(?:I?B?)?|B)?", re.IGNORECASE)


class PrefixCacheWarning(UserWarning):
    """A cache entry was unusable and has been discarded."""


def engine_identity(engine_dir) -> str:
    return hashlib.sha256((Path(engine_dir) / "manifest.json").read_bytes()).hexdigest()


def prefix_identity(identity: str, engine) -> str:
    """What saved KV is keyed by: the engine's files (`identity`) and its backend's `numerics`."""
    numerics = getattr(engine, "numerics", "")
    return hashlib.sha256(f"{identity}\0{numerics}".encode()).hexdigest() if numerics else identity


def parse_size(text: str) -> int:
    """'2G', '2GiB', '512M', '1000000' -> bytes (binary units)."""
    match = SIZE.fullmatch(text.strip())
    value = float(match[1]) * (1 << 10 * ("KMGT".index(match[2].upper()) + 1) if match[2] else 1) if match else 0
    if not match or not math.isfinite(value):  # 1e400 and the like
        raise ValueError(f"--kv-cache-size must be a size like 2G, 512M or 1000000, got {text!r}")
    return int(value)


def open_entry(path: Path, max_bytes: int):
    """An entry's file, opened for reading where it is one: a regular file of at most `max_bytes`
    (the store's limit). Anything else under an entry's name (a FIFO, which would wait for a
    writer; a link to /dev/zero, which never ends) is an OSError, read from no further."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # (a FIFO: no wait for a writer)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        if st.st_size > max_bytes:
            raise OSError(errno.EFBIG, f"{st.st_size} bytes, more than the store's limit {max_bytes}")
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


class PrefixStore:
    def __init__(self, directory, engine_id: str, max_bytes: int = DEFAULT_MAX_BYTES,
                 memory_bytes: int = DEFAULT_MEMORY_BYTES):
        self.dir = Path(directory)
        self.engine_id, self.max_bytes = engine_id, max_bytes
        self.memory_bytes = min(memory_bytes, max_bytes)
        self.memory: dict[str, np.ndarray] = {}  # entries this process has used, least recent first
        self.hits = self.misses = self.saves = 0

    def key(self, prefix_ids: tuple[int, ...], adapter: str | None = None) -> str:
        """`adapter`: the LoRA adapter's digest (runtime/lora.py), None for the base model."""
        h = hashlib.sha256(f"{self.engine_id}\0{adapter or ''}\0".encode())
        h.update(np.asarray(prefix_ids, np.int64).tobytes())
        return h.hexdigest()

    def path(self, key: str) -> Path:
        return self.dir / f"{key}.kv"

    def has(self, prefix_ids: tuple[int, ...], adapter: str | None = None) -> bool:
        """Whether an entry is there, without reading it or counting a hit (a corrupt one counts:
        reading it later discards it)."""
        return self.holds(self.key(prefix_ids, adapter))

    def holds(self, key: str) -> bool:
        return key in self.memory or self.path(key).is_file()

    def load(self, prefix_ids: tuple[int, ...], adapter: str | None = None,
             expect: tuple[tuple[int, ...], np.dtype] | None = None) -> np.ndarray | None:
        """`expect`: the (shape, dtype) the caller's KV buffers take; an entry of another is discarded."""
        key = self.key(prefix_ids, adapter)
        kv = self.memory.get(key)
        if kv is None:
            kv = self.read(key, prefix_ids, adapter, expect)
        if kv is None:
            self.misses += 1
            return None
        self.remember(key, kv)
        self.hits += 1
        try:
            os.utime(self.path(key))  # least-recently-used order is file mtime
        except OSError:
            pass
        return kv

    def read(self, key: str, prefix_ids: tuple[int, ...], adapter: str | None = None,
             expect: tuple[tuple[int, ...], np.dtype] | None = None) -> np.ndarray | None:
        path = self.path(key)
        try:
            with open_entry(path, self.max_bytes) as f:
                data = f.read()
        except (FileNotFoundError, NotADirectoryError):  # no entry, or no directory to hold one
            return None
        except OSError as e:  # another user's entry (umask 077), an I/O error, a pipe: a miss, not corrupt
            warnings.warn(f"saved KV {path} cannot be read ({e.strerror or e}); it will be recomputed",
                          PrefixCacheWarning, stacklevel=3)
            return None
        try:
            kv = self.decode(data, key, prefix_ids, adapter)
            if expect is not None and (kv.shape, kv.dtype) != (tuple(expect[0]), np.dtype(expect[1])):
                # a valid file of another layout (hand-made, another version's): restoring it would
                # broadcast, truncate or cast into the slot
                raise ValueError(f"holds KV of shape {list(kv.shape)} {kv.dtype}, not the engine's "
                                 f"{list(expect[0])} {np.dtype(expect[1])}")
            return kv
        except ValueError as e:
            return self.discard(path, str(e))
        except Exception as e:  # noqa: BLE001 - a header of the wrong types: as corrupt as any
            return self.discard(path, f"has a malformed header ({type(e).__name__}: {e})")

    def decode(self, data: bytes, key: str, prefix_ids: tuple[int, ...], adapter: str | None = None) -> np.ndarray:
        if not data.startswith(MAGIC) or len(data) < len(MAGIC) + 8:
            raise ValueError("is not a trtllm-edge KV entry")
        (size,) = struct.unpack("<Q", data[len(MAGIC):len(MAGIC) + 8])
        start = len(MAGIC) + 8 + size
        try:
            header = json.loads(data[len(MAGIC) + 8:start])
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise ValueError("has a corrupt header") from None
        if not isinstance(header, dict):
            raise ValueError("has a corrupt header")
        expected = {"format": FORMAT, "key": key, "engine": self.engine_id, "adapter": adapter,
                    "prefix_ids": list(prefix_ids)}
        for name, value in expected.items():
            if header.get(name) != value:
                raise ValueError(f"header.{name} does not match")
        payload = memoryview(data)[start:]  # no copy of the (large) payload
        shape = header.get("shape")
        if not (isinstance(shape, list) and len(shape) == 4
                and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape)):
            raise ValueError(f"has a malformed header (shape {shape!r}: four sizes of at least 0 expected)")
        shape = tuple(shape)
        if header.get("dtype") not in KV_STORAGE:
            raise ValueError(f"has an unknown dtype {header.get('dtype')!r}")
        dtype = kv_storage(header["dtype"])
        if len(payload) != math.prod(shape) * dtype.itemsize:
            raise ValueError(f"is truncated ({len(payload)} payload bytes for shape {shape})")
        if zlib.crc32(payload) != header.get("crc32"):
            raise ValueError("fails its checksum")
        return np.frombuffer(payload, dtype).reshape(shape)  # read-only view of `data`

    def discard(self, path: Path, why: str) -> None:
        try:
            path.unlink()
            done = "removed"
        except FileNotFoundError:
            done = "removed"  # (by another process first)
        except OSError as e:  # a read-only directory: it stays, and is read (and refused) again next time
            done = f"could not be removed ({e.strerror})"
        warnings.warn(f"saved KV {path} {why}; {done}, it will be recomputed",
                      PrefixCacheWarning, stacklevel=3)
        return None

    def save(self, prefix_ids: tuple[int, ...], kv: np.ndarray, adapter: str | None = None) -> None:
        key = self.key(prefix_ids, adapter)
        kv = np.ascontiguousarray(kv)
        payload = kv.reshape(-1).view(np.uint8)  # (its bytes, not a copy: an entry is up to hundreds of MB)
        header = json.dumps({"format": FORMAT, "key": key, "engine": self.engine_id, "adapter": adapter,
                             "prefix_ids": list(prefix_ids), "shape": list(kv.shape), "dtype": KV_NAMES[kv.dtype.name],
                             "crc32": zlib.crc32(payload)}).encode()
        self.remember(key, kv)  # this process reuses it even if the disk will not take it
        data = (MAGIC + struct.pack("<Q", len(header)) + header, payload)
        size = len(data[0]) + payload.nbytes
        if size > self.max_bytes:  # it would be evicted at once
            warnings.warn(f"saved KV of {len(prefix_ids)} tokens is {size} bytes, more than "
                          f"--kv-cache-size ({self.max_bytes}): later runs will recompute it",
                          PrefixCacheWarning, stacklevel=2)
            self.tidy()  # a lowered limit still applies to what is there
            return
        try:
            try:
                self.write(key, data)
            except OSError as e:  # a full disk (below --kv-cache-size): older entries make room, once
                if e.errno not in (errno.ENOSPC, errno.EDQUOT) or not self.evict(free=self.shortfall(size, e)):
                    raise
                self.write(key, data)
        except OSError as e:  # a read-only or full cache directory costs the reuse, not the request
            # (the reason without the file's name: each save's temporary name differs, and one
            # warning per request buried the output; Python's filter then says it once)
            warnings.warn(f"saved KV cannot be written to {self.dir} ({e.strerror or type(e).__name__}); later "
                          "runs will recompute it (see --kv-cache-dir)", PrefixCacheWarning, stacklevel=2)
            return
        self.saves += 1
        self.tidy()

    def shortfall(self, size: int, error: OSError) -> int:
        """The bytes a full disk lacks for a file of `size` (with a margin for its blocks and
        metadata); under a quota (EDQUOT) the disk's free space says nothing: all of it."""
        try:
            free = 0 if error.errno == errno.EDQUOT else shutil.disk_usage(self.dir).free
        except OSError:
            free = 0
        return max(size - free, 0) + FULL_DISK_MARGIN

    def tidy(self) -> None:
        """evict(), where a directory it cannot tidy (another user's file in a shared one, a
        read-only mount, a symlink loop) is a warning: the entry is saved, the requests go on."""
        try:
            self.evict()
        except OSError as e:
            warnings.warn(f"the saved KV directory {self.dir} cannot be tidied ({e}); it may grow "
                          "past --kv-cache-size", PrefixCacheWarning, stacklevel=3)

    def remember(self, key: str, kv: np.ndarray) -> None:
        """Keep `kv` in this process, most recent last, within memory_bytes but for the newest."""
        self.memory.pop(key, None)
        self.memory[key] = kv
        total = sum(v.nbytes for v in self.memory.values())
        while total > self.memory_bytes and len(self.memory) > 1:
            total -= self.memory.pop(next(iter(self.memory))).nbytes

    def write(self, key: str, data: tuple[bytes, np.ndarray]) -> None:
        """(header, payload): an entry's file, written whole under a temporary name, then renamed."""
        self.dir.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.dir, prefix=TMP_PREFIX, suffix=".kv")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data[0])
                files.write_synced(f, data[1])
            os.chmod(tmp, 0o666 & ~files.current_umask())  # not mkstemp's 600: a cache directory may be shared
            os.replace(tmp, self.path(key))
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def evict(self, free: int = 0) -> int:
        """Remove least recently used entries until the directory holds at most max_bytes, and `free`
        bytes less than it did (room for an entry on a full disk: none, if all of them are less than
        that); how many bytes were removed."""
        entries = []
        # (listed with os.listdir: Path.glob takes a directory it may not list for an empty one, and
        # the store would grow past its limit without a word; the error goes to tidy()'s warning)
        try:
            names = os.listdir(self.dir)
        except FileNotFoundError:  # (nothing saved yet)
            return 0
        for name in names:
            p = self.dir / name
            ours, tmp = ENTRY_NAME.fullmatch(p.name), TMP_NAME.fullmatch(p.name)
            if not ours and not tmp:
                continue
            try:
                st = p.stat()
            except OSError:  # another process evicted it first; a link that leads nowhere
                continue
            if tmp:  # another process's write in progress, or a dead one's
                if time.time() - st.st_mtime > STALE_TMP_SECONDS:
                    try:
                        p.unlink(missing_ok=True)
                    except OSError:  # another user's, in a shared (sticky) directory: theirs to remove
                        pass
                continue
            entries.append((st.st_mtime, st.st_size, p))
        total = sum(size for _, size, _ in entries)
        if free > total:  # removing every entry would not make the room
            return 0
        limit, removed = min(self.max_bytes, total - free), 0
        for _, size, p in sorted(entries):
            if total <= limit:
                break
            try:
                p.unlink(missing_ok=True)
            except OSError:  # not ours to remove (permissions): it still counts, nothing else to do
                continue
            total -= size
            removed += size
        return removed
