// trtllm.cpu::MatMulBlockQuant: y = x @ W.T for block-quantized W, as an ONNX Runtime custom op.
//
// Why: ONNX Runtime's MatMulNBits has no float per-block offset on its fast path, so the graph
// added it with four more kernels per projection, and it streams 4-bit weights at about half of
// what a memory copy moves. This kernel dequantizes a few weight rows at a time into L1 (codes,
// scale and offset in one fused multiply-add) and multiplies them with fp32 activations, so it is
// also closer to transformers than MatMulNBits' int8 activations: the math is exactly the canonical
// graph's DequantizeLinear + MatMul + offset. Integer activations are the build's choice
// (`activations`, matmul_int8.cc): faster decode, inexact.
//
// Inputs:  x [..., K] float32; codes uint8; scale [N, K/32] float16; offset [N, K/32] float16 (optional)
// Output:  y [..., N] float32
// Attributes: bits (4 or 8), n (N), activation ("none" or "swiglu"), layout (1: what follows; an
// engine packed otherwise is refused), activations ("float32", "int16" or "int8": calls of up to 16
// rows quantize x per block, matmul_int8.cc; longer ones stay float32). Blocks of 32 inputs.
//   swiglu: y [..., N/2] = silu(gate) * up, where the rows come in groups of 32 (the last one
//           shorter): h gate rows then the h up rows of the same outputs (Llama's MLP in one node).
//   bits 4: codes [N, K/2]; per row and block, 16 bytes: byte i holds q[i] in its low nibble and
//           q[i + 16] in its high nibble, q in [0, 15] (GGUF's Q4_1 layout); offset required.
//   bits 8: codes [N, K] as int8 values q in [-127, 127]; offset optional (0).
//   w[n, k] = scale[n, k / 32] * q[n, k] + offset[n, k / 32], in float32
// Scales and offsets are float16 as in GGUF (the builder rounds them so before it quantizes): 20 bytes
// per 32 weights at 4 bits instead of 24, and a decode step is a stream of weights.
#include <algorithm>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "matmul.h"
#include "resident.h"

namespace {

using namespace trtllm_cpu::matmul;

constexpr int64_t kLayout = 1;  // the weight packing above; the builder writes it as the `layout` attribute
constexpr char kName[] = "MatMulBlockQuant";

OrtStatusPtr fail(const std::string& message) { return trtllm_cpu::matmul::fail(message, kName); }

struct Kernel {
  int64_t bits, n;
  bool swiglu;
  int levels;  // integer activations: 0 (float32), 1 (int8) or 2 (int16)
  std::mutex lock;  // guards the copies (sessions may run from several threads)
  trtllm_cpu::Resident codes_copy, scale_copy, offset_copy;

  size_t codes_bytes(int64_t k) const { return static_cast<size_t>(bits == 4 ? n * k / 2 : n * k); }

  OrtStatusPtr check(const Ort::ConstValue& codes, const Ort::ConstValue& scale, const Ort::ConstValue& offset,
                     int64_t k) {
    const int64_t nb = k / kBlock;
    const size_t have_codes = codes.GetTensorTypeAndShapeInfo().GetElementCount();
    if (have_codes != codes_bytes(k))
      return fail("codes hold " + std::to_string(have_codes) + " bytes, expected " + std::to_string(codes_bytes(k)) +
                  " for n=" + std::to_string(n) + ", K=" + std::to_string(k));
    if (scale.GetTensorTypeAndShapeInfo().GetElementCount() != static_cast<size_t>(n * nb))
      return fail("scale must hold n * K / 32 values");
    if (bits == 4 && !offset) return fail("4-bit weights need their offset input");
    if (offset && offset.GetTensorTypeAndShapeInfo().GetElementCount() != static_cast<size_t>(n * nb))
      return fail("offset must hold n * K / 32 values");
    return nullptr;
  }

  OrtStatusPtr ComputeV2(OrtKernelContext* raw) {
    try {
      Ort::KernelContext ctx(raw);
      auto x = ctx.GetInput(0), codes = ctx.GetInput(1), scale = ctx.GetInput(2);
      auto offset = trtllm_cpu::optional_input(ctx, 3);
      const Rows rows = rows_of(x.GetTensorTypeAndShapeInfo().GetShape(), n, swiglu);
      if (!rows.error.empty()) return fail(rows.error);
      const int64_t m = rows.m, k = rows.k, nb = k / kBlock;
      // Every call (a few size reads): the weights are read, and copied once, by these sizes.
      if (OrtStatusPtr bad = check(codes, scale, offset, k)) return bad;
      auto y = ctx.GetOutput(0, rows.y_shape);
      if (m == 0) return nullptr;
      const float* xd = x.GetTensorData<float>();
      // Decode only: a few rows of K / 32 sums, and x split (fused_avx512) or quantized (matmul_int8.cc).
      // Kept per calling thread: a decode step has over a hundred of these nodes, and allocations add up.
      thread_local std::vector<float> sums, split, quant_scale;
      thread_local std::vector<int8_t> quant;
      // The path goes by the tokens, not by the call's size: the runtime says through input 4
      // (`generated`) whether this step's tokens are a prompt's (the prefill path, float32,
      // however few rows: a restored prefix or a batch leaves a prompt's rows as they are alone)
      // or generated ones (decode, EAGLE verification). With integer activations generated rows
      // are quantized however many, which makes them exact across batches too (quantization
      // would magnify any rounding difference). With float32 activations they go by size: the
      // decode kernels specialise by row count anyway (1-2 rows take x split), and past 16 rows
      // the prefill path is faster. Engines from before that input go by size for both.
      const int flag = generated_flag(ctx, 4);
      Job job{{nullptr, nullptr, nullptr, n, k, bits}, xd, nullptr, nullptr, nullptr, m, swiglu};
      job.prompt = flag == 0;
      job.generated = flag == 1 && levels;
      const bool integer = levels && job.decode_path();
      if (job.decode_path()) {
        sums.resize(m * nb);
        const bool split_x = !integer && bits == 4;
        if (split_x) split.resize(m * k);
        decode_inputs(xd, m, k, sums.data(), split_x ? split.data() : nullptr);
        if (integer) {
          const IntRow shape = int_row(k, static_cast<int>(bits), levels);
          quant.resize(m * shape.bytes);
          quant_scale.resize(m * shape.scales);
          quantize_rows(xd, m, k, static_cast<int>(bits), levels, quant.data(), quant_scale.data());
        }
      }
      const void *codes_at, *scale_at, *offset_at = nullptr;
      {
        std::lock_guard<std::mutex> hold(lock);
        codes_at = codes_copy.get(codes.GetTensorRawData(), codes_bytes(k));
        scale_at = scale_copy.get(scale.GetTensorRawData(), n * nb * 2);
        if (offset) offset_at = offset_copy.get(offset.GetTensorRawData(), n * nb * 2);
      }
      job.w = {static_cast<const uint8_t*>(codes_at), static_cast<const uint16_t*>(scale_at),
               static_cast<const uint16_t*>(offset_at), n, k, bits};
      job.xs = sums.data();
      job.xt = split.data();
      job.y = y.GetTensorMutableData<float>();
      if (integer) {
        job.xq = quant.data();
        job.xd = quant_scale.data();
        job.levels = levels;
      }
      run(ctx, job);  // a task's exception reaches the catch below
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
      const int64_t bits = ki.GetAttribute<int64_t>("bits"), n = ki.GetAttribute<int64_t>("n");
      if (bits != 4 && bits != 8) return fail("bits must be 4 or 8, got " + std::to_string(bits));
      if (n < 1) return fail("n must be positive");
      const int64_t layout = trtllm_cpu::attribute_or<int64_t>(ki, "layout", 0);  // 0: from before the attribute
      if (layout != kLayout)
        return fail("the engine's weights are in packing layout " + std::to_string(layout) + ", this library reads layout " +
                    std::to_string(kLayout) + ": rebuild the engine with trtllm-build");
      const std::string activation = trtllm_cpu::attribute_or<std::string>(ki, "activation", "none");
      if (const std::string bad = check_activation(activation, n); !bad.empty()) return fail(bad);
      const std::string activations = trtllm_cpu::attribute_or<std::string>(ki, "activations", "float32");
      const int levels = activations == "int8" ? 1 : activations == "int16" ? 2 : 0;
      if (activations != "float32" && !levels)
        return fail("activations must be float32, int16 or int8, got " + activations);
      const bool constant[3] = {trtllm_cpu::constant_input(ki, 1), trtllm_cpu::constant_input(ki, 2),
                                trtllm_cpu::constant_input(ki, 3)};
      auto* made = new Kernel{bits, n, activation == "swiglu", levels, {}, {}, {}, {}};
      made->codes_copy.constant = constant[0];
      made->scale_copy.constant = constant[1];
      made->offset_copy.constant = constant[2];
      *kernel = made;
      return nullptr;
    } catch (const std::exception& e) {
      return fail(e.what());
    }
  }
  const char* GetName() const { return kName; }
  const char* GetExecutionProviderType() const { return "CPUExecutionProvider"; }
  // x, codes, scale, offset (4-bit only), generated (int64 [1]; engines from before it have none)
  size_t GetInputTypeCount() const { return 5; }
  ONNXTensorElementDataType GetInputType(size_t i) const {
    return i == 0   ? ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT
           : i == 1 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8
           : i == 4 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64
                    : ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16;
  }
  OrtCustomOpInputOutputCharacteristic GetInputCharacteristic(size_t i) const {
    return i >= 3 ? INPUT_OUTPUT_OPTIONAL : INPUT_OUTPUT_REQUIRED;
  }
  size_t GetOutputTypeCount() const { return 1; }
  ONNXTensorElementDataType GetOutputType(size_t) const { return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT; }
};

}  // namespace

namespace trtllm_cpu {
OrtCustomOp* matmul_block_quant_op() {
  static Op op;
  return &op;
}
}  // namespace trtllm_cpu
