// The MatMul kernels' AVX2 path (matmul.h), for x86-64 CPUs without AVX-512 (AMD Zen 1-3, Intel's
// client cores), which ran the portable code before.
//
// Decode rows multiply weights made in registers, 8 at a time (quantized codes with the scale taken
// out of each block's dot product, for every row count; 16-bit ones widened). Unlike the AVX-512
// path, which dequantizes for 3-4 rows, every (row, weight row) pair sums in the same order
// whatever the tile it is in, so decode rows are batch-invariant here without Job::row_exact.
// Prefill rows go through a chunk's 32 weight rows transposed into a panel, as on AVX-512, each input
// an outer product of 6 broadcast activations and 16 panel columns.
#include "matmul.h"

#ifdef TRTLLM_X86

#include <algorithm>
#include <cmath>
#include <cstring>

namespace trtllm_cpu::matmul::avx2 {
namespace {

#define AVX2 TRTLLM_AVX2
using trtllm_cpu::halves_avx2;
using trtllm_cpu::lanes_avx2;
using trtllm_cpu::sum_avx2;

enum Kind { kInt4, kInt8, kHalf, kBrain, kSingle };

constexpr int64_t kAhead = 4;  // tiles prefetched ahead: rows are short, the hardware prefetcher alone lags

// 8 weights at p (elements of a float kind) as float32.
template <int KIND>
AVX2 inline __m256 load8(const void* p) {
  if constexpr (KIND == kSingle) {
    return _mm256_loadu_ps(static_cast<const float*>(p));
  } else {
    const __m128i h = _mm_loadu_si128(static_cast<const __m128i*>(p));
    if constexpr (KIND == kHalf) return _mm256_cvtph_ps(h);
    else return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));  // bfloat16: exact
  }
}

// A block of 32 weights of one row as 4 vectors: quantized codes as s q + o (a 4-bit block's byte i
// holds q[i] in its low nibble and q[i + 16] in its high one), float ones widened.
template <int KIND>
AVX2 inline void block(const uint8_t* p, __m256 s, __m256 o, __m256* out) {
  if constexpr (KIND == kInt4) {
    const __m256i v0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
    const __m256i v1 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 8)));
    const __m256i low = _mm256_set1_epi32(15);
    out[0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(v0, low)), s, o);
    out[1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(v1, low)), s, o);
    out[2] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(v0, 4)), s, o);
    out[3] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(v1, 4)), s, o);
  } else if constexpr (KIND == kInt8) {
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j)
      out[j] = _mm256_fmadd_ps(
          _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 8 * j)))), s, o);
  } else {
    constexpr int64_t size = KIND == kSingle ? 4 : 2;
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) out[j] = load8<KIND>(p + 8 * j * size);
  }
}

constexpr int64_t bytes_per_block(int kind) { return kind == kInt4 ? 16 : kind == kInt8 ? 32 : kind == kSingle ? 128 : 64; }

// Decode: MR activation rows times NR weight rows from `row`. Float weights are widened once for
// the MR rows. Quantized ones take the scale out of each block's dot product and the offset out of
// the loop, as fused_avx512 does for 1-2 rows: y = sum_b s_b (q_b . x_b) + o_b sum(x_b) (xs: the
// block sums); 4-bit codes meet x split (Job::xt: byte i's v = q[i] + 16 q[i + 16] gives
// (v & 15) a + v c with a = x[i] - x[i + 16] / 16, c = x[i + 16] / 16), so 16 code bytes take two
// widenings, two ANDs and four conversions. Every row count computes a row alike.
template <int KIND, int MR, int NR>
AVX2 void tile(const Weights& w, int64_t row, const float* x, const float* xs, int64_t ldx, float* y, int64_t ldy) {
  constexpr bool kQuant = KIND == kInt4 || KIND == kInt8;
  constexpr int64_t kBytes = bytes_per_block(KIND);
  const int64_t nb = w.blocks();
  __m256 acc[MR][NR][2];
#pragma GCC unroll 4
  for (int m = 0; m < MR; ++m)
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) acc[m][r][0] = acc[m][r][1] = _mm256_setzero_ps();
  // A tile's rows lie together (NR * nb blocks), as do the tiles kAhead ahead, fetched at the same pace.
  const char* ahead = reinterpret_cast<const char*>(w.codes) + (row + kAhead * NR) * nb * kBytes;
  const char* ahead_scale = kQuant ? reinterpret_cast<const char*>(w.scale + (row + kAhead * NR) * nb) : nullptr;
  const char* ahead_offset = kQuant && w.offset ? reinterpret_cast<const char*>(w.offset + (row + kAhead * NR) * nb) : nullptr;
  alignas(32) float scale[NR][8];
  for (int64_t b0 = 0; b0 < nb; b0 += 8) {
    const int count = static_cast<int>(std::min<int64_t>(8, nb - b0));
    if constexpr (kQuant) {
#pragma GCC unroll 4
      for (int r = 0; r < NR; ++r) {
        _mm256_store_ps(scale[r], halves_avx2(w.scale + (row + r) * nb + b0, count, w.scale + w.n * nb));
        if (!w.offset) continue;
        const __m256 o = halves_avx2(w.offset + (row + r) * nb + b0, count, w.offset + w.n * nb);
        const __m256 valid = lanes_avx2(0, 0, count);
#pragma GCC unroll 4
        for (int m = 0; m < MR; ++m)  // 8 blocks' offsets at once (xs past count masked: it may end there)
          acc[m][r][1] = _mm256_fmadd_ps(o, _mm256_maskload_ps(xs + m * nb + b0, _mm256_castps_si256(valid)), acc[m][r][1]);
      }
    }
    for (int64_t b = b0; b < b0 + count; ++b) {
#pragma GCC unroll 8
      for (int64_t l = 0; l < (NR * kBytes + 63) / 64; ++l) _mm_prefetch(ahead + b * NR * kBytes + 64 * l, _MM_HINT_T0);
      if (kQuant && b * 64 < NR * nb * 2) {
        _mm_prefetch(ahead_scale + b * 64, _MM_HINT_T0);
        if (ahead_offset) _mm_prefetch(ahead_offset + b * 64, _MM_HINT_T0);
      }
#pragma GCC unroll 4
      for (int r = 0; r < NR; ++r) {
        const uint8_t* p = w.codes + ((row + r) * nb + b) * kBytes;
        __m256 wv[4];
        if constexpr (KIND == kInt4) {  // (v & 15) for a, v for c, of bytes 0-7 and 8-15
          const __m256i v0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
          const __m256i v1 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 8)));
          wv[0] = _mm256_cvtepi32_ps(_mm256_and_si256(v0, _mm256_set1_epi32(15)));
          wv[1] = _mm256_cvtepi32_ps(_mm256_and_si256(v1, _mm256_set1_epi32(15)));
          wv[2] = _mm256_cvtepi32_ps(v0);
          wv[3] = _mm256_cvtepi32_ps(v1);
        } else if constexpr (KIND == kInt8) {
#pragma GCC unroll 4
          for (int j = 0; j < 4; ++j)
            wv[j] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 8 * j))));
        } else {
          block<KIND>(p, _mm256_setzero_ps(), _mm256_setzero_ps(), wv);
        }
#pragma GCC unroll 4
        for (int m = 0; m < MR; ++m) {
          const float* xb = x + m * ldx + b * kBlock;
          if constexpr (kQuant) {
            __m256 dot = _mm256_mul_ps(_mm256_loadu_ps(xb), wv[0]);
#pragma GCC unroll 3
            for (int j = 1; j < 4; ++j) dot = _mm256_fmadd_ps(_mm256_loadu_ps(xb + 8 * j), wv[j], dot);
            acc[m][r][0] = _mm256_fmadd_ps(dot, _mm256_set1_ps(scale[r][b - b0]), acc[m][r][0]);
          } else {
#pragma GCC unroll 4
            for (int j = 0; j < 4; ++j)
              acc[m][r][j >> 1] = _mm256_fmadd_ps(_mm256_loadu_ps(xb + 8 * j), wv[j], acc[m][r][j >> 1]);
          }
        }
      }
    }
  }
#pragma GCC unroll 4
  for (int m = 0; m < MR; ++m)
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) y[m * ldy + r] = sum_avx2(_mm256_add_ps(acc[m][r][0], acc[m][r][1]));
}

// nr weight rows from `row` for MR activation rows: tiles of NR rows, then one at a time. 8
// accumulators each: one activation row takes 4 weight rows at once, two take 2, four take 1.
template <int KIND, int MR, int NR>
void tiles(const Weights& w, int64_t row, int nr, const float* x, const float* xs, float* y, int64_t ldy) {
  int r = 0;
  for (; r + NR <= nr; r += NR) tile<KIND, MR, NR>(w, row + r, x, xs, w.k, y + r, ldy);
  for (; r < nr; ++r) tile<KIND, MR, 1>(w, row + r, x, xs, w.k, y + r, ldy);
}

template <int KIND>
void decode_kind(const Job& job, int64_t row, int nr, float* y, int64_t ldy) {
  const Weights& w = job.w;
  const float* x = KIND == kInt4 ? job.xt : job.x;  // (4-bit codes take x split)
  const int64_t nb = w.blocks();
  int64_t i = 0;
  for (; i + 4 <= job.m; i += 4) tiles<KIND, 4, 1>(w, row, nr, x + i * w.k, job.xs + i * nb, y + i * ldy, ldy);
  for (; i + 2 <= job.m; i += 2) tiles<KIND, 2, 2>(w, row, nr, x + i * w.k, job.xs + i * nb, y + i * ldy, ldy);
  for (; i < job.m; ++i) tiles<KIND, 1, 4>(w, row, nr, x + i * w.k, job.xs + i * nb, y + i * ldy, ldy);
}

int kind_of(const Weights& w) {
  return w.bits == 4 ? kInt4 : w.bits == 8 ? kInt8 : w.bits == 32 ? kSingle : w.brain ? kBrain : kHalf;
}

// nr rows from r0 as float32 rows [nr][k] (the values the decode tiles make).
template <int KIND>
AVX2 void dequant_kind(const Weights& w, int64_t r0, int nr, float* out) {
  constexpr int64_t kBytes = bytes_per_block(KIND);
  const int64_t nb = w.blocks();
  alignas(32) float scale[8] = {}, offset[8] = {};
  for (int r = 0; r < nr; ++r)
    for (int64_t b0 = 0; b0 < nb; b0 += 8) {
      const int count = static_cast<int>(std::min<int64_t>(8, nb - b0));
      if constexpr (KIND == kInt4 || KIND == kInt8) {
        _mm256_store_ps(scale, halves_avx2(w.scale + (r0 + r) * nb + b0, count, w.scale + w.n * nb));
        if (w.offset) _mm256_store_ps(offset, halves_avx2(w.offset + (r0 + r) * nb + b0, count, w.offset + w.n * nb));
      }
      for (int64_t b = b0; b < b0 + count; ++b) {
        __m256 wv[4];
        block<KIND>(w.codes + ((r0 + r) * nb + b) * kBytes, _mm256_set1_ps(scale[b - b0]),
                    _mm256_set1_ps(offset[b - b0]), wv);
#pragma GCC unroll 4
        for (int j = 0; j < 4; ++j) _mm256_storeu_ps(out + r * w.k + b * kBlock + 8 * j, wv[j]);
      }
    }
}

// rows [32][k] (stride k, k a multiple of 8) -> panel [k][32], in 8 x 8 blocks.
AVX2 void transpose_panel(const float* rows, int64_t k, float* panel) {
  for (int64_t k0 = 0; k0 < k; k0 += 8)
    for (int rb = 0; rb < 4; ++rb) {
      __m256 r[8], t[8];
#pragma GCC unroll 8
      for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(rows + (rb * 8 + i) * k + k0);
#pragma GCC unroll 4
      for (int i = 0; i < 4; ++i) {  // pairs of rows interleaved: [a0 b0 a1 b1 | a4 b4 a5 b5], [a2 b2 ...]
        t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
      }
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {  // quads: [a0 b0 c0 d0 | a4 b4 c4 d4] ... (rows 4h .. 4h + 3)
        r[4 * h] = _mm256_shuffle_ps(t[4 * h], t[4 * h + 2], 0x44);
        r[4 * h + 1] = _mm256_shuffle_ps(t[4 * h], t[4 * h + 2], 0xEE);
        r[4 * h + 2] = _mm256_shuffle_ps(t[4 * h + 1], t[4 * h + 3], 0x44);
        r[4 * h + 3] = _mm256_shuffle_ps(t[4 * h + 1], t[4 * h + 3], 0xEE);
      }
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) {  // the two quads' low lanes are column j, their high ones column j + 4
        _mm256_storeu_ps(panel + (k0 + j) * 32 + rb * 8, _mm256_permute2f128_ps(r[j], r[4 + j], 0x20));
        _mm256_storeu_ps(panel + (k0 + j + 4) * 32 + rb * 8, _mm256_permute2f128_ps(r[j], r[4 + j], 0x31));
      }
    }
}

constexpr int kPanelRows = 6;  // MR: 6 x 2 accumulators + 2 panel vectors + 1 broadcast <= 16 ymm

// y[m][c0 : c0 + nc] = x[m] . panel columns c0 .. c0 + 16 (nc of them kept), for MR activation rows.
template <int MR>
AVX2 void panel_tile(const float* panel, int64_t k, const float* x, int64_t ldx, float* y, int64_t ldy, int c0, int nc) {
  __m256 acc[MR][2];
#pragma GCC unroll 6
  for (int m = 0; m < MR; ++m) acc[m][0] = acc[m][1] = _mm256_setzero_ps();
  for (int64_t i = 0; i < k; ++i) {
    const __m256 w0 = _mm256_loadu_ps(panel + i * 32 + c0), w1 = _mm256_loadu_ps(panel + i * 32 + c0 + 8);
#pragma GCC unroll 6
    for (int m = 0; m < MR; ++m) {
      const __m256 xb = _mm256_broadcast_ss(x + m * ldx + i);
      acc[m][0] = _mm256_fmadd_ps(xb, w0, acc[m][0]);
      acc[m][1] = _mm256_fmadd_ps(xb, w1, acc[m][1]);
    }
  }
#pragma GCC unroll 6
  for (int m = 0; m < MR; ++m) {
    alignas(32) float out[16];
    _mm256_store_ps(out, acc[m][0]);
    _mm256_store_ps(out + 8, acc[m][1]);
    std::memcpy(y + m * ldy + c0, out, nc * sizeof(float));
  }
}

using PanelFn = void (*)(const float*, int64_t, const float*, int64_t, float*, int64_t, int, int);
constexpr PanelFn kPanelFns[kPanelRows] = {panel_tile<1>, panel_tile<2>, panel_tile<3>,
                                           panel_tile<4>, panel_tile<5>, panel_tile<6>};

}  // namespace

void decode(const Job& job, int64_t row, int nr, float* y, int64_t ldy) {
  switch (kind_of(job.w)) {
    case kInt4: return decode_kind<kInt4>(job, row, nr, y, ldy);
    case kInt8: return decode_kind<kInt8>(job, row, nr, y, ldy);
    case kHalf: return decode_kind<kHalf>(job, row, nr, y, ldy);
    case kBrain: return decode_kind<kBrain>(job, row, nr, y, ldy);
    default: return decode_kind<kSingle>(job, row, nr, y, ldy);
  }
}

void dequant_rows(const Weights& w, int64_t r0, int nr, float* out) {
  switch (kind_of(w)) {
    case kInt4: return dequant_kind<kInt4>(w, r0, nr, out);
    case kInt8: return dequant_kind<kInt8>(w, r0, nr, out);
    case kHalf: return dequant_kind<kHalf>(w, r0, nr, out);
    case kBrain: return dequant_kind<kBrain>(w, r0, nr, out);
    default: std::memcpy(out, reinterpret_cast<const float*>(w.codes) + r0 * w.k, nr * w.k * sizeof(float));
  }
}

void prefill(const float* rows, int64_t k, int nr, const float* x, int64_t m, float* y, int64_t ldy, float* panel) {
  transpose_panel(rows, k, panel);
  for (int c0 = 0; c0 < nr; c0 += 16)
    for (int64_t i = 0; i < m; i += kPanelRows) {
      const int mr = static_cast<int>(std::min<int64_t>(kPanelRows, m - i));
      kPanelFns[mr - 1](panel, k, x + i * k, k, y + i * ldy, ldy, c0, std::min(16, nr - c0));
    }
}

AVX2 void swiglu(const float* gate, const float* up, int64_t count, float* out) {
  int64_t i = 0;
  for (; i + 8 <= count; i += 8) {  // silu(g) u = g u / (1 + exp(-g))
    const __m256 g = _mm256_loadu_ps(gate + i), u = _mm256_loadu_ps(up + i);
    const __m256 e = trtllm_cpu::exp_avx2(_mm256_sub_ps(_mm256_setzero_ps(), g));
    _mm256_storeu_ps(out + i, _mm256_div_ps(_mm256_mul_ps(g, u), _mm256_add_ps(_mm256_set1_ps(1.0f), e)));
  }
  for (; i < count; ++i) out[i] = gate[i] * up[i] / (1.0f + std::exp(-gate[i]));
}

}  // namespace trtllm_cpu::matmul::avx2

#endif  // TRTLLM_X86
