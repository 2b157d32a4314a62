// Integer activations on AVX2 (matmul.h, avx2::int_tile): matmul_int8.cc's AVX-512BW tile (maddubs
// pairs to 16 bits, madd to 32) on CPUs without AVX-512, which ran the portable loop before.
//
// The activations keep the AVX-512 layout (quantize_rows): each of its 64-byte vectors is read as
// two 256-bit halves. Every step of that tile stays within 128-bit lanes (the 4 x 4 transposes of
// 32-bit words, the byte products), so half h of a vector holds lanes 8h .. 8h + 7 of its sums, and
// the block in each lane is the one the layout puts there. The integer sums are exact, as on every
// path; only their float sums, in 8 lanes here, are rounded in another order.
#include "matmul.h"

#ifdef TRTLLM_X86

#include <algorithm>
#include <cstring>

namespace trtllm_cpu::matmul::avx2 {
namespace {

#define AVX2 TRTLLM_AVX2
using trtllm_cpu::halves_avx2;
using trtllm_cpu::lanes_avx2;

AVX2 inline __m256i load(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

// One digit's sums of four byte products per 32-bit lane over N code halves, the activations' halves
// 64 bytes apart from a. 4-bit codes are unsigned and the activations signed: a pair of products is
// at most 2 * 15 * 127 = 3,810, so the N <= 8 vectors' pairs add up in 16 bits (30,480) and widen
// once. 8-bit codes are signed: |q| times a with q's sign (2 * 128 * 127 < 32767), widened each.
template <int BITS, int N>
AVX2 inline __m256i digit_sums(const __m256i* codes, const int8_t* a) {
  static_assert(BITS == 8 || N <= 8, "16-bit sums of at most 8 products of pairs");
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i pairs = _mm256_setzero_si256(), sum = _mm256_setzero_si256();
#pragma GCC unroll 8
  for (int j = 0; j < N; ++j) {
    __m256i c = codes[j], x = load(a + 64 * j);
    if constexpr (BITS == 8) {
      x = _mm256_sign_epi8(x, c);
      c = _mm256_abs_epi8(c);
    }
    const __m256i p = _mm256_maddubs_epi16(c, x);
    if constexpr (BITS == 4) pairs = _mm256_add_epi16(pairs, p);
    else sum = _mm256_add_epi32(sum, _mm256_madd_epi16(p, ones));
  }
  return BITS == 4 ? _mm256_madd_epi16(pairs, ones) : sum;
}

// One activation row's sums (int16: of the second digit too, `part` bytes on: 256 a + a2).
template <int BITS, int LEVELS, int N>
AVX2 inline __m256i dots(const __m256i* codes, const int8_t* a, int64_t part) {
  __m256i sum = digit_sums<BITS, N>(codes, a);
  if constexpr (LEVELS == 2) sum = _mm256_add_epi32(_mm256_slli_epi32(sum, 8), digit_sums<BITS, N>(codes, a + part));
  return sum;
}

// v[0..3] -> u[j]: 32-bit word j of each 128-bit lane L of v[i], at lane 4L + i (as matmul_int8.cc).
AVX2 inline void transpose(const __m256i* v, __m256i* u) {
  const __m256i t0 = _mm256_unpacklo_epi32(v[0], v[1]), t1 = _mm256_unpackhi_epi32(v[0], v[1]);
  const __m256i t2 = _mm256_unpacklo_epi32(v[2], v[3]), t3 = _mm256_unpackhi_epi32(v[2], v[3]);
  u[0] = _mm256_unpacklo_epi64(t0, t2), u[1] = _mm256_unpackhi_epi64(t0, t2);
  u[2] = _mm256_unpacklo_epi64(t1, t3), u[3] = _mm256_unpackhi_epi64(t1, t3);
}

// A run's count (<= 16) float16 values as float32 in two vectors (values 0-7, 8-15), zeros past
// count, kept in registers (halves_avx2).
AVX2 inline void halves(const uint16_t* h, int64_t count, const uint16_t* end, __m256* v) {
  v[0] = halves_avx2(h, count, end);
  v[1] = halves_avx2(h + 8, count - 8, end);
}

// Lane e of the result: s[idx[e] + 8 (lanes of `high`)], from s's two vectors.
AVX2 inline __m256 pick(const __m256* s, __m256i idx, int high) {
  return _mm256_blend_ps(_mm256_permutevar8x32_ps(s[0], idx), _mm256_permutevar8x32_ps(s[1], idx), high);
}

constexpr int64_t kAhead = 16;  // weight rows prefetched ahead, as matmul_int8.cc
constexpr int kTileBatch = 4;   // MR: 4 accumulators + 8 code halves + temporaries <= 16 ymm

// nr weight rows from row0 times MR activation rows from m0, one weight row at a time.
template <int BITS, int LEVELS, int MR>
AVX2 void tile(const Job& job, int64_t row0, int nr, int64_t m0, float* out, int64_t ldy) {
  const Weights& w = job.w;
  const int64_t nb = w.blocks(), runs = nb / kRun, row_bytes = nb * kBlock * BITS / 8;
  const IntRow shape = int_row(w.k, BITS, LEVELS);
  const int8_t* xq = job.xq + m0 * shape.bytes;
  const float* xd = job.xd + m0 * shape.scales;
  const float* xs = job.xs + m0 * nb;
  const __m256i low = _mm256_set1_epi8(0x0F);
  for (int64_t row = row0; row < row0 + nr; ++row) {
    const uint8_t* codes = w.codes + row * row_bytes;
    const char* ahead = reinterpret_cast<const char*>(codes + kAhead * row_bytes);
    __m256 acc[MR];
#pragma GCC unroll 4
    for (int m = 0; m < MR; ++m) acc[m] = _mm256_setzero_ps();
    _mm_prefetch(reinterpret_cast<const char*>(w.scale + (row + kAhead) * nb), _MM_HINT_T0);
    if (w.offset) _mm_prefetch(reinterpret_cast<const char*>(w.offset + (row + kAhead) * nb), _MM_HINT_T0);
    for (int64_t b0 = 0; b0 < nb; b0 += kRun) {
      const int64_t count = std::min<int64_t>(kRun, nb - b0);
      // the run's scales and offsets as float32 (zeros past count: a unit's lanes may reach there)
      __m256 s[2], o[2];
      halves(w.scale + row * nb + b0, count, w.scale + w.n * nb, s);
      if (w.offset) {  // the offsets' share: o . (the blocks' sums of x), in lanes summed at the end
        halves(w.offset + row * nb + b0, count, w.offset + w.n * nb, o);
#pragma GCC unroll 4
        for (int m = 0; m < MR; ++m) {
          const float* sums = xs + m * nb + b0;
          // (masked lanes read as 0, from no memory: a short run's sums end the row's)
          const __m256 lo = _mm256_maskload_ps(sums, _mm256_castps_si256(lanes_avx2(0, 0, count)));
          const __m256 hi = _mm256_maskload_ps(sums + 8, _mm256_castps_si256(lanes_avx2(8, 0, count)));
          acc[m] = _mm256_fmadd_ps(o[0], lo, acc[m]);
          acc[m] = _mm256_fmadd_ps(o[1], hi, acc[m]);
        }
      }
#pragma GCC unroll 8
      for (int l = 0; l < BITS; ++l) _mm_prefetch(ahead + b0 * kBlock * BITS / 8 + l * 64, _MM_HINT_T0);
      if (count == kRun) {
        const int64_t at = (b0 / kRun) * kRunBytes, d_at = (b0 / kRun) * run_scales(BITS);
        if constexpr (BITS == 4) {  // 4 loads of 4 blocks; lane e holds block 4 (e % 4) + e / 4
#pragma GCC unroll 2
          for (int h = 0; h < 2; ++h) {
            __m256i v[4], u[4], nib[8];
#pragma GCC unroll 4
            for (int i = 0; i < 4; ++i) v[i] = load(codes + (b0 + 4 * i) * 16 + 32 * h);
            transpose(v, u);
#pragma GCC unroll 4
            for (int j = 0; j < 4; ++j) {
              nib[2 * j] = _mm256_and_si256(u[j], low);
              nib[2 * j + 1] = _mm256_and_si256(_mm256_srli_epi16(u[j], 4), low);
            }
            // half h: blocks 0 4 8 12 1 5 9 13 (+ 2h), lanes 2, 3, 6, 7 from s[1]
            const __m256 scale = pick(s, _mm256_setr_epi32(2 * h, 4 + 2 * h, 2 * h, 4 + 2 * h, 1 + 2 * h, 5 + 2 * h,
                                                           1 + 2 * h, 5 + 2 * h), 0xCC);
#pragma GCC unroll 4
            for (int m = 0; m < MR; ++m) {
              const __m256i sum = dots<4, LEVELS, 8>(nib, xq + m * shape.bytes + at + 32 * h, shape.part);
              const __m256 d = _mm256_loadu_ps(xd + m * shape.scales + d_at + 8 * h);
              acc[m] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(sum), d), scale, acc[m]);
            }
          }
        } else {  // per half-run of 8 blocks, 4 loads of 2 blocks; lane e holds block 8 hh + 2 (e % 4) + e / 8
          for (int hh = 0; hh < 2; ++hh)
#pragma GCC unroll 2
            for (int h = 0; h < 2; ++h) {
              __m256i v[4], u[4];
#pragma GCC unroll 4
              for (int i = 0; i < 4; ++i) v[i] = load(codes + (b0 + 8 * hh + 2 * i) * kBlock + 32 * h);
              transpose(v, u);
              // half h: blocks 8 hh + (0 2 4 6 0 2 4 6) + h, all in s[hh]
              const __m256i idx = _mm256_add_epi32(_mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6), _mm256_set1_epi32(h));
              const __m256 scale = _mm256_permutevar8x32_ps(s[hh], idx);
#pragma GCC unroll 4
              for (int m = 0; m < MR; ++m) {
                const __m256i sum = dots<8, LEVELS, 4>(u, xq + m * shape.bytes + at + hh * 256 + 32 * h, shape.part);
                const __m256 d = _mm256_loadu_ps(xd + m * shape.scales + d_at + hh * 16 + 8 * h);
                acc[m] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(sum), d), scale, acc[m]);
              }
            }
        }
        continue;
      }
      // The rest, in units of 4 blocks (4-bit: 4 lanes per block) or 2 (8-bit: 8 lanes).
      constexpr int64_t kUnit = unit_blocks(BITS);
      for (int64_t g = 0; g * kUnit < count; ++g) {
        // the unit's codes of blocks before count (masked words read as 0, from no memory)
        const int* unit = reinterpret_cast<const int*>(codes + (b0 + kUnit * g) * kBlock * BITS / 8);
        const int64_t words = std::min<int64_t>(kUnit, count - kUnit * g) * kBlock * BITS / 32;
        const int64_t at = runs * kRunBytes + g * unit_bytes(BITS), d_at = runs * run_scales(BITS) + g * kUnitScales;
#pragma GCC unroll 2
        for (int h = 0; h < 2; ++h) {
          if (8 * h >= words) break;  // (a half past the blocks would add exact zeros)
          const __m256i r = _mm256_maskload_epi32(unit + 8 * h, _mm256_castps_si256(lanes_avx2(8 * h, 0, words)));
          __m256i vec[2] = {r, r};
          if constexpr (BITS == 4) vec[0] = _mm256_and_si256(r, low), vec[1] = _mm256_and_si256(_mm256_srli_epi16(r, 4), low);
          // lane e holds block first + e / 4 (4-bit) or first + e / 8 (8-bit): its half's one or two
          const int block = static_cast<int>(kUnit * g) + (BITS == 4 ? 2 * h : h);
          const __m256i idx = BITS == 4 ? _mm256_setr_epi32(block % 8, block % 8, block % 8, block % 8, block % 8 + 1,
                                                            block % 8 + 1, block % 8 + 1, block % 8 + 1)
                                        : _mm256_set1_epi32(block % 8);
          const __m256 scale = _mm256_permutevar8x32_ps(s[block / 8], idx);
#pragma GCC unroll 4
          for (int m = 0; m < MR; ++m) {
            const __m256i sum = dots<BITS, LEVELS, BITS == 4 ? 2 : 1>(vec, xq + m * shape.bytes + at + 32 * h, shape.part);
            const __m256 d = _mm256_loadu_ps(xd + m * shape.scales + d_at + 8 * h);
            acc[m] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(sum), d), scale, acc[m]);
          }
        }
      }
    }
#pragma GCC unroll 4
    for (int m = 0; m < MR; ++m) out[(m0 + m) * ldy + row - row0] = sum_avx2(acc[m]);
  }
}

using TileFn = void (*)(const Job&, int64_t, int, int64_t, float*, int64_t);

template <int BITS, int LEVELS>
constexpr TileFn kTiles[kTileBatch] = {tile<BITS, LEVELS, 1>, tile<BITS, LEVELS, 2>, tile<BITS, LEVELS, 3>,
                                       tile<BITS, LEVELS, 4>};

}  // namespace

void int_tile(const Job& job, int64_t row, int nr, float* out, int64_t ldy) {
  const TileFn* tiles = job.w.bits == 4 ? (job.levels == 2 ? kTiles<4, 2> : kTiles<4, 1>)
                                        : (job.levels == 2 ? kTiles<8, 2> : kTiles<8, 1>);
  for (int64_t m = 0; m < job.m; m += kTileBatch) {
    const int mr = static_cast<int>(std::min<int64_t>(kTileBatch, job.m - m));
    tiles[mr - 1](job, row, nr, m, out, ldy);
  }
}

}  // namespace trtllm_cpu::matmul::avx2

#endif  // TRTLLM_X86
