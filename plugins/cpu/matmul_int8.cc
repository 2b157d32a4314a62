// Integer activations (MatMulBlockQuant's activations="int8" or "int16"; calls of up to 16 rows,
// longer ones (prompts) stay float32).
//
// Why: with float32 activations each weight costs every activation row two FMAs, and from batch 2
// on the projections are bound by those FMAs, not by the weight stream (this CPU runs about one
// 512-bit operation per cycle). Quantizing each row's activations per block of 32 turns a block's
// dot product into integer multiply-adds of 64 byte pairs per instruction (VNNI):
//   int8:  a = round(x / d), d = max|x_b| / 127: llama.cpp's and MatMulNBits' numerics. Each x moves
//          by up to d / 2, and top-1 agreement with transformers drops (measured in docs/performance.md).
//   int16: the rest too, in a second int8 digit: x ~ d (a + a2 / 256), a2 = round((x - d a) 256 / d)
//          clamped to 127: each x moves by at most d / 256 (d / 512 but where the rest is near d / 2),
//          about 3e-5 of the block's largest value, for twice the dot products.
//
// The math, per activation row and weight row, with q the codes, s and o the block's scale and
// offset:  y = sum_b s_b d_b (q_b . a_b) + o_b sum(x_b)   (int16: d_b / 256 and 256 a + a2)
// The offsets' share uses the exact float sums of x (the job's `xs`), so a weight offset costs no
// precision. The integer dot products are exact; only their float sums are rounded.
//
// VNNI multiplies unsigned by signed bytes. 4-bit codes are the unsigned side. With 8-bit codes
// (signed) the activations are: stored as a + 128, with 128 sum(q) (from a dot product of the codes
// with ones, once per weight row) taken off again. AVX-512 without VNNI multiplies pairs to 16 bits
// (maddubs): 4-bit codes as they are, 8-bit codes as |q| times a with q's sign, a stored signed.
//
// Activation layout (quantize_rows), per row: runs of 16 blocks, then the rest in units of 4 blocks
// (4-bit) or 2 (8-bit). A run is 8 vectors of 64 bytes laid out so that 4 loads of codes, after a
// 4 x 4 transpose of 32-bit words, meet them lane by lane, and each vector of sums holds one block
// per 32-bit lane (4-bit: 16 blocks, one lane each; 8-bit: 8 blocks, two lanes each): a block then
// costs one float multiply-add per 16 lanes instead of per 4. A unit is the natural order: 4 blocks'
// first 16 values then their last 16 (4-bit: a 64-byte load's low and high nibbles), or 2 blocks'
// 32 values (8-bit). int16 rows hold the a digit, then the a2 digit in the same layout. `d` holds
// each block's d in every lane of its sums.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "matmul.h"

namespace trtllm_cpu::matmul {

IntRow int_row(int64_t k, int bits, int levels) {
  const int64_t nb = k / kBlock, runs = nb / kRun;
  const int64_t units = (nb - runs * kRun + unit_blocks(bits) - 1) / unit_blocks(bits);
  const int64_t part = runs * kRunBytes + units * unit_bytes(bits);
  return {levels * part, runs * run_scales(bits) + units * kUnitScales, part};
}

namespace {

// 8-bit codes on VNNI: activations stored as a + 128 (the unsigned operand).
bool shifted(int bits) { return bits == 8 && use_vnni(); }

// Where value i (0..31) of block b goes in one digit of a row; the lanes of `d` that hold its d.
struct Layout {
  int64_t nb, runs;
  int bits;

  int64_t slot(int64_t b, int i) const {
    const int64_t bb = b % kRun;
    if (b >= runs * kRun) {
      const int64_t t = b - runs * kRun, per = unit_blocks(bits);
      const int64_t at = runs * kRunBytes + (t / per) * unit_bytes(bits);
      if (bits == 4) return at + (i / 16) * 64 + (t % 4) * 16 + i % 16;
      return at + (t % 2) * 32 + i;
    }
    if (bits == 4)  // vector 2j + (i >= 16) meets code bytes 4j..4j+3; block 4 (e % 4) + e / 4 in lane e
      return (b / kRun) * kRunBytes + (2 * ((i % 16) / 4) + i / 16) * 64 + (4 * (bb % 4) + bb / 4) * 4 + i % 4;
    // 8-bit: half h = bb / 8, vector 4h + j meets 32-bit words j and 4 + j; lane e = 4L + i' holds
    // block 8h + 2i' + L / 2, word 4 (L % 2) + j
    const int64_t hb = bb % 8, word = i / 4, lane = 4 * (2 * (hb % 2) + word / 4) + hb / 2;
    return (b / kRun) * kRunBytes + ((bb / 8) * 4 + word % 4) * 64 + lane * 4 + i % 4;
  }

  // d's lanes for block b: `count` of them from `first`, `step` apart.
  void lanes(int64_t b, int64_t& first, int& count, int& step) const {
    const int64_t bb = b % kRun, per_run = run_scales(bits);
    if (b >= runs * kRun) {
      const int64_t t = b - runs * kRun, per_unit = unit_blocks(bits), lanes = kUnitScales / per_unit;
      first = runs * per_run + (t / per_unit) * kUnitScales + (t % per_unit) * lanes;
      count = static_cast<int>(lanes), step = 1;
    } else if (bits == 4) {
      first = (b / kRun) * per_run + 4 * (bb % 4) + bb / 4, count = 1, step = 1;
    } else {
      const int64_t hb = bb % 8;
      first = (b / kRun) * per_run + (bb / 8) * 16 + 8 * (hb % 2) + hb / 2, count = 2, step = 4;
    }
  }
};

// One block's digits (a, and a2 for int16) and d as they are stored.
void place(const int8_t* a, const int8_t* a2, float d, const Layout& lay, int64_t b, const IntRow& shape, int8_t* q,
           float* ds) {
  const uint32_t bias = shifted(lay.bits) ? 0x80808080u : 0;  // a + 128 as unsigned bytes
  for (int i = 0; i < kBlock; i += 4) {  // every layout keeps 4 consecutive values together
    const int64_t at = lay.slot(b, i);
    uint32_t word;
    std::memcpy(&word, a + i, 4);
    word ^= bias;
    std::memcpy(q + at, &word, 4);
    if (a2) {
      std::memcpy(&word, a2 + i, 4);
      word ^= bias;
      std::memcpy(q + shape.part + at, &word, 4);
    }
  }
  int64_t first;
  int count, step;
  lay.lanes(b, first, count, step);
  for (int l = 0; l < count; ++l) ds[first + l * step] = d;
}

// A block's scales from its largest |x|: inv = 127 / amax to quantize, d = amax / 127 to multiply.
// A block with a NaN gets d = NaN (its outputs are NaN, as float32's would be); a block below 1e-30
// counts as zeros, so that 256 * inv stays finite for the second digit (such values add nothing).
inline void block_scales(float amax, bool nan, float& inv, float& d) {
  constexpr float kTiny = 1e-30f;
  inv = !nan && amax > kTiny ? 127.0f / amax : 0.0f;
  d = nan ? std::nanf("") : amax > kTiny ? amax / 127.0f : 0.0f;
}

// Rows of padding count as a = 0: stored 128 where shifted.
void clear(int8_t* q, float* ds, int64_t m, const IntRow& shape, int bits) {
  std::fill(q, q + m * shape.bytes, static_cast<int8_t>(shifted(bits) ? 0x80 : 0));
  std::fill(ds, ds + m * shape.scales, 0.0f);
}

// One block of 32 values: its digits a (and a2 for levels 2) and its d (d / 256 for levels 2).
float digits_generic(const float* v, int levels, int8_t* a, int8_t* a2) {
  float amax = 0.0f, inv, d;
  bool nan = false;
  for (int i = 0; i < kBlock; ++i) amax = std::max(amax, std::fabs(v[i])), nan |= std::isnan(v[i]);
  block_scales(amax, nan, inv, d);
  // A NaN digit (a NaN or infinite x, where d is NaN or infinite anyway) is 0, as the AVX-512 path has it.
  auto digit = [](float f) { return static_cast<int8_t>(std::isnan(f) ? 0.0f : std::min(127.0f, std::max(-127.0f, f))); };
  for (int i = 0; i < kBlock; ++i) {
    const float whole = std::nearbyint(v[i] * inv);
    a[i] = digit(whole);
    if (levels == 2) a2[i] = digit(std::nearbyint(std::fma(-whole, d, v[i]) * (256.0f * inv)));  // fma: as fnmadd
  }
  return levels == 2 ? d / 256.0f : d;
}

// nr weight rows from `row` times every activation row: out[m * ldy + r].
void tile_generic(const Job& job, int64_t row, int nr, float* out, int64_t ldy) {
  const Weights& w = job.w;
  const int bits = static_cast<int>(w.bits);
  const Layout lay{w.blocks(), w.blocks() / kRun, bits};
  const IntRow shape = int_row(w.k, bits, job.levels);
  const int bias = shifted(bits) ? 128 : 0;
  for (int r = 0; r < nr; ++r)
    for (int64_t m = 0; m < job.m; ++m) {
      const int8_t* a = job.xq + m * shape.bytes;
      float acc = 0.0f;
      for (int64_t b = 0; b < lay.nb; ++b) {
        int32_t dot[2] = {0, 0};
        for (int digit = 0; digit < job.levels; ++digit)
          for (int i = 0; i < kBlock; ++i) {
            const int stored = bias ? static_cast<uint8_t>(a[digit * shape.part + lay.slot(b, i)])
                                    : a[digit * shape.part + lay.slot(b, i)];
            int q;
            if (bits == 4) {
              const uint8_t byte = w.codes[((row + r) * lay.nb + b) * 16 + i % 16];
              q = i < 16 ? byte & 0x0F : byte >> 4;
            } else {
              q = reinterpret_cast<const int8_t*>(w.codes)[((row + r) * lay.nb + b) * kBlock + i];
            }
            dot[digit] += q * (stored - bias);
          }
        int64_t first;
        int count, step;
        lay.lanes(b, first, count, step);
        const int64_t at = (row + r) * lay.nb + b;
        const float d = job.xd[m * shape.scales + first];
        acc += half_to_float(w.scale[at]) * (d * static_cast<float>(job.levels == 2 ? dot[0] * 256 + dot[1] : dot[0]));
        if (w.offset) acc += half_to_float(w.offset[at]) * job.xs[m * lay.nb + b];
      }
      out[m * ldy + r] = acc;
    }
}

#ifdef TRTLLM_X86
#define TRTLLM_INT8_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,fma")))

__attribute__((target("avx512f,avx512bw,avx512vl,fma"))) float digits_avx512(const float* v, int levels, int8_t* a,
                                                                           int8_t* a2) {
  const __m512i top = _mm512_set1_epi32(127), bottom = _mm512_set1_epi32(-127);
  const __m512 x0 = _mm512_loadu_ps(v), x1 = _mm512_loadu_ps(v + 16);
  const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(x0), _mm512_abs_ps(x1)));
  const bool nan = (_mm512_cmp_ps_mask(x0, x0, _CMP_UNORD_Q) | _mm512_cmp_ps_mask(x1, x1, _CMP_UNORD_Q)) != 0;
  float inv, d;
  block_scales(amax, nan, inv, d);
  int half = 0;
  for (const __m512 xv : {x0, x1}) {  // cvtps_epi32 rounds to nearest even, as nearbyint does
    const __m512i whole = _mm512_cvtps_epi32(_mm512_mul_ps(xv, _mm512_set1_ps(inv)));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(a + 16 * half), _mm512_cvtepi32_epi8(whole));
    if (levels == 2) {
      __m512 rest = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(whole), _mm512_set1_ps(d), xv);
      rest = _mm512_mask_mov_ps(rest, _mm512_cmp_ps_mask(rest, rest, _CMP_UNORD_Q), _mm512_setzero_ps());
      __m512i part = _mm512_cvtps_epi32(_mm512_mul_ps(rest, _mm512_set1_ps(256.0f * inv)));
      part = _mm512_min_epi32(_mm512_max_epi32(part, bottom), top);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(a2 + 16 * half), _mm512_cvtepi32_epi8(part));
    }
    ++half;
  }
  return levels == 2 ? d / 256.0f : d;
}

// f with its NaN lanes 0.
TRTLLM_AVX2 inline __m256 ordered_avx2(__m256 f) { return _mm256_andnot_ps(_mm256_cmp_ps(f, f, _CMP_UNORD_Q), f); }

// 32 int32 values (|v| <= 127) as bytes in order: the packs interleave 128-bit lanes, a permute undoes it.
TRTLLM_AVX2 inline void store_digits_avx2(const __m256i* q, int8_t* out) {
  const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out),
                      _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
}

// digits_avx512 in 8 lanes. NaN products go in as 0 (the digit a NaN gets everywhere) before the
// conversion, whose NaN value the saturating packs would make -128.
TRTLLM_AVX2 float digits_avx2(const float* v, int levels, int8_t* a, int8_t* a2) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 x[4], top = _mm256_setzero_ps(), unordered = _mm256_setzero_ps();
  for (int j = 0; j < 4; ++j) {
    x[j] = _mm256_loadu_ps(v + 8 * j);
    top = _mm256_max_ps(top, _mm256_andnot_ps(sign, x[j]));
    unordered = _mm256_or_ps(unordered, _mm256_cmp_ps(x[j], x[j], _CMP_UNORD_Q));
  }
  float inv, d;
  block_scales(trtllm_cpu::max_avx2(top), _mm256_movemask_ps(unordered) != 0, inv, d);
  __m256i whole[4], part[4];
  for (int j = 0; j < 4; ++j) whole[j] = _mm256_cvtps_epi32(ordered_avx2(_mm256_mul_ps(x[j], _mm256_set1_ps(inv))));
  store_digits_avx2(whole, a);
  if (levels == 2) {
    for (int j = 0; j < 4; ++j) {
      const __m256 rest = ordered_avx2(_mm256_fnmadd_ps(_mm256_cvtepi32_ps(whole[j]), _mm256_set1_ps(d), x[j]));
      part[j] = _mm256_cvtps_epi32(_mm256_mul_ps(rest, _mm256_set1_ps(256.0f * inv)));
      part[j] = _mm256_min_epi32(_mm256_max_epi32(part[j], _mm256_set1_epi32(-127)), _mm256_set1_epi32(127));
    }
    store_digits_avx2(part, a2);
  }
  return levels == 2 ? d / 256.0f : d;
}

// acc + sums of four byte products per 32-bit lane, codes times activations. 4-bit: codes unsigned,
// activations signed (without VNNI, pairs to 16 bits cannot saturate: 2 * 15 * 127 < 32767). 8-bit:
// with VNNI activations unsigned (a + 128) and codes signed; without, |q| times a with q's sign.
template <bool VNNI, int BITS>
TRTLLM_INT8_TARGET inline __m512i dot(__m512i acc, __m512i codes, __m512i a) {
  if constexpr (VNNI) return BITS == 4 ? _mm512_dpbusd_epi32(acc, codes, a) : _mm512_dpbusd_epi32(acc, a, codes);
  __m512i u = codes, s = a;
  if constexpr (BITS == 8) {
    u = _mm512_abs_epi8(codes);
    s = _mm512_mask_sub_epi8(a, _mm512_movepi8_mask(codes), _mm512_setzero_si512(), a);
  }
  return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(u, s), _mm512_set1_epi16(1)));
}

// One activation row's sums over `n` code vectors (and, int16, the second digit: 256 a + a2),
// less 128 sum(q) (`bias`, made by biases() below) where the activations are shifted.
template <bool VNNI, int BITS, int LEVELS, int N>
TRTLLM_INT8_TARGET inline __m512i dots(const __m512i* codes, const int8_t* a, int64_t part, __m512i bias) {
  __m512i sum = _mm512_setzero_si512();
#pragma GCC unroll 8
  for (int j = 0; j < N; ++j) sum = dot<VNNI, BITS>(sum, codes[j], _mm512_loadu_si512(a + 64 * j));
  if constexpr (LEVELS == 2) {
    sum = _mm512_slli_epi32(sum, 8);
#pragma GCC unroll 8
    for (int j = 0; j < N; ++j) sum = dot<VNNI, BITS>(sum, codes[j], _mm512_loadu_si512(a + part + 64 * j));
  }
  if constexpr (VNNI && BITS == 8) sum = _mm512_sub_epi32(sum, bias);
  return sum;
}

// What shifted activations add to `dots`: 128 sum(q) per lane, times 257 for two digits.
template <bool VNNI, int BITS, int LEVELS, int N>
TRTLLM_INT8_TARGET inline __m512i biases(const __m512i* codes) {
  if constexpr (!(VNNI && BITS == 8)) return _mm512_setzero_si512();
  __m512i sum = _mm512_setzero_si512();
#pragma GCC unroll 8
  for (int j = 0; j < N; ++j) sum = _mm512_dpbusd_epi32(sum, _mm512_set1_epi8(1), codes[j]);
  const __m512i once = _mm512_slli_epi32(sum, 7);
  return LEVELS == 2 ? _mm512_add_epi32(_mm512_slli_epi32(sum, 15), once) : once;
}

// v[0..3] -> u[j]: 32-bit word j of each 128-bit lane L of v[i], at lane 4L + i.
TRTLLM_INT8_TARGET inline void transpose(const __m512i* v, __m512i* u) {
  const __m512i t0 = _mm512_unpacklo_epi32(v[0], v[1]), t1 = _mm512_unpackhi_epi32(v[0], v[1]);
  const __m512i t2 = _mm512_unpacklo_epi32(v[2], v[3]), t3 = _mm512_unpackhi_epi32(v[2], v[3]);
  u[0] = _mm512_unpacklo_epi64(t0, t2), u[1] = _mm512_unpackhi_epi64(t0, t2);
  u[2] = _mm512_unpacklo_epi64(t1, t3), u[3] = _mm512_unpackhi_epi64(t1, t3);
}

TRTLLM_INT8_TARGET inline __m512i lane_ids() { return _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0); }

constexpr int64_t kAhead = 16;  // weight rows prefetched ahead: a row is a few hundred bytes
constexpr int kTileBatch = 8;   // MR: 8 accumulators + 8 code vectors + a few temporaries

// nr weight rows from row0 times MR activation rows from m0, one weight row at a time: its codes are
// loaded (and split into nibbles) once and used by all MR rows. One call per chunk of rows: a call
// per row costs more than a short row's work.
// (Compiled with VNNI enabled for both VNNI = true and false: only the intrinsics emit VNNI
// instructions, and the false instances have none, checked with objdump; there are no loops here
// for the compiler to vectorize into dot products.)
template <bool VNNI, int BITS, int LEVELS, int MR>
TRTLLM_INT8_TARGET void tile_avx512(const Job& job, int64_t row0, int nr, int64_t m0, float* out, int64_t ldy) {
  const Weights& w = job.w;
  const int64_t nb = w.blocks(), runs = nb / kRun, row_bytes = nb * kBlock * BITS / 8;
  const IntRow shape = int_row(w.k, BITS, LEVELS);
  const int8_t* xq = job.xq + m0 * shape.bytes;
  const float* xd = job.xd + m0 * shape.scales;
  const float* xs = job.xs + m0 * nb;
  const __m512i low = _mm512_set1_epi8(0x0F), ids = lane_ids();
  for (int64_t row = row0; row < row0 + nr; ++row) {
    const uint8_t* codes = w.codes + row * row_bytes;
    const char* ahead = reinterpret_cast<const char*>(codes + kAhead * row_bytes);
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
        for (int m = 0; m < MR; ++m)
          acc[m] = _mm512_fmadd_ps(o, _mm512_maskz_loadu_ps(valid, xs + m * nb + b0), acc[m]);
      }
#pragma GCC unroll 8
      for (int l = 0; l < BITS; ++l) _mm_prefetch(ahead + b0 * kBlock * BITS / 8 + l * 64, _MM_HINT_T0);  // 16 blocks
      if (count == kRun) {
        const int64_t at = (b0 / kRun) * kRunBytes, d_at = (b0 / kRun) * run_scales(BITS);
        if constexpr (BITS == 4) {  // 4 loads of 4 blocks; their nibbles, one vector per 16 blocks of sums
          __m512i v[4], u[4], nib[8];
#pragma GCC unroll 4
          for (int i = 0; i < 4; ++i) v[i] = _mm512_loadu_si512(codes + (b0 + 4 * i) * 16);
          transpose(v, u);
#pragma GCC unroll 4
          for (int j = 0; j < 4; ++j) {
            nib[2 * j] = _mm512_and_si512(u[j], low);
            nib[2 * j + 1] = _mm512_and_si512(_mm512_srli_epi16(u[j], 4), low);
          }
          // lane e holds block 4 (e % 4) + e / 4
          const __m512i order = _mm512_or_si512(_mm512_slli_epi32(_mm512_and_si512(ids, _mm512_set1_epi32(3)), 2),
                                                _mm512_srli_epi32(ids, 2));
          const __m512 scale = _mm512_permutexvar_ps(order, s);
#pragma GCC unroll 8
          for (int m = 0; m < MR; ++m) {
            const __m512i sum = dots<VNNI, 4, LEVELS, 8>(nib, xq + m * shape.bytes + at, shape.part, _mm512_setzero_si512());
            acc[m] = _mm512_fmadd_ps(
                _mm512_mul_ps(_mm512_cvtepi32_ps(sum), _mm512_loadu_ps(xd + m * shape.scales + d_at)), scale, acc[m]);
          }
        } else {  // per half of 8 blocks, 4 loads of 2 blocks; a vector of sums per half
#pragma GCC unroll 2
          for (int h = 0; h < 2; ++h) {
            __m512i v[4], u[4];
#pragma GCC unroll 4
            for (int i = 0; i < 4; ++i) v[i] = _mm512_loadu_si512(codes + (b0 + 8 * h + 2 * i) * kBlock);
            transpose(v, u);
            const __m512i bias = biases<VNNI, 8, LEVELS, 4>(u);
            // lane e holds block 8h + 2 (e % 4) + e / 8
            const __m512i order = _mm512_add_epi32(
                _mm512_set1_epi32(8 * h), _mm512_or_si512(_mm512_slli_epi32(_mm512_and_si512(ids, _mm512_set1_epi32(3)), 1),
                                                          _mm512_srli_epi32(ids, 3)));
            const __m512 scale = _mm512_permutexvar_ps(order, s);
#pragma GCC unroll 8
            for (int m = 0; m < MR; ++m) {
              const __m512i sum = dots<VNNI, 8, LEVELS, 4>(u, xq + m * shape.bytes + at + h * 256, shape.part, bias);
              acc[m] = _mm512_fmadd_ps(
                  _mm512_mul_ps(_mm512_cvtepi32_ps(sum), _mm512_loadu_ps(xd + m * shape.scales + d_at + h * 16)), scale,
                  acc[m]);
            }
          }
        }
        continue;
      }
      // The rest, in units of 4 blocks (4-bit: sums in 4 lanes per block) or 2 (8-bit: 8 lanes).
      constexpr int64_t kUnit = unit_blocks(BITS);
      for (int64_t g = 0; g * kUnit < count; ++g) {
        const int64_t left = count - kUnit * g;
        const __mmask64 bytes = left >= kUnit ? ~0ull : (1ull << (32 * BITS / 8 * left)) - 1;
        const __m512i raw = _mm512_maskz_loadu_epi8(bytes, codes + (b0 + kUnit * g) * kBlock * BITS / 8);
        __m512i vec[2] = {raw, raw};
        if constexpr (BITS == 4) vec[0] = _mm512_and_si512(raw, low), vec[1] = _mm512_and_si512(_mm512_srli_epi16(raw, 4), low);
        const __m512i order = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(kUnit * g)),
                                               _mm512_srli_epi32(ids, BITS == 4 ? 2 : 3));
        const __m512 scale = _mm512_permutexvar_ps(order, s);
        const __m512i bias = biases<VNNI, BITS, LEVELS, 1>(vec);
        const int64_t at = runs * kRunBytes + g * unit_bytes(BITS), d_at = runs * run_scales(BITS) + g * kUnitScales;
#pragma GCC unroll 8
        for (int m = 0; m < MR; ++m) {
          const __m512i sum = dots<VNNI, BITS, LEVELS, BITS == 4 ? 2 : 1>(vec, xq + m * shape.bytes + at, shape.part, bias);
          acc[m] = _mm512_fmadd_ps(
              _mm512_mul_ps(_mm512_cvtepi32_ps(sum), _mm512_loadu_ps(xd + m * shape.scales + d_at)), scale, acc[m]);
        }
      }
    }
#pragma GCC unroll 8
    for (int m = 0; m < MR; ++m) out[(m0 + m) * ldy + row - row0] = _mm512_reduce_add_ps(acc[m]);
  }
}

using TileFn = void (*)(const Job&, int64_t, int, int64_t, float*, int64_t);

template <bool VNNI, int BITS, int LEVELS>
constexpr TileFn kTiles[kTileBatch] = {
    tile_avx512<VNNI, BITS, LEVELS, 1>, tile_avx512<VNNI, BITS, LEVELS, 2>, tile_avx512<VNNI, BITS, LEVELS, 3>,
    tile_avx512<VNNI, BITS, LEVELS, 4>, tile_avx512<VNNI, BITS, LEVELS, 5>, tile_avx512<VNNI, BITS, LEVELS, 6>,
    tile_avx512<VNNI, BITS, LEVELS, 7>, tile_avx512<VNNI, BITS, LEVELS, 8>};

template <bool VNNI>
const TileFn* tiles_for(int bits, int levels) {
  if (bits == 4) return levels == 2 ? kTiles<VNNI, 4, 2> : kTiles<VNNI, 4, 1>;
  return levels == 2 ? kTiles<VNNI, 8, 2> : kTiles<VNNI, 8, 1>;
}
#endif  // TRTLLM_X86

}  // namespace

void quantize_rows(const float* x, int64_t m, int64_t k, int bits, int levels, int8_t* q, float* ds) {
  float (*digits)(const float*, int, int8_t*, int8_t*) = digits_generic;
#ifdef TRTLLM_X86
  if (use_avx512()) digits = digits_avx512;
  else if (use_avx2()) digits = digits_avx2;
#endif
  const Layout lay{k / kBlock, k / kBlock / kRun, bits};
  const IntRow shape = int_row(k, bits, levels);
  clear(q, ds, m, shape, bits);
  int8_t a[kBlock], a2[kBlock];
  for (int64_t r = 0; r < m; ++r)
    for (int64_t b = 0; b < lay.nb; ++b) {
      const float d = digits(x + r * k + b * kBlock, levels, a, a2);
      place(a, levels == 2 ? a2 : nullptr, d, lay, b, shape, q + r * shape.bytes, ds + r * shape.scales);
    }
}

void int_tile(const Job& job, int64_t row, int nr, float* out, int64_t ldy) {
#ifdef TRTLLM_X86
  if (!use_avx512() && use_avx2()) return avx2::int_tile(job, row, nr, out, ldy);
  if (use_avx512()) {
    const int bits = static_cast<int>(job.w.bits);
    const TileFn* tiles = use_vnni() ? tiles_for<true>(bits, job.levels) : tiles_for<false>(bits, job.levels);
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
