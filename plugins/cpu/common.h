// Shared by the trtllm.cpu kernels: ONNX Runtime's C++ API, the x86 switch, the code-path choice
// and a vector exp.
#pragma once

#define ORT_API_MANUAL_INIT
#include <onnxruntime_cxx_api.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

// TRTLLM_PORTABLE_ONLY: the portable code alone, as a CPU other than x86 builds it (a compile check).
#if (defined(__x86_64__) || defined(__i386__)) && !defined(TRTLLM_PORTABLE_ONLY)
#define TRTLLM_X86 1
#include <immintrin.h>
#endif

namespace trtllm_cpu {

// AVX-512 (F, BW, VL) kernels, unless TRTLLM_CPU_KERNEL=generic asks for the portable ones (tests).
bool use_avx512();
// AVX2 with FMA and F16C (every kernel's path where AVX-512 is not), unless TRTLLM_CPU_KERNEL=generic
// asks for the portable one; TRTLLM_CPU_KERNEL=avx2 takes it on an AVX-512 CPU too (tests).
bool use_avx2();
// And AVX-512 VNNI's int8 dot products, unless TRTLLM_CPU_KERNEL=avx512 asks for AVX-512BW's (tests).
bool use_vnni();

// Whether to copy weights onto huge pages: trtllm_cpu_set_huge_pages() if called, else not
// TRTLLM_HUGE_PAGES=0.
bool huge_pages_wanted();

// Adds to what trtllm_cpu_copied_bytes() reports (Resident's copies).
void count_copied(size_t bytes);

// out[0:D] = rotate_half rotary of x's first R dimensions (cos, sin: its row's R / 2 values), the rest
// as they are (partial rotary), all times `times`: a q or k head (attention.cc, segment_attention.cc).
inline void rotary(const float* x, const float* cos, const float* sin, int64_t d, int64_t r, float times, float* out) {
  const int64_t half = r / 2;
  for (int64_t i = 0; i < half; ++i) {
    out[i] = (x[i] * cos[i] - x[i + half] * sin[i]) * times;
    out[i + half] = (x[i + half] * cos[i] + x[i] * sin[i]) * times;
  }
  for (int64_t i = r; i < d; ++i) out[i] = x[i] * times;
}

// A node attribute, or `fallback` when the node does not have it.
template <typename T>
T attribute_or(const Ort::ConstKernelInfo& info, const char* name, T fallback) {
  try {
    return info.GetAttribute<T>(name);
  } catch (const Ort::Exception&) {
    return fallback;
  }
}

// An optional input: the value, or null where the node leaves it out (empty name) or has fewer inputs
// (a graph from before it was added).
inline Ort::ConstValue optional_input(Ort::KernelContext& ctx, size_t i) {
  return ctx.GetInputCount() > i ? ctx.GetInput(i) : Ort::ConstValue{nullptr};
}

// task(data, i) for i < count on ONNX Runtime's pool. An exception there (a bad_alloc) would end the
// process (std::terminate): it is caught in the pool thread and thrown again here, for the
// kernel's own catch to turn into an error status.
inline void parallel_for(Ort::KernelContext& ctx, void (*task)(void*, size_t), size_t count, void* data) {
  struct Guard {
    void (*task)(void*, size_t);
    void* data;
    std::atomic<bool> failed{false};
    std::string error;
  } guard{task, data};
  ctx.ParallelFor(
      [](void* p, size_t i) {
        Guard& g = *static_cast<Guard*>(p);
        try {
          g.task(g.data, i);
        } catch (const std::exception& e) {
          if (!g.failed.exchange(true)) g.error = e.what();
        } catch (...) {
          if (!g.failed.exchange(true)) g.error = "unknown error";
        }
      },
      count, 0, &guard);
  if (guard.failed) throw std::runtime_error(guard.error);
}

OrtCustomOp* matmul_block_quant_op();
OrtCustomOp* matmul_half_op();       // float16 weights
OrtCustomOp* matmul_half_bf16_op();  // the same op for bfloat16 weights
OrtCustomOp* attention_op();             // a float32 KV cache
OrtCustomOp* attention_half_cache_op();  // the same op for a float16 cache
OrtCustomOp* attention_bf16_cache_op();  // and for a bfloat16 cache
OrtCustomOp* attention_int8_cache_op();  // and for an int8 cache (rows of D values and a float32 scale)
OrtCustomOp* segment_attention_op();     // a vision encoder's: within runs of rows (Qwen-VL's windows, images)
OrtCustomOp* lora_add_op();
OrtCustomOp* lora_add_swiglu_op();
OrtCustomOp* sample_op();  // trtllm::Sample (plugins/sample/reference.py)
OrtCustomOp* moe_op();       // float32 experts
OrtCustomOp* moe_half_op();  // the same op for float16 experts
OrtCustomOp* moe_bf16_op();  // and for bfloat16 ones
OrtCustomOp* moe_block_quant_op();  // MoEBlockQuant: int4 or int8 experts (MatMulBlockQuant's packing)
OrtCustomOp* mamba_scan_op();  // MambaScan: a Mamba-2 layer's convolution and selective scan (mamba.cc)

// IEEE float16 bits <-> float32, portable (the AVX-512 paths use F16C's conversions, which agree).
inline float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16, exp = (h >> 10) & 0x1F, man = h & 0x3FF;
  uint32_t bits;
  if (exp == 0x1F) {
    bits = sign | 0x7F800000 | (man << 13);  // inf, nan
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  } else if (man == 0) {
    bits = sign;
  } else {  // subnormal: normalise
    int e = -1;
    uint32_t m = man;
    do { m <<= 1; ++e; } while (!(m & 0x400));
    bits = sign | ((112 - e) << 23) | ((m & 0x3FF) << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Rounded to nearest, ties to even (as numpy's astype(float16) and _mm512_cvtps_ph).
inline uint16_t float_to_half(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000;
  x &= 0x7FFFFFFF;
  if (x >= 0x7F800000) return static_cast<uint16_t>(sign | 0x7C00 | (x > 0x7F800000 ? 0x200 : 0));  // inf, nan
  if (x >= 0x477FF000) return static_cast<uint16_t>(sign | 0x7C00);  // >= 65520 rounds past 65504
  if (x < 0x38800000) {  // below 2^-14: a multiple of 2^-24 (nearbyint rounds half to even)
    float a;
    std::memcpy(&a, &x, 4);
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(std::nearbyint(a * 16777216.0f)));
  }
  uint32_t r = x - 0x38000000;  // exponent bias 127 -> 15
  r += 0x0FFF + ((r >> 13) & 1);
  return static_cast<uint16_t>(sign | (r >> 13));
}

// bfloat16 (float32's upper half: a bfloat16 engine's weights and KV cache). A type of its own so
// that a template over the cache's element tells it from float16's bits.
struct bf16 {
  uint16_t bits;
};

inline float bf16_to_float(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;  // exact: the low half is zero
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Rounded to nearest, ties to even (as torch's .bfloat16() and ml_dtypes); NaN stays NaN.
inline uint16_t float_to_bf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7FFFFFFF) > 0x7F800000) return static_cast<uint16_t>((x >> 16) | 0x40);  // quiet NaN
  x += 0x7FFF + ((x >> 16) & 1);
  return static_cast<uint16_t>(x >> 16);
}

#ifdef TRTLLM_X86
// 16 bfloat16 values as float32: each shifted into a float's upper half (exact).
__attribute__((target("avx512f,avx512bw,avx512vl,fma"))) inline __m512 widen_bf16(__m256i h) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// exp(x) as 2^n * p(r), r = x - n ln2 in [-ln2/2, ln2/2], p of degree 6 (Taylor): relative error
// below 2e-7, float32's own rounding. x is clamped to [-88, 88]; a NaN stays NaN (min and max give
// their second operand where one is NaN, so x goes second: exp(NaN) is e^88 the other way round).
__attribute__((target("avx512f,avx512bw,avx512vl,fma"))) inline __m512 exp_avx512(__m512 x) {
  x = _mm512_max_ps(_mm512_set1_ps(-88.0f), _mm512_min_ps(_mm512_set1_ps(88.0f), x));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)), _MM_FROUND_TO_NEAREST_INT);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145752f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.42860677e-6f), r);
  __m512 p = _mm512_set1_ps(1.0f / 720);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

// The AVX2 paths (8 lanes, with FMA and F16C): every x86-64 CPU of the last ten years has them,
// AVX-512 ones included, and CPUs without AVX-512 (AMD Zen 1-3, Intel's client cores) run them.
#define TRTLLM_AVX2 __attribute__((target("avx2,fma,f16c")))

// exp(x) as 2^n p(r), r = x - n ln2, p of degree 6 (as exp_avx512): relative error below 2e-7. x is
// clamped to [-87, 88] (2^n stays a normal number: its exponent bits are built directly); a NaN
// stays NaN (min and max give their second operand where one is NaN).
TRTLLM_AVX2 inline __m256 exp_avx2(__m256 x) {
  x = _mm256_max_ps(_mm256_set1_ps(-87.0f), _mm256_min_ps(_mm256_set1_ps(88.0f), x));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145752f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.42860677e-6f), r);
  __m256 p = _mm256_set1_ps(1.0f / 720);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

// Lanes j .. j + 7 that lie in [lo, hi), as a mask of all-ones floats.
TRTLLM_AVX2 inline __m256 lanes_avx2(int64_t j, int64_t lo, int64_t hi) {
  const __m256i k = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(j - lo)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  const __m256i in = _mm256_and_si256(_mm256_cmpgt_epi32(k, _mm256_set1_epi32(-1)),
                                      _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(hi - lo)), k));
  return _mm256_castsi256_ps(in);
}

// count (<= 8; none when <= 0) float16 values at h as float32, zeros past them. Where 8 values from
// h stay within the buffer (`end`: its end) they are loaded and the rest masked; only a buffer's
// last values go one at a time, in registers (a vector loaded from a copy made in 2-byte stores
// waits for the stores).
TRTLLM_AVX2 inline __m256 halves_avx2(const uint16_t* h, int64_t count, const uint16_t* end) {
  if (count <= 0) return _mm256_setzero_ps();
  if (count >= 8 || h + 8 <= end) {
    const __m256 v = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h)));
    return count >= 8 ? v : _mm256_and_ps(v, lanes_avx2(0, 0, count));
  }
  float f[8];
  for (int i = 0; i < 8; ++i) f[i] = i < count ? _cvtsh_ss(h[i]) : 0.0f;
  return _mm256_setr_ps(f[0], f[1], f[2], f[3], f[4], f[5], f[6], f[7]);
}

// The largest of a vector's 8 lanes.
TRTLLM_AVX2 inline float max_avx2(__m256 x) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}

// The sum of a vector's 8 lanes, in a fixed order.
TRTLLM_AVX2 inline float sum_avx2(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
#endif

}  // namespace trtllm_cpu
