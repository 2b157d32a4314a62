// Integer activations for 4-bit weights (MatMulBlockQuant's activations="int8" or "int16"; decode
// rows only, prefill rows stay float32).
//
// Why: with float32 activations each weight costs every activation row two FMAs, and from batch 2
// on the projections are bound by those FMAs, not by the weight stream (this CPU runs one 512-bit
// FMA per cycle). Quantizing each row's activations per block of 32 turns a block's dot product into
// integer multiply-adds of 64 byte pairs per instruction (VNNI):
//   int8:  a = round(x / d), d = max|x_b| / 127: llama.cpp's and MatMulNBits' numerics. Each x moves
//          by up to d / 2, and top-1 agreement with transformers drops (measured in docs/performance.md).
//   int16: the rest too, in a second int8 part: x ~ d (a + a2 / 256), a2 = round((x - d a) 256 / d):
//          each x moves by at most d / 512, about 1.5e-5 of the block's largest value, for two more
//          instructions per 64 pairs.
//
// The math, per activation row and weight row, with q the 4-bit codes, s and o the block's scale
// and offset:  y = sum_b s_b d_b (q_b . a_b) + o_b sum(x_b)   (int16: d_b / 256 and 256 a + a2)
// The offsets' share uses the exact float sums of x (the job's `xs`), so a weight offset costs no
// precision. The integer dot products are exact; only their float sums are rounded.
//
// Activation layout (quantize_rows), per row: runs of 16 blocks, then groups of 4 for the rest.
//  - A run is 8 vectors of 64 bytes: for j = 0..3, the values that code bytes 4j..4j+3 of 16 blocks
//    meet: low nibbles (values 4j..4j+3), then high nibbles (16 + 4j..). Lane e (4 bytes) holds block
//    4 (e % 4) + e / 4: the order in which 4 loads of 4 blocks each come out of a 4 x 4 transpose of
//    32-bit words. All 16 blocks' sums then sit in one vector, one lane per block, and each block costs
//    one float multiply-add per 16.
//  - A group is the 4 blocks' first 16 values (matching a 64-byte load's low nibbles), then their last 16.
// int16 rows hold the a part, then the a2 part in the same layout. `d` holds per run the 16 blocks'
// d in lane order, per group each block's d four times (one per 32-bit lane of its sums).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "matmul.h"

namespace trtllm_cpu::matmul {

constexpr int64_t kRun = 16;  // blocks per run

IntRow int_row(int64_t k, int levels) {
  const int64_t nb = k / kBlock, runs = nb / kRun, groups = (nb - runs * kRun + 3) / 4;
  const int64_t part = runs * 512 + groups * 128;
  return {levels * part, runs * 16 + groups * 16, part};
}

namespace {

// Where value i (0..31) of block b goes in one part of a row, and where its d goes.
inline int64_t slot(int64_t nb, int64_t b, int i) {
  const int64_t runs = nb / kRun;
  if (b < runs * kRun)
    return (b / kRun) * 512 + (2 * ((i % 16) / 4) + i / 16) * 64 + (4 * (b % 4) + (b % kRun) / 4) * 4 + i % 4;
  const int64_t t = b - runs * kRun;
  return runs * 512 + (t / 4) * 128 + (i / 16) * 64 + (t % 4) * 16 + i % 16;
}

inline int64_t d_slot(int64_t nb, int64_t b) {  // the first of a group block's four
  const int64_t runs = nb / kRun;
  if (b < runs * kRun) return (b / kRun) * 16 + 4 * (b % 4) + (b % kRun) / 4;
  const int64_t t = b - runs * kRun;
  return runs * 16 + (t / 4) * 16 + (t % 4) * 4;
}

// One block's values (a, and a2 for int16) and d as they are stored.
void place(const int8_t* a, const int8_t* a2, float d, int64_t nb, int64_t b, const IntRow& shape, int8_t* q,
           float* ds) {
  for (int i = 0; i < kBlock; i += 4) {
    std::memcpy(q + slot(nb, b, i), a + i, 4);
    if (a2) std::memcpy(q + shape.part + slot(nb, b, i), a2 + i, 4);
  }
  const int64_t at = d_slot(nb, b);
  if (b < nb / kRun * kRun) ds[at] = d;
  else std::fill_n(ds + at, 4, d);
}

void quantize_rows_generic(const float* x, int64_t m, int64_t k, int levels, int8_t* q, float* ds) {
  const int64_t nb = k / kBlock;
  const IntRow shape = int_row(k, levels);
  std::fill(q, q + m * shape.bytes, 0);
  std::fill(ds, ds + m * shape.scales, 0.0f);
  int8_t a[kBlock], a2[kBlock];
  for (int64_t r = 0; r < m; ++r)
    for (int64_t b = 0; b < nb; ++b) {
      const float* v = x + r * k + b * kBlock;
      float amax = 0.0f;
      for (int i = 0; i < kBlock; ++i) amax = std::max(amax, std::fabs(v[i]));
      const float inv = amax > 0.0f ? 127.0f / amax : 0.0f, d = amax / 127.0f;
      for (int i = 0; i < kBlock; ++i) {
        const float whole = std::nearbyint(v[i] * inv);
        a[i] = static_cast<int8_t>(whole);
        const float rest = std::nearbyint(std::fma(-whole, d, v[i]) * (256.0f * inv));  // as fnmadd
        a2[i] = static_cast<int8_t>(std::min(127.0f, std::max(-127.0f, rest)));
      }
      place(a, levels == 2 ? a2 : nullptr, levels == 2 ? d / 256.0f : d, nb, b, shape, q + r * shape.bytes,
            ds + r * shape.scales);
    }
}

// nr weight rows from `row` times every activation row: out[m * ldy + r].
void tile_generic(const Job& job, int64_t row, int nr, float* out, int64_t ldy) {
  const Weights& w = job.w;
  const int64_t nb = w.blocks();
  const IntRow shape = int_row(w.k, job.levels);
  for (int r = 0; r < nr; ++r) {
    const uint8_t* codes = w.codes + (row + r) * nb * (kBlock / 2);
    for (int64_t m = 0; m < job.m; ++m) {
      const int8_t* a = job.xq + m * shape.bytes;
      float acc = 0.0f;
      for (int64_t b = 0; b < nb; ++b) {
        int32_t dot = 0, dot2 = 0;
        for (int i = 0; i < 16; ++i) {
          const int lo = codes[b * 16 + i] & 0x0F, hi = codes[b * 16 + i] >> 4;
          dot += lo * a[slot(nb, b, i)] + hi * a[slot(nb, b, i + 16)];
          if (job.levels == 2)
            dot2 += lo * a[shape.part + slot(nb, b, i)] + hi * a[shape.part + slot(nb, b, i + 16)];
        }
        const int64_t at = (row + r) * nb + b;
        const float d = job.xd[m * shape.scales + d_slot(nb, b)];
        acc += half_to_float(w.scale[at]) * (d * static_cast<float>(job.levels == 2 ? dot * 256 + dot2 : dot));
        if (w.offset) acc += half_to_float(w.offset[at]) * job.xs[m * nb + b];
      }
      out[m * ldy + r] = acc;
    }
  }
}

#ifdef TRTLLM_X86
#define TRTLLM_INT8_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,fma")))

TRTLLM_INT8_TARGET void quantize_rows_avx512(const float* x, int64_t m, int64_t k, int levels, int8_t* q,
                                             float* ds) {
  const int64_t nb = k / kBlock;
  const IntRow shape = int_row(k, levels);
  std::fill(q, q + m * shape.bytes, 0);
  std::fill(ds, ds + m * shape.scales, 0.0f);
  alignas(16) int8_t a[kBlock], a2[kBlock];
  const __m512i top = _mm512_set1_epi32(127), bottom = _mm512_set1_epi32(-127);
  for (int64_t r = 0; r < m; ++r)
    for (int64_t b = 0; b < nb; ++b) {
      const float* v = x + r * k + b * kBlock;
      const __m512 x0 = _mm512_loadu_ps(v), x1 = _mm512_loadu_ps(v + 16);
      const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(x0), _mm512_abs_ps(x1)));
      const float inv = amax > 0.0f ? 127.0f / amax : 0.0f, d = amax / 127.0f;
      int half = 0;
      for (const __m512 xv : {x0, x1}) {  // cvtps_epi32 rounds to nearest even, as nearbyint does
        const __m512i whole = _mm512_cvtps_epi32(_mm512_mul_ps(xv, _mm512_set1_ps(inv)));
        _mm_store_si128(reinterpret_cast<__m128i*>(a + 16 * half), _mm512_cvtepi32_epi8(whole));
        if (levels == 2) {
          const __m512 rest = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(whole), _mm512_set1_ps(d), xv);
          __m512i part = _mm512_cvtps_epi32(_mm512_mul_ps(rest, _mm512_set1_ps(256.0f * inv)));
          part = _mm512_min_epi32(_mm512_max_epi32(part, bottom), top);
          _mm_store_si128(reinterpret_cast<__m128i*>(a2 + 16 * half), _mm512_cvtepi32_epi8(part));
        }
        ++half;
      }
      place(a, levels == 2 ? a2 : nullptr, levels == 2 ? d / 256.0f : d, nb, b, shape, q + r * shape.bytes,
            ds + r * shape.scales);
    }
}

// acc + sum of four u8 x s8 products per 32-bit lane: one VNNI instruction, or its AVX-512BW
// equivalent (u8 x s8 pairs to int16 without saturation here: 2 * 15 * 127 < 32767).
template <bool VNNI>
TRTLLM_INT8_TARGET inline __m512i dot_u8s8(__m512i acc, __m512i u8, __m512i s8) {
  if constexpr (VNNI) return _mm512_dpbusd_epi32(acc, u8, s8);
  return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(u8, s8), _mm512_set1_epi16(1)));
}

// The integer dot products of `n` nibble vectors with one part (and, int16, the next) of a row's
// activations: 256 a + a2 per lane.
template <bool VNNI, int LEVELS, int N>
TRTLLM_INT8_TARGET inline __m512i dots(const __m512i* nibbles, const int8_t* a, int64_t part) {
  __m512i dot = _mm512_setzero_si512();
#pragma GCC unroll 8
  for (int j = 0; j < N; ++j) dot = dot_u8s8<VNNI>(dot, nibbles[j], _mm512_loadu_si512(a + 64 * j));
  if constexpr (LEVELS == 2) {
    dot = _mm512_slli_epi32(dot, 8);
#pragma GCC unroll 8
    for (int j = 0; j < N; ++j) dot = dot_u8s8<VNNI>(dot, nibbles[j], _mm512_loadu_si512(a + part + 64 * j));
  }
  return dot;
}

constexpr int64_t kAhead = 16;  // weight rows prefetched ahead: a row is a few hundred bytes
constexpr int kTileBatch = 8;  // MR: 8 accumulators + 8 nibble vectors + a few temporaries

// nr weight rows from row0 times MR activation rows from m0, one weight row at a time: its codes are
// split into nibbles once and used by all MR rows. (One call per chunk: a call per row costs more
// than a short row's work.)
template <bool VNNI, int LEVELS, int MR>
TRTLLM_INT8_TARGET void tile_avx512(const Job& job, int64_t row0, int nr, int64_t m0, float* out, int64_t ldy) {
  const Weights& w = job.w;
  const int64_t nb = w.blocks(), runs = nb / kRun;
  const IntRow shape = int_row(w.k, LEVELS);
  const int8_t* xq = job.xq + m0 * shape.bytes;
  const float* xd = job.xd + m0 * shape.scales;
  const float* xs = job.xs + m0 * nb;
  const __m512i low = _mm512_set1_epi8(0x0F);
  // A run's sums come out in lane order 4 (e % 4) + e / 4 (the transpose below); scales follow.
  const __m512i run_order = _mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0);
  for (int64_t row = row0; row < row0 + nr; ++row) {
  const uint8_t* codes = w.codes + row * nb * (kBlock / 2);
  const char* ahead = reinterpret_cast<const char*>(codes + kAhead * nb * (kBlock / 2));
  __m512 acc[MR];
#pragma GCC unroll 8
  for (int m = 0; m < MR; ++m) acc[m] = _mm512_setzero_ps();
  _mm_prefetch(reinterpret_cast<const char*>(w.scale + (row + kAhead) * nb), _MM_HINT_T0);
  if (w.offset) _mm_prefetch(reinterpret_cast<const char*>(w.offset + (row + kAhead) * nb), _MM_HINT_T0);
  for (int64_t b0 = 0; b0 < nb; b0 += kRun) {
    const int64_t count = std::min<int64_t>(kRun, nb - b0);
    const __mmask16 valid = static_cast<__mmask16>((1u << count) - 1);
    const __m512 s = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(valid, w.scale + row * nb + b0));
    if (w.offset) {  // the offsets' share, 16 blocks at once: lanes are summed at the end anyway
      const __m512 o = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(valid, w.offset + row * nb + b0));
#pragma GCC unroll 8
      for (int m = 0; m < MR; ++m) acc[m] = _mm512_fmadd_ps(o, _mm512_maskz_loadu_ps(valid, xs + m * nb + b0), acc[m]);
    }
#pragma GCC unroll 4
    for (int l = 0; l < 4; ++l) _mm_prefetch(ahead + b0 * 16 + l * 64, _MM_HINT_T0);
    if (count == kRun) {  // a run: 4 loads of 4 blocks, transposed by 32-bit words
      __m512i v[4], nib[8];
#pragma GCC unroll 4
      for (int i = 0; i < 4; ++i) v[i] = _mm512_loadu_si512(codes + (b0 + 4 * i) * 16);
      const __m512i t0 = _mm512_unpacklo_epi32(v[0], v[1]), t1 = _mm512_unpackhi_epi32(v[0], v[1]);
      const __m512i t2 = _mm512_unpacklo_epi32(v[2], v[3]), t3 = _mm512_unpackhi_epi32(v[2], v[3]);
      const __m512i u[4] = {_mm512_unpacklo_epi64(t0, t2), _mm512_unpackhi_epi64(t0, t2),
                            _mm512_unpacklo_epi64(t1, t3), _mm512_unpackhi_epi64(t1, t3)};
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) {
        nib[2 * j] = _mm512_and_si512(u[j], low);
        nib[2 * j + 1] = _mm512_and_si512(_mm512_srli_epi16(u[j], 4), low);
      }
      const __m512 scale = _mm512_permutexvar_ps(run_order, s);
      const int64_t at = (b0 / kRun) * 512, d_at = (b0 / kRun) * 16;
#pragma GCC unroll 8
      for (int m = 0; m < MR; ++m) {
        const __m512i dot = dots<VNNI, LEVELS, 8>(nib, xq + m * shape.bytes + at, shape.part);
        acc[m] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(dot), _mm512_loadu_ps(xd + m * shape.scales + d_at)),
                                 scale, acc[m]);
      }
      continue;
    }
    for (int64_t g = 0; g * 4 < count; ++g) {  // the rest: groups of 4 blocks, sums in 4 lanes each
      const int64_t left = count - 4 * g;
      const __mmask64 bytes = left >= 4 ? ~0ull : (1ull << (16 * left)) - 1;
      const __m512i raw = _mm512_maskz_loadu_epi8(bytes, codes + (b0 + 4 * g) * 16);
      const __m512i nib[2] = {_mm512_and_si512(raw, low), _mm512_and_si512(_mm512_srli_epi16(raw, 4), low)};
      const __m512i order = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(4 * g)),
                                             _mm512_srli_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6,
                                                                                5, 4, 3, 2, 1, 0), 2));
      const __m512 scale = _mm512_permutexvar_ps(order, s);
      const int64_t at = runs * 512 + g * 128, d_at = runs * 16 + g * 16;
#pragma GCC unroll 8
      for (int m = 0; m < MR; ++m) {
        const __m512i dot = dots<VNNI, LEVELS, 2>(nib, xq + m * shape.bytes + at, shape.part);
        acc[m] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(dot), _mm512_loadu_ps(xd + m * shape.scales + d_at)),
                                 scale, acc[m]);
      }
    }
  }
#pragma GCC unroll 8
  for (int m = 0; m < MR; ++m) out[(m0 + m) * ldy + row - row0] = _mm512_reduce_add_ps(acc[m]);
  }
}

using TileFn = void (*)(const Job&, int64_t, int, int64_t, float*, int64_t);

template <bool VNNI, int LEVELS>
constexpr TileFn kTiles[kTileBatch] = {tile_avx512<VNNI, LEVELS, 1>, tile_avx512<VNNI, LEVELS, 2>,
                                       tile_avx512<VNNI, LEVELS, 3>, tile_avx512<VNNI, LEVELS, 4>,
                                       tile_avx512<VNNI, LEVELS, 5>, tile_avx512<VNNI, LEVELS, 6>,
                                       tile_avx512<VNNI, LEVELS, 7>, tile_avx512<VNNI, LEVELS, 8>};
#endif  // TRTLLM_X86

}  // namespace

void quantize_rows(const float* x, int64_t m, int64_t k, int levels, int8_t* q, float* d) {
#ifdef TRTLLM_X86
  if (use_avx512()) return quantize_rows_avx512(x, m, k, levels, q, d);
#endif
  quantize_rows_generic(x, m, k, levels, q, d);
}

void int_tile(const Job& job, int64_t row, int nr, float* out, int64_t ldy) {
#ifdef TRTLLM_X86
  if (use_avx512()) {
    const bool vnni = use_vnni(), two = job.levels == 2;
    const TileFn* tiles = vnni ? (two ? kTiles<true, 2> : kTiles<true, 1>) : (two ? kTiles<false, 2> : kTiles<false, 1>);
    for (int64_t m = 0; m < job.m; m += kTileBatch) {
      const int mr = static_cast<int>(std::min<int64_t>(kTileBatch, job.m - m));
      tiles[mr - 1](job, row, nr, m, out, ldy);
    }
    return;
  }
#endif
  tile_generic(job, row, nr, out, ldy);
}

}  // namespace trtllm_cpu::matmul
