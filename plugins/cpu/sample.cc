// trtllm.cpu::Sample: trtllm::Sample (plugins/sample/reference.py, the numbers' one source) as one
// pass per row in C++, for ONNX Runtime engines on our kernels. The ONNX body spends about 2 ms per
// sampled row of a 49,152-token vocabulary on a sort of the top M = 1024 logits and vocabulary-wide
// cumulative sums; here the sort is a heap of the L values the thresholds can reach (top_k when set,
// else M), and only the tokens a threshold keeps are summed.
//
// Token ids follow the reference's float32 operations in its order (d = (y - max) / t, exp, the
// sequential cumulative sums, y >= threshold), so a row gives the reference's token for the same
// uniform unless the uniform or a min-p / top-p cut sits within float rounding of a boundary: libm's
// exp and log and numpy's differ in the last bit on some inputs, and the top-p denominator is
// summed in double (numpy sums pairwise in float32), as the ONNX body's kernels differ from numpy
// too. Why L values suffice: with top_k > 0 the survivors are the first k' <= top_k sorted values,
// and counts past them cannot change min(k', n').
#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "common.h"

namespace {

constexpr const char* kName = "Sample";
constexpr int64_t kMaxLogprobs = 50;  // schema.MAX_NUM_LOGPROBS: K = min(50, M) columns
constexpr float kInf = std::numeric_limits<float>::infinity();

OrtStatusPtr fail(const std::string& message) {
  return Ort::GetApi().CreateStatus(ORT_INVALID_ARGUMENT, (std::string("trtllm.cpu::") + kName + ": " + message).c_str());
}

struct Job {
  const float *logits, *logit_bias, *penalty_bias;
  const bool* seen;
  const float *repetition_penalty, *temperature, *min_p;
  const int64_t* top_k;
  const float *top_p, *uniform;
  int64_t vocab, max_top_k, columns;
  int64_t repeat;  // logits rows per parameter row (EAGLE verification: every position of a row's draft)
  int64_t* token_ids;
  float* top_logprobs;       // null: not asked for (verification's node has the token output alone)
  int64_t* top_logprob_ids;
};

// The vocabulary-wide passes, in AVX-512 where the CPU has it (each vector loop leaves its last
// n % 16 elements to the portable loop). Only exact IEEE operations (add, multiply, divide,
// compare), so both paths give the same numbers; but sum_exp and exp_weights, whose exp is a
// polynomial on AVX-512 (without top_k, exp_weights' weights decide the draw: a uniform within
// float rounding of a boundary may draw the neighbour on one path, as between libm and numpy).

// sum(exp(x - xmax)) for the log-softmax (logprobs only: a tolerance of 1e-5, no token depends on it).
double sum_exp_portable(const float* x, int64_t n, float xmax) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += std::exp(x[i] - xmax);
  return s;
}

// w[i] = exp(d_i), d_i = (y[i] - ymax) / t, over n values; returns the sum of the w whose d >= cut
// (in double) and their count. The sampler's draw without top_k reads every token's weight.
double exp_weights_portable(const float* y, int64_t n, float ymax, float t, float cut, float* w, int64_t& count) {
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float d = (y[i] - ymax) / t;
    w[i] = std::exp(d);
    if (d >= cut) sum += w[i], ++count;
  }
  return sum;
}

// out = a + b; returns max(out), `nan` when some out is NaN.
float add_max_portable(const float* a, const float* b, float* out, int64_t n, bool& nan) {
  float m = -kInf;
  nan = false;
  for (int64_t i = 0; i < n; ++i) {
    out[i] = a[i] + b[i];
    nan |= out[i] != out[i];
    m = std::max(m, out[i]);
  }
  return m;
}

// y = where(seen, where(x > 0, x / r, x * r), x) + pbias; returns max(y).
float penalize_portable(const float* x, const bool* seen, const float* pbias, float r, float* y, int64_t n) {
  float m = -kInf;
  for (int64_t i = 0; i < n; ++i) {
    const float v = seen[i] ? (x[i] > 0 ? x[i] / r : x[i] * r) : x[i];
    y[i] = v + pbias[i];
    m = std::max(m, y[i]);
  }
  return m;
}

// The first i >= from with x[i] > thr (kStrict) or x[i] >= thr; n when none.
template <bool kStrict>
int64_t scan_portable(const float* x, int64_t from, int64_t n, float thr) {
  for (int64_t i = from; i < n; ++i)
    if (kStrict ? x[i] > thr : x[i] >= thr) return i;
  return n;
}

#ifdef TRTLLM_X86
#define TRTLLM_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,fma")))

TRTLLM_AVX512 double sum_exp_avx512(const float* x, int64_t n, float xmax) {
  __m512d acc = _mm512_setzero_pd();  // in double: float lanes over 3,000 terms each lose 1e-5
  const __m512 m = _mm512_set1_ps(xmax);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 e = trtllm_cpu::exp_avx512(_mm512_sub_ps(_mm512_loadu_ps(x + i), m));
    acc = _mm512_add_pd(acc, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
    acc = _mm512_add_pd(acc, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1))));
  }
  return _mm512_reduce_add_pd(acc) + sum_exp_portable(x + i, n - i, xmax);
}

// exp_weights with the polynomial exp (within 2e-7 of libm's, as libm's and numpy's differ in the
// last bit anyway: a uniform within that of a boundary can draw the neighbour). Lanes below -87
// (the far tail, tokens banned at -inf) take libm's exp, whose denormals and zero the polynomial's
// clamp would not give: a banned token keeps weight 0 and is never drawn. The sum is in double, in
// another order than the portable loop's: the same float total but within double rounding.
TRTLLM_AVX512 double exp_weights_avx512(const float* y, int64_t n, float ymax, float t, float cut, float* w,
                                        int64_t& count) {
  const __m512 m = _mm512_set1_ps(ymax), tv = _mm512_set1_ps(t), cv = _mm512_set1_ps(cut),
               floor = _mm512_set1_ps(-87.0f);
  __m512d lo = _mm512_setzero_pd(), hi = _mm512_setzero_pd();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 d = _mm512_div_ps(_mm512_sub_ps(_mm512_loadu_ps(y + i), m), tv);
    __m512 e = trtllm_cpu::exp_avx512(d);
    const __mmask16 tail = _mm512_cmp_ps_mask(d, floor, _CMP_LT_OQ);  // (NaN: not a tail, as the max is finite)
    if (tail) {
      alignas(64) float ds[16], es[16];
      _mm512_store_ps(ds, d);
      _mm512_store_ps(es, e);
      for (int j = 0; j < 16; ++j)
        if (tail >> j & 1) es[j] = std::exp(ds[j]);
      e = _mm512_load_ps(es);
    }
    _mm512_storeu_ps(w + i, e);
    const __mmask16 kept = _mm512_cmp_ps_mask(d, cv, _CMP_GE_OQ);
    count += __builtin_popcount(kept);
    const __m512 k = _mm512_maskz_mov_ps(kept, e);
    lo = _mm512_add_pd(lo, _mm512_cvtps_pd(_mm512_castps512_ps256(k)));
    hi = _mm512_add_pd(hi, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(k), 1))));
  }
  return _mm512_reduce_add_pd(_mm512_add_pd(lo, hi)) + exp_weights_portable(y + i, n - i, ymax, t, cut, w + i, count);
}

TRTLLM_AVX512 float add_max_avx512(const float* a, const float* b, float* out, int64_t n, bool& nan) {
  __m512 mx = _mm512_set1_ps(-kInf);
  __mmask16 unordered = 0;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 x = _mm512_add_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i));
    _mm512_storeu_ps(out + i, x);
    unordered |= _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    mx = _mm512_max_ps(mx, x);
  }
  bool tail_nan = false;
  const float m = std::max(_mm512_reduce_max_ps(mx), add_max_portable(a + i, b + i, out + i, n - i, tail_nan));
  nan = unordered != 0 || tail_nan;
  return m;
}

TRTLLM_AVX512 float penalize_avx512(const float* x, const bool* seen, const float* pbias, float r, float* y, int64_t n) {
  __m512 mx = _mm512_set1_ps(-kInf);
  const __m512 rv = _mm512_set1_ps(r), zero = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512 v = _mm512_loadu_ps(x + i);
    const __mmask16 on = _mm_test_epi8_mask(_mm_loadu_si128(reinterpret_cast<const __m128i*>(seen + i)),
                                            _mm_set1_epi8(static_cast<char>(0xFF)));
    if (on) {
      const __mmask16 positive = _mm512_cmp_ps_mask(v, zero, _CMP_GT_OQ);
      v = _mm512_mask_blend_ps(on, v, _mm512_mask_blend_ps(positive, _mm512_mul_ps(v, rv), _mm512_div_ps(v, rv)));
    }
    v = _mm512_add_ps(v, _mm512_loadu_ps(pbias + i));
    _mm512_storeu_ps(y + i, v);
    mx = _mm512_max_ps(mx, v);
  }
  return std::max(_mm512_reduce_max_ps(mx), penalize_portable(x + i, seen + i, pbias + i, r, y + i, n - i));
}

template <bool kStrict>
TRTLLM_AVX512 int64_t scan_avx512(const float* x, int64_t from, int64_t n, float thr) {
  const __m512 t = _mm512_set1_ps(thr);
  int64_t i = from;
  for (; i + 16 <= n; i += 16) {
    const __mmask16 hit = _mm512_cmp_ps_mask(_mm512_loadu_ps(x + i), t, kStrict ? _CMP_GT_OQ : _CMP_GE_OQ);
    if (hit) return i + __builtin_ctz(hit);
  }
  return scan_portable<kStrict>(x, i, n, thr);
}
#endif

#ifdef TRTLLM_X86
// The same five on AVX2 (x86-64 without AVX-512), 8 lanes: the same numbers but for the exp
// polynomial's last bit and the double sums' order, as above.

TRTLLM_AVX2 inline __m256d sum8_pd(__m256d acc, __m256 e) {
  acc = _mm256_add_pd(acc, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
  return _mm256_add_pd(acc, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
}

TRTLLM_AVX2 inline double sum_pd(__m256d v) {
  alignas(32) double d[4];
  _mm256_store_pd(d, v);
  return (d[0] + d[1]) + (d[2] + d[3]);
}

TRTLLM_AVX2 double sum_exp_avx2(const float* x, int64_t n, float xmax) {
  __m256d acc = _mm256_setzero_pd();
  const __m256 m = _mm256_set1_ps(xmax);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) acc = sum8_pd(acc, trtllm_cpu::exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(x + i), m)));
  return sum_pd(acc) + sum_exp_portable(x + i, n - i, xmax);
}

TRTLLM_AVX2 double exp_weights_avx2(const float* y, int64_t n, float ymax, float t, float cut, float* w,
                                           int64_t& count) {
  const __m256 m = _mm256_set1_ps(ymax), tv = _mm256_set1_ps(t), cv = _mm256_set1_ps(cut), floor = _mm256_set1_ps(-87.0f);
  __m256d acc = _mm256_setzero_pd();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 d = _mm256_div_ps(_mm256_sub_ps(_mm256_loadu_ps(y + i), m), tv);
    __m256 e = trtllm_cpu::exp_avx2(d);
    const int tail = _mm256_movemask_ps(_mm256_cmp_ps(d, floor, _CMP_LT_OQ));  // libm's exp there, as above
    if (tail) {
      alignas(32) float ds[8], es[8];
      _mm256_store_ps(ds, d);
      _mm256_store_ps(es, e);
      for (int j = 0; j < 8; ++j)
        if (tail >> j & 1) es[j] = std::exp(ds[j]);
      e = _mm256_load_ps(es);
    }
    _mm256_storeu_ps(w + i, e);
    const __m256 kept = _mm256_cmp_ps(d, cv, _CMP_GE_OQ);
    count += __builtin_popcount(_mm256_movemask_ps(kept));
    acc = sum8_pd(acc, _mm256_and_ps(kept, e));
  }
  return sum_pd(acc) + exp_weights_portable(y + i, n - i, ymax, t, cut, w + i, count);
}

TRTLLM_AVX2 float add_max_avx2(const float* a, const float* b, float* out, int64_t n, bool& nan) {
  __m256 mx = _mm256_set1_ps(-kInf), unordered = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_add_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i));
    _mm256_storeu_ps(out + i, x);
    unordered = _mm256_or_ps(unordered, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
    mx = _mm256_max_ps(mx, x);
  }
  bool tail_nan = false;
  const float m = std::max(trtllm_cpu::max_avx2(mx), add_max_portable(a + i, b + i, out + i, n - i, tail_nan));
  nan = _mm256_movemask_ps(unordered) != 0 || tail_nan;
  return m;
}

TRTLLM_AVX2 float penalize_avx2(const float* x, const bool* seen, const float* pbias, float r, float* y, int64_t n) {
  __m256 mx = _mm256_set1_ps(-kInf);
  const __m256 rv = _mm256_set1_ps(r), zero = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 v = _mm256_loadu_ps(x + i);
    const __m128i flags = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(seen + i));
    if (!_mm_testz_si128(flags, flags)) {  // seen tokens: x / r where positive, x r otherwise
      const __m256 on = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_cvtepu8_epi32(flags), _mm256_setzero_si256()));
      const __m256 positive = _mm256_cmp_ps(v, zero, _CMP_GT_OQ);
      v = _mm256_blendv_ps(v, _mm256_blendv_ps(_mm256_mul_ps(v, rv), _mm256_div_ps(v, rv), positive), on);
    }
    v = _mm256_add_ps(v, _mm256_loadu_ps(pbias + i));
    _mm256_storeu_ps(y + i, v);
    mx = _mm256_max_ps(mx, v);
  }
  return std::max(trtllm_cpu::max_avx2(mx), penalize_portable(x + i, seen + i, pbias + i, r, y + i, n - i));
}

template <bool kStrict>
TRTLLM_AVX2 int64_t scan_avx2(const float* x, int64_t from, int64_t n, float thr) {
  const __m256 t = _mm256_set1_ps(thr);
  int64_t i = from;
  for (; i + 8 <= n; i += 8) {
    const int hit = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), t, kStrict ? _CMP_GT_OQ : _CMP_GE_OQ));
    if (hit) return i + __builtin_ctz(hit);
  }
  return scan_portable<kStrict>(x, i, n, thr);
}
#endif

double sum_exp(const float* x, int64_t n, float xmax) {
#ifdef TRTLLM_X86
  if (trtllm_cpu::use_avx512()) return sum_exp_avx512(x, n, xmax);
  if (trtllm_cpu::use_avx2()) return sum_exp_avx2(x, n, xmax);
#endif
  return sum_exp_portable(x, n, xmax);
}

double exp_weights(const float* y, int64_t n, float ymax, float t, float cut, float* w, int64_t& count) {
#ifdef TRTLLM_X86
  if (trtllm_cpu::use_avx512()) return exp_weights_avx512(y, n, ymax, t, cut, w, count);
  if (trtllm_cpu::use_avx2()) return exp_weights_avx2(y, n, ymax, t, cut, w, count);
#endif
  return exp_weights_portable(y, n, ymax, t, cut, w, count);
}

float add_max(const float* a, const float* b, float* out, int64_t n, bool& nan) {
#ifdef TRTLLM_X86
  if (trtllm_cpu::use_avx512()) return add_max_avx512(a, b, out, n, nan);
  if (trtllm_cpu::use_avx2()) return add_max_avx2(a, b, out, n, nan);
#endif
  return add_max_portable(a, b, out, n, nan);
}

float penalize(const float* x, const bool* seen, const float* pbias, float r, float* y, int64_t n) {
#ifdef TRTLLM_X86
  if (trtllm_cpu::use_avx512()) return penalize_avx512(x, seen, pbias, r, y, n);
  if (trtllm_cpu::use_avx2()) return penalize_avx2(x, seen, pbias, r, y, n);
#endif
  return penalize_portable(x, seen, pbias, r, y, n);
}

template <bool kStrict>
int64_t scan(const float* x, int64_t from, int64_t n, float thr) {
#ifdef TRTLLM_X86
  if (trtllm_cpu::use_avx512()) return scan_avx512<kStrict>(x, from, n, thr);
  if (trtllm_cpu::use_avx2()) return scan_avx2<kStrict>(x, from, n, thr);
#endif
  return scan_portable<kStrict>(x, from, n, thr);
}

// The K largest of x as (value, id), descending, ties lower id first (ONNX TopK's order).
void top_ids(const float* x, int64_t n, int64_t k, std::vector<std::pair<float, int64_t>>& heap) {
  // "a before b" in the output order; the heap keeps its last element (the worst) on top
  auto better = [](const std::pair<float, int64_t>& a, const std::pair<float, int64_t>& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  heap.clear();
  int64_t i = 0;
  for (; i < n && static_cast<int64_t>(heap.size()) < k; ++i) {
    heap.emplace_back(x[i], i);
    std::push_heap(heap.begin(), heap.end(), better);
  }
  // then only values above the worst kept one (an equal value has a higher id: never better)
  for (i = scan<true>(x, i, n, heap.front().first); i < n; i = scan<true>(x, i + 1, n, heap.front().first)) {
    std::pop_heap(heap.begin(), heap.end(), better);
    heap.back() = {x[i], i};
    std::push_heap(heap.begin(), heap.end(), better);
  }
  std::sort_heap(heap.begin(), heap.end(), better);
}

// The L largest values of y, descending (the reference's sy, cut to L).
void top_values(const float* y, int64_t n, int64_t l, std::vector<float>& heap) {
  heap.clear();
  int64_t i = 0;
  for (; i < n && static_cast<int64_t>(heap.size()) < l; ++i) {
    heap.push_back(y[i]);
    std::push_heap(heap.begin(), heap.end(), std::greater<float>());
  }
  for (i = scan<true>(y, i, n, heap.front()); i < n; i = scan<true>(y, i + 1, n, heap.front())) {
    std::pop_heap(heap.begin(), heap.end(), std::greater<float>());
    heap.back() = y[i];
    std::push_heap(heap.begin(), heap.end(), std::greater<float>());
  }
  std::sort_heap(heap.begin(), heap.end(), std::greater<float>());
}

// Steps 6-9 with top_k > 0: the survivors are the first k' <= top_k sorted values, so a heap of the
// top_k largest holds every value the thresholds read (counts past it cannot change min(k', n')).
float threshold_top_k(const std::vector<float>& y, float ymax, float t, int64_t top_k, float log_min_p, float top_p,
                      std::vector<float>& sy) {
  top_values(y.data(), static_cast<int64_t>(y.size()), top_k, sy);
  std::vector<float> e(top_k);
  int64_t m = 0;
  for (int64_t j = 0; j < top_k; ++j) {
    const float sd = (sy[j] - ymax) / t;
    e[j] = std::exp(sd);
    m += sd >= log_min_p;
  }
  // >= 1 for any min_p in [0, 1] (sd[0] = 0); 1 also for one out of range (the top token, as top_p 0 gives)
  const int64_t k_eff = std::max<int64_t>(1, std::min(top_k, m));
  double denom = 0;
  for (int64_t j = 0; j < k_eff; ++j) denom += e[j];
  const float total = static_cast<float>(denom);
  int64_t n = top_k;  // top_p 1: min(k', M) = k'
  if (top_p < 1.0f) {
    float incl = 0;  // excl_j = incl before j; n = max(count(excl < top_p), 1)
    for (n = 0; n < top_k && incl < top_p; ++n) incl += (n < k_eff ? e[n] : 0.0f) / total;
    n = std::max<int64_t>(n, 1);
  }
  return sy[std::min(k_eff, n) - 1];
}

// Steps 6-9 with top_k == 0 and min_p or top_p on; w[i] = exp(d_i) over the vocabulary (kept for the
// draw). The min-p survivors are the values with d >= log(min_p), an upper set of y: k' = min(M, their
// count), and top-p's mass over them is the sum of their w. The sorted values are the largest L (a
// heap, as with top_k), L doubling from 64 until the threshold's index is inside: a nucleus is
// usually far smaller than M.
float threshold_dense(const std::vector<float>& y, float ymax, float t, int64_t m_cap, float log_min_p, float top_p,
                      std::vector<float>& w, std::vector<float>& sy) {
  const int64_t v = static_cast<int64_t>(y.size());
  int64_t count = 0;
  w.resize(v);
  const double denom = exp_weights(y.data(), v, ymax, t, log_min_p, w.data(), count);  // (-inf when min_p is 0: every token)
  const int64_t k_eff = std::max<int64_t>(1, std::min(m_cap, count));
  const float total = static_cast<float>(denom);
  if (!(top_p < 1.0f)) {  // the k'-th largest
    top_values(y.data(), v, k_eff, sy);
    return sy[k_eff - 1];
  }
  for (int64_t l = std::min<int64_t>(64, k_eff);; l = std::min(2 * l, k_eff)) {
    top_values(y.data(), v, l, sy);
    float incl = 0;  // excl_j = incl before j; n = max(count(excl < top_p), 1)
    int64_t n = 0;
    for (; n < l && incl < top_p; ++n) incl += std::exp((sy[n] - ymax) / t) / total;  // the reference's e_j / D
    if (n < l || l == k_eff) return sy[std::max<int64_t>(n, 1) - 1];  // (n = l = k': the k'-th)
  }
}

// Steps 5-10 for logits row n (parameter row b) with temperature t > 0: the drawn token.
int64_t draw(const Job& job, int64_t b, int64_t n_row, const std::vector<float>& y, float ymax, std::vector<float>& w,
             std::vector<float>& sy) {
  const int64_t v = job.vocab, m_cap = job.max_top_k, top_k = job.top_k[b];
  const float t = job.temperature[b], min_p = job.min_p[b], top_p = job.top_p[b];
  const float log_min_p = min_p > 0 ? std::log(min_p) : -kInf;
  bool w_filled = false;  // w[i] = exp(d_i) over the vocabulary, computed for the sum and kept for the draw
  float thr = -kInf;      // with nothing restricted every token is kept
  if (top_k > 0) {
    thr = threshold_top_k(y, ymax, t, top_k, log_min_p, top_p, sy);
  } else if (min_p > 0 || top_p < 1.0f) {
    thr = threshold_dense(y, ymax, t, m_cap, log_min_p, top_p, w, sy);
    w_filled = true;
  } else {
    w.resize(v);
    int64_t count = 0;
    exp_weights(y.data(), v, ymax, t, -kInf, w.data(), count);
    w_filled = true;
  }
  // The draw: the cumulative sum in vocabulary order over kept tokens (a token not kept adds 0),
  // in double as the reference sums (a float sum near 3 takes nothing from a weight below 1.2e-7:
  // with nothing restricted, most of a large vocabulary could never be drawn). Kept tokens are
  // found by scanning (few under top_k or top-p); with nothing restricted every token is kept:
  // plain loops.
  const float* yp = y.data();
  if (w_filled && thr == -kInf) {
    // Every token kept: one sequential pass (the additions the reference's cumsum makes, in its
    // order) keeps each running sum, and the drawn token is the first whose sum passes the target.
    thread_local std::vector<double> sums;
    sums.resize(v);
    double c = 0;
    for (int64_t i = 0; i < v; ++i) sums[i] = c += w[i];
    const double target = static_cast<double>(job.uniform[n_row]) * c;
    int64_t i = 0;
    while (i < v - 1 && !(sums[i] > target || sums[i] >= c)) ++i;
    return i;
  }
  auto next = [&](int64_t i) { return scan<false>(yp, i, v, thr); };
  double c = 0, total = 0;
  for (int64_t i = next(0); i < v; i = next(i + 1)) total += w_filled ? w[i] : std::exp((y[i] - ymax) / t);
  const double target = static_cast<double>(job.uniform[n_row]) * total;
  int64_t last = 0;
  for (int64_t i = next(0); i < v; i = next(i + 1)) {
    c += w_filled ? w[i] : std::exp((y[i] - ymax) / t);
    if (c > target || c >= total) return i;
    last = i;
  }
  return last;  // not reached: the last kept token has c == total
}

// Step 2: log_softmax(x)'s K largest, descending (ties lower id first).
void log_softmax_top(const std::vector<float>& x, float xmax, int64_t k, float* out_lp, int64_t* out_ids) {
  const int64_t v = static_cast<int64_t>(x.size());
  const float lse = std::log(static_cast<float>(sum_exp(x.data(), v, xmax)));
  std::vector<std::pair<float, int64_t>> best;
  top_ids(x.data(), v, k, best);
  for (auto& [value, id] : best) value = (value - xmax) - lse;
  // the reference sorts the rounded logprobs (stably: equal ones lower id first)
  std::sort(best.begin(), best.end(),
            [](const auto& a, const auto& c) { return a.first > c.first || (a.first == c.first && a.second < c.second); });
  for (int64_t j = 0; j < k; ++j) out_lp[j] = best[j].first, out_ids[j] = best[j].second;
}

void sample_row(void* data, size_t task) {
  const Job& job = *static_cast<const Job*>(data);
  const int64_t n = static_cast<int64_t>(task), b = n / job.repeat, v = job.vocab, k = job.columns;
  const float *logits = job.logits + n * v, *bias = job.logit_bias + b * v, *pbias = job.penalty_bias + b * v;
  const bool* seen = job.seen + b * v;
  const bool logprobs = job.top_logprobs != nullptr;
  float* out_lp = logprobs ? job.top_logprobs + n * k : nullptr;
  int64_t* out_ids = logprobs ? job.top_logprob_ids + n * k : nullptr;
  thread_local std::vector<float> x, y, w, sy;  // (per thread: a vocabulary's worth each, every row)
  x.resize(v);
  y.resize(v);
  bool nan = false;
  const float xmax = add_max(logits, bias, x.data(), v, nan);
  // Overflowed logits, or every token banned: NaN logprobs and token -1 (outside the vocabulary, so a
  // verified position without logprobs fails too), which fail this row alone.
  if (nan || !std::isfinite(xmax)) {
    job.token_ids[n] = -1;
    for (int64_t j = 0; j < k && logprobs; ++j) out_lp[j] = std::numeric_limits<float>::quiet_NaN(), out_ids[j] = j;
    return;
  }
  if (logprobs) log_softmax_top(x, xmax, k, out_lp, out_ids);
  // steps 3-4: penalties, greedy
  const float r = job.repetition_penalty[b];
  const float ymax = penalize(x.data(), seen, pbias, r, y.data(), v);
  if (!(ymax > -kInf)) {
    job.token_ids[n] = -1;
    for (int64_t j = 0; j < k && logprobs; ++j) out_lp[j] = std::numeric_limits<float>::quiet_NaN();
    return;
  }
  const int64_t greedy = std::min(scan<false>(y.data(), 0, v, ymax), v - 1);  // the first maximum (0 if all -inf)
  const bool sampled = job.temperature[b] > 0 && std::isfinite(ymax);
  job.token_ids[n] = sampled ? draw(job, b, n, y, ymax, w, sy) : greedy;
}

struct Kernel {
  int64_t max_top_k;

  OrtStatusPtr ComputeV2(OrtKernelContext* raw) {
    try {
      Ort::KernelContext ctx(raw);
      const auto shape = ctx.GetInput(0).GetTensorTypeAndShapeInfo().GetShape();
      if (shape.size() != 2) return fail("logits must be [N, V]");
      const int64_t rows = shape[0], vocab = shape[1];
      // B parameter rows (logit_bias's); N = B x R logits rows, R per parameter row (a plain step:
      // R = 1; EAGLE verification: R drafted positions of each row), and a uniform per logits row.
      const auto bias_shape = ctx.GetInput(1).GetTensorTypeAndShapeInfo().GetShape();
      if (bias_shape.size() != 2) return fail("logit_bias (input 1) must be [B, V]");
      const int64_t params = bias_shape[0];
      if (max_top_k > vocab) return fail("max_top_k must be <= the vocabulary size " + std::to_string(vocab));
      if (params > 0 ? rows % params : rows)
        return fail("logits' rows (" + std::to_string(rows) + ") must be a multiple of the parameter rows (" +
                    std::to_string(params) + ")");
      for (size_t i = 1; i < 10; ++i) {
        const auto s = ctx.GetInput(i).GetTensorTypeAndShapeInfo().GetShape();
        const bool dense = i <= 3;
        const int64_t want = i == 9 ? rows : params;
        if (s.size() != (dense ? 2u : 1u) || s[0] != want || (dense && s[1] != vocab))
          return fail("input " + std::to_string(i) + (i == 9 ? " must be [N] (N logits rows)" : " must be [B") +
                      (i == 9 ? "" : dense ? ", V] (B of logit_bias, V of logits)" : "] (B of logit_bias)"));
      }
      const int64_t columns = std::min(kMaxLogprobs, max_top_k);
      const int64_t* top_k = ctx.GetInput(7).GetTensorData<int64_t>();
      for (int64_t b = 0; b < params; ++b)  // (sizes the heaps; other values out of range stay in bounds)
        if (top_k[b] < 0 || top_k[b] > max_top_k)
          return fail("top_k must be in [0, max_top_k=" + std::to_string(max_top_k) + "], got " +
                      std::to_string(top_k[b]) + " in row " + std::to_string(b));
      const bool logprobs = ctx.GetOutputCount() == 3;
      Job job{ctx.GetInput(0).GetTensorData<float>(), ctx.GetInput(1).GetTensorData<float>(),
              ctx.GetInput(2).GetTensorData<float>(), ctx.GetInput(3).GetTensorData<bool>(),
              ctx.GetInput(4).GetTensorData<float>(), ctx.GetInput(5).GetTensorData<float>(),
              ctx.GetInput(6).GetTensorData<float>(), top_k,
              ctx.GetInput(8).GetTensorData<float>(), ctx.GetInput(9).GetTensorData<float>(),
              vocab, max_top_k, columns, params > 0 ? rows / params : 1,
              ctx.GetOutput(0, {rows}).GetTensorMutableData<int64_t>(),
              logprobs ? ctx.GetOutput(1, {rows, columns}).GetTensorMutableData<float>() : nullptr,
              logprobs ? ctx.GetOutput(2, {rows, columns}).GetTensorMutableData<int64_t>() : nullptr};
      if (rows > 1)
        trtllm_cpu::parallel_for(ctx, sample_row, static_cast<size_t>(rows), &job);
      else if (rows == 1)
        sample_row(&job, 0);
      return nullptr;
    } catch (const std::exception& e) {
      return fail(e.what());
    }
  }
};

struct Op : Ort::CustomOpBase<Op, Kernel, true> {
  OrtStatusPtr CreateKernelV2(const OrtApi&, const OrtKernelInfo* info, void** kernel) const {
    try {
      Ort::ConstKernelInfo ki(info);
      const int64_t max_top_k = ki.GetAttribute<int64_t>("max_top_k");
      if (max_top_k < 1 || max_top_k >= 3840) return fail("max_top_k must be in [1, 3840)");
      *kernel = new Kernel{max_top_k};
      return nullptr;
    } catch (const std::exception& e) {
      return fail(e.what());
    }
  }
  const char* GetName() const { return kName; }
  const char* GetExecutionProviderType() const { return "CPUExecutionProvider"; }
  size_t GetInputTypeCount() const { return 10; }
  ONNXTensorElementDataType GetInputType(size_t i) const {
    return i == 3 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL
           : i == 7 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64
                    : ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
  }
  size_t GetOutputTypeCount() const { return 3; }
  OrtCustomOpInputOutputCharacteristic GetOutputCharacteristic(size_t i) const {
    return i == 0 ? INPUT_OUTPUT_REQUIRED : INPUT_OUTPUT_OPTIONAL;  // logprobs: not for verification
  }
  ONNXTensorElementDataType GetOutputType(size_t i) const {
    return i == 1 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT : ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64;
  }
};

}  // namespace

// One row drawn on the host, as the op draws it (the same code, so the same token for the same
// inputs and uniform): speculative decoding walks a verified position whose biases or penalties
// changed within the step (runtime/sampling.host_draw). -1: the row's logits overflowed.
extern "C" __attribute__((visibility("default"))) int64_t trtllm_cpu_sample_row(
    const float* logits, const float* logit_bias, const float* penalty_bias, const bool* seen, float repetition_penalty,
    float temperature, float min_p, int64_t top_k, float top_p, float uniform, int64_t vocab, int64_t max_top_k) {
  int64_t token = -1;
  if (vocab < 1 || top_k < 0 || top_k > max_top_k || max_top_k < 1 || max_top_k > vocab) return -2;
  Job job{logits, logit_bias, penalty_bias, seen, &repetition_penalty, &temperature, &min_p, &top_k, &top_p, &uniform,
          vocab, max_top_k, 0, 1, &token, nullptr, nullptr};
  sample_row(&job, 0);
  return token;
}

namespace trtllm_cpu {
OrtCustomOp* sample_op() {
  static Op op;
  return &op;
}
}  // namespace trtllm_cpu
