// Weight copies on huge pages, for the kernels of plugins/cpu (see Resident).
#pragma once

#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <tuple>
#include <utility>
#include <vector>

#include "common.h"

namespace trtllm_cpu {

// Weights on huge pages. ONNX Runtime hands the kernel its initializers where it loaded them: for an
// engine's external data file, private file mappings on 4 KiB pages, which runtime/hugepages.py
// cannot promote (it takes anonymous memory). A decode step streams every weight once, so on first
// use each weight is copied into an arena of 2 MiB-aligned chunks marked for huge pages (one
// projection is far smaller than a huge page, so they share chunks), and the file pages are let go.
// TRTLLM_HUGE_PAGES=0 (or trtllm_cpu_set_huge_pages(0), what trtllm-run --no-huge-pages calls)
// keeps ONNX Runtime's memory.
class Arena {
 public:
  static constexpr size_t kHuge = size_t(2) << 20, kChunk = size_t(64) << 20;

  // A copy of src (64-byte aligned) and the chunk that holds it, or null when huge pages are off.
  static std::pair<void*, std::shared_ptr<void>> copy(const void* src, size_t size) {
    static std::mutex lock;
    static std::weak_ptr<void> filling;  // weak: a chunk goes when its last weight does
    static size_t used = 0, capacity = 0;
    if (!trtllm_cpu::huge_pages_wanted()) return {nullptr, nullptr};
    std::lock_guard<std::mutex> hold(lock);
    size = (size + 63) / 64 * 64;
    std::shared_ptr<void> chunk = filling.lock();
    if (!chunk || used + size > capacity) {
      capacity = std::max(kChunk, (size + kHuge - 1) / kHuge * kHuge);
      void* raw = std::aligned_alloc(kHuge, capacity);
      if (!raw) return {nullptr, nullptr};
#ifdef __linux__
      madvise(raw, capacity, MADV_HUGEPAGE);  // before the first touch: the faults take huge pages
#endif
      chunk = std::shared_ptr<void>(raw, std::free);  // freed with the last weight in it
      filling = chunk;
      used = 0;
    }
    void* at = static_cast<char*>(chunk.get()) + used;
    used += size;
    return {at, chunk};
  }
};

// Whether [src, src + size) lies in one private file mapping (dropping anonymous memory would zero
// it). The maps are read afresh each time (once per weight, on its first use; ~0.2 ms): a cached
// copy goes stale when a closed engine's file is unmapped and anonymous memory takes its place.
inline bool file_backed(const void* src, size_t size) {
#ifdef __linux__
  const uintptr_t at = reinterpret_cast<uintptr_t>(src);
  FILE* maps = std::fopen("/proc/self/maps", "r");
  if (!maps) return false;
  bool found = false;
  char line[512];
  while (std::fgets(line, sizeof line, maps)) {
    unsigned long lo, hi, offset, inode;
    char perms[8], dev[16];
    if (std::sscanf(line, "%lx-%lx %7s %lx %15s %lu", &lo, &hi, perms, &offset, dev, &inode) != 6) continue;
    if (at < lo) break;  // sorted by address: no later line covers it
    if (at < hi) {
      found = inode != 0 && perms[3] == 'p' && at + size <= hi;
      break;
    }
  }
  std::fclose(maps);
  return found;
#else
  (void)src;
  (void)size;
  return false;
#endif
}

// Whether input i of the node is a constant initializer: only those are copied (a graph input may
// change between calls at the same address, and its pages are the caller's, not ours to drop).
inline bool constant_input(const Ort::ConstKernelInfo& info, size_t i) {
  int constant = 0;
  info.GetTensorConstantInput(i, &constant);
  return constant != 0;
}

struct Resident {
  bool constant = false;  // set from constant_input: anything else is read where it is, every call
  const void* source = nullptr;
  size_t bytes = 0;
  void* copy = nullptr;
  std::shared_ptr<void> chunk;

  const void* get(const void* src, size_t size) {
    if (!constant) return src;
    if (src == source && size == bytes) return copy ? copy : src;
    source = src, bytes = size;
    std::tie(copy, chunk) = Arena::copy(src, size);
    if (!copy) return src;
    std::memcpy(copy, src, size);
    count_copied(size);
#ifdef __linux__
    // Clean private file pages: dropping them costs nothing (a later read, if any, faults them back
    // in from the file) and keeps the weights resident once, not twice.
    const uintptr_t lo = (reinterpret_cast<uintptr_t>(src) + 4095) & ~uintptr_t(4095);
    const uintptr_t hi = (reinterpret_cast<uintptr_t>(src) + size) & ~uintptr_t(4095);
    if (hi > lo && file_backed(src, size)) madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_DONTNEED);
#endif
    return copy;
  }
};

}  // namespace trtllm_cpu
