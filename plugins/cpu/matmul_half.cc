// trtllm.cpu::MatMulHalf: y = x @ W.T for float16 or bfloat16 W, MatMulBlockQuant's kernels
// (matmul.cc) on a float16 or bfloat16 engine's projections.
//
// Why: ONNX Runtime's float16 MatMul on x86 converts to float32 inside every call; a float16 decode
// step ran at 37 tok/s on it and 80 on this op, which converts each weight in registers as it
// streams them (half the bytes of float32) and keeps the activations in float32.
//
// Inputs:  x [..., K] float32 (K a multiple of 32); w [N, K] float16 or bfloat16 (row-major: a
//          tied lm_head shares the embedding table). Registered once per weight type under one name.
//          bfloat16 is widened exactly (a shift), float16 by F16C.
// Output:  y [..., N] float32, or [..., N/2] with activation "swiglu" (rows in MatMulBlockQuant's
//          swiglu order)
// Attributes: n (N), activation. Products accumulate in float32; only the weights are half precision.
#include <algorithm>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "matmul.h"
#include "resident.h"

namespace {

using namespace trtllm_cpu::matmul;

constexpr char kHalfName[] = "MatMulHalf";

struct HalfKernel {
  int64_t n;
  bool swiglu, brain;  // brain: w is bfloat16
  std::mutex lock;  // guards the copy
  trtllm_cpu::Resident copy;

  OrtStatusPtr ComputeV2(OrtKernelContext* raw) {
    try {
      Ort::KernelContext ctx(raw);
      auto x = ctx.GetInput(0), w = ctx.GetInput(1);
      const Rows rows = rows_of(x.GetTensorTypeAndShapeInfo().GetShape(), n, swiglu);
      if (!rows.error.empty()) return fail(rows.error, kHalfName);
      const int64_t m = rows.m, k = rows.k;
      const auto ws = w.GetTensorTypeAndShapeInfo().GetShape();
      if (ws.size() != 2 || ws[0] != n || ws[1] != k)
        return fail("w must be [n, K] = [" + std::to_string(n) + ", " + std::to_string(k) + "]", kHalfName);
      auto y = ctx.GetOutput(0, rows.y_shape);
      if (m == 0) return nullptr;
      const void* at;
      {
        std::lock_guard<std::mutex> hold(lock);
        at = copy.get(w.GetTensorRawData(), static_cast<size_t>(n * k) * 2);
      }
      Job job{{static_cast<const uint8_t*>(at), nullptr, nullptr, n, k, 16}, x.GetTensorData<float>(), nullptr,
              nullptr, y.GetTensorMutableData<float>(), m, swiglu};
      job.w.brain = brain;
      const int flag = generated_flag(ctx, 2);  // one path per row role, as in MatMulBlockQuant
      job.prompt = flag == 0;
      job.generated = flag == 1;
      run(ctx, job);  // a task's exception reaches the catch below
      return nullptr;
    } catch (const std::exception& e) {
      return fail(e.what(), kHalfName);
    }
  }
};

template <ONNXTensorElementDataType W>
struct HalfOp : Ort::CustomOpBase<HalfOp<W>, HalfKernel, true> {
  OrtStatusPtr CreateKernelV2(const OrtApi&, const OrtKernelInfo* info, void** kernel) const {
    try {
      Ort::ConstKernelInfo ki(info);
      const int64_t n = ki.GetAttribute<int64_t>("n");
      if (n < 1) return fail("n must be positive", kHalfName);
      const std::string activation = trtllm_cpu::attribute_or<std::string>(ki, "activation", "none");
      if (const std::string bad = check_activation(activation, n); !bad.empty()) return fail(bad, kHalfName);
      const bool constant = trtllm_cpu::constant_input(ki, 1);
      auto* made = new HalfKernel{n, activation == "swiglu", W == ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16, {}, {}};
      made->copy.constant = constant;
      *kernel = made;
      return nullptr;
    } catch (const std::exception& e) {
      return fail(e.what(), kHalfName);
    }
  }
  const char* GetName() const { return kHalfName; }
  const char* GetExecutionProviderType() const { return "CPUExecutionProvider"; }
  // x, w, generated (int64 [1]; engines from before it have none)
  size_t GetInputTypeCount() const { return 3; }
  ONNXTensorElementDataType GetInputType(size_t i) const {
    return i == 0 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT
                  : i == 1 ? W : ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64;
  }
  OrtCustomOpInputOutputCharacteristic GetInputCharacteristic(size_t i) const {
    return i == 2 ? INPUT_OUTPUT_OPTIONAL : INPUT_OUTPUT_REQUIRED;
  }
  size_t GetOutputTypeCount() const { return 1; }
  ONNXTensorElementDataType GetOutputType(size_t) const { return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT; }
};

}  // namespace

namespace trtllm_cpu {
OrtCustomOp* matmul_half_op() {
  static HalfOp<ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16> op;
  return &op;
}
OrtCustomOp* matmul_half_bf16_op() {
  static HalfOp<ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16> op;
  return &op;
}
}  // namespace trtllm_cpu
