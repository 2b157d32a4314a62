"""Back the engine's weights with huge pages (Linux transparent huge pages: 2 MiB on x86-64).

A decode step reads every weight once. With 4 KiB pages that stream crosses a page boundary every
4 KiB: each crossing can miss the TLB, and the hardware prefetcher stops at it. ONNX Runtime packs
its weights into malloc'd memory, which on a system whose THP mode is "madvise" (the default on
Debian, Ubuntu and JetPack) gets 4 KiB pages. So after the session is built we ask the kernel to
MADV_COLLAPSE the mappings that appeared while it was built (Linux >= 6.1: huge pages now, and no
lasting change to how the range faults later); on older kernels we mark them MADV_HUGEPAGE, which
khugepaged acts on in the background. Measured on the demo model (docs/performance.md): fp32
decode 5-20% faster in A/B pairs, int4 0-7%.

Only memory that is new since the snapshot (the part of each mapping that no earlier mapping
covered: the kernel merges new anonymous mappings into adjacent older ones, and the brk heap grows
in place), anonymous, private, at least MIN_BYTES and almost fully resident is touched: that is
ONNX Runtime's packed weights (in the heap when glibc's mmap threshold has risen, as it does after
a library like tokenizers frees large blocks), not the host program's memory from before, thread
stacks or sparse arenas, whose untouched pages huge pages would fill. Best effort:
elsewhere (not Linux, THP "never", no such mapping) it changes nothing and says why in its report.
"""
from __future__ import annotations

import ctypes
import os
import sys
import time
from dataclasses import dataclass

MADV_HUGEPAGE, MADV_COLLAPSE = 14, 25
THP_MODE = "/sys/kernel/mm/transparent_hugepage/enabled"
THP_SIZE = "/sys/kernel/mm/transparent_hugepage/hpage_pmd_size"
MIN_RESIDENT = 0.9  # share of a mapping that must be in memory already


def huge_page_size() -> int:
    """The kernel's THP size: 2 MiB with 4 KiB base pages (x86-64, Jetson), 512 MiB with 64 KiB."""
    try:
        with open(THP_SIZE, encoding="ascii") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 2 << 20


HUGE_PAGE = huge_page_size()
MIN_BYTES = 2 * HUGE_PAGE  # smaller mappings cannot hold a whole aligned huge page often enough


@dataclass(frozen=True, slots=True)
class Mapping:
    start: int
    end: int
    rss: int  # bytes resident

    def huge_range(self) -> tuple[int, int]:
        """The part of the mapping that whole huge pages can cover."""
        lo = (self.start + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1)
        return lo, max(lo, self.end & ~(HUGE_PAGE - 1))


@dataclass(frozen=True, slots=True)
class Report:
    mappings: int = 0        # mappings collapsed or advised
    bytes: int = 0           # bytes they cover
    collapsed_bytes: int = 0  # bytes the kernel turned into huge pages at once
    seconds: float = 0.0
    skipped: str = ""        # why nothing was done, when nothing was

    def to_json(self) -> dict:
        return {"mappings": self.mappings, "mib": self.bytes >> 20, "collapsed_mib": self.collapsed_bytes >> 20,
                "seconds": round(self.seconds, 3), **({"skipped": self.skipped} if self.skipped else {})}


def parse_smaps(text: str) -> list[Mapping]:
    """Anonymous private writable mappings (unnamed, or the brk heap) from smaps text."""
    out, current = [], None
    for line in text.splitlines():
        head = line.split(None, 5)
        if head and "-" in head[0] and len(head) >= 5 and ":" not in head[0]:
            current = None
            name = head[5].strip() if len(head) > 5 else ""
            if head[1].startswith("rw") and head[1].endswith("p") and head[4] == "0" and name in ("", "[heap]"):
                lo, hi = (int(x, 16) for x in head[0].split("-"))
                current = [lo, hi]
        elif current is not None and head and head[0] == "Rss:":
            out.append(Mapping(current[0], current[1], int(head[1]) * 1024))
            current = None
    return out


def candidates(before: set[tuple[int, int]], now: list[Mapping]) -> list[Mapping]:
    """The parts of `now` that no mapping of `before` covered, large and almost resident.

    The kernel merges a new anonymous mapping into an adjacent older one, so a mapping of `now` can
    be part old, part new: only the new part (memory allocated since `before`) is taken. smaps gives
    one resident count per mapping, so a part's residency is bounded below by the mapping's
    resident bytes minus the size of the rest of it."""
    out = []
    for m in now:
        covered = sorted((max(lo, m.start), min(hi, m.end)) for lo, hi in before if lo < m.end and m.start < hi)
        gaps, pos = [], m.start
        for lo, hi in covered + [(m.end, m.end)]:
            if lo > pos:
                gaps.append((pos, lo))
            pos = max(pos, hi)
        for lo, hi in gaps:
            resident = m.rss - ((m.end - m.start) - (hi - lo))
            if hi - lo >= MIN_BYTES and resident >= MIN_RESIDENT * (hi - lo):
                out.append(Mapping(lo, hi, resident))
    return out


def snapshot() -> set[tuple[int, int]]:
    """The process's anonymous mappings now; pass it to promote() after allocating the weights.
    Empty (nothing read) where promote() will do nothing: not Linux, or TRTLLM_HUGE_PAGES=0."""
    if not sys.platform.startswith("linux") or os.environ.get("TRTLLM_HUGE_PAGES", "1") == "0":
        return set()
    return {(m.start, m.end) for m in parse_smaps(read_smaps())}


def read_smaps() -> str:
    with open("/proc/self/smaps", encoding="ascii", errors="replace") as f:
        return f.read()


def thp_mode() -> str:
    """'always', 'madvise' or 'never' (the bracketed word of the sysfs file); '' when unknown."""
    try:
        with open(THP_MODE, encoding="ascii") as f:
            text = f.read()
    except OSError:
        return ""
    return text[text.find("[") + 1:text.find("]")] if "[" in text else ""


def promote(before: set[tuple[int, int]]) -> Report:
    """MADV_COLLAPSE each candidate (MADV_HUGEPAGE where the kernel cannot collapse: before 6.1)."""
    if not sys.platform.startswith("linux"):
        return Report(skipped="not Linux")
    if os.environ.get("TRTLLM_HUGE_PAGES", "1") == "0":
        return Report(skipped="TRTLLM_HUGE_PAGES=0")
    mode = thp_mode()
    if mode in ("", "never"):
        return Report(skipped=f"transparent huge pages are {mode or 'not available'}")
    t0 = time.perf_counter()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    n = total = collapsed = 0
    for m in candidates(before, parse_smaps(read_smaps())):
        lo, hi = m.huge_range()
        if hi <= lo:
            continue
        if libc.madvise(lo, hi - lo, MADV_COLLAPSE) == 0:
            collapsed += hi - lo
        elif libc.madvise(lo, hi - lo, MADV_HUGEPAGE) != 0:  # kernels before 6.1: khugepaged, later
            continue
        n, total = n + 1, total + hi - lo
    if not n:
        return Report(seconds=time.perf_counter() - t0, skipped="no new mapping large enough")
    return Report(n, total, collapsed, time.perf_counter() - t0)
