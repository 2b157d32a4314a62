// trtllm.cpu::Attention: rotary, the in-place KV write and grouped-query attention in one node per
// layer, for any mix of prefill chunks and decode rows.
//
// Why: ONNX Runtime's GroupQueryAttention is a third of a batch-1 int4 decode step here; most of it
// is 128-bit loops over the cache. This kernel reads each row's keys and values once per kv head
// with AVX-512 (or AVX2: attention_avx2.cc) and splits the work over (row, heads of one kv head,
// block of queries).
//
// Inputs:  0 qkv [B, S, (H + 2 Hk) D] float32 (the q heads, then the k heads, then the v heads); with
//            shared_kv 1, [B, S, H D]: the q heads alone
//          1 past_key, 2 past_value [B, Hk, C, D] float32, or both float16 or bfloat16 (a float16 or
//            bfloat16 engine's cache: read and written in that type, computed in float32), or both
//            int8 [B, Hk, C, D + 4] (--kv-cache-dtype int8): each slot's row holds its D values
//            rounded to round(x / s), s = max|x| / 127, then s itself, a float32 in its last 4 bytes
//          3 write_index [B] int64: the slot of the row's first new token
//          4 last_index [B] int64: the row's new tokens are s = 0 .. last_index (the rest is padding)
//          5 position_ids [B, S] int64
//          6 cos_cache, 7 sin_cache [P, R / 2] float32: rotary on the first R <= D dimensions of
//            each head (R < D: partial rotary, Phi-4-mini), the rest unrotated
//          8 q_norm, 9 k_norm [D] float32, optional (Qwen3, Gemma 3): each q and k head is
//            RMS-normalized (epsilon) and scaled by these before its rotary (after it with
//            norm_after_rotary 1: Hunyuan)
//          10 tree_mask [B, S, T] bool, optional (EAGLE tree verification; 8 and 9 may be absent): it
//            covers row b's last T slots of the step, from start = write_index[b] + S - T
//          11 look_ahead [B, S] int64, optional (Gemma 3's images; 8 to 10 may be absent): how many
//            slots past its own token s also sees, all among the row's new tokens (an image token:
//            the rest of its image, whose tokens see each other both ways); 0: causal
// Outputs: 0 y [B, S, H D]; 1 present_key, 2 present_value [B, Hk, C, D]: the past buffers when the
//          caller binds them so (the runtime does); otherwise past is copied first. Absent with
//          shared_kv 1.
// Attributes: num_heads H, kv_num_heads Hk, scale (0: 1 / sqrt(D)), window (0: none), epsilon,
// norm_after_rotary (0: q_norm and k_norm before the rotary, 1: after it),
// softcap c (0: none; Gemma 2: each scaled score x becomes c tanh(x / c) before the softmax),
// v_norm (1: each v head RMS-normalized, epsilon, without a scale, before it is written: Gemma 4),
// shared_kv (1: the KV is another layer's, this step's keys and values already written by it:
// Gemma 4's last layers; this node reads inputs 1 and 2 and writes nothing).
// For row b and s <= last_index[b]: slot = write_index[b] + s; q and k get the rotary embedding of
// position_ids[b, s] (rotate_half: x[i] cos - x[i + D/2] sin, x[i + D/2] cos + x[i] sin); k and v
// are written at the slot; query s attends to slots [0, slot] of its kv head h / (H / Hk), or with
// a window W to slots [slot - W + 1, slot]. Padding tokens write nothing and their output is 0.
// With tree_mask, a slot j in [start, slot] is seen only where tree_mask[b, s, j - start] (exactly 0
// weight otherwise), and a window counts from the position: slots [position - W + 1, slot] (a tree's
// tokens share positions, not slots). Each token must see its own slot (the caller's part).
// With look_ahead, query s attends to slots [.., slot + look_ahead[b, s]]: the step writes every new
// key before any query reads one, and a row's ends never fall from one token to the next (checked),
// as a block of queries sharing its reads of the cache needs.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "attention.h"

namespace {

using namespace trtllm_cpu::attention;
using trtllm_cpu::rotary;
using trtllm_cpu::use_avx512;
#ifdef TRTLLM_X86
using trtllm_cpu::exp_avx512;
#endif

constexpr int64_t kQueries = 8;  // tokens per task (prefill): they share each read of the keys and values
// Keys are split into parts of this many slots, at fixed slot numbers, each part a task of its own
// whose partial softmax is merged after (as flash-decoding does): a long context's decode step then
// has work for every thread, and the heads of a kv head read its cache once. The parts of a row
// depend on its slots only, so its result is the same in any batch or chunk; a row of at most one
// part is computed exactly as without the split.
constexpr int64_t kPart = 512;

struct Shape {
  int64_t b, s, h, hk, d, c, p, half;  // half: the rotary tables' width, R / 2 (R <= D: partial rotary)
};

// How a layer's work is split: tasks of (row, a group of `heads` query heads that share one kv
// head, up to kQueries tokens). Sharing a task, the heads read each key and value once (grouped
// query attention reads them once per query head otherwise): faster even where that leaves fewer
// tasks than threads (batch-1 decode of 3 kv heads on 2 threads: 11.3 -> 10.0 us at 200 tokens,
// 38 -> 30 us at 1000). One task in all (one kv head, one row, one block) keeps one head per task.
struct Split {
  int64_t heads, head_groups, blocks, parts;  // parts: of kPart slots, enough for the longest row
  size_t tasks;
  Split(const Shape& n, int64_t longest) : blocks((n.s + kQueries - 1) / kQueries), parts((longest + kPart - 1) / kPart) {
    const int64_t group = n.h / n.hk;
    parts = std::max<int64_t>(parts, 1);
    heads = group * kQueries <= kMaxRows && n.b * n.hk * blocks * parts >= 2 ? group : 1;
    head_groups = n.h / heads;
    tasks = static_cast<size_t>(n.b * head_groups * blocks * parts);
  }
  int64_t rows() const { return heads * kQueries; }  // the most query rows of a task

  // What a task of one (row, head group, block) covers, its part aside: tokens s0 .. s1 - 1 of row
  // b, the first `last - s0` of them real (the rest padding), heads h0 .. h0 + heads - 1, and its
  // query rows (token-major: token s0 + r / heads, head h0 + r % heads).
  struct Rows {
    int64_t b, h0, s0, s1, last;
    int qn;
  };
  Rows rows_of(int64_t group_task, const Shape& n, const int64_t* last_index) const {
    Rows r;
    r.b = group_task / (head_groups * blocks);
    r.h0 = (group_task / blocks) % head_groups * heads;
    r.s0 = (group_task % blocks) * kQueries;
    r.s1 = std::min(n.s, r.s0 + kQueries);
    r.last = std::min(r.s1, last_index[r.b] + 1);
    r.qn = static_cast<int>(std::max<int64_t>(0, r.last - r.s0) * heads);
    return r;
  }
};

template <typename T>
struct Job {
  Shape n;
  Split split;  // of n
  const float* qkv;
  int64_t width;  // of a token's row of qkv: (H + 2 Hk) D, or H D (shared_kv)
  const int64_t* write_index;
  const int64_t* last_index;
  const int64_t* position_ids;
  const float* cos;
  const float* sin;
  const T* key;    // present_key
  const T* value;  // present_value
  float scale;
  float* y;
  const float* q_norm;  // or null
  float epsilon;
  bool norm_after;  // q_norm after the rotary (Hunyuan), not before
  int64_t window;  // 0: none
  float* partial;  // parts > 1: per task and row, its part's unnormalized output [D], then max and sum
  const bool* tree;    // tree_mask [B, S, tree_width], or null
  int64_t tree_width;  // T
  float softcap;       // 0: none
  const int64_t* ahead;  // look_ahead [B, S], or null
};

// out[0:D] = x RMS-normalized and scaled by w (a q or k head's norm; w null: no scale, Gemma 4's v): in
// float32, as transformers normalizes Qwen3's and Gemma's heads. out may not be x.
void head_norm(const float* x, const float* w, float epsilon, int64_t d, float* out) {
  float sum = 0.0f;
  for (int64_t i = 0; i < d; ++i) sum += x[i] * x[i];
  const float inv = 1.0f / std::sqrt(sum / static_cast<float>(d) + epsilon);
  for (int64_t i = 0; i < d; ++i) out[i] = w ? x[i] * inv * w[i] : x[i] * inv;
}

// One query against slots [lo, t) (with `mask`, a tree's: those it hides weigh 0): scores, softmax,
// the weighted sum of values. Portable.
template <typename T>
void attend_generic(const float* q, const T* key, const T* value, int64_t lo, int64_t t, int64_t d, const bool* mask,
                    int64_t start, float softcap, float* scores, float* out, float* stats) {
  const int64_t ld = d + kScaleBytes<T>;
  float top = -INFINITY;
  for (int64_t j = lo; j < t; ++j) {
    float acc = 0.0f;
    for (int64_t i = 0; i < d; ++i) acc += q[i] * to_float(key[j * ld + i]);
    acc *= row_scale(key + j * ld, d);
    if (softcap > 0.0f) acc = softcap * std::tanh(acc / softcap);
    scores[j] = acc;
    top = std::max(top, acc);
  }
  float shift = top;
  if (mask) {
    hide(mask, start, lo, t, scores);
    top = -INFINITY;
    for (int64_t j = lo; j < t; ++j) top = std::max(top, scores[j]);
    shift = top == -INFINITY ? 0.0f : top;  // a part whose slots it all hides: weights 0, not exp(NaN)
  }
  float total = 0.0f;
  for (int64_t j = lo; j < t; ++j) total += scores[j] = std::exp(scores[j] - shift);
  std::fill(out, out + d, 0.0f);
  for (int64_t j = lo; j < t; ++j) {
    if (mask && scores[j] == 0.0f) continue;  // hidden: its value never read (a NaN there, 0 x NaN, spread)
    const float w = scores[j] * row_scale(value + j * ld, d);
    for (int64_t i = 0; i < d; ++i) out[i] += w * to_float(value[j * ld + i]);
  }
  if (stats) {  // a part: the caller merges
    stats[0] = top;
    stats[1] = total;
    return;
  }
  const float inv = 1.0f / total;
  for (int64_t i = 0; i < d; ++i) out[i] *= inv;
}

#ifdef TRTLLM_X86
__attribute__((target("avx512f,avx512bw,avx512vl,fma"))) inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
__attribute__((target("avx512f,avx512bw,avx512vl,fma"))) inline __m512 load16(const uint16_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
__attribute__((target("avx512f,avx512bw,avx512vl,fma"))) inline __m512 load16(const bf16* p) {
  return trtllm_cpu::widen_bf16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
__attribute__((target("avx512f,avx512bw,avx512vl,fma"))) inline __m512 load16(const int8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}

// 16 vectors -> one vector of their 16 sums, in 4 rounds of shuffles and adds (instead of a
// horizontal sum each). Sum k lands in lane kTranspose[k] (a 4x4 transpose, its own inverse), so
// callers pass their vectors in that order.
constexpr int kTranspose[16] = {0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15};

__attribute__((target("avx512f,avx512bw,avx512vl,fma"))) inline __m512 sum16(const __m512* a) {
  __m512 s8[8], s4[4], s2[2];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i)
    s8[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0x44),
                          _mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0xEE));
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i)
    s4[i] = _mm512_add_ps(_mm512_shuffle_f32x4(s8[2 * i], s8[2 * i + 1], 0x88),
                          _mm512_shuffle_f32x4(s8[2 * i], s8[2 * i + 1], 0xDD));
#pragma GCC unroll 2
  for (int i = 0; i < 2; ++i)
    s2[i] = _mm512_add_ps(_mm512_shuffle_ps(s4[2 * i], s4[2 * i + 1], 0x44), _mm512_shuffle_ps(s4[2 * i], s4[2 * i + 1], 0xEE));
  return _mm512_add_ps(_mm512_shuffle_ps(s2[0], s2[1], 0x88), _mm512_shuffle_ps(s2[0], s2[1], 0xDD));
}

// tanh(x): (1 - e) / (1 + e) with e = exp(-2|x|), its sign restored; below |x| = 1/8, where 1 - e
// would cancel, the series to x^9 (its next term is under 1e-11 there). Within 2e-6 of tanh, relative.
__attribute__((target("avx512f,avx512bw,avx512vl,fma"))) inline __m512 tanh_avx512(__m512 x) {
  const __m512 a = _mm512_abs_ps(x);
  const __m512 e = exp_avx512(_mm512_mul_ps(a, _mm512_set1_ps(-2.0f)));
  const __m512 one = _mm512_set1_ps(1.0f);
  __m512 far = _mm512_div_ps(_mm512_sub_ps(one, e), _mm512_add_ps(one, e));
  const __m512 x2 = _mm512_mul_ps(a, a);
  __m512 p = _mm512_set1_ps(62.0f / 2835);
  p = _mm512_fmadd_ps(p, x2, _mm512_set1_ps(-17.0f / 315));
  p = _mm512_fmadd_ps(p, x2, _mm512_set1_ps(2.0f / 15));
  p = _mm512_fmadd_ps(p, x2, _mm512_set1_ps(-1.0f / 3));
  const __m512 near = _mm512_fmadd_ps(_mm512_mul_ps(p, x2), a, a);
  far = _mm512_mask_mov_ps(far, _mm512_cmp_ps_mask(a, _mm512_set1_ps(0.125f), _CMP_LT_OQ), near);
  // the sign of x back (x = -0 stays -0)
  return _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(far),
                                             _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(INT32_MIN))));
}

// Lanes j .. j + 15 that lie in [lo, hi).
__attribute__((target("avx512f,avx512bw,avx512vl,fma"))) inline __mmask16 lanes(int64_t j, int64_t lo, int64_t hi) {
  uint32_t m = hi - j >= 16 ? 0xFFFFu : (1u << std::max<int64_t>(0, hi - j)) - 1;
  if (lo > j) m &= ~((1u << std::min<int64_t>(16, lo - j)) - 1);
  return static_cast<__mmask16>(m);
}

// A block of query rows sharing one kv head (tokens in order, each with its task's heads: row r
// sees slots [lo[r], t[r]), t never falling; lo may, in a tree's window) against their keys and
// values, D = 16 ND. Keys and values are read in groups of 16 that stay in L1 while every row of the
// block uses them: a prefill chunk reads its cache once per block, not once per query. tree (or
// null): the slots it hides weigh exactly 0. scores: [qn][ld] scratch, indexed by slot; out[r]: row
// r's output, or with `stats` its unnormalized part (stats[2r], [2r + 1]: the part's largest score
// and its sum of exponentials) for the caller to merge.
template <int ND, typename T>
__attribute__((target("avx512f,avx512bw,avx512vl,fma"))) void attend_block_avx512(
    const float* q, int qn, const int64_t* lo, const int64_t* t, const T* key, const T* value, const Tree* tree,
    float softcap, float* scores, int64_t ld, float* const* out, float* stats) {
  constexpr int64_t d = 16 * ND, rd = d + kScaleBytes<T>;  // rd: a cache row's elements
  const int64_t tmax = *std::max_element(t, t + qn), jmin = *std::min_element(lo, lo + qn) / 16 * 16;
  // 1. scores (from the first row's window on; a later row's scores before its own are not read)
  for (int64_t j0 = jmin; j0 < tmax; j0 += 16) {
    for (int r = 0; r < qn; ++r) {
      if (j0 >= t[r] || j0 + 16 <= lo[r]) continue;
      __m512 qv[ND];
#pragma GCC unroll 8
      for (int i = 0; i < ND; ++i) qv[i] = _mm512_loadu_ps(q + r * d + 16 * i);
      float* row = scores + r * ld;
      if (j0 + 16 <= tmax) {  // tmax <= capacity, so all 16 keys exist (later ones masked below)
        __m512 acc[16];
#pragma GCC unroll 16
        for (int k = 0; k < 16; ++k) acc[k] = _mm512_setzero_ps();
#pragma GCC unroll 8
        for (int i = 0; i < ND; ++i)
#pragma GCC unroll 16
          for (int k = 0; k < 16; ++k) acc[k] = _mm512_fmadd_ps(qv[i], load16(key + (j0 + k) * rd + 16 * i), acc[k]);
        __m512 ordered[16];
#pragma GCC unroll 16
        for (int k = 0; k < 16; ++k) ordered[k] = acc[kTranspose[k]];
        __m512 sums = sum16(ordered);
        if constexpr (kScaleBytes<T> > 0) {  // each key's scale
          alignas(64) float scales[16];
          for (int k = 0; k < 16; ++k) scales[k] = row_scale(key + (j0 + k) * rd, d);
          sums = _mm512_mul_ps(sums, _mm512_load_ps(scales));
        }
        _mm512_storeu_ps(row + j0, sums);
      } else {
        for (int64_t j = j0; j < tmax; ++j) {
          __m512 acc = _mm512_setzero_ps();
#pragma GCC unroll 8
          for (int i = 0; i < ND; ++i) acc = _mm512_fmadd_ps(qv[i], load16(key + j * rd + 16 * i), acc);
          row[j] = _mm512_reduce_add_ps(acc) * row_scale(key + j * rd, d);
        }
      }
    }
  }
  if (softcap > 0.0f) {  // c tanh(x / c), before the tree hides any
    const __m512 c = _mm512_set1_ps(softcap), inv_c = _mm512_set1_ps(1.0f / softcap);
    for (int r = 0; r < qn; ++r)
      for (int64_t j = lo[r] / 16 * 16; j < t[r]; j += 16) {
        const __mmask16 valid = lanes(j, lo[r], t[r]);
        float* at = scores + r * ld + j;
        _mm512_mask_storeu_ps(at, valid, _mm512_mul_ps(c, tanh_avx512(_mm512_mul_ps(_mm512_maskz_loadu_ps(valid, at), inv_c))));
      }
  }
  if (tree)
    for (int r = 0; r < qn; ++r) hide(tree->row[r], tree->start, lo[r], t[r], scores + r * ld);
  // 2. softmax of each query's scores in [lo[r], t[r]) (exp in place), 1 / sum kept
  float inv[kMaxRows];
  for (int r = 0; r < qn; ++r) {
    float* row = scores + r * ld;
    __m512 top = _mm512_set1_ps(-INFINITY), sum = _mm512_setzero_ps();
    for (int64_t j = lo[r] / 16 * 16; j < t[r]; j += 16) {
      const __mmask16 valid = lanes(j, lo[r], t[r]);
      top = _mm512_mask_max_ps(top, valid, top, _mm512_maskz_loadu_ps(valid, row + j));
    }
    const float peak_value = _mm512_reduce_max_ps(top);
    // a part whose slots the tree all hides: weights 0, not exp(NaN)
    const __m512 peak = _mm512_set1_ps(tree && peak_value == -INFINITY ? 0.0f : peak_value);
    // A tree row whose slots from the tree's start on are in this part (and its window before them)
    // sums its exponentials in the lanes a plain step would: the k-th slot it sees from the tree's
    // start as slot start + k, where its path's KV lies once accepted. Its sum is then a plain step's
    // to the bit (the lanes' order of adds and their reduction alike), and so its token: speculation
    // gives plain decoding's. (A tree across a part's end is summed by its slots: its last bits may
    // differ.)
    const bool as_plain = tree && lo[r] <= tree->start && tree->start < t[r];
    const int64_t vector_end = as_plain ? tree->start : t[r];
    for (int64_t j = lo[r] / 16 * 16; j < t[r]; j += 16) {
      const __mmask16 valid = lanes(j, lo[r], t[r]);
      const __m512 x = _mm512_maskz_loadu_ps(valid, row + j);
      __m512 e = exp_avx512(_mm512_sub_ps(x, peak));
      if (tree)  // hidden: exactly 0 (exp_avx512 clamps at -88)
        e = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(-INFINITY), _CMP_NEQ_UQ), e);
      if (j < vector_end) sum = _mm512_add_ps(sum, _mm512_maskz_mov_ps(lanes(j, lo[r], vector_end), e));
      _mm512_mask_storeu_ps(row + j, valid, e);
    }
    if (as_plain) {
      alignas(64) float lane[16];
      _mm512_store_ps(lane, sum);
      int64_t k = 0;
      for (int64_t j = tree->start; j < t[r]; ++j)
        if (tree->row[r][j - tree->start]) lane[(tree->start + k++) % 16] += row[j];
      sum = _mm512_load_ps(lane);
    }
    const float total = _mm512_reduce_add_ps(sum);
    if (stats) {
      stats[2 * r] = peak_value;
      stats[2 * r + 1] = total;
    }
    inv[r] = 1.0f / total;
  }
  // 3. the weighted sums of values, 16 values at a time for every query
  for (int r = 0; r < qn; ++r)
#pragma GCC unroll 8
    for (int i = 0; i < ND; ++i) _mm512_storeu_ps(out[r] + 16 * i, _mm512_setzero_ps());
  for (int64_t j0 = jmin; j0 < tmax; j0 += 16) {
    for (int r = 0; r < qn; ++r) {
      const int64_t start = std::max(j0, lo[r]), end = std::min(t[r], j0 + 16);
      if (start >= end) continue;
      const float* p = scores + r * ld;
      __m512 acc[ND];
#pragma GCC unroll 8
      for (int i = 0; i < ND; ++i) acc[i] = _mm512_loadu_ps(out[r] + 16 * i);
      for (int64_t j = start; j < end; ++j) {
        // a slot the tree hides weighs exactly 0: its value is not read, so a NaN there (a rejected
        // draft that overflowed) stays out of its siblings' sums (0 x NaN is NaN)
        if (tree && p[j] == 0.0f) continue;
        const __m512 w = _mm512_set1_ps(p[j] * row_scale(value + j * rd, d));
#pragma GCC unroll 8
        for (int i = 0; i < ND; ++i) acc[i] = _mm512_fmadd_ps(w, load16(value + j * rd + 16 * i), acc[i]);
      }
#pragma GCC unroll 8
      for (int i = 0; i < ND; ++i) _mm512_storeu_ps(out[r] + 16 * i, acc[i]);
    }
  }
  if (stats) return;  // a part: the caller merges
  for (int r = 0; r < qn; ++r) {
    const __m512 scale = _mm512_set1_ps(inv[r]);
#pragma GCC unroll 8
    for (int i = 0; i < ND; ++i)
      _mm512_storeu_ps(out[r] + 16 * i, _mm512_mul_ps(_mm512_loadu_ps(out[r] + 16 * i), scale));
  }
}

template <typename T>
using BlockFn = void (*)(const float*, int, const int64_t*, const int64_t*, const T*, const T*, const Tree*, float,
                         float*, int64_t, float* const*, float*);
// D = 16 .. 128 in steps of 16, 256 (Gemma 3) and 512 (Gemma 4's full layers); other sizes take the
// portable loop
template <typename T>
constexpr BlockFn<T> kBlock[10] = {attend_block_avx512<1, T>, attend_block_avx512<2, T>, attend_block_avx512<3, T>,
                                   attend_block_avx512<4, T>, attend_block_avx512<5, T>, attend_block_avx512<6, T>,
                                   attend_block_avx512<7, T>, attend_block_avx512<8, T>, attend_block_avx512<16, T>,
                                   attend_block_avx512<32, T>};
#endif

template <typename T>
void run_task(void* data, size_t task) {
  const Job<T>& job = *static_cast<const Job<T>*>(data);
  const Shape& n = job.n;
  const Split& split = job.split;
  const int64_t part = static_cast<int64_t>(task) % split.parts;
  const auto [b, h0, s0, s1, last, qn] = split.rows_of(static_cast<int64_t>(task) / split.parts, n, job.last_index);
  const int64_t g = h0 / (n.h / n.hk), width = job.width;
  const T* key = job.key + (b * n.hk + g) * n.c * (n.d + kScaleBytes<T>);
  const T* value = job.value + (b * n.hk + g) * n.c * (n.d + kScaleBytes<T>);
  for (int64_t s = std::max(s0, last); s < s1; ++s)  // padding tokens: 0
    for (int64_t h = h0; h < h0 + split.heads; ++h) {
      float* out = job.y + ((b * n.s + s) * n.h + h) * n.d;
      std::fill(out, out + n.d, 0.0f);
    }
  if (qn <= 0) return;
  thread_local std::vector<float> scores, q, normed;
  int64_t t[kMaxRows], lo[kMaxRows];
  float* outs[kMaxRows];
  Tree tree;
  tree.start = job.tree ? job.write_index[b] + n.s - job.tree_width : 0;
  q.resize(qn * n.d);
  normed.resize(n.d);
  for (int r = 0; r < qn; ++r) {
    const int64_t s = s0 + r / split.heads, h = h0 + r % split.heads, pos = job.position_ids[b * n.s + s];
    const int64_t own = job.write_index[b] + s + 1;  // (a window counts back from its own slot)
    t[r] = own + (job.ahead ? job.ahead[b * n.s + s] : 0);
    const int64_t from = job.tree ? pos + 1 : own;  // a tree's window: from the position (see the top)
    lo[r] = job.window > 0 ? std::max<int64_t>(0, from - job.window) : 0;
    if (job.tree) tree.row[r] = job.tree + (b * n.s + s) * job.tree_width;
    outs[r] = job.y + ((b * n.s + s) * n.h + h) * n.d;
    const float* x = job.qkv + (b * n.s + s) * width + h * n.d;
    float* qr = q.data() + r * n.d;
    if (job.q_norm && job.norm_after) {  // rotary, then the norm, then the scale
      rotary(x, job.cos + pos * n.half, job.sin + pos * n.half, n.d, 2 * n.half, 1.0f, normed.data());
      head_norm(normed.data(), job.q_norm, job.epsilon, n.d, qr);
      for (int64_t i = 0; i < n.d; ++i) qr[i] *= job.scale;
      continue;
    }
    if (job.q_norm) {
      head_norm(x, job.q_norm, job.epsilon, n.d, normed.data());
      x = normed.data();
    }
    rotary(x, job.cos + pos * n.half, job.sin + pos * n.half, n.d, 2 * n.half, job.scale, qr);
  }
  const int64_t ld = t[qn - 1] + 16;
  if (scores.size() < static_cast<size_t>(qn * ld)) scores.resize(qn * ld);
  float* stats = nullptr;
  if (split.parts > 1) {  // this task's part of each row's slots, into the partial buffer (merge_parts)
    float* base = job.partial + static_cast<size_t>(task) * split.rows() * (n.d + 2);
    stats = base + split.rows() * n.d;
    for (int r = 0; r < qn; ++r) {
      lo[r] = std::max(lo[r], part * kPart);
      t[r] = std::min(t[r], (part + 1) * kPart);
      outs[r] = base + r * n.d;
    }
  }
#ifdef TRTLLM_X86
  if (use_avx512() && block_index(n.d) >= 0)
    return kBlock<T>[block_index(n.d)](q.data(), qn, lo, t, key, value, job.tree ? &tree : nullptr, job.softcap,
                                       scores.data(), ld, outs, stats);
  if (trtllm_cpu::use_avx2() && attend_block_avx2(n.d, q.data(), qn, lo, t, key, value, job.tree ? &tree : nullptr,
                                                  job.softcap, scores.data(), ld, outs, stats))
    return;
#endif
  for (int r = 0; r < qn; ++r)
    attend_generic(q.data() + r * n.d, key, value, lo[r], t[r], n.d, job.tree ? tree.row[r] : nullptr, tree.start,
                   job.softcap, scores.data(), outs[r], stats ? stats + 2 * r : nullptr);
}

// After the tasks of a split (parts > 1): each row's parts merged, o = sum_p o_p e^(m_p - m) and
// l = sum_p l_p e^(m_p - m) with m the largest m_p, y = o (1 / l). A part without slots of the row
// adds zeros, so a row within one part gets exactly its unsplit result.
template <typename T>
void merge_parts(const Job<T>& job) {
  const Shape& n = job.n;
  const Split& split = job.split;
  const size_t stride = split.rows() * (n.d + 2);
  std::vector<float> o(n.d);
  for (int64_t group_task = 0; group_task < n.b * split.head_groups * split.blocks; ++group_task) {
    const auto [b, h0, s0, s1, last, qn] = split.rows_of(group_task, n, job.last_index);
    for (int r = 0; r < qn; ++r) {
      const float* first = job.partial + static_cast<size_t>(group_task * split.parts) * stride;
      float top = -INFINITY;
      for (int64_t p = 0; p < split.parts; ++p) top = std::max(top, first[p * stride + split.rows() * n.d + 2 * r]);
      float total = 0.0f;
      std::fill(o.begin(), o.end(), 0.0f);
      for (int64_t p = 0; p < split.parts; ++p) {
        const float* part = first + p * stride;
        const float* stats = part + split.rows() * n.d + 2 * r;
        if (stats[1] == 0.0f) continue;  // no slots of this row in the part
        const float w = std::exp(stats[0] - top);
        total += stats[1] * w;
        for (int64_t i = 0; i < n.d; ++i) o[i] += part[r * n.d + i] * w;
      }
      const int64_t s = s0 + r / split.heads, h = h0 + r % split.heads;
      float* y = job.y + ((b * n.s + s) * n.h + h) * n.d;
      const float inv = 1.0f / total;
      for (int64_t i = 0; i < n.d; ++i) y[i] = o[i] * inv;
    }
  }
}

// A row of the cache from float32: copied, or rounded to float16 or bfloat16.
void store(const float* src, int64_t d, float* dst) { std::memcpy(dst, src, d * sizeof(float)); }
void store(const float* src, int64_t d, uint16_t* dst) {
  for (int64_t i = 0; i < d; ++i) dst[i] = trtllm_cpu::float_to_half(src[i]);
}
void store(const float* src, int64_t d, bf16* dst) {
  for (int64_t i = 0; i < d; ++i) dst[i].bits = trtllm_cpu::float_to_bf16(src[i]);
}
// int8: round(x / s) with s = max|x| / 127 (a row of zeros: s 0, values 0), s after the values. A NaN
// or infinite value makes s NaN (values 0): what reads the row is not finite, as it would not be from
// a float cache, and the build's check sees it.
void store(const float* src, int64_t d, int8_t* dst) {
  float top = 0.0f;
  bool finite = true;
  for (int64_t i = 0; i < d; ++i) {
    const float a = std::fabs(src[i]);
    finite = finite && std::isfinite(a);
    top = std::max(top, a);
  }
  if (!finite) top = std::numeric_limits<float>::quiet_NaN();
  const float s = top / 127.0f, inv = finite && top > 0.0f ? 127.0f / top : 0.0f;
  for (int64_t i = 0; i < d; ++i)
    dst[i] = static_cast<int8_t>(std::max(-127.0f, std::min(127.0f, std::nearbyint(src[i] * inv))));
  std::memcpy(dst + d, &s, sizeof s);
}

OrtStatusPtr fail(const std::string& message) {
  return Ort::GetApi().CreateStatus(ORT_INVALID_ARGUMENT, ("trtllm.cpu::Attention: " + message).c_str());
}

struct Kernel {
  int64_t h, hk;
  float scale;
  int64_t window;
  float epsilon;
  float softcap;
  bool norm_after;
  bool v_norm;
  bool shared;  // shared_kv: another layer's KV, read only

  OrtStatusPtr ComputeV2(OrtKernelContext* raw) {
    try {
      Ort::KernelContext ctx(raw);
      auto qkv = ctx.GetInput(0), past_key = ctx.GetInput(1), past_value = ctx.GetInput(2);
      auto cos = ctx.GetInput(6);
      const auto qs = qkv.GetTensorTypeAndShapeInfo().GetShape();
      const auto ks = past_key.GetTensorTypeAndShapeInfo().GetShape();
      const auto cs = cos.GetTensorTypeAndShapeInfo().GetShape();
      if (qs.size() != 3 || ks.size() != 4 || cs.size() != 2) return fail("qkv must be 3-D, the KV 4-D, cos 2-D");
      const auto kv_type = past_key.GetTensorTypeAndShapeInfo().GetElementType();
      const bool int8 = kv_type == ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8;  // rows of D values and a float32 scale
      Shape n{qs[0], qs[1], h, hk, ks[3] - (int8 ? 4 : 0), ks[2], cs[0], cs[1]};
      if (ks[0] != n.b || ks[1] != hk || qs[2] != (shared ? h : h + 2 * hk) * n.d)
        return fail("qkv's width " + std::to_string(qs[2]) + " is not " +
                    (shared ? "num_heads" : "(num_heads + 2 kv_num_heads)") + " x the KV's head size " +
                    std::to_string(n.d) + ", or the KV's batch/heads differ");
      if (cs[1] < 1 || cs[1] * 2 > n.d) return fail("cos/sin must be [positions, R / 2] with 2 <= R <= head_size");
      // The per-row inputs are read by index below: a tensor of another shape would be read past its end.
      const std::vector<int64_t> rows{n.b}, grid{n.b, n.s};
      if (ctx.GetInput(3).GetTensorTypeAndShapeInfo().GetShape() != rows ||
          ctx.GetInput(4).GetTensorTypeAndShapeInfo().GetShape() != rows)
        return fail("write_index and last_index must be [batch]");
      if (ctx.GetInput(5).GetTensorTypeAndShapeInfo().GetShape() != grid) return fail("position_ids must be [batch, seq]");
      if (ctx.GetInput(7).GetTensorTypeAndShapeInfo().GetShape() != cs) return fail("sin must have cos's shape");
      if (past_value.GetTensorTypeAndShapeInfo().GetShape() != ks) return fail("past_key and past_value differ in shape");
      for (size_t i : {size_t{8}, size_t{9}}) {
        auto norm = trtllm_cpu::optional_input(ctx, i);
        if (norm && norm.GetTensorTypeAndShapeInfo().GetShape() != std::vector<int64_t>{n.d})
          return fail("q_norm and k_norm must be [head_size]");
      }
      if (!shared && bool(trtllm_cpu::optional_input(ctx, 8)) != bool(trtllm_cpu::optional_input(ctx, 9)))
        return fail("q_norm and k_norm come together");  // (shared_kv: k_norm's keys are written, q_norm alone)
      if (auto tree = trtllm_cpu::optional_input(ctx, 10)) {
        const auto ts = tree.GetTensorTypeAndShapeInfo().GetShape();
        if (ts.size() != 3 || ts[0] != n.b || ts[1] != n.s) return fail("tree_mask must be [batch, seq, T]");
      }
      if (auto ahead = trtllm_cpu::optional_input(ctx, 11)) {
        if (ahead.GetTensorTypeAndShapeInfo().GetShape() != grid) return fail("look_ahead must be [batch, seq]");
      }
      if (past_value.GetTensorTypeAndShapeInfo().GetElementType() != kv_type)
        return fail("past_key and past_value differ in element type");
      auto y = ctx.GetOutput(0, {n.b, n.s, h * n.d});
      if (kv_type == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT) return run<float>(ctx, n, y);
      if (kv_type == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16) return run<uint16_t>(ctx, n, y);
      if (kv_type == ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16) return run<bf16>(ctx, n, y);
      if (int8) return run<int8_t>(ctx, n, y);
      return fail("the KV cache must be float32, float16, bfloat16 or int8");
    } catch (const std::exception& e) {
      return fail(e.what());
    }
  }

  // The new keys (with their rotary) and values go into the cache before any query reads them.
  template <typename T>
  OrtStatusPtr run(Ort::KernelContext& ctx, const Shape& n, Ort::UnownedValue& y) {
    auto qkv = ctx.GetInput(0), past_key = ctx.GetInput(1), past_value = ctx.GetInput(2);
    const auto ks = past_key.GetTensorTypeAndShapeInfo().GetShape();
    T* key = nullptr;
    T* value = nullptr;
    const int64_t rd = n.d + kScaleBytes<T>;  // a cache row's elements
    if (!shared) {
      auto present_key = ctx.GetOutput(1, ks), present_value = ctx.GetOutput(2, ks);
      key = static_cast<T*>(present_key.GetTensorMutableRawData());
      value = static_cast<T*>(present_value.GetTensorMutableRawData());
      const size_t kv_bytes = static_cast<size_t>(n.b * n.hk * n.c * rd) * sizeof(T);
      if (kv_bytes > 0 && key != past_key.GetTensorRawData()) std::memcpy(key, past_key.GetTensorRawData(), kv_bytes);
      if (kv_bytes > 0 && value != past_value.GetTensorRawData())  // (an empty batch's buffers may be null)
        std::memcpy(value, past_value.GetTensorRawData(), kv_bytes);
    }
    const int64_t* wi = ctx.GetInput(3).GetTensorData<int64_t>();
    const int64_t* li = ctx.GetInput(4).GetTensorData<int64_t>();
    const int64_t* pos = ctx.GetInput(5).GetTensorData<int64_t>();
    const float* x = qkv.GetTensorData<float>();
    const float* cosd = ctx.GetInput(6).GetTensorData<float>();
    const float* sind = ctx.GetInput(7).GetTensorData<float>();
    auto q_norm = trtllm_cpu::optional_input(ctx, 8), k_norm = trtllm_cpu::optional_input(ctx, 9);
    const float* kn = k_norm ? k_norm.GetTensorData<float>() : nullptr;
    auto tree = trtllm_cpu::optional_input(ctx, 10), look_ahead = trtllm_cpu::optional_input(ctx, 11);
    const int64_t* ahead = look_ahead ? look_ahead.GetTensorData<int64_t>() : nullptr;
    const int64_t tree_width = tree ? tree.GetTensorTypeAndShapeInfo().GetShape()[2] : 0;
    const int64_t width = (shared ? h : h + 2 * hk) * n.d;
    thread_local std::vector<float> rotated, normed;
    rotated.resize(n.d);
    normed.resize(n.d);
    for (int64_t b = 0; b < n.b; ++b) {
      if (li[b] < 0 || li[b] >= n.s) return fail("last_index[" + std::to_string(b) + "] is outside the chunk");
      if (wi[b] < 0 || wi[b] >= n.c || li[b] >= n.c - wi[b])  // no wi + li: it could overflow
        return fail("row " + std::to_string(b) + " writes " + std::to_string(li[b] + 1) + " slots from slot " +
                    std::to_string(wi[b]) + " of a KV cache of " + std::to_string(n.c));
      for (int64_t s = 0; ahead && s <= li[b]; ++s) {  // each end in the row's new slots, never falling
        const int64_t a = ahead[b * n.s + s];
        if (a < 0 || a > li[b] - s || (s > 0 && a < ahead[b * n.s + s - 1] - 1) || (a > 0 && tree_width > 0))
          return fail("look_ahead[" + std::to_string(b) + ", " + std::to_string(s) + "] = " + std::to_string(a) +
                      ": a token sees 0 or more of its row's next new slots, no fewer than the token before it "
                      "(and none in a tree step)");
      }
      for (int64_t s = 0; s <= li[b]; ++s) {
        const int64_t p = pos[b * n.s + s], slot = wi[b] + s;
        if (p < 0 || p >= n.p) return fail("position " + std::to_string(p) + " is beyond the rotary tables");
        if (tree && window > 0 && p - window >= slot)  // its window, counted from p, would leave it no slot
          return fail("row " + std::to_string(b) + " token " + std::to_string(s) + ": position " + std::to_string(p) +
                      " with a window of " + std::to_string(window) + " does not reach its slot " +
                      std::to_string(slot));
        for (int64_t g = 0; g < hk && !shared; ++g) {
          const float* src = x + (b * n.s + s) * width + (h + g) * n.d;
          const int64_t at = ((b * hk + g) * n.c + slot) * rd;
          const float* k = src;
          if (kn && !norm_after) {
            head_norm(src, kn, epsilon, n.d, normed.data());
            k = normed.data();
          }
          rotary(k, cosd + p * n.half, sind + p * n.half, n.d, 2 * n.half, 1.0f, rotated.data());
          if (kn && norm_after) {
            head_norm(rotated.data(), kn, epsilon, n.d, normed.data());
            store(normed.data(), n.d, key + at);
          } else {
            store(rotated.data(), n.d, key + at);
          }
          if (v_norm) {
            head_norm(src + hk * n.d, nullptr, epsilon, n.d, normed.data());
            store(normed.data(), n.d, value + at);
          } else {
            store(src + hk * n.d, n.d, value + at);
          }
        }
      }
    }
    int64_t longest = 0;  // slots the longest row reads up to
    for (int64_t b = 0; b < n.b; ++b) longest = std::max(longest, wi[b] + li[b] + 1);
    const Split split(n, longest);
    thread_local std::vector<float> partial;
    if (split.parts > 1) partial.resize(split.tasks * split.rows() * (n.d + 2));
    const T* keys = shared ? static_cast<const T*>(past_key.GetTensorRawData()) : key;
    const T* values = shared ? static_cast<const T*>(past_value.GetTensorRawData()) : value;
    Job<T> job{n, split, x, width, wi, li, pos, cosd, sind, keys, values,
               scale > 0 ? scale : 1.0f / std::sqrt(static_cast<float>(n.d)),
               y.GetTensorMutableData<float>(), q_norm ? q_norm.GetTensorData<float>() : nullptr, epsilon, norm_after, window,
               partial.data(), tree ? tree.GetTensorData<bool>() : nullptr, tree_width, softcap, ahead};
    if (job.split.tasks) trtllm_cpu::parallel_for(ctx, run_task<T>, job.split.tasks, &job);
    if (split.parts > 1) merge_parts(job);
    return nullptr;
  }
};

// Registered three times under one name, once per cache type: ONNX Runtime makes one schema of them and
// picks the kernel by the cache's type.
template <ONNXTensorElementDataType KV>
struct Op : Ort::CustomOpBase<Op<KV>, Kernel, true> {
  OrtStatusPtr CreateKernelV2(const OrtApi&, const OrtKernelInfo* info, void** kernel) const {
    try {
      Ort::ConstKernelInfo ki(info);
      const int64_t h = ki.GetAttribute<int64_t>("num_heads"), hk = ki.GetAttribute<int64_t>("kv_num_heads");
      const float scale = trtllm_cpu::attribute_or<float>(ki, "scale", 0.0f);  // 0: 1 / sqrt(D)
      const int64_t window = trtllm_cpu::attribute_or<int64_t>(ki, "window", 0);  // 0: none
      const float epsilon = trtllm_cpu::attribute_or<float>(ki, "epsilon", 1e-6f);  // of q_norm and k_norm
      const bool norm_after = trtllm_cpu::attribute_or<int64_t>(ki, "norm_after_rotary", 0) != 0;
      const float softcap = trtllm_cpu::attribute_or<float>(ki, "softcap", 0.0f);  // 0: none
      const bool v_norm = trtllm_cpu::attribute_or<int64_t>(ki, "v_norm", 0) != 0;
      const bool shared = trtllm_cpu::attribute_or<int64_t>(ki, "shared_kv", 0) != 0;
      if (h < 1 || hk < 1 || h % hk) return fail("num_heads must be a positive multiple of kv_num_heads");
      if (window < 0) return fail("window must be >= 0 (0: none)");
      if (!(softcap >= 0.0f) || std::isinf(softcap)) return fail("softcap must be a finite number >= 0 (0: none)");
      if (shared && ki.GetOutputCount() != 1) return fail("shared_kv 1 writes no KV: its node has one output, y");
      *kernel = new Kernel{h, hk, scale, window, epsilon, softcap, norm_after, v_norm, shared};
      return nullptr;
    } catch (const std::exception& e) {
      return fail(e.what());
    }
  }
  const char* GetName() const { return "Attention"; }
  const char* GetExecutionProviderType() const { return "CPUExecutionProvider"; }
  size_t GetInputTypeCount() const { return 12; }
  ONNXTensorElementDataType GetInputType(size_t i) const {
    return i == 1 || i == 2                ? KV
           : (i >= 3 && i <= 5) || i == 11 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64
           : i == 10          ? ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL
                              : ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
  }
  OrtCustomOpInputOutputCharacteristic GetInputCharacteristic(size_t i) const {
    return i >= 8 ? INPUT_OUTPUT_OPTIONAL : INPUT_OUTPUT_REQUIRED;  // q_norm, k_norm, tree_mask, look_ahead
  }
  size_t GetOutputTypeCount() const { return 3; }
  OrtCustomOpInputOutputCharacteristic GetOutputCharacteristic(size_t i) const {
    return i >= 1 ? INPUT_OUTPUT_OPTIONAL : INPUT_OUTPUT_REQUIRED;  // present_key, present_value: not with shared_kv
  }
  ONNXTensorElementDataType GetOutputType(size_t i) const { return i == 0 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT : KV; }
};

}  // namespace

namespace trtllm_cpu {
OrtCustomOp* attention_op() {
  static Op<ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT> op;
  return &op;
}
OrtCustomOp* attention_half_cache_op() {
  static Op<ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16> op;
  return &op;
}
OrtCustomOp* attention_bf16_cache_op() {
  static Op<ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16> op;
  return &op;
}
OrtCustomOp* attention_int8_cache_op() {
  static Op<ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8> op;
  return &op;
}
}  // namespace trtllm_cpu
