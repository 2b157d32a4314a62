// The MatMul kernels (matmul.h): decode rows multiply weights dequantized or converted straight
// into registers; prefill rows go through a transposed float32 panel per chunk of weight rows.
// Portable code first (the reference the AVX-512 and AVX2 (matmul_avx2.cc) paths are tested
// against, and the fallback).
#include "matmul.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <type_traits>
#include <vector>

namespace trtllm_cpu::matmul {
namespace {

using trtllm_cpu::use_avx2;
using trtllm_cpu::use_avx512;
#ifdef TRTLLM_X86
using trtllm_cpu::exp_avx512;
#endif

// ---- portable code: the reference the AVX-512 path is tested against, and the fallback ----

using trtllm_cpu::half_to_float;

// One row's scales and offsets as float32 (offsets 0 when absent).
void row_params_generic(const Weights& w, int64_t row, float* s, float* o) {
  const int64_t nb = w.blocks();
  for (int64_t b = 0; b < nb; ++b) {
    s[b] = half_to_float(w.scale[row * nb + b]);
    o[b] = w.offset ? half_to_float(w.offset[row * nb + b]) : 0.0f;
  }
}

void dequant_rows_generic(const Weights& w, int64_t r0, int nr, float* out) {
  const int64_t nb = w.blocks();
  thread_local std::vector<float> params;
  params.resize(2 * nb);
  for (int r = 0; r < nr; ++r) {
    const int64_t row = r0 + r;
    if (w.bits == 32) {
      std::memcpy(out + r * w.k, reinterpret_cast<const float*>(w.codes) + row * w.k, w.k * sizeof(float));
      continue;
    }
    if (w.bits == 16) {
      const uint16_t* h = reinterpret_cast<const uint16_t*>(w.codes) + row * w.k;
      for (int64_t i = 0; i < w.k; ++i) out[r * w.k + i] = w.brain ? trtllm_cpu::bf16_to_float(h[i]) : half_to_float(h[i]);
      continue;
    }
    row_params_generic(w, row, params.data(), params.data() + nb);
    for (int64_t b = 0; b < nb; ++b) {
      const float s = params[b], o = params[nb + b];
      float* dst = out + r * w.k + b * kBlock;
      if (w.bits == 4) {
        const uint8_t* p = w.codes + (row * nb + b) * (kBlock / 2);
        for (int i = 0; i < 16; ++i) {
          dst[i] = s * static_cast<float>(p[i] & 0x0F) + o;
          dst[i + 16] = s * static_cast<float>(p[i] >> 4) + o;
        }
      } else {
        const int8_t* p = reinterpret_cast<const int8_t*>(w.codes) + row * w.k + b * kBlock;
        for (int i = 0; i < kBlock; ++i) dst[i] = s * static_cast<float>(p[i]) + o;
      }
    }
  }
}

// Each dot product in 8 interleaved partial sums, added pairwise at the end: one running sum over k
// terms loses up to k float32 roundings (the logits of a CPU without AVX-512 drifted 1e-4 from
// transformers'), and the 8 lanes are what a compiler vectorizes on any CPU.
void tile_generic(const float* w, int nr, int64_t k, const float* x, int mr, int64_t ldx, float* y, int64_t ldy) {
  for (int m = 0; m < mr; ++m)
    for (int r = 0; r < nr; ++r) {
      const float* a = x + m * ldx;
      const float* b = w + r * k;
      float acc[8] = {};
      int64_t i = 0;
      for (; i + 8 <= k; i += 8)
        for (int l = 0; l < 8; ++l) acc[l] += a[i + l] * b[i + l];
      for (; i < k; ++i) acc[i % 8] += a[i] * b[i];
      y[m * ldy + r] = ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
    }
}

// ---- AVX-512 ----

#ifdef TRTLLM_X86  // ---- AVX-512 (the rest of the file dispatches on use_avx512()) ----

// 16 values of 16 bits as float32: float16 (F16C) or, BF, bfloat16.
template <bool BF>
__attribute__((target("avx512f,avx512bw,avx512vl,fma"))) inline __m512 widen(__m256i h) {
  if constexpr (BF) return trtllm_cpu::widen_bf16(h);
  else return _mm512_cvtph_ps(h);
}

// count values of 16 bits -> float32.
template <bool BF>
__attribute__((target("avx512f,avx512bw,avx512vl,fma"))) void widen_avx512(const uint16_t* h, int64_t count,
                                                                         float* out) {
  int64_t i = 0;
  for (; i + 16 <= count; i += 16)
    _mm512_storeu_ps(out + i, widen<BF>(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(h + i))));
  if (i < count) {
    const __mmask16 tail = static_cast<__mmask16>((1u << (count - i)) - 1);
    _mm512_mask_storeu_ps(out + i, tail, widen<BF>(_mm256_maskz_loadu_epi16(tail, h + i)));
  }
}

__attribute__((target("avx512f,avx512bw,avx512vl,fma"))) void row_params_avx512(const Weights& w, int64_t row,
                                                                              float* s, float* o) {
  const int64_t nb = w.blocks();
  widen_avx512<false>(w.scale + row * nb, nb, s);
  if (w.offset) widen_avx512<false>(w.offset + row * nb, nb, o);
  else std::fill(o, o + nb, 0.0f);
}

__attribute__((target("avx512f,avx512bw,avx512vl,fma"))) void dequant_rows_avx512(const Weights& w, int64_t r0, int nr,
                                                                                float* out) {
  const int64_t nb = w.blocks();
  const __m512 nibbles = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  thread_local std::vector<float> params;
  params.resize(2 * nb);
  for (int r = 0; r < nr; ++r) {
    const int64_t row = r0 + r;
    if (w.bits == 32) {
      std::memcpy(out + r * w.k, reinterpret_cast<const float*>(w.codes) + row * w.k, w.k * sizeof(float));
      continue;
    }
    if (w.bits == 16) {
      const uint16_t* h = reinterpret_cast<const uint16_t*>(w.codes) + row * w.k;
      if (w.brain) widen_avx512<true>(h, w.k, out + r * w.k);
      else widen_avx512<false>(h, w.k, out + r * w.k);
      continue;
    }
    row_params_avx512(w, row, params.data(), params.data() + nb);
    const float* scale = params.data();
    const float* offset = params.data() + nb;
    float* dst = out + r * w.k;
    if (w.bits == 4) {  // the block's 16 weights s q + o, then each code looked up (as fused_avx512)
      const uint8_t* p = w.codes + row * nb * (kBlock / 2);
      for (int64_t b = 0; b < nb; ++b, p += kBlock / 2, dst += kBlock) {
        const __m512 table = _mm512_fmadd_ps(nibbles, _mm512_set1_ps(scale[b]), _mm512_set1_ps(offset[b]));
        const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
        _mm512_storeu_ps(dst, _mm512_permutexvar_ps(v, table));
        _mm512_storeu_ps(dst + 16, _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), table));
      }
    } else {
      const int8_t* p = reinterpret_cast<const int8_t*>(w.codes) + row * w.k;
      for (int64_t b = 0; b < nb; ++b, p += kBlock, dst += kBlock) {
        const __m512 s = _mm512_set1_ps(scale[b]), o = _mm512_set1_ps(offset[b]);
        const __m128i c0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
        const __m128i c1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16));
        _mm512_storeu_ps(dst, _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(c0)), s, o));
        _mm512_storeu_ps(dst + 16, _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(c1)), s, o));
      }
    }
  }
}

// MR activation rows times NR dequantized weight rows, accumulated in 16 lanes each and summed at
// the end: every weight vector loaded once serves MR rows, every activation vector NR rows.
template <int MR, int NR>
__attribute__((target("avx512f,avx512bw,avx512vl,fma"))) void tile_avx512(const float* w, int64_t k, const float* x,
                                                                        int64_t ldx, float* y, int64_t ldy) {
  __m512 acc[MR][NR];
#pragma GCC unroll 8
  for (int m = 0; m < MR; ++m)
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) acc[m][r] = _mm512_setzero_ps();
  for (int64_t i = 0; i < k; i += 16) {
    __m512 wv[NR];
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) wv[r] = _mm512_loadu_ps(w + r * k + i);
#pragma GCC unroll 8
    for (int m = 0; m < MR; ++m) {
      const __m512 xv = _mm512_loadu_ps(x + m * ldx + i);
#pragma GCC unroll 4
      for (int r = 0; r < NR; ++r) acc[m][r] = _mm512_fmadd_ps(xv, wv[r], acc[m][r]);
    }
  }
#pragma GCC unroll 8
  for (int m = 0; m < MR; ++m)
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) y[m * ldy + r] = _mm512_reduce_add_ps(acc[m][r]);
}

constexpr int64_t kAhead = 4;  // tiles prefetched ahead

// Decode (few activation rows): NR rows' block is dequantized straight into registers and used by
// MR activation rows at once, so nothing goes through memory but the codes and the activations.
template <int BITS, int MR, int NR>
__attribute__((target("avx512f,avx512bw,avx512vl,fma"))) void fused_avx512(const Weights& w, int64_t row,
                                                                         const float* x, int64_t ldx, const float* xs,
                                                                         float* y, int64_t ldy) {
  // With one or two activation rows, the scale is taken out of the block's dot product and the
  // offset out of the loop: sum_b s_b (q_b . x_b) + sum_b o_b sum(x_b) (xs: the block sums) takes
  // fewer instructions per weight than dequantizing (s q + o) first. With more rows, dequantizing
  // once and sharing it wins.
  //
  // 4-bit codes with the scale factored out take the activations split (`x` is then Job::xt): byte i
  // of a block is v = q[i] + 16 q[i + 16], so with a = x[i] - x[i + 16] / 16 and c = x[i + 16] / 16
  // (per activation row, made once per call), q[i] x[i] + q[i + 16] x[i + 16] = (v & 15) a + v c.
  // That is one widening and one AND per 16 bytes instead of two of each plus a shift: the kernel
  // is bound by its vector instructions, not by memory, at 4 bits.
  constexpr bool kFactor = MR <= 2;
  const int64_t nb = w.blocks();
  // 4-bit codes: v & 15 as float32 in one instruction, a table lookup that reads only its index's
  // low 4 bits (an AND and a conversion before)
  const __m512 nibbles = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  __m512 acc[MR][NR];
#pragma GCC unroll 4
  for (int m = 0; m < MR; ++m)
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) acc[m][r] = _mm512_setzero_ps();
  // The next tiles' codes, scales and offsets are prefetched while this one is computed: rows are
  // short (K / 2 bytes), so the hardware prefetcher alone leaves most of the bandwidth unused.
  const char* ahead_codes = reinterpret_cast<const char*>(w.codes) + (row + kAhead * NR) * nb * (kBlock * BITS / 8);
  const char* ahead_scale = reinterpret_cast<const char*>(w.scale + (row + kAhead * NR) * nb);
  const char* ahead_offset = w.offset ? reinterpret_cast<const char*>(w.offset + (row + kAhead * NR) * nb) : nullptr;
  alignas(64) float scale[NR][16], offset[NR][16];  // 16 blocks' parameters as float32, per row
  for (int64_t b0 = 0; b0 < nb; b0 += 16) {
    const int64_t count = std::min<int64_t>(16, nb - b0);
    const __mmask16 valid = static_cast<__mmask16>((1u << count) - 1);
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) {
      const int64_t at = (row + r) * nb + b0;
      _mm512_store_ps(scale[r], _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(valid, w.scale + at)));
      const __m512 o = w.offset ? _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(valid, w.offset + at)) : _mm512_setzero_ps();
      if (kFactor) {  // the offsets' share, 16 blocks at once: lanes are summed at the end anyway
#pragma GCC unroll 2
        for (int m = 0; m < MR; ++m)
          acc[m][r] = _mm512_fmadd_ps(o, _mm512_maskz_loadu_ps(valid, xs + m * nb + b0), acc[m][r]);
      } else {
        _mm512_store_ps(offset[r], o);
      }
    }
    for (int64_t b = b0; b < b0 + count; ++b) {
      // One tile's codes are NR * nb * 16 bytes (4-bit): NR / 4 lines per block; its scales an eighth of that.
#pragma GCC unroll 4
      for (int l = 0; l < NR * BITS / 16; ++l) _mm_prefetch(ahead_codes + (b * NR * BITS / 16 + l) * 64, _MM_HINT_T0);
      if (b * 64 < NR * nb * 2) {
        _mm_prefetch(ahead_scale + b * 64, _MM_HINT_T0);
        if (ahead_offset) _mm_prefetch(ahead_offset + b * 64, _MM_HINT_T0);
      }
      __m512 wlo[NR], whi[NR];
#pragma GCC unroll 4
      for (int r = 0; r < NR; ++r) {
        const int64_t at = (row + r) * nb + b;
        __m512i lo, hi;
        if (BITS == 4 && kFactor) {
          hi = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w.codes + at * (kBlock / 2))));
          lo = hi;  // (its low nibble is taken by the lookup below)
        } else if (BITS == 4) {  // (each nibble is looked up in the row's table of 16 weights below)
          lo = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w.codes + at * (kBlock / 2))));
          hi = _mm512_srli_epi32(lo, 4);
        } else {
          const int8_t* p = reinterpret_cast<const int8_t*>(w.codes) + at * kBlock;
          lo = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
          hi = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16)));
        }
        if (kFactor) {
          wlo[r] = BITS == 4 ? _mm512_permutexvar_ps(lo, nibbles) : _mm512_cvtepi32_ps(lo);
          whi[r] = _mm512_cvtepi32_ps(hi);
        } else {
          const __m512 s = _mm512_set1_ps(scale[r][b - b0]), o = _mm512_set1_ps(offset[r][b - b0]);
          if (BITS == 4) {  // the block's 16 weights s q + o, each made as below, then looked up
            const __m512 table = _mm512_fmadd_ps(nibbles, s, o);
            wlo[r] = _mm512_permutexvar_ps(lo, table);
            whi[r] = _mm512_permutexvar_ps(hi, table);
          } else {
            wlo[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(lo), s, o);
            whi[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(hi), s, o);
          }
        }
      }
#pragma GCC unroll 4
      for (int m = 0; m < MR; ++m) {
        const __m512 xlo = _mm512_loadu_ps(x + m * ldx + b * kBlock), xhi = _mm512_loadu_ps(x + m * ldx + b * kBlock + 16);
#pragma GCC unroll 4
        for (int r = 0; r < NR; ++r) {
          if (kFactor) {
            const __m512 dot = _mm512_fmadd_ps(xhi, whi[r], _mm512_mul_ps(xlo, wlo[r]));
            acc[m][r] = _mm512_fmadd_ps(dot, _mm512_set1_ps(scale[r][b - b0]), acc[m][r]);
          } else {
            acc[m][r] = _mm512_fmadd_ps(xhi, whi[r], _mm512_fmadd_ps(xlo, wlo[r], acc[m][r]));
          }
        }
      }
    }
  }
#pragma GCC unroll 4
  for (int m = 0; m < MR; ++m)
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) y[m * ldy + r] = _mm512_reduce_add_ps(acc[m][r]);
}

// Float weights as the decode kernels read them: float16 (F16C), bfloat16 (a shift) or float32.
enum Float { kHalf, kBrain, kSingle };

// 16 weights from p (elements of the kind), as float32.
template <int KIND>
__attribute__((target("avx512f,avx512bw,avx512vl,fma"))) inline __m512 load16(const void* p) {
  if constexpr (KIND == kSingle) return _mm512_loadu_ps(p);
  else return widen<KIND == kBrain>(_mm256_loadu_si256(static_cast<const __m256i*>(p)));
}

// Decode with float weights (16-bit, converted in registers, or float32): NR rows used by MR
// activation rows at once; the next tiles are prefetched as above (a row is K elements).
template <int MR, int NR, int KIND>
__attribute__((target("avx512f,avx512bw,avx512vl,fma"))) void float_avx512(const Weights& w, int64_t row,
                                                                         const float* x, int64_t ldx, const float*,
                                                                         float* y, int64_t ldy) {
  using T = std::conditional_t<KIND == kSingle, float, uint16_t>;
  const T* base = reinterpret_cast<const T*>(w.codes) + row * w.k;
  const char* ahead = reinterpret_cast<const char*>(base + kAhead * NR * w.k);
  __m512 acc[MR][NR];
#pragma GCC unroll 4
  for (int m = 0; m < MR; ++m)
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) acc[m][r] = _mm512_setzero_ps();
  for (int64_t i = 0; i < w.k; i += kBlock) {
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) {
      _mm_prefetch(ahead + (r * w.k + i) * sizeof(T), _MM_HINT_T0);
      if constexpr (sizeof(T) == 4) _mm_prefetch(ahead + (r * w.k + i) * sizeof(T) + 64, _MM_HINT_T0);
    }
    __m512 wlo[NR], whi[NR];
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) {
      wlo[r] = load16<KIND>(base + r * w.k + i);
      whi[r] = load16<KIND>(base + r * w.k + i + 16);
    }
#pragma GCC unroll 4
    for (int m = 0; m < MR; ++m) {
      const __m512 xlo = _mm512_loadu_ps(x + m * ldx + i), xhi = _mm512_loadu_ps(x + m * ldx + i + 16);
#pragma GCC unroll 4
      for (int r = 0; r < NR; ++r) acc[m][r] = _mm512_fmadd_ps(xhi, whi[r], _mm512_fmadd_ps(xlo, wlo[r], acc[m][r]));
    }
  }
#pragma GCC unroll 4
  for (int m = 0; m < MR; ++m)
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) y[m * ldy + r] = _mm512_reduce_add_ps(acc[m][r]);
}

// Prefill: the chunk's 32 weight rows transposed into a panel [K][32] (two vectors per input), so
// each input k is an outer product: MR activations, broadcast one at a time, times the panel's two
// vectors, into MR x 32 sums that stay in registers (no horizontal sums, two loads per 2 MR FMAs).
constexpr int kPanelRows = 12;  // MR: 12 x 2 accumulators + 2 weight vectors + 1 broadcast <= 32 zmm

// rows [32][k] (row-major, stride k; k a multiple of 16) -> panel [k][32], in 16 x 16 blocks.
__attribute__((target("avx512f,avx512bw,avx512vl,fma"))) void transpose_panel(const float* rows, int64_t k,
                                                                           float* panel) {
  for (int64_t k0 = 0; k0 < k; k0 += 16)
    for (int half = 0; half < 2; ++half) {
      __m512 r[16], t[16];
#pragma GCC unroll 16
      for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(rows + (half * 16 + i) * k + k0);
#pragma GCC unroll 8
      for (int i = 0; i < 8; ++i) {  // pairs of rows, interleaved by element
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
      }
#pragma GCC unroll 4
      for (int i = 0; i < 4; ++i) {  // quads, by 64-bit pairs
        const __m512d a = _mm512_castps_pd(t[4 * i]), b = _mm512_castps_pd(t[4 * i + 1]);
        const __m512d c = _mm512_castps_pd(t[4 * i + 2]), d = _mm512_castps_pd(t[4 * i + 3]);
        r[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
        r[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
        r[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
        r[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
      }
      // r[4i + j] holds, in each 128-bit lane l, element 4l + j' of rows 4i..4i+3 (j' = 0, 1, 2, 3 for
      // j = 0, 1, 2, 3): gather the lanes of the four quads into columns.
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) {
        const __m512 a = _mm512_shuffle_f32x4(r[j], r[4 + j], 0x44), b = _mm512_shuffle_f32x4(r[j], r[4 + j], 0xEE);
        const __m512 c = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0x44), d = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0xEE);
        t[j] = _mm512_shuffle_f32x4(a, c, 0x88);       // lane 0: column j
        t[4 + j] = _mm512_shuffle_f32x4(a, c, 0xDD);   // lane 1: column 4 + j
        t[8 + j] = _mm512_shuffle_f32x4(b, d, 0x88);   // lane 2: column 8 + j
        t[12 + j] = _mm512_shuffle_f32x4(b, d, 0xDD);  // lane 3: column 12 + j
      }
#pragma GCC unroll 16
      for (int i = 0; i < 16; ++i) _mm512_storeu_ps(panel + (k0 + i) * 32 + half * 16, t[i]);
    }
}

// y[m][0:nr] = x[m] . panel columns, for MR activation rows.
template <int MR>
__attribute__((target("avx512f,avx512bw,avx512vl,fma"))) void panel_avx512(const float* panel, int64_t k, const float* x,
                                                                         int64_t ldx, float* y, int64_t ldy, int nr) {
  __m512 acc[MR][2];
#pragma GCC unroll 12
  for (int m = 0; m < MR; ++m) acc[m][0] = acc[m][1] = _mm512_setzero_ps();
  for (int64_t i = 0; i < k; ++i) {
    const __m512 w0 = _mm512_loadu_ps(panel + i * 32), w1 = _mm512_loadu_ps(panel + i * 32 + 16);
#pragma GCC unroll 12
    for (int m = 0; m < MR; ++m) {
      const __m512 xb = _mm512_set1_ps(x[m * ldx + i]);
      acc[m][0] = _mm512_fmadd_ps(xb, w0, acc[m][0]);
      acc[m][1] = _mm512_fmadd_ps(xb, w1, acc[m][1]);
    }
  }
  const __mmask16 lo = nr >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << nr) - 1);
  const __mmask16 hi = nr >= 32 ? 0xFFFF : nr <= 16 ? 0 : static_cast<__mmask16>((1u << (nr - 16)) - 1);
#pragma GCC unroll 12
  for (int m = 0; m < MR; ++m) {
    _mm512_mask_storeu_ps(y + m * ldy, lo, acc[m][0]);
    _mm512_mask_storeu_ps(y + m * ldy + 16, hi, acc[m][1]);
  }
}

using PanelFn = void (*)(const float*, int64_t, const float*, int64_t, float*, int64_t, int);
constexpr PanelFn kPanelFns[kPanelRows] = {panel_avx512<1>,  panel_avx512<2>,  panel_avx512<3>,  panel_avx512<4>,
                                           panel_avx512<5>,  panel_avx512<6>,  panel_avx512<7>,  panel_avx512<8>,
                                           panel_avx512<9>,  panel_avx512<10>, panel_avx512<11>, panel_avx512<12>};

constexpr int kFusedBatch = 4;  // 4 x 4 accumulators + 8 weight vectors + 2 activations <= 32 zmm
using FusedFn = void (*)(const Weights&, int64_t, const float*, int64_t, const float*, float*, int64_t);

template <int BITS, int MR>
constexpr FusedFn fused_row[kRows] = {fused_avx512<BITS, MR, 1>, fused_avx512<BITS, MR, 2>, fused_avx512<BITS, MR, 3>,
                                      fused_avx512<BITS, MR, 4>};
template <int BITS>
constexpr const FusedFn* kFused[kFusedBatch] = {fused_row<BITS, 1>, fused_row<BITS, 2>, fused_row<BITS, 3>,
                                                fused_row<BITS, 4>};
template <int MR, int KIND>
constexpr FusedFn float_row[kRows] = {float_avx512<MR, 1, KIND>, float_avx512<MR, 2, KIND>, float_avx512<MR, 3, KIND>,
                                      float_avx512<MR, 4, KIND>};
template <int KIND>
constexpr const FusedFn* kFloat[kFusedBatch] = {float_row<1, KIND>, float_row<2, KIND>, float_row<3, KIND>,
                                                float_row<4, KIND>};

using TileFn = void (*)(const float*, int64_t, const float*, int64_t, float*, int64_t);

template <int MR>
constexpr TileFn tile_row[kRows] = {tile_avx512<MR, 1>, tile_avx512<MR, 2>, tile_avx512<MR, 3>, tile_avx512<MR, 4>};
constexpr const TileFn* kTiles[kBatch] = {tile_row<1>, tile_row<2>, tile_row<3>, tile_row<4>, tile_row<5>, tile_row<6>};

#endif  // TRTLLM_X86

void dequant_rows(const Weights& w, int64_t r0, int nr, float* out) {
#ifdef TRTLLM_X86
  if (use_avx512()) return dequant_rows_avx512(w, r0, nr, out);
  if (use_avx2()) return avx2::dequant_rows(w, r0, nr, out);
#endif
  dequant_rows_generic(w, r0, nr, out);
}

void tile(const float* w, int nr, int64_t k, const float* x, int mr, int64_t ldx, float* y, int64_t ldy) {
#ifdef TRTLLM_X86
  if (use_avx512()) return kTiles[mr - 1][nr - 1](w, k, x, ldx, y, ldy);
#endif
  tile_generic(w, nr, k, x, mr, ldx, y, ldy);
}

}  // namespace

#ifdef TRTLLM_X86
// out[i] = silu(gate[i]) * up[i] = gate * up / (1 + exp(-gate))
__attribute__((target("avx512f,avx512bw,avx512vl,fma"))) void swiglu_avx512(const float* gate, const float* up,
                                                                          int64_t count, float* out) {
  for (int64_t i = 0; i < count; i += 16) {
    const __mmask16 valid = count - i >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (count - i)) - 1);
    const __m512 g = _mm512_maskz_loadu_ps(valid, gate + i), u = _mm512_maskz_loadu_ps(valid, up + i);
    const __m512 e = exp_avx512(_mm512_sub_ps(_mm512_setzero_ps(), g));
    _mm512_mask_storeu_ps(out + i, valid, _mm512_div_ps(_mm512_mul_ps(g, u), _mm512_add_ps(_mm512_set1_ps(1.0f), e)));
  }
}

#endif  // TRTLLM_X86

void decode_inputs(const float* x, int64_t m, int64_t k, float* sums, float* split) {
  for (int64_t i = 0; i < m * (k / kBlock); ++i) {
    float total = 0.0f;
    for (int64_t j = 0; j < kBlock; ++j) total += x[i * kBlock + j];
    sums[i] = total;
    if (!split) continue;
    for (int64_t j = 0; j < kBlock / 2; ++j) {  // byte j holds q[j] and q[j + 16]: see fused_avx512
      const float hi = x[i * kBlock + j + 16] * 0.0625f;
      split[i * kBlock + j] = x[i * kBlock + j] - hi;
      split[i * kBlock + j + 16] = hi;
    }
  }
}

void swiglu(const float* gate, const float* up, int64_t count, float* out) {
#ifdef TRTLLM_X86
  if (use_avx512()) return swiglu_avx512(gate, up, count, out);
  if (use_avx2()) return avx2::swiglu(gate, up, count, out);
#endif
  for (int64_t i = 0; i < count; ++i) out[i] = gate[i] * up[i] / (1.0f + std::exp(-gate[i]));
}

namespace {

// One task: weight rows [c * kChunkRows, ...) for every activation row. With SwiGLU, a task's rows
// are h gate rows then the h matching up rows (the builder orders them so), and the task writes
// silu(gate) * up for those h outputs: y's last dimension is n / 2.
void run_chunk(void* data, size_t chunk) {
  const Job& job = *static_cast<const Job*>(data);
  const Weights& w = job.w;
  const int64_t r0 = static_cast<int64_t>(chunk) * kChunkRows, r1 = std::min(w.n, r0 + kChunkRows);
  thread_local std::vector<float> scratch, staged;
  float* out = job.y + r0;  // row r of activation m goes to out[m * ldy + r - r0]
  int64_t ldy = w.n;
  if (job.swiglu) {
    if (staged.size() < static_cast<size_t>(job.m * kChunkRows)) staged.resize(job.m * kChunkRows);
    out = staged.data();
    ldy = kChunkRows;
  }
  if (job.xq) {  // integer activations (matmul_int8.cc): the whole chunk in one call
    int_tile(job, r0, static_cast<int>(r1 - r0), out, ldy);
  } else if (job.decode_path()) {
    for (int64_t r = r0; r < r1; r += kRows) {
      const int nr = static_cast<int>(std::min<int64_t>(kRows, r1 - r));
#ifdef TRTLLM_X86
      if (use_avx512()) {
        // Decode: the weights go from their codes into registers; a batch re-reads them from L1.
        const int64_t batch = job.row_exact && w.bits <= 8 ? 2 : kFusedBatch;  // (Job::row_exact)
        for (int64_t m = 0; m < job.m; m += batch) {
          const int mr = static_cast<int>(std::min<int64_t>(batch, job.m - m));
          const FusedFn* const* table = w.bits == 4 ? kFused<4> : w.bits == 8 ? kFused<8>
                                         : w.bits == 32 ? kFloat<kSingle> : w.brain ? kFloat<kBrain> : kFloat<kHalf>;
          const float* x = (w.bits == 4 && mr <= 2 ? job.xt : job.x) + m * w.k;
          table[mr - 1][nr - 1](w, r, x, w.k, job.xs ? job.xs + m * w.blocks() : nullptr,
                                out + m * ldy + (r - r0), ldy);
        }
        continue;
      }
      if (use_avx2()) {
        avx2::decode(job, r, nr, out + (r - r0), ldy);
        continue;
      }
#endif
      if (scratch.size() < static_cast<size_t>(kRows * w.k)) scratch.resize(kRows * w.k);
      dequant_rows_generic(w, r, nr, scratch.data());
      tile_generic(scratch.data(), nr, w.k, job.x, static_cast<int>(job.m), w.k, out + (r - r0), ldy);
    }
  } else {
    // Prefill: the chunk's rows are dequantized once (L2) and reused by panels of activation rows.
    if (scratch.size() < static_cast<size_t>(kChunkRows * w.k)) scratch.resize(kChunkRows * w.k);
#ifdef TRTLLM_X86
    const bool avx512 = use_avx512() && w.k % 16 == 0;
    if (avx512 || use_avx2()) {  // outer products over a transposed panel (kPanelRows above; matmul_avx2.cc)
      thread_local std::vector<float> panel;
      if (panel.size() < static_cast<size_t>(kChunkRows * w.k)) panel.resize(kChunkRows * w.k);
      const int nr = static_cast<int>(r1 - r0);
      const float* rows = scratch.data();
      if (w.bits == 32 && nr == kChunkRows) {  // float32 rows are transposed where they lie
        rows = reinterpret_cast<const float*>(w.codes) + r0 * w.k;
      } else {
        dequant_rows(w, r0, nr, scratch.data());
        std::fill(scratch.begin() + nr * w.k, scratch.begin() + kChunkRows * w.k, 0.0f);  // a short chunk's rest
      }
      if (!avx512) {
        avx2::prefill(rows, w.k, nr, job.x, job.m, out, ldy, panel.data());
      } else {
        transpose_panel(rows, w.k, panel.data());
        for (int64_t m = 0; m < job.m; m += kPanelRows) {
          const int mr = static_cast<int>(std::min<int64_t>(kPanelRows, job.m - m));
          kPanelFns[mr - 1](panel.data(), w.k, job.x + m * w.k, w.k, out + m * ldy, ldy, nr);
        }
      }
    } else
#endif
    {
      dequant_rows(w, r0, static_cast<int>(r1 - r0), scratch.data());
      for (int64_t m0 = 0; m0 < job.m; m0 += kPanel) {  // portable: 6 x 4 tiles of dot products
        const int64_t m1 = std::min(job.m, m0 + kPanel);
        for (int64_t r = r0; r < r1; r += kRows) {
          const int nr = static_cast<int>(std::min<int64_t>(kRows, r1 - r));
          const float* wr = scratch.data() + (r - r0) * w.k;
          for (int64_t m = m0; m < m1; m += kBatch) {
            const int mr = static_cast<int>(std::min<int64_t>(kBatch, m1 - m));
            tile(wr, nr, w.k, job.x + m * w.k, mr, w.k, out + m * ldy + (r - r0), ldy);
          }
        }
      }
    }
  }
  if (job.swiglu) {
    const int64_t h = (r1 - r0) / 2, half = w.n / 2;
    for (int64_t m = 0; m < job.m; ++m) swiglu(out + m * ldy, out + m * ldy + h, h, job.y + m * half + r0 / 2);
  }
}

}  // namespace

Rows rows_of(std::vector<int64_t> x_shape, int64_t n, bool swiglu) {
  Rows rows;
  if (x_shape.empty()) {
    rows.error = "x must have at least one dimension";
    return rows;
  }
  rows.k = x_shape.back();
  if (rows.k % kBlock) rows.error = "x's last dimension (" + std::to_string(rows.k) + ") is not a multiple of 32";
  for (size_t i = 0; i + 1 < x_shape.size(); ++i) rows.m *= x_shape[i];
  x_shape.back() = swiglu ? n / 2 : n;
  rows.y_shape = std::move(x_shape);
  return rows;
}

int generated_flag(Ort::KernelContext& ctx, size_t index) {
  const auto flag = trtllm_cpu::optional_input(ctx, index);
  if (!flag) return -1;
  if (flag.GetTensorTypeAndShapeInfo().GetElementCount() != 1)
    throw std::runtime_error("generated must hold one value (1: generated rows, 0: a prompt's)");
  return flag.GetTensorData<int64_t>()[0] != 0 ? 1 : 0;
}

int64_t chunks(const Job& job) { return (job.w.n + kChunkRows - 1) / kChunkRows; }

void run_task(const Job& job, int64_t chunk) { run_chunk(const_cast<Job*>(&job), static_cast<size_t>(chunk)); }

void run(Ort::KernelContext& ctx, Job& job) {
  parallel_for(ctx, run_chunk, static_cast<size_t>(chunks(job)), &job);
}

OrtStatusPtr fail(const std::string& message, const char* op) {
  return Ort::GetApi().CreateStatus(ORT_INVALID_ARGUMENT, (std::string(op) + ": " + message).c_str());
}

// The activation attribute: "none" or "swiglu" (which needs an even n); empty when valid.
std::string check_activation(const std::string& activation, int64_t n) {
  if (activation != "none" && activation != "swiglu") return "activation must be none or swiglu, got " + activation;
  if (activation == "swiglu" && n % 2) return "swiglu needs an even n (gate and up rows)";
  return "";
}

}  // namespace trtllm_cpu::matmul
