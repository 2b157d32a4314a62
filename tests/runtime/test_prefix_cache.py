"""Saved system-prompt KV: the on-disk store alone (end to end on a tiny engine: test_prefix_cache_cli.py)."""
from __future__ import annotations

import errno
import json
import os
import time

import numpy as np
import pytest

from trtllm.runtime.prefix_cache import PrefixCacheWarning, PrefixStore, parse_size

PREFIX = (1, 2, 3, 4)


def kv(n=4, seed=0):
    return np.random.default_rng(seed).standard_normal((4, 2, n, 8)).astype(np.float32)


def test_roundtrip_in_memory_and_across_processes(tmp_path):
    store = PrefixStore(tmp_path, "engine-a")
    assert store.load(PREFIX) is None
    store.save(PREFIX, kv())
    assert np.array_equal(store.load(PREFIX), kv())
    fresh = PrefixStore(tmp_path, "engine-a")  # a later process: reads the file
    assert np.array_equal(fresh.load(PREFIX), kv())
    assert fresh.hits == 1 and list(tmp_path.iterdir()) == [store.path(store.key(PREFIX))]


def test_has_tells_without_reading_or_counting(tmp_path):
    store = PrefixStore(tmp_path, "engine-a")
    assert not store.has(PREFIX)
    store.save(PREFIX, kv())
    fresh = PrefixStore(tmp_path, "engine-a")  # a later process: the file only
    assert store.has(PREFIX) and fresh.has(PREFIX) and not fresh.has(PREFIX, adapter="french")
    assert fresh.hits == fresh.misses == 0 and not fresh.memory  # nothing read


def test_an_entry_it_may_not_read_is_a_miss_and_stays(tmp_path, monkeypatch):
    """Another user's entry (saved with umask 077) in a shared directory: reading it fails with a
    permission error, which is no reason to delete it for its owner."""
    from pathlib import Path

    PrefixStore(tmp_path, "engine-a").save(PREFIX, kv())
    real = os.open
    monkeypatch.setattr(os, "open", lambda p, *a, **k: (_ for _ in ()).throw(PermissionError(13, "Permission denied"))
                        if Path(p).suffix == ".kv" else real(p, *a, **k))
    store = PrefixStore(tmp_path, "engine-a")
    with pytest.warns(PrefixCacheWarning, match="cannot be read"):
        assert store.load(PREFIX) is None
    assert store.path(store.key(PREFIX)).is_file()


@pytest.mark.parametrize("kind", ["fifo", "device", "too large"])
def test_what_is_no_entry_under_an_entrys_name_is_a_miss_read_from_no_further(tmp_path, kind):
    """A FIFO (reading it waited for a writer: the run hung), a link to /dev/zero (read until memory
    ran out) or a file past the store's limit: a miss with a warning, left where it is; the context
    index passes over them too."""
    from trtllm.runtime.context_cache import ContextCache

    store = PrefixStore(tmp_path, "engine-a", max_bytes=1 << 20)
    path = store.path(store.key(PREFIX))
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "device":
        path.symlink_to("/dev/zero")
    else:
        PrefixStore(tmp_path, "engine-a").save(PREFIX, kv())
        os.truncate(path, 2 << 20)
    start = time.monotonic()
    with pytest.warns(PrefixCacheWarning, match="cannot be read"):
        assert store.load(PREFIX) is None
    contexts = ContextCache(PrefixStore(tmp_path, "engine-a", max_bytes=1 << 20))
    contexts.scan()
    assert contexts.index == {} and time.monotonic() - start < 10 and os.path.lexists(path)


def test_key_covers_engine_adapter_and_prefix(tmp_path):
    PrefixStore(tmp_path, "engine-a").save(PREFIX, kv())
    assert PrefixStore(tmp_path, "engine-b").load(PREFIX) is None
    assert PrefixStore(tmp_path, "engine-a").load(PREFIX, adapter="french") is None
    assert PrefixStore(tmp_path, "engine-a").load(PREFIX + (5,)) is None
    assert PrefixStore(tmp_path, "engine-a").load(PREFIX) is not None


@pytest.mark.parametrize("damage", ["flip", "truncate", "empty", "header", "garbage", "list", "types"])
def test_damaged_entry_is_discarded_with_a_warning(tmp_path, damage):
    store = PrefixStore(tmp_path, "engine-a")
    store.save(PREFIX, kv())
    path = store.path(store.key(PREFIX))
    data = bytearray(path.read_bytes())
    if damage == "flip":
        data[-5] ^= 0xFF
    elif damage == "truncate":
        data = data[:-16]
    elif damage == "empty":
        data = bytearray()
    elif damage == "header":
        data = data.replace(b'"engine-a"', b'"engine-x"')
    elif damage in ("list", "types"):  # valid JSON of the wrong shape: not a crash of every request
        header = b"[1]" if damage == "list" else json.dumps(
            {**json.loads(bytes(data[18:18 + int.from_bytes(data[10:18], "little")])), "shape": 7}).encode()
        data = bytearray(b"TRTLLM-KV\n" + len(header).to_bytes(8, "little") + header)
    else:
        data = bytearray(b"not a kv file at all")
    path.write_bytes(bytes(data))
    with pytest.warns(PrefixCacheWarning):
        assert PrefixStore(tmp_path, "engine-a").load(PREFIX) is None
    assert not path.exists()


def test_interrupted_write_leaves_no_entry(tmp_path, monkeypatch):
    store = PrefixStore(tmp_path, "engine-a")

    def crash(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(KeyboardInterrupt):
        store.save(PREFIX, kv())
    monkeypatch.undo()
    assert list(tmp_path.iterdir()) == []
    assert PrefixStore(tmp_path, "engine-a").load(PREFIX) is None


def test_lru_eviction_keeps_the_directory_bounded(tmp_path):
    size = len(PrefixStore(tmp_path, "x").key(PREFIX))  # any small number; real size measured below
    store = PrefixStore(tmp_path, "engine-a")
    store.save((1,), kv(seed=1))
    entry = store.path(store.key((1,))).stat().st_size
    store.max_bytes = 2 * entry + size
    store.save((2,), kv(seed=2))
    old = time.time() - 100
    os.utime(store.path(store.key((1,))), (old, old))
    os.utime(store.path(store.key((2,))), (old + 1, old + 1))
    assert store.load((1,)) is not None  # a hit refreshes (1,): (2,) is now the least recent
    store.save((3,), kv(seed=3))
    names = {p.name for p in tmp_path.iterdir()}
    assert names == {store.path(store.key(k)).name for k in [(1,), (3,)]}


def test_a_full_disk_evicts_older_entries_to_make_room(tmp_path, monkeypatch, recwarn):
    """A disk that fills below --kv-cache-size: the least recently used entries go until the new one
    fits (the disk here holds two entries), and it is saved; an entry larger than all of them
    removes none of them, and is a warning."""
    from trtllm.runtime import prefix_cache

    N = 8192  # positions: entries of 2 MiB, more than the margin a write keeps

    store = PrefixStore(tmp_path, "engine-a")
    store.save((1,), kv(n=N, seed=1))
    entry = store.path(store.key((1,))).stat().st_size
    store.save((2,), kv(n=N, seed=2))
    old = time.time() - 100
    for k, t in (((1,), old), ((2,), old + 1)):
        os.utime(store.path(store.key(k)), (t, t))
    write, disk = PrefixStore.write, 2 * entry + prefix_cache.FULL_DISK_MARGIN

    def free():
        return disk - sum(p.stat().st_size for p in tmp_path.glob("*.kv"))

    def small_disk(self, key, data):
        if len(data[0]) + data[1].nbytes > free():  # (header, payload)
            raise OSError(errno.ENOSPC, "No space left on device")
        write(self, key, data)

    monkeypatch.setattr(PrefixStore, "write", small_disk)
    monkeypatch.setattr(prefix_cache.shutil, "disk_usage", lambda d: type("Usage", (), {"free": free()}))
    store.save((3,), kv(n=N, seed=3))
    assert {p.name for p in tmp_path.iterdir()} == {store.path(store.key(k)).name for k in [(2,), (3,)]}
    assert store.saves == 3 and not recwarn.list
    np.testing.assert_array_equal(PrefixStore(tmp_path, "engine-a").load((3,)), kv(n=N, seed=3))
    big = PrefixStore(tmp_path, "engine-a")  # an entry larger than the whole disk: a warning, nothing lost
    with pytest.warns(PrefixCacheWarning, match="No space left"):
        big.save((4,), kv(n=3 * N, seed=4))
    assert big.saves == 0 and big.load((4,)) is not None  # (from memory)
    assert {p.name for p in tmp_path.iterdir()} == {store.path(store.key(k)).name for k in [(2,), (3,)]}


def test_a_full_quota_evicts_for_the_whole_entry(tmp_path, monkeypatch, recwarn):
    """Under a quota (EDQUOT) the disk's free space says nothing: least recently used entries go
    until the whole entry and the margin fit, so one failed save does not drain the cache for nothing."""
    from trtllm.runtime import prefix_cache

    N, store = 8192, PrefixStore(tmp_path, "engine-a")
    for i in (1, 2, 3):
        store.save((i,), kv(n=N, seed=i))
        os.utime(store.path(store.key((i,))), (time.time() - 100 + i,) * 2)
    entry, write = store.path(store.key((1,))).stat().st_size, PrefixStore.write
    quota = 3 * entry

    def quota_write(self, key, data):
        if sum(p.stat().st_size for p in tmp_path.glob("*.kv")) + len(data[0]) + data[1].nbytes > quota:
            raise OSError(errno.EDQUOT, "Disk quota exceeded")
        write(self, key, data)

    monkeypatch.setattr(PrefixStore, "write", quota_write)
    monkeypatch.setattr(prefix_cache.shutil, "disk_usage", lambda d: type("Usage", (), {"free": 1 << 40}))
    store.save((4,), kv(n=N, seed=4))  # one entry + 1 MiB: the two oldest go (entries are 2 MiB)
    assert {p.name for p in tmp_path.iterdir()} == {store.path(store.key(k)).name for k in [(3,), (4,)]}
    assert store.saves == 4 and not recwarn.list


def test_unwritable_directory_is_a_warning_and_the_entry_still_serves(tmp_path):
    (tmp_path / "afile").write_text("x")
    store = PrefixStore(tmp_path / "afile" / "cache", "engine-a")  # cannot be created (root ignores modes)
    with pytest.warns(PrefixCacheWarning, match="cannot be written to"):
        store.save(PREFIX, kv())
    np.testing.assert_array_equal(store.load(PREFIX), kv())  # this process reuses it from memory
    assert store.saves == 0


def test_an_unwritable_directory_warns_once_per_run(tmp_path, monkeypatch):
    """Each save's temporary file has its own name: the warning leaves it out, so Python's filter
    says it once, not once per request (a read-only store gave 37 lines for 30 requests)."""
    import warnings

    store = PrefixStore(tmp_path, "engine-a")

    def read_only(self, key, data):
        raise OSError(errno.EROFS, "Read-only file system", str(tmp_path / f".tmp-{len(data)}-{key[:4]}.kv"))

    monkeypatch.setattr(PrefixStore, "write", read_only)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        for n in (3, 4, 5):
            store.save(tuple(range(n)), kv(n=n))
    assert len(caught) == 1 and "(Read-only file system)" in str(caught[0].message)


def test_eviction_leaves_writes_in_progress_alone(tmp_path):
    """Another process's temporary file is not an entry: evicting it would fail that process's save."""
    other = tmp_path / ".tmp-other123.kv"
    other.write_bytes(b"x" * 100_000)
    store = PrefixStore(tmp_path, "engine-a", max_bytes=10_000)
    store.save(PREFIX, kv())
    assert other.exists() and store.path(store.key(PREFIX)).exists()


def test_too_large_entry_is_a_warning_and_a_lowered_limit_applies(tmp_path):
    store = PrefixStore(tmp_path, "engine-a")
    for n in range(3):
        store.save((n,), kv(seed=n))
    entry = store.path(store.key((0,))).stat().st_size
    assert kv().nbytes < entry  # the header counts: a payload of exactly the limit does not fit
    smaller = PrefixStore(tmp_path, "engine-a", max_bytes=kv().nbytes)
    with pytest.warns(PrefixCacheWarning, match="more than --kv-cache-size"):
        smaller.save((9,), kv(seed=9))
    assert list(tmp_path.iterdir()) == []  # the three older entries went too
    assert smaller.load((9,)) is not None  # this process still reuses it


def test_memory_copy_is_bounded(tmp_path):
    store = PrefixStore(tmp_path, "engine-a", max_bytes=2 * kv().nbytes + 1000)
    for n in range(5):
        store.save((n,), kv(seed=n))
    assert list(store.memory) == [store.key((3,)), store.key((4,))]
    assert store.load((3,)) is not None  # a hit makes it the most recent
    store.save((5,), kv(seed=5))
    assert list(store.memory) == [store.key((3,)), store.key((5,))]
    none = PrefixStore(tmp_path / "none", "engine-a", max_bytes=0)
    for n in range(3):
        with pytest.warns(PrefixCacheWarning):
            none.save((n,), kv(seed=n))
    assert list(none.memory) == [none.key((2,))]  # only what the current request reuses
    # RAM is bounded apart from the disk (256 MiB by default, 2 GiB of disk)
    ram = PrefixStore(tmp_path / "ram", "engine-a", max_bytes=10 * kv().nbytes, memory_bytes=kv().nbytes)
    for n in range(3):
        ram.save((n,), kv(seed=n))
    assert list(ram.memory) == [ram.key((2,))] and len(list((tmp_path / "ram").iterdir())) == 3
    assert ram.load((0,)) is not None and list(ram.memory) == [ram.key((0,))]  # read back from disk


def test_entries_get_the_umask_mode_and_dead_writes_are_cleared(tmp_path):
    stale = tmp_path / ".tmp-deadbeef.kv"
    stale.write_bytes(b"x")
    old = time.time() - 2 * 3600
    os.utime(stale, (old, old))
    mask = os.umask(0o022)
    try:
        PrefixStore(tmp_path, "engine-a").save(PREFIX, kv())
    finally:
        os.umask(mask)
    (entry,) = tmp_path.iterdir()
    assert entry.stat().st_mode & 0o777 == 0o644


def test_eviction_leaves_files_it_did_not_write_alone(tmp_path):
    """The directory may hold the user's own files: only our entries (sha256 names) and our writes'
    temporary files count and go. The wrong variant, every *.kv, would remove the user's."""
    theirs = [tmp_path / "my_database.kv", tmp_path / ".tmp-notes.kv", tmp_path / ("A" * 64 + ".kv")]
    old = time.time() - 10 * 365 * 86400
    for f in theirs:
        f.write_bytes(b"x" * 200_000)
        os.utime(f, (old, old))
    store = PrefixStore(tmp_path, "engine-a", max_bytes=2 * kv().nbytes + 800)  # two entries (their headers)
    for n in range(4):
        store.save((n,), kv(seed=n))
    assert all(f.exists() for f in theirs)
    assert sorted(p.name for p in tmp_path.iterdir() if p not in theirs) == sorted(
        store.path(store.key((n,))).name for n in (2, 3))


def test_an_entry_that_cannot_be_removed_is_not_said_to_be(tmp_path, monkeypatch):
    from pathlib import Path

    store = PrefixStore(tmp_path, "engine-a")
    store.save(PREFIX, kv())
    path = store.path(store.key(PREFIX))
    path.write_bytes(path.read_bytes()[:-10])  # truncated
    fresh = PrefixStore(tmp_path, "engine-a")

    def refuse(self, missing_ok=False):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Path, "unlink", refuse)
    with pytest.warns(PrefixCacheWarning, match="could not be removed \\(Permission denied\\), it will be recomputed"):
        assert fresh.load(PREFIX) is None
    assert path.exists()


def test_a_directory_it_cannot_tidy_is_a_warning_and_the_entry_is_saved(tmp_path, monkeypatch):
    """Another user's stale temporary file in a shared (sticky) directory, a symlink loop named
    like an entry: eviction cannot stat or remove them, and that costs the tidying, not the save.
    The wrong variant, the error raised, failed every unfinished request of the run."""
    from pathlib import Path

    stale = tmp_path / ".tmp-abcdefgh.kv"
    stale.write_bytes(b"x")
    old = time.time() - 2 * 3600
    os.utime(stale, (old, old))
    loop = tmp_path / ("0" * 64 + ".kv")
    loop.symlink_to(loop.name)
    unlink = Path.unlink

    def sticky(self, missing_ok=False):
        if self.name == stale.name:
            raise PermissionError(1, "Operation not permitted")
        return unlink(self, missing_ok)

    monkeypatch.setattr(Path, "unlink", sticky)
    store = PrefixStore(tmp_path, "engine-a")
    store.save(PREFIX, kv())  # no warning needed: what it cannot touch is skipped
    assert np.array_equal(PrefixStore(tmp_path, "engine-a").load(PREFIX), kv()) and stale.exists()
    monkeypatch.setattr(PrefixStore, "evict", lambda self: (_ for _ in ()).throw(OSError(30, "Read-only file system")))
    with pytest.warns(PrefixCacheWarning, match="cannot be tidied .*Read-only file system"):
        store.save((9,), kv(seed=1))


@pytest.mark.parametrize("shape, dtype", [((4, 2, 6, 8), np.float32), ((4, 1, 4, 8), np.float32),
                                          ((2, 2, 4, 8), np.float32), ((4, 2, 4, 8), np.float16),
                                          ((4, 8, 4, 2), np.float32)])
def test_an_entry_of_another_layout_is_discarded(tmp_path, shape, dtype):
    """A valid file (checksum and all) whose KV is not the engine's layout for its prefix: restoring
    it would broadcast, truncate or cast into the slot, or fail the step."""
    PrefixStore(tmp_path, "engine-a").save(PREFIX, np.zeros(shape, dtype))
    fresh = PrefixStore(tmp_path, "engine-a")
    with pytest.warns(PrefixCacheWarning, match="holds KV of shape .* not the engine's \\[4, 2, 4, 8\\] float32; removed"):
        assert fresh.load(PREFIX, expect=((4, 2, 4, 8), np.float32)) is None
    assert not list(tmp_path.iterdir())
    PrefixStore(tmp_path, "engine-a").save(PREFIX, kv())
    assert np.array_equal(PrefixStore(tmp_path, "engine-a").load(PREFIX, expect=((4, 2, 4, 8), np.float32)), kv())


def test_parse_size():
    assert parse_size("2G") == 2 << 30 and parse_size("512MiB") == 512 << 20 and parse_size("1000") == 1000
    assert parse_size("2Gi") == parse_size("2gb") == 2 << 30 and parse_size("1.5K") == 1536
    for bad in ("lots", "inf", "nan", "1e400", "-1G", "2IB", "1_000", "G", ""):
        with pytest.raises(ValueError, match="--kv-cache-size"):
            parse_size(bad)


@pytest.mark.parametrize("shape", [[-4, -2, 8, 16], ["4", "2", "8", "16x"], [4, 2, 8, 16, 1], None, [2, 2, 2, True]])
def test_an_entry_with_a_malformed_shape_says_so(tmp_path, shape):
    """A header whose shape is not four sizes (its payload and checksum sound) is discarded with a
    warning that says so; a review found numpy's reshape text instead, or 'truncated'."""
    store = PrefixStore(tmp_path, "engine-a")
    store.save(PREFIX, kv())
    path = store.path(store.key(PREFIX))
    data = path.read_bytes()
    size = int.from_bytes(data[10:18], "little")
    header = json.dumps({**json.loads(data[18:18 + size]), "shape": shape}).encode()
    path.write_bytes(b"TRTLLM-KV\n" + len(header).to_bytes(8, "little") + header + data[18 + size:])
    with pytest.warns(PrefixCacheWarning, match=r"has a malformed header \(shape .*four sizes"):
        assert PrefixStore(tmp_path, "engine-a").load(PREFIX) is None
    assert not path.exists()


def test_a_directory_that_cannot_be_listed_is_a_warning(tmp_path, monkeypatch):
    """Entries are written, but a directory that cannot be listed (mode 0300) cannot be kept within
    --kv-cache-size: a warning says so (Path.glob took it for an empty one: it grew without a word)."""
    store = PrefixStore(tmp_path, "engine-a", max_bytes=1 << 20)
    listdir = os.listdir

    def refuse(path):
        if os.fspath(path) == os.fspath(tmp_path):
            raise PermissionError(13, "Permission denied")
        return listdir(path)

    monkeypatch.setattr(os, "listdir", refuse)
    with pytest.warns(PrefixCacheWarning, match="cannot be tidied"):
        store.save(PREFIX, kv())
    assert store.path(store.key(PREFIX)).exists()


def test_a_save_writes_the_kv_as_it_is_without_copies(tmp_path):
    """An entry is up to hundreds of MB (and --context-reuse saves one per request): its bytes go
    to the file from the caller's array, not through a copy of them and another of the file's."""
    import tracemalloc

    store, big = PrefixStore(tmp_path, "engine-a"), kv(n=65536, seed=5)  # 16 MiB
    tracemalloc.start()
    try:
        store.save((9,), big)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < big.nbytes // 8, peak
    np.testing.assert_array_equal(PrefixStore(tmp_path, "engine-a").load((9,)), big)
