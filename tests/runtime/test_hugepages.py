"""runtime/hugepages.py: which mappings it picks, and that the kernel really backs them with 2 MiB pages."""
from __future__ import annotations

import ctypes
import mmap
import sys

import pytest

from trtllm.runtime import hugepages as hp

SMAPS = """\
00400000-00600000 r-xp 00000000 08:01 123   /usr/bin/python3
01000000-03000000 rw-p 00000000 00:00 0     [heap]
Size:              32768 kB
Rss:               32000 kB
7e0000000000-7e0002000000 rw-p 00000000 00:00 0     [anon:some arena]
Rss:               32768 kB
7f0000000000-7f0001000000 rw-p 00000000 00:00 0
Size:              16384 kB
Rss:               16384 kB
VmFlags: rd wr mr mw me ac
7f0002000000-7f0003000000 rw-p 00000000 00:00 0
Rss:                 100 kB
7f0004000000-7f0005000000 rw-s 00000000 00:01 7     /dev/zero (deleted)
Rss:               16384 kB
7f0006000000-7f0007000000 rw-p 00000000 08:01 99    /data/llm.onnx.data
Rss:               16384 kB
7f0008000000-7f0008100000 rw-p 00000000 00:00 0
Rss:                1024 kB
7ffc00000000-7ffc00800000 rw-p 00000000 00:00 0     [stack]
Rss:                8192 kB
"""


@pytest.fixture
def two_mib_pages(monkeypatch):
    """The synthetic maps below are laid out for 2 MiB huge pages (x86-64, 4 KiB base pages)."""
    monkeypatch.setattr(hp, "HUGE_PAGE", 2 << 20)
    monkeypatch.setattr(hp, "MIN_BYTES", 4 << 20)


def test_parse_smaps_keeps_private_anonymous_mappings_and_the_heap():
    got = hp.parse_smaps(SMAPS)
    assert [(hex(m.start), m.rss >> 10) for m in got] == [
        ("0x1000000", 32000), ("0x7f0000000000", 16384), ("0x7f0002000000", 100), ("0x7f0008000000", 1024)]


def test_only_the_heap_growth_is_taken(two_mib_pages):
    heap = hp.parse_smaps(SMAPS)[:1]  # 0x1000000-0x3000000, 32000 kB resident
    assert hp.candidates({(0x1000000, 0x1800000)}, heap) == [hp.Mapping(0x1800000, 0x3000000, (32000 << 10) - (8 << 20))]
    assert hp.candidates({(0x1000000, 0x3000000)}, heap) == []  # no growth: the host's heap, left alone


def test_candidates_are_new_large_and_resident(two_mib_pages):
    now = hp.parse_smaps(SMAPS) + [hp.Mapping(0x7F000A000000, 0x7F000B000000, 16 << 20)]
    # 0x7f0000000000 existed before: left alone. 0x7f000a000000 is an older 1 MiB mapping the kernel
    # merged a new 15 MiB one into: only the new part is taken. The 100 kB-resident mapping would be
    # filled by huge pages (a stack or sparse arena); the 1 MiB one is below MIN_BYTES.
    before = {(0x1000000, 0x3000000), (0x7F0000000000, 0x7F0001000000), (0x7F000A000000, 0x7F000A100000)}
    picked = hp.candidates(before, now)
    assert [(hex(m.start), hex(m.end), m.rss >> 20) for m in picked] == [("0x7f000a100000", "0x7f000b000000", 15)]
    assert picked[0].huge_range() == (0x7F000A200000, 0x7F000B000000)
    assert [hex(m.start) for m in hp.candidates(set(), now)] == ["0x1000000", "0x7f0000000000", "0x7f000a000000"]
    # a merged mapping whose new part is mostly not resident (its old part holds the resident bytes)
    sparse = [hp.Mapping(0x7F000C000000, 0x7F000E000000, 17 << 20)]
    assert hp.candidates({(0x7F000C000000, 0x7F000D000000)}, sparse) == []
    assert hp.Mapping(0x1000100, 0x3000100, 0).huge_range() == (0x1200000, 0x3000000)


def test_turned_off_by_environment(monkeypatch):
    monkeypatch.setenv("TRTLLM_HUGE_PAGES", "0")
    assert hp.promote(hp.snapshot()).skipped == "TRTLLM_HUGE_PAGES=0"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="transparent huge pages are Linux's")
def test_nothing_new_is_said_so():
    if hp.thp_mode() in ("", "never"):
        pytest.skip("transparent huge pages are off here")
    assert hp.promote(hp.snapshot()).skipped == "no new mapping large enough"


def mapping_flags(address: int) -> tuple[str, int]:
    """(VmFlags, AnonHugePages kB) of the mapping holding `address`."""
    inside, flags, huge = False, "", 0
    for line in hp.read_smaps().splitlines():
        head = line.split()
        if head and "-" in head[0] and ":" not in head[0]:
            lo, hi = (int(x, 16) for x in head[0].split("-"))
            inside = lo <= address < hi
        elif inside and head[0] == "AnonHugePages:":
            huge = int(head[1])
        elif inside and head[0] == "VmFlags:":
            flags = line
    return flags, huge


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="transparent huge pages are Linux's")
def test_promote_backs_new_weights_with_huge_pages():
    before = hp.snapshot()
    size = 64 << 20
    if hp.MIN_BYTES > 32 << 20:
        pytest.skip(f"huge pages of {hp.HUGE_PAGE >> 20} MiB: a test buffer would take {hp.MIN_BYTES >> 30} GiB")
    buf = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)  # stands for the weights a session allocates and fills
    for i in range(0, size, mmap.PAGESIZE):
        buf[i] = 1
    view = ctypes.c_char.from_buffer(buf)
    address = ctypes.addressof(view)
    del view  # a live export would keep buf from closing
    report = hp.promote(before)
    if hp.thp_mode() in ("", "never"):
        assert report.skipped.startswith("transparent huge pages are") and report.mappings == 0
        return
    assert report.mappings >= 1 and report.bytes >= size - 2 * hp.HUGE_PAGE
    flags, huge_kb = mapping_flags(address)
    if report.collapsed_bytes:  # kernels >= 6.1 collapse at once, and leave the range's flags alone
        assert huge_kb << 10 >= size - 2 * hp.HUGE_PAGE and " hg" not in flags
    else:  # older kernels: advised, for khugepaged
        assert " hg" in flags
    buf.close()
