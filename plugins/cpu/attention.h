// What trtllm.cpu::Attention's code paths share (attention.cc, and its AVX2 path in
// attention_avx2.cc): the cache's element types, a task's tree mask, and the AVX2 block.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "common.h"

namespace trtllm_cpu::attention {

constexpr int kMaxRows = 64;     // query rows per task: tokens x the heads of a group that share a task

// The cache's element: float, float16 bits, bfloat16, or int8 (a row's scale after its values).
using trtllm_cpu::bf16;
inline float to_float(int8_t x) { return static_cast<float>(x); }
inline float to_float(float x) { return x; }
inline float to_float(uint16_t h) { return trtllm_cpu::half_to_float(h); }
inline float to_float(bf16 h) { return trtllm_cpu::bf16_to_float(h.bits); }

// Bytes after an int8 row's D values: its scale. A row of the cache is D + kScaleBytes<T> elements.
template <typename T>
constexpr int64_t kScaleBytes = 0;
template <>
constexpr int64_t kScaleBytes<int8_t> = 4;

// What a row's values are multiplied by: its scale (int8), else 1.
template <typename T>
inline float row_scale(const T*, int64_t) {
  return 1.0f;
}
inline float row_scale(const int8_t* row, int64_t d) {
  float s;
  std::memcpy(&s, row + d, sizeof s);
  return s;
}

// A task's tree mask (input 10): row r sees a slot j >= start only where row[r][j - start].
struct Tree {
  int64_t start;
  const bool* row[kMaxRows];
};

// The slots in [lo, t) that a row's mask hides, their scores set to -inf.
inline void hide(const bool* mask, int64_t start, int64_t lo, int64_t t, float* scores) {
  for (int64_t j = std::max(lo, start); j < t; ++j)
    if (!mask[j - start]) scores[j] = -INFINITY;
}

// The head sizes the vector blocks have code for, as an index into their tables: D = 16 .. 128 in
// steps of 16, and 256 (Gemma 3); -1 for any other (the portable loop).
inline int block_index(int64_t d) {
  return d % 16 || d < 16 ? -1 : d <= 128 ? static_cast<int>(d / 16 - 1) : d == 256 ? 8 : d == 512 ? 9 : -1;
}

#ifdef TRTLLM_X86
// A block of query rows of one kv head against their keys and values, as attend_block_avx512 does
// it (attention.cc), in 8 lanes: false (nothing done) for a head size it has no code for.
template <typename T>
bool attend_block_avx2(int64_t d, const float* q, int qn, const int64_t* lo, const int64_t* t, const T* key,
                       const T* value, const Tree* tree, float softcap, float* scores, int64_t ld, float* const* out,
                       float* stats);
#endif

}  // namespace trtllm_cpu::attention
