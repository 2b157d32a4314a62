// trtllm.cpu::MambaScan: a Mamba-2 layer's convolution and selective scan in one node (builder/mamba.py
// writes the same in standard ops: llm.onnx, and the ONNX Runtime form without this library). Its step
// of one token is a few dozen standard-op nodes a layer, each dispatched on its own (a millisecond a
// layer on 2 cores); here one pass over the state.
//
//   inputs   0 xbc [B,S,C] (in_proj's x|B|C columns), 1 dt [B,S,H] (its dt columns), 2 conv_state
//            [B,K-1,C], 3 ssm_state [B,G,H/G,P,N], 4 write_index [B] int64, 5 last_index [B] int64,
//            6 conv_weight [K,C], 7 conv_bias [C] (optional), 8 A [H] (-exp(A_log)), 9 dt_bias [H], 10 D [H]
//   outputs  0 y [B,S,H*P] (before the gate and norm), 1 conv_state and 2 ssm_state after the step
//            (the runtime binds them to inputs 2 and 3: updated in place)
//   attrs    heads, head_dim, state_size, groups
//
// Row b's tokens s <= last_index[b] are its own; a row whose write_index is 0 starts from zero states.
// For each of them, as transformers' recurrent form (a generated token's):
//   xbc_s = silu(bias + sum_k w[k] * window[s + k])     window: the K-1 inputs before, then the step's
//   dt = softplus(dt_s + dt_bias);  S = S * exp(dt A) + (dt x_s) B_s^T;  y_s = S C_s + D x_s
// A token past last_index (padding; a parked row's -1: all) leaves both states alone and gets
// y_s = S C_s + D x_s of the state as it is. The convolution state after the step is the window's
// last K-1 rows up to the row's last token.
#include <algorithm>
#include <cmath>
#include <vector>

#include "common.h"

namespace {

constexpr const char* kName = "MambaScan";
constexpr int64_t kParallelFloats = 1 << 16;  // below this much state work a call runs on one thread

OrtStatusPtr fail(const std::string& what, const char* name) {
  return Ort::GetApi().CreateStatus(ORT_INVALID_ARGUMENT, (std::string("trtllm.cpu::") + name + ": " + what).c_str());
}

float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }  // (torch's threshold 20)
float silu(float x) { return x / (1.0f + std::exp(-x)); }

struct Job {
  const float *xbc, *dt, *conv_in, *ssm_in, *w, *bias, *a, *dt_bias, *d;
  const int64_t *write_index, *last_index;
  float *y, *conv_out, *ssm_out, *conv;  // conv: the convolution's outputs [B,S,C], silu applied
  int64_t batch, seq, channels, taps, heads, dim, n, groups;
};

// Row b's convolution: its window (the K-1 inputs before, zeros where it starts, then the step's) and
// the new convolution state, the window's K-1 rows up to its last token.
void conv_row(const Job& j, int64_t b) {
  const int64_t c = j.channels, k1 = j.taps - 1, s = j.seq;
  std::vector<float> window((k1 + s) * c);
  if (j.write_index[b] > 0)
    std::copy(j.conv_in + b * k1 * c, j.conv_in + (b + 1) * k1 * c, window.begin());
  std::copy(j.xbc + b * s * c, j.xbc + (b + 1) * s * c, window.begin() + k1 * c);
  for (int64_t t = 0; t < s; ++t) {
    float* out = j.conv + (b * s + t) * c;
    for (int64_t ch = 0; ch < c; ++ch) out[ch] = j.bias ? j.bias[ch] : 0.0f;
    for (int64_t k = 0; k < j.taps; ++k) {
      const float* row = window.data() + (t + k) * c;
      const float* wk = j.w + k * c;
      for (int64_t ch = 0; ch < c; ++ch) out[ch] += wk[ch] * row[ch];
    }
    for (int64_t ch = 0; ch < c; ++ch) out[ch] = silu(out[ch]);
  }
  const int64_t last = std::clamp<int64_t>(j.last_index[b], -1, s - 1);
  std::copy(window.begin() + (last + 1) * c, window.begin() + (last + 1 + k1) * c, j.conv_out + b * k1 * c);
}

// sum over i < n of a[i] * b[i], eight running sums side by side (a loop the compiler vectorizes), added
// in a fixed order
__attribute__((always_inline)) inline float dot(const float* a, const float* b, int64_t n) {
  float part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; ++k) part[k] += a[i + k] * b[i + k];
  float rest = 0.0f;
  for (; i < n; ++i) rest += a[i] * b[i];
  return ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7])) + rest;
}

// One head of one row: its state through the step's tokens, and their outputs.
__attribute__((always_inline)) inline void head_scan(const Job& j, int64_t b, int64_t h) {
  const int64_t p_dim = j.dim, n = j.n, s_len = j.seq, c = j.channels, inner = j.heads * j.dim;
  const int64_t g = h / (j.heads / j.groups), last = std::min(j.last_index[b], s_len - 1);
  const float* old = j.ssm_in + (b * j.heads + h) * p_dim * n;
  float* state = j.ssm_out + (b * j.heads + h) * p_dim * n;  // (may be `old`: each value read, then written)
  if (j.write_index[b] > 0) {
    if (state != old) std::copy(old, old + p_dim * n, state);
  } else {
    std::fill(state, state + p_dim * n, 0.0f);
  }
  for (int64_t t = 0; t < s_len; ++t) {
    const float* row = j.conv + (b * s_len + t) * c;
    const float *x = row + h * p_dim, *bb = row + inner + g * n, *cc = row + inner + j.groups * n + g * n;
    float* y = j.y + (b * s_len + t) * inner + h * p_dim;
    const bool taken = t <= last;
    const float dt = taken ? softplus(j.dt[(b * s_len + t) * j.heads + h] + j.dt_bias[h]) : 0.0f;
    const float decay = std::exp(dt * j.a[h]);
    for (int64_t p = 0; p < p_dim; ++p) {
      float* sp = state + p * n;
      if (taken) {
        const float xdt = x[p] * dt;
        for (int64_t i = 0; i < n; ++i) sp[i] = sp[i] * decay + xdt * bb[i];
      }
      y[p] = dot(sp, cc, n) + j.d[h] * x[p];
    }
  }
}

void scan_portable(const Job& j, int64_t b, int64_t h) { head_scan(j, b, h); }
#ifdef TRTLLM_X86
TRTLLM_AVX2 void scan_avx2(const Job& j, int64_t b, int64_t h) { head_scan(j, b, h); }
#endif

void conv_task(void* data, size_t b) { conv_row(*static_cast<Job*>(data), static_cast<int64_t>(b)); }

void scan_task(void* data, size_t task) {
  const Job& j = *static_cast<Job*>(data);
  const int64_t b = static_cast<int64_t>(task) / j.heads, h = static_cast<int64_t>(task) % j.heads;
#ifdef TRTLLM_X86
  if (trtllm_cpu::use_avx2()) return scan_avx2(j, b, h);
#endif
  scan_portable(j, b, h);
}

void run(Ort::KernelContext& ctx, void (*task)(void*, size_t), size_t count, Job* job, bool parallel) {
  if (parallel && count > 1) return trtllm_cpu::parallel_for(ctx, task, count, job);
  for (size_t i = 0; i < count; ++i) task(job, i);
}

struct Kernel {
  int64_t heads, dim, n, groups;

  OrtStatusPtr ComputeV2(OrtKernelContext* raw) {
    try {
      Ort::KernelContext ctx(raw);
      auto xbc = ctx.GetInput(0), dt = ctx.GetInput(1), conv = ctx.GetInput(2), ssm = ctx.GetInput(3);
      auto wi = ctx.GetInput(4), li = ctx.GetInput(5), w = ctx.GetInput(6);
      auto bias = trtllm_cpu::optional_input(ctx, 7);
      auto a = ctx.GetInput(8), dtb = ctx.GetInput(9), d = ctx.GetInput(10);
      const auto xs = xbc.GetTensorTypeAndShapeInfo().GetShape(), cs = conv.GetTensorTypeAndShapeInfo().GetShape();
      const auto ws = w.GetTensorTypeAndShapeInfo().GetShape();
      const int64_t inner = heads * dim, channels = inner + 2 * groups * n;
      if (xs.size() != 3 || xs[2] != channels)
        return fail("xbc must be [B, S, " + std::to_string(channels) + "]", kName);
      const int64_t batch = xs[0], seq = xs[1];
      if (ws.size() != 2 || ws[1] != channels || ws[0] < 1)
        return fail("conv_weight must be [K, " + std::to_string(channels) + "]", kName);
      const int64_t taps = ws[0];
      if (cs != std::vector<int64_t>{batch, taps - 1, channels})
        return fail("conv_state must be [B, K - 1, C]", kName);
      const std::vector<int64_t> ss{batch, groups, heads / groups, dim, n};
      if (ssm.GetTensorTypeAndShapeInfo().GetShape() != ss) return fail("ssm_state must be [B, G, H/G, P, N]", kName);
      if (dt.GetTensorTypeAndShapeInfo().GetShape() != std::vector<int64_t>{batch, seq, heads})
        return fail("dt must be [B, S, H]", kName);
      for (auto* v : {&wi, &li})
        if (v->GetTensorTypeAndShapeInfo().GetShape() != std::vector<int64_t>{batch})
          return fail("write_index and last_index must be [B]", kName);
      for (auto* v : {&a, &dtb, &d})
        if (v->GetTensorTypeAndShapeInfo().GetShape() != std::vector<int64_t>{heads})
          return fail("A, dt_bias and D must be [H]", kName);
      if (bias && bias.GetTensorTypeAndShapeInfo().GetShape() != std::vector<int64_t>{channels})
        return fail("conv_bias must be [C]", kName);
      auto y = ctx.GetOutput(0, {batch, seq, inner});
      auto conv_out = ctx.GetOutput(1, cs);
      auto ssm_out = ctx.GetOutput(2, ss);
      std::vector<float> convolved(batch * seq * channels);
      Job job{xbc.GetTensorData<float>(), dt.GetTensorData<float>(), conv.GetTensorData<float>(),
              ssm.GetTensorData<float>(), w.GetTensorData<float>(), bias ? bias.GetTensorData<float>() : nullptr,
              a.GetTensorData<float>(), dtb.GetTensorData<float>(), d.GetTensorData<float>(),
              wi.GetTensorData<int64_t>(), li.GetTensorData<int64_t>(), y.GetTensorMutableData<float>(),
              conv_out.GetTensorMutableData<float>(), ssm_out.GetTensorMutableData<float>(), convolved.data(),
              batch, seq, channels, taps, heads, dim, n, groups};
      if (batch == 0 || seq == 0) return nullptr;
      const bool parallel = batch * heads * seq * dim * n >= kParallelFloats;
      run(ctx, conv_task, static_cast<size_t>(batch), &job, parallel && batch * seq * channels >= kParallelFloats);
      run(ctx, scan_task, static_cast<size_t>(batch * heads), &job, parallel);
      return nullptr;
    } catch (const std::exception& e) {
      return fail(e.what(), kName);
    }
  }
};

struct Op : Ort::CustomOpBase<Op, Kernel, true> {
  OrtStatusPtr CreateKernelV2(const OrtApi&, const OrtKernelInfo* info, void** kernel) const {
    try {
      Ort::ConstKernelInfo ki(info);
      const int64_t heads = ki.GetAttribute<int64_t>("heads"), dim = ki.GetAttribute<int64_t>("head_dim");
      const int64_t n = ki.GetAttribute<int64_t>("state_size"), groups = ki.GetAttribute<int64_t>("groups");
      if (heads < 1 || dim < 1 || n < 1 || groups < 1 || heads % groups)
        return fail("heads, head_dim, state_size and groups must be >= 1, groups dividing heads", kName);
      *kernel = new Kernel{heads, dim, n, groups};
      return nullptr;
    } catch (const std::exception& e) {
      return fail(e.what(), kName);
    }
  }
  const char* GetName() const { return kName; }
  const char* GetExecutionProviderType() const { return "CPUExecutionProvider"; }
  size_t GetInputTypeCount() const { return 11; }
  ONNXTensorElementDataType GetInputType(size_t i) const {
    return i == 4 || i == 5 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64 : ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
  }
  OrtCustomOpInputOutputCharacteristic GetInputCharacteristic(size_t i) const {
    return i == 7 ? INPUT_OUTPUT_OPTIONAL : INPUT_OUTPUT_REQUIRED;
  }
  size_t GetOutputTypeCount() const { return 3; }
  ONNXTensorElementDataType GetOutputType(size_t) const { return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT; }
};

}  // namespace

namespace trtllm_cpu {
OrtCustomOp* mamba_scan_op() {
  static Op op;
  return &op;
}
}  // namespace trtllm_cpu
