// The library's entry points: RegisterCustomOps (SessionOptions.register_custom_ops_library) and the
// code-path choice the kernels share.
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>

#include "common.h"

namespace trtllm_cpu {

bool use_avx512() {
  static const bool yes = [] {
    const char* force = std::getenv("TRTLLM_CPU_KERNEL");
    if (force && (std::string(force) == "generic" || std::string(force) == "avx2")) return false;
#ifdef TRTLLM_X86
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl");
#else
    return false;
#endif
  }();
  return yes;
}

bool use_avx2() {
  static const bool yes = [] {
    const char* force = std::getenv("TRTLLM_CPU_KERNEL");
    if (force && std::string(force) == "generic") return false;
#ifdef TRTLLM_X86
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
#else
    return false;
#endif
  }();
  return yes;
}

bool use_vnni() {
  static const bool yes = [] {
    const char* force = std::getenv("TRTLLM_CPU_KERNEL");
    if (!use_avx512() || (force && std::string(force) == "avx512")) return false;
#ifdef TRTLLM_X86
    return __builtin_cpu_supports("avx512vnni") != 0;
#else
    return false;
#endif
  }();
  return yes;
}

std::atomic<int> huge_pages_setting{-1};  // -1: the environment decides

std::atomic<uint64_t> copied{0};

void count_copied(size_t bytes) { copied.fetch_add(bytes); }

bool huge_pages_wanted() {
  const int set = huge_pages_setting.load();
  if (set >= 0) return set != 0;
  const char* env = std::getenv("TRTLLM_HUGE_PAGES");
  return !(env && std::string(env) == "0");
}

}  // namespace trtllm_cpu

extern "C" {

// trtllm-run --no-huge-pages: the runtime's switch, for weights the kernels copy from here on.
__attribute__((visibility("default"))) void trtllm_cpu_set_huge_pages(int on) {
  trtllm_cpu::huge_pages_setting.store(on ? 1 : 0);
}

// Whether SegmentAttention takes its AVX2 path here (the runtime then runs vision.ort.onnx: elsewhere
// the portable path is slower than ONNX Runtime's own Attention, and vision.onnx runs).
__attribute__((visibility("default"))) int trtllm_cpu_avx2() { return trtllm_cpu::use_avx2() ? 1 : 0; }

// The bytes of weights copied onto huge pages so far (a test's way to see which ones were).
__attribute__((visibility("default"))) uint64_t trtllm_cpu_copied_bytes() { return trtllm_cpu::copied.load(); }

__attribute__((visibility("default"))) OrtStatus* ORT_API_CALL RegisterCustomOps(OrtSessionOptions* options,
                                                                                const OrtApiBase* api) {
  const OrtApi* ort_api = api->GetApi(ORT_API_VERSION);
  if (!ort_api) {  // an ONNX Runtime older than the headers: no way to return a status without its API
    std::fprintf(stderr, "trtllm.cpu: ONNX Runtime %s lacks C API version %d\n", api->GetVersionString(), ORT_API_VERSION);
    return nullptr;
  }
  Ort::InitApi(ort_api);
  static std::once_flag once;
  static Ort::CustomOpDomain* domain = nullptr;
  try {
    std::call_once(once, [] {
      domain = new Ort::CustomOpDomain("trtllm.cpu");  // lives as long as the process: sessions keep pointers
      domain->Add(trtllm_cpu::matmul_block_quant_op());
      domain->Add(trtllm_cpu::matmul_half_op());
      domain->Add(trtllm_cpu::matmul_half_bf16_op());
      domain->Add(trtllm_cpu::attention_op());
      domain->Add(trtllm_cpu::attention_half_cache_op());
      domain->Add(trtllm_cpu::attention_bf16_cache_op());
      domain->Add(trtllm_cpu::attention_int8_cache_op());
      domain->Add(trtllm_cpu::segment_attention_op());
      domain->Add(trtllm_cpu::lora_add_op());
      domain->Add(trtllm_cpu::lora_add_swiglu_op());
      domain->Add(trtllm_cpu::sample_op());
      domain->Add(trtllm_cpu::moe_op());
      domain->Add(trtllm_cpu::moe_half_op());
      domain->Add(trtllm_cpu::moe_bf16_op());
      domain->Add(trtllm_cpu::moe_block_quant_op());
      domain->Add(trtllm_cpu::mamba_scan_op());
    });
    Ort::UnownedSessionOptions(options).Add(*domain);
  } catch (const std::exception& e) {
    return Ort::GetApi().CreateStatus(ORT_FAIL, e.what());
  }
  return nullptr;
}

// Which code path this CPU takes (for reports): 4 = AVX-512 with VNNI, 3 = AVX-512, 2 = AVX2, 1 = portable.
__attribute__((visibility("default"))) int trtllm_cpu_kernel_path() {
  return trtllm_cpu::use_vnni() ? 4 : trtllm_cpu::use_avx512() ? 3 : trtllm_cpu::use_avx2() ? 2 : 1;
}
}
