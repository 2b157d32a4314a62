// Shared by the trtllm.cpu kernels: ONNX Runtime's C++ API, the x86 switch, the code-path choice
// and a vector exp.
#pragma once

#define ORT_API_MANUAL_INIT
#include <onnxruntime_cxx_api.h>

#if defined(__x86_64__) || defined(__i386__)
#define TRTLLM_X86 1
#include <immintrin.h>
#endif

namespace trtllm_cpu {

// AVX-512 (F, BW, VL) kernels, unless TRTLLM_CPU_KERNEL=generic asks for the portable ones (tests).
bool use_avx512();

// Whether to copy weights onto huge pages: trtllm_cpu_set_huge_pages() if called, else not
// TRTLLM_HUGE_PAGES=0.
bool huge_pages_wanted();

// A node attribute, or `fallback` when the node does not have it.
template <typename T>
T attribute_or(const Ort::ConstKernelInfo& info, const char* name, T fallback) {
  try {
    return info.GetAttribute<T>(name);
  } catch (const Ort::Exception&) {
    return fallback;
  }
}

OrtCustomOp* matmul_block_quant_op();
OrtCustomOp* attention_op();

#ifdef TRTLLM_X86
// exp(x) as 2^n * p(r), r = x - n ln2 in [-ln2/2, ln2/2], p of degree 6 (Taylor): relative error
// below 2e-7, float32's own rounding. x is clamped to [-88, 88].
__attribute__((target("avx512f,avx512bw,avx512vl,fma"))) inline __m512 exp_avx512(__m512 x) {
  x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(88.0f)), _mm512_set1_ps(-88.0f));
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
#endif

}  // namespace trtllm_cpu
