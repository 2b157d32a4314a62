// trtllm.cpu::MoE and MoEBlockQuant: a mixture of experts' MLP (Qwen3-MoE, Qwen2-MoE, OLMoE,
// Mixtral, Granite MoE), each token through its top-k experts only, on the MatMul kernels of
// MatMulHalf and MatMulBlockQuant (matmul.cc).
//
// Why: ONNX Runtime's MoE node holds its experts in float32 only (a 16-bit engine's twice the
// bytes), at batch 1 it ran a float32 model's decode at 0.92x llama.cpp's, and its QMoE takes no
// float block offsets (our int4) nor float32 activations at 8 bits. Here every chosen expert's weight
// rows are tasks of one parallel pass, gate|up for all of them, then down for all.
//
// MoE inputs:  x [..., H] float32; logits [..., E] float32 (the router's); w1 [E, 2I, H] (each
//              expert's gate and up rows in the swiglu order of MatMulHalf: quantize.swiglu_rows);
//              w2 [E, H, I]; generated (int64 [1], optional: MatMulHalf's row roles). w1 and w2
//              float32, float16 or bfloat16 (registered once per type under one name).
// MoEBlockQuant inputs: x, logits, w1 codes, w1_scale, w1_offset, w2 codes, w2_scale, w2_offset,
//              generated: each expert's weights packed as MatMulBlockQuant's (uint8 codes [E, N, K/2]
//              at 4 bits or [E, N, K] at 8, float16 scales and offsets [E, N, K/32]; offsets
//              optional at 8 bits); attributes bits (4 or 8) and exact_rows (1: generated rows
//              through the decode kernels 1-2 at a time, so each row's result is the same whatever
//              shares its experts, at some cost in batched decode; 0, the default: by count, as
//              MatMulBlockQuant's float32 activations). Activations float32.
// LoRA (both ops, optional, after generated): gate_a [n, E, H, rg], gate_b [n, E, rg, I], up_a, up_b
//          (likewise), down_a [n, E, I, rd], down_b [n, E, rd, H], float32, in the checkpoint's column
//          order (the graph feeds the runtime's arrays as they are: no copy a step); n 1 (one adapter)
//          or x's leading dimension (row b's own). Each chosen expert's gate gets (x gate_a_e)
//          gate_b_e before the activation, its up likewise, and its down (h down_a_e) down_b_e: a
//          LoRA adapter on the experts (a rank of 0: none on that projection).
// expert_scale (both ops, optional, after LoRA's): [E] float32, each chosen expert's weight times its own
//          (Gemma 4's per_expert_scale; LFM2-MoE's routed_scaling_factor, E times), after the normalization.
// selection_bias (both ops, optional, last): [E] float32, added to the scores that choose the experts,
//          not to their weights (LFM2-MoE's expert_bias).
// Output:  y [..., H] float32: sum over the token's chosen experts e of p_e (silu(x W1g_e.T) *
//          (x W1u_e.T)) @ W2_e.T. H and I multiples of 32.
// Attributes: k (experts a token), normalize (1: the chosen probabilities divided by their sum),
//          activation ("silu", the default, or "gelu_tanh": Gemma 4's experts, gelu_tanh(gate) * up with
//          GELU's tanh form as torch computes it), scoring ("softmax", the default, or "sigmoid":
//          LFM2-MoE's, each logit's sigmoid, normalized by their sum + 1e-6 as transformers does), norm_min
//          (float, default 0: the normalizing sum at least this, as ERNIE 4.5's moe_norm_min clamps it),
//          norm_epsilon (float: added to the sum first; default 1e-6 with sigmoid scores, else 0; AFMoE's 1e-20).
// Routing as transformers': softmax (or sigmoid) of the logits in float32, the k largest scores (an
// exact tie goes to the lower expert index, as ONNX's TopK), normalized when asked; products accumulate
// in float32, and a token's experts are summed in the router's order.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "matmul.h"
#include "resident.h"

namespace {

using namespace trtllm_cpu::matmul;
using trtllm_cpu::parallel_for;

constexpr char kName[] = "MoE", kQuantName[] = "MoEBlockQuant";
// Tokens routed per pass: bounds the gathered rows' memory (k x 3 rows of H or I floats a token)
// while a long prompt still gives each expert many rows to share a read of its weights.
constexpr int64_t kTokens = 1024;
constexpr int64_t kRowsPerTask = 64;  // gather, LoRA and combine: rows (token slots) per task

// The experts' LoRA inputs (a rank of 0 or absent: none on that projection).
struct Lora {
  struct Pair {
    const float *a = nullptr, *b = nullptr;
    int64_t r = 0;
  } gate, up, down;
  int64_t n = 1, per = 1;  // adapters, tokens per adapter
  bool gate_up() const { return gate.r || up.r; }
};

struct Pass {  // one block of tokens, routed
  const float* x;  // [count, H]
  float* y;        // [count, H]
  int64_t count, h, k;
  int64_t t0 = 0, e = 0, inner = 0;  // the block's first token; experts; I
  const Lora* lora = nullptr;
  bool gelu = false;                // the activation: GELU's tanh form (else SiLU)
  std::vector<int64_t> row_expert;  // gathered row -> its expert (LoRA)
  std::vector<float> pre;           // LoRA on gate|up or GELU: the rows' gate|up before the activation [rows, 2I]
  std::vector<int64_t> slot_row;    // token slot t * k + j -> its row in the gathered buffers
  std::vector<int64_t> row_token;   // gathered row -> its token
  std::vector<float> weight;        // token slot -> its expert's weight
  std::vector<float> xg, hg, og;    // gathered x [rows, H], silu(gate) * up [rows, I], down [rows, H]
  std::vector<float> sums[2], split[2];  // block-quantized decode rows' inputs (decode_inputs) of xg, hg
  std::vector<Job> jobs;            // gate|up jobs, then down jobs, one of each per chosen expert
  std::vector<std::pair<int64_t, int64_t>> tasks;  // (job, chunk)
};

// A task's kRowsPerTask rows (or token slots) of `total`: [first, end).
struct Span {
  int64_t first, end;
};
Span span(size_t task, int64_t total) {
  const int64_t first = static_cast<int64_t>(task) * kRowsPerTask;
  return {first, std::min(total, first + kRowsPerTask)};
}
size_t spans(int64_t total) { return static_cast<size_t>((total + kRowsPerTask - 1) / kRowsPerTask); }  // tasks

void gather(void* data, size_t task) {
  Pass& p = *static_cast<Pass*>(data);
  const Span s = span(task, p.count * p.k);
  for (int64_t r = s.first; r < s.end; ++r)
    std::copy_n(p.x + p.row_token[r] * p.h, p.h, p.xg.data() + r * p.h);
}

void compute(void* data, size_t task) {
  const Pass& p = *static_cast<const Pass*>(data);
  const auto [job, chunk] = p.tasks[task];
  run_task(p.jobs[job], chunk);
}

// out [cols] += (in [k] @ a [k, r]) @ b [r, cols]: one row's LoRA delta.
void add_delta(const float* in, int64_t k, const float* a, const float* b, int64_t r, int64_t cols, float* out) {
  thread_local std::vector<float> u;
  u.assign(r, 0.0f);
  for (int64_t i = 0; i < k; ++i)
    for (int64_t j = 0; j < r; ++j) u[j] += in[i] * a[i * r + j];
  for (int64_t j = 0; j < r; ++j)
    for (int64_t c = 0; c < cols; ++c) out[c] += u[j] * b[j * cols + c];
}

// The adapter (of n) of gathered row r: its token's batch row's, or the one.
int64_t adapter_of(const Pass& p, int64_t r) { return p.lora->n == 1 ? 0 : (p.t0 + p.row_token[r]) / p.lora->per; }

// gelu_tanh(gate) * up, GELU's tanh form with torch's constants and order of operations.
void geglu(const float* gate, const float* up, int64_t count, float* out) {
  constexpr float kBeta = 0.7978845608028654f, kKappa = 0.044715f;  // sqrt(2 / pi)
  for (int64_t t = 0; t < count; ++t) {
    const float x = gate[t], inner = kBeta * (x + kKappa * (x * x * x));
    out[t] = 0.5f * x * (1.0f + std::tanh(inner)) * up[t];
  }
}

// The rows' gate|up (p.pre) to hg where the fused swiglu jobs do not write it (LoRA on gate|up, or
// GELU): each row's gate and up deltas added first, then act(gate) * up. gate|up is in w1's swiglu
// order, per 32 columns 16 gate then their 16 up; the deltas are in the checkpoint's order, and go to
// those places.
void activate(void* data, size_t task) {
  Pass& p = *static_cast<Pass*>(data);
  const Lora& l = *p.lora;
  const int64_t half = kChunkRows / 2;
  const Span s = span(task, p.count * p.k);
  thread_local std::vector<float> delta;
  for (int64_t r = s.first; r < s.end; ++r) {
    float* pre = p.pre.data() + r * 2 * p.inner;
    const Lora::Pair* pairs[2] = {&l.gate, &l.up};
    for (int j = 0; j < 2; ++j) {
      const Lora::Pair& q = *pairs[j];
      if (!q.r) continue;
      const int64_t at = adapter_of(p, r) * p.e + p.row_expert[r];
      delta.assign(p.inner, 0.0f);
      add_delta(p.xg.data() + r * p.h, p.h, q.a + at * p.h * q.r, q.b + at * q.r * p.inner, q.r, p.inner, delta.data());
      for (int64_t c = 0; c < p.inner; c += half)  // (gate column c at 2c - c % 16; up's 16 after)
        for (int64_t t = 0; t < half; ++t) pre[2 * c + j * half + t] += delta[c + t];
    }
    for (int64_t c = 0; c < 2 * p.inner; c += kChunkRows)
      (p.gelu ? geglu : swiglu)(pre + c, pre + c + half, half, p.hg.data() + r * p.inner + c / 2);
  }
}

// LoRA on down: each row's delta added to its down.
void lora_down(void* data, size_t task) {
  Pass& p = *static_cast<Pass*>(data);
  const Lora& l = *p.lora;
  const Span s = span(task, p.count * p.k);
  for (int64_t r = s.first; r < s.end; ++r) {
    const int64_t at = adapter_of(p, r) * p.e + p.row_expert[r];
    add_delta(p.hg.data() + r * p.inner, p.inner, l.down.a + at * p.inner * l.down.r, l.down.b + at * l.down.r * p.h,
              l.down.r, p.h, p.og.data() + r * p.h);
  }
}

// y[t] = sum_j weight[t, j] og[row of (t, j)], the slots in the router's order (largest first)
void combine(void* data, size_t task) {
  Pass& p = *static_cast<Pass*>(data);
  const Span s = span(task, p.count);
  for (int64_t t = s.first; t < s.end; ++t) {
    float* y = p.y + t * p.h;
    std::fill(y, y + p.h, 0.0f);
    for (int64_t j = 0; j < p.k; ++j) {
      const float w = p.weight[t * p.k + j], *o = p.og.data() + p.slot_row[t * p.k + j] * p.h;
      for (int64_t c = 0; c < p.h; ++c) y[c] += w * o[c];
    }
  }
}

// Each token's k experts and their weights (chosen [count, k], weight [count, k]): the scores (softmax,
// or `sigmoid` each), the k largest of scores + bias (bias: null, or [E] added for the choice only),
// their scores normalized where asked (sigmoid's by the sum + 1e-6, as LFM2-MoE's router; the sum at least
// norm_min, as ERNIE 4.5's), then times scale (null, or [E]).
void route(const float* logits, int64_t count, int64_t e, int64_t k, bool normalize, bool sigmoid, float epsilon,
           float norm_min, const float* bias, const float* scale, std::vector<int64_t>& chosen,
           std::vector<float>& weight) {
  std::vector<float> probs(e), keys(e);
  std::vector<char> taken(e);
  for (int64_t t = 0; t < count; ++t) {
    const float* l = logits + t * e;
    if (sigmoid) {
      for (int64_t i = 0; i < e; ++i) probs[i] = 1.0f / (1.0f + std::exp(-l[i]));
    } else {
      const float top = *std::max_element(l, l + e);
      float sum = 0.0f;
      for (int64_t i = 0; i < e; ++i) sum += probs[i] = std::exp(l[i] - top);
      for (int64_t i = 0; i < e; ++i) probs[i] /= sum;
    }
    for (int64_t i = 0; i < e; ++i) keys[i] = bias ? probs[i] + bias[i] : probs[i];
    std::fill(taken.begin(), taken.end(), 0);
    float picked = 0.0f;
    for (int64_t j = 0; j < k; ++j) {
      int64_t best = -1;
      for (int64_t i = 0; i < e; ++i)  // strictly greater: a tie keeps the lower index
        if (!taken[i] && (best < 0 || keys[i] > keys[best])) best = i;
      taken[best] = 1;
      chosen[t * k + j] = best;
      picked += weight[t * k + j] = probs[best];
    }
    if (normalize) picked = std::max(picked + epsilon, norm_min);
    if (normalize)
      for (int64_t j = 0; j < k; ++j) weight[t * k + j] /= picked;
    if (scale)
      for (int64_t j = 0; j < k; ++j) weight[t * k + j] *= scale[chosen[t * k + j]];
  }
}

// One projection of every expert, E weights of n rows by k inputs: float (bits 32 or 16) or
// MatMulBlockQuant's codes, scales and offsets (bits 4 or 8), each expert's after the last's.
struct Experts {
  const uint8_t* codes = nullptr;
  const uint16_t *scale = nullptr, *offset = nullptr;
  int64_t e = 0, n = 0, k = 0, bits = 32;
  bool brain = false;

  size_t code_bytes() const { return static_cast<size_t>(bits == 4 ? n * k / 2 : n * k * (bits / 8)); }
  size_t params() const { return static_cast<size_t>(n * (k / kBlock)); }  // scales (offsets) an expert
  Weights of(int64_t i) const {
    Weights w{codes + i * code_bytes(), scale ? scale + i * params() : nullptr, offset ? offset + i * params() : nullptr,
              n, k, bits};
    w.brain = brain;
    return w;
  }
};

struct MoEKernel {
  int64_t k;
  bool normalize;
  int64_t bits;  // 32 or 16 (brain: bfloat16): the float op; 4 or 8: MoEBlockQuant
  bool brain;
  bool exact_rows;  // quantized generated rows 1-2 at a time (Job::row_exact): the exact_rows attribute
  bool gelu;        // the activation attribute: gelu_tanh
  bool sigmoid;     // the scoring attribute: sigmoid
  float epsilon;    // the norm_epsilon attribute
  float norm_min;   // the norm_min attribute
  const char* name;
  std::mutex lock;  // guards the copies
  trtllm_cpu::Resident copies[6];  // w1's codes, scale, offset, then w2's

  bool quantized() const { return bits <= 8; }

  // The node's two projections, checked against each other and copied (once) where they are constants.
  std::string experts(Ort::KernelContext& ctx, Experts& w1, Experts& w2) {
    const size_t at2 = quantized() ? 5 : 3;
    auto shape = [&](size_t i) { return ctx.GetInput(i).GetTensorTypeAndShapeInfo().GetShape(); };
    const auto s1 = shape(quantized() ? 3 : 2), s2 = shape(quantized() ? 6 : 3);  // scales, or the weights
    const int64_t scale = quantized() ? kBlock : 1;  // a scale per 32 inputs
    if (s1.size() != 3 || s2.size() != 3 || s1[0] != s2[0] || s1[1] != 2 * s2[2] * scale || s1[2] * scale != s2[1])
      return quantized() ? "w1_scale must be [E, 2I, H / 32] and w2_scale [E, H, I / 32]"
                         : "w1 must be [E, 2I, H] and w2 [E, H, I]";
    w1.e = w2.e = s1[0], w1.n = s1[1], w1.k = s2[1], w2.n = s2[1], w2.k = w1.n / 2;
    if (w1.k % kBlock || w2.k % kBlock) return "H and I must be multiples of 32";
    Experts* both[2] = {&w1, &w2};
    std::lock_guard<std::mutex> hold(lock);
    for (int j = 0; j < 2; ++j) {
      Experts& w = *both[j];
      w.bits = bits, w.brain = brain;
      const size_t first = j == 0 ? 2 : at2;
      auto codes = ctx.GetInput(first);
      const size_t bytes = w.e * w.code_bytes();
      const char* which = j == 0 ? "w1" : "w2";
      if (codes.GetTensorTypeAndShapeInfo().GetElementCount() * (quantized() ? 1 : bits / 8) != bytes)
        return std::string(which) + " holds " + std::to_string(codes.GetTensorTypeAndShapeInfo().GetElementCount()) +
               " values, expected " + std::to_string(bytes / (quantized() ? 1 : bits / 8)) + " for [E, N, K] = [" +
               std::to_string(w.e) + ", " + std::to_string(w.n) + ", " + std::to_string(w.k) + "]";
      w.codes = static_cast<const uint8_t*>(copies[3 * j].get(codes.GetTensorRawData(), bytes));
      if (!quantized()) continue;
      w.scale = static_cast<const uint16_t*>(copies[3 * j + 1].get(ctx.GetInput(first + 1).GetTensorRawData(),
                                                                    w.e * w.params() * 2));
      auto offset = ctx.GetInput(first + 2);
      if (offset) {
        if (offset.GetTensorTypeAndShapeInfo().GetElementCount() != w.e * w.params())
          return std::string(which) + "_offset must be shaped as its scale";
        w.offset = static_cast<const uint16_t*>(copies[3 * j + 2].get(offset.GetTensorRawData(), w.e * w.params() * 2));
      } else if (bits == 4) {
        return std::string("4-bit experts need their offsets (") + which + "_offset)";
      }
    }
    return "";
  }

  // The optional LoRA inputs from `first` on (gate, up, down: a then b), checked against the experts
  // and x's m rows of `batch` leading rows.
  std::string lora_inputs(Ort::KernelContext& ctx, size_t first, int64_t e, int64_t h, int64_t inner, int64_t m,
                          int64_t batch, Lora& l) {
    const char* names[3] = {"gate", "up", "down"};
    const int64_t widths[3][2] = {{h, inner}, {h, inner}, {inner, h}};
    Lora::Pair* pairs[3] = {&l.gate, &l.up, &l.down};
    bool counted = false;
    for (int j = 0; j < 3; ++j) {
      const size_t at = first + 2 * j;
      const auto a = trtllm_cpu::optional_input(ctx, at), b = trtllm_cpu::optional_input(ctx, at + 1);
      const std::string which = names[j];
      if (bool(a) != bool(b)) return "lora " + which + "_a and " + which + "_b go together";
      if (!a) continue;
      const auto sa = a.GetTensorTypeAndShapeInfo().GetShape(), sb = b.GetTensorTypeAndShapeInfo().GetShape();
      if (sa.size() != 4 || sb.size() != 4 || sa[0] != sb[0] || sa[1] != e || sb[1] != e || sa[2] != widths[j][0] ||
          sa[3] != sb[2] || sb[3] != widths[j][1] || (sa[0] != 1 && sa[0] != batch))
        return "lora " + which + "_a must be [n, E, " + std::to_string(widths[j][0]) + ", r] and " + which + "_b [n, E, r, " +
               std::to_string(widths[j][1]) + "], n 1 or x's leading dimension " + std::to_string(batch);
      if (sa[3] == 0) continue;  // (rank 0: no adapter there)
      if (counted && sa[0] != l.n) return "the lora inputs must hold the same number of adapters";
      l.n = sa[0], counted = true;
      *pairs[j] = {a.GetTensorData<float>(), b.GetTensorData<float>(), sa[3]};
    }
    l.per = m / l.n;
    return "";
  }

  OrtStatusPtr ComputeV2(OrtKernelContext* raw) {
    try {
      Ort::KernelContext ctx(raw);
      auto x = ctx.GetInput(0), logits = ctx.GetInput(1);
      Experts w1, w2;
      if (const std::string bad = experts(ctx, w1, w2); !bad.empty()) return fail(bad, name);
      const int64_t e = w1.e, h = w1.k, inner = w2.k;
      if (k > e) return fail("k must be in [1, E = " + std::to_string(e) + "]", name);
      const Rows rows = rows_of(x.GetTensorTypeAndShapeInfo().GetShape(), h, false);
      if (!rows.error.empty()) return fail(rows.error, name);
      if (rows.k != h) return fail("x's last dimension must be H = " + std::to_string(h), name);
      const auto ls = logits.GetTensorTypeAndShapeInfo().GetShape();
      if (ls.empty() || ls.back() != e || static_cast<int64_t>(logits.GetTensorTypeAndShapeInfo().GetElementCount()) != rows.m * e)
        return fail("logits must hold E = " + std::to_string(e) + " values per row of x", name);
      auto y = ctx.GetOutput(0, rows.y_shape);
      if (rows.m == 0) return nullptr;
      const int flag = generated_flag(ctx, quantized() ? 8 : 4);
      Lora lora;
      const auto xs_shape = x.GetTensorTypeAndShapeInfo().GetShape();
      if (const std::string bad = lora_inputs(ctx, quantized() ? 9 : 5, e, h, inner, rows.m,
                                              xs_shape.size() > 1 ? xs_shape[0] : 1, lora); !bad.empty())
        return fail(bad, name);
      const float* xs = x.GetTensorData<float>();
      float* ys = y.GetTensorMutableData<float>();
      std::vector<int64_t> chosen(rows.m * k);
      std::vector<float> weight(rows.m * k);
      const size_t tail = (quantized() ? 8 : 4) + 7;  // (after generated and LoRA's 6)
      const auto scale = trtllm_cpu::optional_input(ctx, tail), bias = trtllm_cpu::optional_input(ctx, tail + 1);
      for (const auto& [v, what] : {std::pair{scale, "expert_scale"}, std::pair{bias, "selection_bias"}})
        if (v && static_cast<int64_t>(v.GetTensorTypeAndShapeInfo().GetElementCount()) != e)
          return fail(std::string(what) + " must hold E = " + std::to_string(e) + " values", name);
      route(logits.GetTensorData<float>(), rows.m, e, k, normalize, sigmoid, epsilon, norm_min,
            bias ? bias.GetTensorData<float>() : nullptr, scale ? scale.GetTensorData<float>() : nullptr, chosen,
            weight);
      // the calling thread's buffers, kept between calls: new pages each call cost more than the
      // gather (page faults, zeroing); they hold the largest pass's rows until the thread ends
      thread_local Pass p;
      for (int64_t t0 = 0; t0 < rows.m; t0 += kTokens) {
        p.jobs.clear();
        p.count = std::min(kTokens, rows.m - t0);
        p.x = xs + t0 * h, p.y = ys + t0 * h, p.h = h, p.k = k;
        p.t0 = t0, p.e = e, p.inner = inner, p.lora = &lora, p.gelu = gelu;
        const bool apart = gelu || lora.gate_up();  // gate|up to p.pre, activated by `activate`
        const int64_t slots = p.count * k;
        const int64_t* pick = chosen.data() + t0 * k;
        p.weight.assign(weight.begin() + t0 * k, weight.begin() + t0 * k + slots);
        // counting sort of the slots by expert: each expert's rows contiguous, in token order
        std::vector<int64_t> start(e + 1, 0);
        for (int64_t s = 0; s < slots; ++s) ++start[pick[s] + 1];
        for (int64_t i = 0; i < e; ++i) start[i + 1] += start[i];
        std::vector<int64_t> next(start.begin(), start.end() - 1);
        p.slot_row.resize(slots), p.row_token.resize(slots);
        for (int64_t s = 0; s < slots; ++s) {
          const int64_t r = next[pick[s]]++;
          p.slot_row[s] = r, p.row_token[r] = s / k;
        }
        p.xg.resize(slots * h), p.hg.resize(slots * inner), p.og.resize(slots * h);
        if (lora.gate_up() || lora.down.r) {
          p.row_expert.resize(slots);
          for (int64_t i = 0; i < e; ++i) std::fill(p.row_expert.begin() + start[i], p.row_expert.begin() + start[i + 1], i);
        }
        if (apart) p.pre.resize(slots * 2 * inner);
        parallel_for(ctx, gather, spans(slots), &p);
        std::vector<int64_t> used;
        for (int64_t i = 0; i < e; ++i)
          if (start[i + 1] > start[i]) used.push_back(i);
        // the busiest experts' tasks first: the last tasks to start are the short ones
        std::stable_sort(used.begin(), used.end(),
                         [&](int64_t a, int64_t b) { return start[a + 1] - start[a] > start[b + 1] - start[b]; });
        bool decode[2] = {false, false};
        for (int pass = 0; pass < 2; ++pass)
          for (const int64_t i : used) {
            const int64_t r0 = start[i], m = start[i + 1] - r0, width = pass == 0 ? h : inner;
            Job job{};
            job.w = (pass == 0 ? w1 : w2).of(i);
            job.x = (pass == 0 ? p.xg.data() : p.hg.data()) + r0 * width;
            // (apart: the rows' gate|up as they are, the delta and activation after)
            job.y = pass == 1 ? p.og.data() + r0 * h : apart ? p.pre.data() + r0 * 2 * inner : p.hg.data() + r0 * inner;
            job.m = m, job.swiglu = pass == 0 && !apart;
            job.prompt = flag == 0, job.generated = flag == 1;
            job.row_exact = exact_rows && flag == 1;
            decode[pass] = decode[pass] || (quantized() && job.decode_path());
            p.jobs.push_back(job);
          }
        const size_t half = p.jobs.size() / 2;
        for (int pass = 0; pass < 2; ++pass) {
          const int64_t width = pass == 0 ? h : inner;
          const float* in = pass == 0 ? p.xg.data() : p.hg.data();
          if (decode[pass]) {  // the pass's rows' block sums (and 4-bit split), where its decode jobs read them
            p.sums[pass].resize(slots * width / kBlock);
            p.split[pass].resize(bits == 4 ? slots * width : 0);
            decode_inputs(in, slots, width, p.sums[pass].data(), bits == 4 ? p.split[pass].data() : nullptr);
            for (size_t j = pass * half; j < (pass + 1) * half; ++j) {
              const int64_t r0 = (p.jobs[j].x - in) / width;
              p.jobs[j].xs = p.sums[pass].data() + r0 * (width / kBlock);
              p.jobs[j].xt = bits == 4 ? p.split[pass].data() + r0 * width : nullptr;
            }
          }
          p.tasks.clear();
          for (size_t j = pass * half; j < (pass + 1) * half; ++j)
            for (int64_t c = 0; c < chunks(p.jobs[j]); ++c) p.tasks.emplace_back(j, c);
          parallel_for(ctx, compute, p.tasks.size(), &p);  // a task's exception reaches the catch below
          if (pass == 0 ? apart : lora.down.r > 0)
            parallel_for(ctx, pass == 0 ? activate : lora_down, spans(slots), &p);
        }
        parallel_for(ctx, combine, spans(p.count), &p);
      }
      return nullptr;
    } catch (const std::exception& e) {
      return fail(e.what(), name);
    }
  }
};

// W: the experts' element type (float32, float16, bfloat16; uint8 for MoEBlockQuant's codes).
template <ONNXTensorElementDataType W>
struct MoEOp : Ort::CustomOpBase<MoEOp<W>, MoEKernel, true> {
  static constexpr bool kQuant = W == ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8;

  OrtStatusPtr CreateKernelV2(const OrtApi&, const OrtKernelInfo* info, void** kernel) const {
    try {
      Ort::ConstKernelInfo ki(info);
      const int64_t k = ki.GetAttribute<int64_t>("k");
      if (k < 1) return fail("k must be positive", GetName());
      const int64_t normalize = trtllm_cpu::attribute_or<int64_t>(ki, "normalize", 0);
      const int64_t bits = kQuant ? ki.GetAttribute<int64_t>("bits") : W == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT ? 32 : 16;
      if (kQuant && bits != 4 && bits != 8) return fail("bits must be 4 or 8", GetName());
      const bool exact_rows = trtllm_cpu::attribute_or<int64_t>(ki, "exact_rows", 0) != 0;
      const std::string activation = trtllm_cpu::attribute_or<std::string>(ki, "activation", "silu");
      if (activation != "silu" && activation != "gelu_tanh")
        return fail("activation must be silu or gelu_tanh, got " + activation, GetName());
      const std::string scoring = trtllm_cpu::attribute_or<std::string>(ki, "scoring", "softmax");
      if (scoring != "softmax" && scoring != "sigmoid")
        return fail("scoring must be softmax or sigmoid, got " + scoring, GetName());
      const float norm_min = trtllm_cpu::attribute_or<float>(ki, "norm_min", 0.0f);
      const float epsilon = trtllm_cpu::attribute_or<float>(ki, "norm_epsilon", scoring == "sigmoid" ? 1e-6f : 0.0f);
      if (!(norm_min >= 0.0f) || !(epsilon >= 0.0f)) return fail("norm_min and norm_epsilon must be >= 0", GetName());
      auto* made = new MoEKernel{k, normalize != 0, bits, W == ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16,
                                 exact_rows, activation == "gelu_tanh", scoring == "sigmoid", epsilon, norm_min,
                                 GetName(), {}, {}};
      for (size_t j = 0; j < (kQuant ? 6u : 2u); ++j)  // an input that is not a constant is read where it is
        made->copies[kQuant ? j : 3 * j].constant = trtllm_cpu::constant_input(ki, 2 + j);
      *kernel = made;
      return nullptr;
    } catch (const std::exception& e) {
      return fail(e.what(), GetName());
    }
  }
  const char* GetName() const { return kQuant ? kQuantName : kName; }
  const char* GetExecutionProviderType() const { return "CPUExecutionProvider"; }
  // float: x, logits, w1, w2, generated; MoEBlockQuant: x, logits, w1, w1_scale, w1_offset, w2,
  // w2_scale, w2_offset, generated (offsets optional at 8 bits; generated int64 [1], optional);
  // then both: LoRA's gate_a, gate_b, up_a, up_b, down_a, down_b, expert_scale, selection_bias (optional,
  // float32)
  static constexpr size_t kGenerated = kQuant ? 8 : 4;
  size_t GetInputTypeCount() const { return kGenerated + 9; }  // (LoRA's 6, expert_scale, selection_bias)
  ONNXTensorElementDataType GetInputType(size_t i) const {
    if (i < 2 || i > kGenerated) return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
    if (i == kGenerated) return ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64;
    return kQuant && i != 2 && i != 5 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16 : W;
  }
  OrtCustomOpInputOutputCharacteristic GetInputCharacteristic(size_t i) const {
    const bool optional = i >= kGenerated || (kQuant && (i == 4 || i == 7));
    return optional ? INPUT_OUTPUT_OPTIONAL : INPUT_OUTPUT_REQUIRED;
  }
  size_t GetOutputTypeCount() const { return 1; }
  ONNXTensorElementDataType GetOutputType(size_t) const { return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT; }
};

}  // namespace

namespace trtllm_cpu {
OrtCustomOp* moe_op() {
  static MoEOp<ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT> op;
  return &op;
}
OrtCustomOp* moe_half_op() {
  static MoEOp<ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16> op;
  return &op;
}
OrtCustomOp* moe_bf16_op() {
  static MoEOp<ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16> op;
  return &op;
}
OrtCustomOp* moe_block_quant_op() {
  static MoEOp<ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8> op;
  return &op;
}
}  // namespace trtllm_cpu
