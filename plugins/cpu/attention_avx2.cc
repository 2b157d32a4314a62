// trtllm.cpu::Attention's AVX2 path (attention.h): attend_block_avx512 (attention.cc) in 8 lanes, for
// x86-64 CPUs without AVX-512, which ran the portable loop (one query at a time, scalar sums) before.
// The same three steps and the same guarantees: a row's result depends on its own slots only (keys
// in groups of 8 at fixed slot numbers), hidden slots weigh exactly 0, and a tree row sums its
// exponentials in the lanes a plain step would.
#include "attention.h"

#ifdef TRTLLM_X86


namespace trtllm_cpu::attention {
namespace {

#define AVX2 TRTLLM_AVX2
using trtllm_cpu::exp_avx2;
using trtllm_cpu::lanes_avx2;
using trtllm_cpu::max_avx2;
using trtllm_cpu::sum_avx2;

AVX2 inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
AVX2 inline __m256 load8(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
AVX2 inline __m256 load8(const bf16* p) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16));
}
AVX2 inline __m256 load8(const int8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}

// 8 vectors -> one vector of their 8 sums (sum k in lane k), each summed alike: pairs, quads, halves.
AVX2 inline __m256 sum8(const __m256* a) {
  const __m256 s0 = _mm256_hadd_ps(a[0], a[1]), s1 = _mm256_hadd_ps(a[2], a[3]);
  const __m256 s2 = _mm256_hadd_ps(a[4], a[5]), s3 = _mm256_hadd_ps(a[6], a[7]);
  const __m256 t0 = _mm256_hadd_ps(s0, s1), t1 = _mm256_hadd_ps(s2, s3);  // [0 1 2 3 | 0 1 2 3] per half of a
  return _mm256_add_ps(_mm256_permute2f128_ps(t0, t1, 0x20), _mm256_permute2f128_ps(t0, t1, 0x31));
}

// tanh(x) as tanh_avx512 makes it: (1 - e) / (1 + e), e = exp(-2|x|), below |x| = 1/8 the series.
AVX2 inline __m256 tanh8(__m256 x) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256 a = _mm256_andnot_ps(sign, x);
  const __m256 e = exp_avx2(_mm256_mul_ps(a, _mm256_set1_ps(-2.0f)));
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 far = _mm256_div_ps(_mm256_sub_ps(one, e), _mm256_add_ps(one, e));
  const __m256 x2 = _mm256_mul_ps(a, a);
  __m256 p = _mm256_set1_ps(62.0f / 2835);
  p = _mm256_fmadd_ps(p, x2, _mm256_set1_ps(-17.0f / 315));
  p = _mm256_fmadd_ps(p, x2, _mm256_set1_ps(2.0f / 15));
  p = _mm256_fmadd_ps(p, x2, _mm256_set1_ps(-1.0f / 3));
  const __m256 near = _mm256_fmadd_ps(_mm256_mul_ps(p, x2), a, a);
  const __m256 y = _mm256_blendv_ps(far, near, _mm256_cmp_ps(a, _mm256_set1_ps(0.125f), _CMP_LT_OQ));
  return _mm256_or_ps(y, _mm256_and_ps(x, sign));  // the sign of x back
}

// D = 8 ND. See attend_block_avx512 for what each step does and why.
template <int ND, typename T>
AVX2 void block(const float* q, int qn, const int64_t* lo, const int64_t* t, const T* key, const T* value,
                const Tree* tree, float softcap, float* scores, int64_t ld, float* const* out, float* stats) {
  constexpr int64_t d = 8 * ND, rd = d + kScaleBytes<T>;
  const int64_t tmax = *std::max_element(t, t + qn), jmin = *std::min_element(lo, lo + qn) / 8 * 8;
  // 1. scores, 8 keys at a time (those past tmax, which may not exist, left at 0); ld >= tmax + 8
  for (int64_t j0 = jmin; j0 < tmax; j0 += 8) {
    const int n8 = static_cast<int>(std::min<int64_t>(8, tmax - j0));
    for (int r = 0; r < qn; ++r) {
      if (j0 >= t[r] || j0 + 8 <= lo[r]) continue;
      __m256 acc[8];
#pragma GCC unroll 8
      for (int k = 0; k < 8; ++k) acc[k] = _mm256_setzero_ps();
      if (n8 == 8) {
#pragma GCC unroll 4
        for (int i = 0; i < ND; ++i) {
          const __m256 qv = _mm256_loadu_ps(q + r * d + 8 * i);
#pragma GCC unroll 8
          for (int k = 0; k < 8; ++k) acc[k] = _mm256_fmadd_ps(qv, load8(key + (j0 + k) * rd + 8 * i), acc[k]);
        }
      } else {
        for (int k = 0; k < n8; ++k)
          for (int i = 0; i < ND; ++i)
            acc[k] = _mm256_fmadd_ps(_mm256_loadu_ps(q + r * d + 8 * i), load8(key + (j0 + k) * rd + 8 * i), acc[k]);
      }
      __m256 sums = sum8(acc);
      if constexpr (kScaleBytes<T> > 0) {  // each key's scale
        alignas(32) float scales[8] = {};
        for (int k = 0; k < n8; ++k) scales[k] = row_scale(key + (j0 + k) * rd, d);
        sums = _mm256_mul_ps(sums, _mm256_load_ps(scales));
      }
      _mm256_storeu_ps(scores + r * ld + j0, sums);
    }
  }
  if (softcap > 0.0f) {  // c tanh(x / c), before the tree hides any
    const __m256 c = _mm256_set1_ps(softcap), inv_c = _mm256_set1_ps(1.0f / softcap);
    for (int r = 0; r < qn; ++r)
      for (int64_t j = lo[r] / 8 * 8; j < t[r]; j += 8) {
        float* at = scores + r * ld + j;
        const __m256 x = _mm256_loadu_ps(at);
        _mm256_storeu_ps(at, _mm256_blendv_ps(x, _mm256_mul_ps(c, tanh8(_mm256_mul_ps(x, inv_c))), lanes_avx2(j, lo[r], t[r])));
      }
  }
  if (tree)
    for (int r = 0; r < qn; ++r) hide(tree->row[r], tree->start, lo[r], t[r], scores + r * ld);
  // 2. softmax of each query's scores in [lo[r], t[r]) (exp in place), 1 / sum kept
  float inv[kMaxRows];
  const __m256 minus_inf = _mm256_set1_ps(-INFINITY);
  for (int r = 0; r < qn; ++r) {
    float* row = scores + r * ld;
    __m256 top = minus_inf, sum = _mm256_setzero_ps();
    for (int64_t j = lo[r] / 8 * 8; j < t[r]; j += 8)
      top = _mm256_max_ps(top, _mm256_blendv_ps(minus_inf, _mm256_loadu_ps(row + j), lanes_avx2(j, lo[r], t[r])));
    const float peak_value = max_avx2(top);
    const __m256 peak = _mm256_set1_ps(tree && peak_value == -INFINITY ? 0.0f : peak_value);
    const bool as_plain = tree && lo[r] <= tree->start && tree->start < t[r];
    const int64_t vector_end = as_plain ? tree->start : t[r];
    for (int64_t j = lo[r] / 8 * 8; j < t[r]; j += 8) {
      const __m256 valid = lanes_avx2(j, lo[r], t[r]);
      const __m256 x = _mm256_loadu_ps(row + j);
      __m256 e = _mm256_and_ps(valid, exp_avx2(_mm256_sub_ps(x, peak)));  // (lanes outside: 0, a NaN there too)
      if (tree) e = _mm256_and_ps(e, _mm256_cmp_ps(x, minus_inf, _CMP_NEQ_UQ));  // hidden: exactly 0
      if (j < vector_end) sum = _mm256_add_ps(sum, _mm256_and_ps(e, lanes_avx2(j, lo[r], vector_end)));
      _mm256_storeu_ps(row + j, _mm256_blendv_ps(x, e, valid));
    }
    if (as_plain) {  // the k-th slot seen from the tree's start in the lane of slot start + k
      alignas(32) float lane[8];
      _mm256_store_ps(lane, sum);
      int64_t k = 0;
      for (int64_t j = tree->start; j < t[r]; ++j)
        if (tree->row[r][j - tree->start]) lane[(tree->start + k++) % 8] += row[j];
      sum = _mm256_load_ps(lane);
    }
    const float total = sum_avx2(sum);
    if (stats) {
      stats[2 * r] = peak_value;
      stats[2 * r + 1] = total;
    }
    inv[r] = 1.0f / total;
  }
  // 3. the weighted sums of values, 8 slots at a time for every query (slot by slot within a row)
  for (int r = 0; r < qn; ++r)
    for (int i = 0; i < ND; ++i) _mm256_storeu_ps(out[r] + 8 * i, _mm256_setzero_ps());
  for (int64_t j0 = jmin; j0 < tmax; j0 += 8) {
    for (int r = 0; r < qn; ++r) {
      const int64_t start = std::max(j0, lo[r]), end = std::min(t[r], j0 + 8);
      if (start >= end) continue;
      const float* p = scores + r * ld;
      __m256 acc[ND];
#pragma GCC unroll 16
      for (int i = 0; i < ND; ++i) acc[i] = _mm256_loadu_ps(out[r] + 8 * i);
      for (int64_t j = start; j < end; ++j) {
        if (tree && p[j] == 0.0f) continue;  // hidden: its value not read (a NaN there stays out)
        const __m256 w = _mm256_set1_ps(p[j] * row_scale(value + j * rd, d));
#pragma GCC unroll 16
        for (int i = 0; i < ND; ++i) acc[i] = _mm256_fmadd_ps(w, load8(value + j * rd + 8 * i), acc[i]);
      }
#pragma GCC unroll 16
      for (int i = 0; i < ND; ++i) _mm256_storeu_ps(out[r] + 8 * i, acc[i]);
    }
  }
  if (stats) return;  // a part: the caller merges
  for (int r = 0; r < qn; ++r) {
    const __m256 scale = _mm256_set1_ps(inv[r]);
    for (int i = 0; i < ND; ++i) _mm256_storeu_ps(out[r] + 8 * i, _mm256_mul_ps(_mm256_loadu_ps(out[r] + 8 * i), scale));
  }
}

template <typename T>
using BlockFn = void (*)(const float*, int, const int64_t*, const int64_t*, const T*, const T*, const Tree*, float,
                         float*, int64_t, float* const*, float*);
// D = 8 ND for block_index's sizes, as on AVX-512
template <typename T>
constexpr BlockFn<T> kBlocks[10] = {block<2, T>, block<4, T>, block<6, T>, block<8, T>, block<10, T>,
                                    block<12, T>, block<14, T>, block<16, T>, block<32, T>, block<64, T>};

}  // namespace

template <typename T>
bool attend_block_avx2(int64_t d, const float* q, int qn, const int64_t* lo, const int64_t* t, const T* key,
                       const T* value, const Tree* tree, float softcap, float* scores, int64_t ld, float* const* out,
                       float* stats) {
  const int index = block_index(d);
  if (index < 0) return false;
  kBlocks<T>[index](q, qn, lo, t, key, value, tree, softcap, scores, ld, out, stats);
  return true;
}

#define TRTLLM_ATTEND_AVX2(T)                                                                                         \
  template bool attend_block_avx2<T>(int64_t, const float*, int, const int64_t*, const int64_t*, const T*, const T*, \
                                     const Tree*, float, float*, int64_t, float* const*, float*);
TRTLLM_ATTEND_AVX2(float)
TRTLLM_ATTEND_AVX2(uint16_t)
TRTLLM_ATTEND_AVX2(bf16)
TRTLLM_ATTEND_AVX2(int8_t)
#undef TRTLLM_ATTEND_AVX2

}  // namespace trtllm_cpu::attention

#endif  // TRTLLM_X86
