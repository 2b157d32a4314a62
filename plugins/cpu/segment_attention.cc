// trtllm.cpu::SegmentAttention: a vision encoder's attention in one node: the rotary of each row's q
// and k heads, then bidirectional multi-head attention within segments of a packed sequence (Qwen-VL's
// windows and images: every image of a run, or every window of it, is one run of rows).
//
// Why: ONNX's Attention (ONNX Runtime's kernel for it) computes each head's whole [P, P] score matrix
// at once, a block-diagonal mask over it: its memory grows with the square of an image's patches (an
// image of Qwen2.5-VL's default max_pixels, 65,536 patches, would take 256 GiB) and most of its work
// is masked out. This kernel streams each segment's keys past a block of queries with an online
// softmax (flash attention's), so its memory is linear in P and it computes only what a row sees.
//
// Inputs:  0 qkv [P, 3 H D] float32: each row's q heads, then k heads, then v heads (a fused qkv
//            projection's output, as transformers' Qwen-VL encoders lay it out)
//          1 cos, 2 sin [P, R / 2] float32, optional (both or neither): rotate_half rotary on the first
//            R <= D dimensions of each q and k head at its row's angles (x[i] cos - x[i + R/2] sin,
//            x[i + R/2] cos + x[i] sin), the rest unrotated
//          3 segment_ids [P] int64: row i attends to the run of consecutive rows whose id is its own
// Output:  y [P, H D] float32: each row's heads side by side (the output projection's input)
// Attributes: num_heads H, scale (0: 1 / sqrt(D)).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "common.h"

namespace {

constexpr int64_t kRows = 132;  // query rows per task (kMicro x 44): they share each read of their segment's keys and values
constexpr int64_t kChunk = 64;   // keys per step of the online softmax (8 vectors of 8)
constexpr int kMicro = 3;        // query rows computed together (registers: 3 x 4 sums)

OrtStatusPtr fail(const std::string& message) {
  return Ort::GetApi().CreateStatus(ORT_INVALID_ARGUMENT, ("trtllm.cpu::SegmentAttention: " + message).c_str());
}

// A task: query rows q0 .. q1 - 1 of head h, whose segment is rows s0 .. s1 - 1.
struct Task {
  int64_t s0, s1, q0, q1, h;
};

struct Job {
  int64_t p, h, d, half;  // half: the rotary tables' width (0: no rotary)
  const float* qkv;
  const float* cos;
  const float* sin;
  float scale;
  // The keys, rotated, 8 rows interleaved: head h's rows 8 b .. 8 b + 7 are kt[((h nb + b) D + i) 8 + lane]
  // (a vector of 8 keys' dimension i), nb blocks a head, zeros past P (read, then masked out)
  float* kt;
  int64_t nb;
  float* v;  // the values, head by head: head h's row j is v[(h P + j) D + i] (the next key's, D floats on)
  const std::vector<Task>* tasks;
  float* y;
};

// Task t of the prepass: head t / nb's keys of block t % nb, rotated into kt, and their values into v.
void keys_task(void* data, size_t t) {
  const Job& job = *static_cast<const Job*>(data);
  const int64_t h = static_cast<int64_t>(t) / job.nb, b = static_cast<int64_t>(t) % job.nb, d = job.d;
  const int64_t width = 3 * job.h * d;
  float* block = job.kt + (h * job.nb + b) * d * 8;
  thread_local std::vector<float> row;
  row.resize(d);
  for (int64_t lane = 0; lane < 8; ++lane) {
    const int64_t j = b * 8 + lane;
    if (j >= job.p) {
      for (int64_t i = 0; i < d; ++i) block[i * 8 + lane] = 0.0f;
      continue;
    }
    const float* k = job.qkv + j * width + (job.h + h) * d;
    trtllm_cpu::rotary(k, job.cos + j * job.half, job.sin + j * job.half, d, 2 * job.half, 1.0f, row.data());
    for (int64_t i = 0; i < d; ++i) block[i * 8 + lane] = row[i];
    std::memcpy(job.v + (h * job.p + j) * d, k + job.h * d, d * sizeof(float));
  }
}

// The query rows of a task, rotated and scaled: q[r][0:D].
void queries(const Job& job, const Task& t, float* q) {
  const int64_t width = 3 * job.h * job.d;
  for (int64_t i = t.q0; i < t.q1; ++i)
    trtllm_cpu::rotary(job.qkv + i * width + t.h * job.d, job.cos + i * job.half, job.sin + i * job.half, job.d,
                       2 * job.half, job.scale, q + (i - t.q0) * job.d);
}

// Portable: each row's scores over its segment (8 keys at a time, as kt holds them: loops the compiler
// vectorizes on any CPU), softmax, the weighted sum of values.
void task_generic(const Job& job, const Task& t) {
  const int64_t d = job.d;
  thread_local std::vector<float> q, scores;
  q.resize(kRows * d);
  scores.resize(t.s1 - t.s0 + 16);
  queries(job, t, q.data());
  const float* kt = job.kt + t.h * job.nb * d * 8;
  const int64_t first = t.s0 / 8 * 8;  // scores[j - first] for key j (the block that holds s0 on)
  for (int64_t i = t.q0; i < t.q1; ++i) {
    const float* qi = q.data() + (i - t.q0) * d;
    for (int64_t j0 = first; j0 < t.s1; j0 += 8) {
      const float* kb = kt + (j0 / 8) * d * 8;
      float acc[8] = {};
      for (int64_t c = 0; c < d; ++c)
        for (int l = 0; l < 8; ++l) acc[l] += qi[c] * kb[c * 8 + l];
      std::memcpy(scores.data() + (j0 - first), acc, sizeof acc);
    }
    float* row = scores.data() + (t.s0 - first);  // the segment's keys
    const int64_t n = t.s1 - t.s0;
    const float top = *std::max_element(row, row + n);
    float total = 0.0f;
    for (int64_t j = 0; j < n; ++j) total += row[j] = std::exp(row[j] - top);
    float* out = job.y + i * job.h * d + t.h * d;
    std::fill(out, out + d, 0.0f);
    for (int64_t j = 0; j < n; ++j) {
      const float w = row[j] / total;
      const float* v = job.v + (t.h * job.p + t.s0 + j) * d;
      for (int64_t c = 0; c < d; ++c) out[c] += w * v[c];
    }
  }
}

#ifdef TRTLLM_X86
#define AVX2 TRTLLM_AVX2
using trtllm_cpu::exp_avx2;
using trtllm_cpu::lanes_avx2;
using trtllm_cpu::max_avx2;
using trtllm_cpu::sum_avx2;

// Scores of kMicro query rows (q: D apart) against NV vectors of 8 keys (kt: their first block of 8),
// stored at out[r][8 v + lane] (rows kChunk apart). kMicro x NV sums, kMicro broadcasts and a key vector
// fill AVX2's 16 registers. D = 8 ND (ND 0: d, known at run time only).
template <int ND, int NV>
AVX2 inline void scores_avx2(const float* q, const float* kt, int64_t d_run, float* out) {
  const int64_t d = ND ? 8 * ND : d_run;
  __m256 s[kMicro][NV];
#pragma GCC unroll 4
  for (int r = 0; r < kMicro; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) s[r][v] = _mm256_setzero_ps();
#pragma GCC unroll 8
  for (int64_t i = 0; i < d; ++i) {
    __m256 x[kMicro];
#pragma GCC unroll 4
    for (int r = 0; r < kMicro; ++r) x[r] = _mm256_broadcast_ss(q + r * d + i);
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      const __m256 k = _mm256_loadu_ps(kt + (v * d + i) * 8);
#pragma GCC unroll 4
      for (int r = 0; r < kMicro; ++r) s[r][v] = _mm256_fmadd_ps(x[r], k, s[r][v]);
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < kMicro; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) _mm256_storeu_ps(out + r * kChunk + 8 * v, s[r][v]);
}

// o[r][0 .. 8 G) = o[r] * corr[r] + sum over keys j0 .. j1 - 1 of p[r][j - base] v_j, for kMicro rows
// (v_j: a row `stride` floats after the last; o's rows D apart).
template <int G>
AVX2 inline void weigh_avx2(float* o, int64_t d, const float* corr, const float* p, int64_t base, const float* v,
                            int64_t stride, int64_t j0, int64_t j1) {
  __m256 acc[kMicro][G];
#pragma GCC unroll 4
  for (int r = 0; r < kMicro; ++r) {
    const __m256 c = _mm256_set1_ps(corr[r]);
#pragma GCC unroll 4
    for (int i = 0; i < G; ++i) acc[r][i] = _mm256_mul_ps(_mm256_loadu_ps(o + r * d + 8 * i), c);
  }
  for (int64_t j = j0; j < j1; ++j) {
    __m256 w[kMicro];
#pragma GCC unroll 4
    for (int r = 0; r < kMicro; ++r) w[r] = _mm256_broadcast_ss(p + r * kChunk + j - base);
    const float* vj = v + j * stride;
#pragma GCC unroll 4
    for (int i = 0; i < G; ++i) {
      const __m256 x = _mm256_loadu_ps(vj + 8 * i);
#pragma GCC unroll 4
      for (int r = 0; r < kMicro; ++r) acc[r][i] = _mm256_fmadd_ps(w[r], x, acc[r][i]);
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < kMicro; ++r)
#pragma GCC unroll 4
    for (int i = 0; i < G; ++i) _mm256_storeu_ps(o + r * d + 8 * i, acc[r][i]);
}

// One task, D = 8 ND (ND 0: any multiple of 8, known at run time): its keys in chunks of kChunk (from
// the 8-row block that holds s0), each chunk met by every query row of the task (kMicro at a time)
// before the next, so the chunk stays in cache: scores into p, their online softmax, then the values.
template <int ND>
AVX2 void task_avx2(const Job& job, const Task& t) {
  const int64_t d = ND ? 8 * ND : job.d, n = t.q1 - t.q0, padded = (n + kMicro - 1) / kMicro * kMicro;
  thread_local std::vector<float> q, o, top, total, p, corr;
  q.assign(padded * d, 0.0f);  // (rows past n: zeros, computed and dropped)
  o.assign(padded * d, 0.0f);
  top.assign(padded, -INFINITY);
  total.assign(padded, 0.0f);
  p.resize(kMicro * kChunk);
  corr.resize(padded);
  queries(job, t, q.data());
  const float* kt = job.kt + t.h * job.nb * d * 8;
  const float* values = job.v + t.h * job.p * d;
  const int64_t stride = d;
  for (int64_t j0 = t.s0 / 8 * 8; j0 < t.s1; j0 += kChunk) {
    const int64_t nv = std::min<int64_t>(kChunk / 8, (t.s1 - j0 + 7) / 8);  // vectors of 8 keys
    const int64_t lo = std::max(j0, t.s0), hi = std::min(j0 + kChunk, t.s1);  // the chunk's keys of the segment
    const float* kb = kt + (j0 / 8) * d * 8;
    for (int64_t r0 = 0; r0 < padded; r0 += kMicro) {
      const float* qr = q.data() + r0 * d;
      for (int64_t v = 0; v < nv; v += 4) {
        float* out = p.data() + 8 * v;
        switch (std::min<int64_t>(4, nv - v)) {
          case 4: scores_avx2<ND, 4>(qr, kb + v * d * 8, d, out); break;
          case 3: scores_avx2<ND, 3>(qr, kb + v * d * 8, d, out); break;
          case 2: scores_avx2<ND, 2>(qr, kb + v * d * 8, d, out); break;
          default: scores_avx2<ND, 1>(qr, kb + v * d * 8, d, out); break;
        }
      }
      for (int r = 0; r < kMicro; ++r) {
        float* row = p.data() + r * kChunk;
        __m256 most = _mm256_set1_ps(-INFINITY);
        for (int64_t v = 0; v < nv; ++v)
          most = _mm256_max_ps(most, _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), _mm256_loadu_ps(row + 8 * v),
                                                      lanes_avx2(j0 + 8 * v, t.s0, t.s1)));
        const float old = top[r0 + r], now = std::max(old, max_avx2(most));
        const __m256 shift = _mm256_set1_ps(now);
        __m256 sum = _mm256_setzero_ps();
        for (int64_t v = 0; v < nv; ++v) {  // (a key outside the segment weighs exactly 0)
          const __m256 e = _mm256_and_ps(lanes_avx2(j0 + 8 * v, t.s0, t.s1),
                                         exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(row + 8 * v), shift)));
          sum = _mm256_add_ps(sum, e);
          _mm256_storeu_ps(row + 8 * v, e);
        }
        corr[r0 + r] = std::exp(old - now);  // (0 at the first chunk: old is -inf)
        total[r0 + r] = total[r0 + r] * corr[r0 + r] + sum_avx2(sum);
        top[r0 + r] = now;
      }
      for (int64_t c = 0; c < d; c += 32) {  // the output's dimensions 32 at a time (kMicro x 4 sums)
        float* oc = o.data() + r0 * d + c;
        switch (std::min<int64_t>(4, (d - c) / 8)) {
          case 4: weigh_avx2<4>(oc, d, corr.data() + r0, p.data(), j0, values + c, stride, lo, hi); break;
          case 3: weigh_avx2<3>(oc, d, corr.data() + r0, p.data(), j0, values + c, stride, lo, hi); break;
          case 2: weigh_avx2<2>(oc, d, corr.data() + r0, p.data(), j0, values + c, stride, lo, hi); break;
          default: weigh_avx2<1>(oc, d, corr.data() + r0, p.data(), j0, values + c, stride, lo, hi); break;
        }
      }
    }
  }
  for (int64_t r = 0; r < n; ++r) {
    const __m256 inv = _mm256_set1_ps(1.0f / total[r]);
    float* out = job.y + (t.q0 + r) * job.h * d + t.h * d;
    for (int64_t c = 0; c < d; c += 8) _mm256_storeu_ps(out + c, _mm256_mul_ps(_mm256_loadu_ps(o.data() + r * d + c), inv));
  }
}

// The task for this head size: D a compile-time constant for the common ones (its loops unrolled).
AVX2 void task_avx2_any(const Job& job, const Task& t) {
  switch (job.d) {
    case 64: return task_avx2<8>(job, t);
    case 80: return task_avx2<10>(job, t);
    case 128: return task_avx2<16>(job, t);
    default: return task_avx2<0>(job, t);
  }
}
#undef AVX2
#endif

void run_task(void* data, size_t i) {
  const Job& job = *static_cast<const Job*>(data);
  const Task& t = (*job.tasks)[i];
#ifdef TRTLLM_X86
  if (trtllm_cpu::use_avx2() && job.d % 8 == 0) return task_avx2_any(job, t);
#endif
  task_generic(job, t);
}

struct Kernel {
  int64_t h;
  float scale;

  OrtStatusPtr ComputeV2(OrtKernelContext* raw) {
    try {
      Ort::KernelContext ctx(raw);
      auto qkv = ctx.GetInput(0);
      const auto qs = qkv.GetTensorTypeAndShapeInfo().GetShape();
      if (qs.size() != 2 || qs[1] % (3 * h) != 0 || qs[1] == 0)
        return fail("qkv must be [rows, 3 x num_heads " + std::to_string(h) + " x head_size]");
      const int64_t p = qs[0], d = qs[1] / (3 * h);
      auto cos = trtllm_cpu::optional_input(ctx, 1), sin = trtllm_cpu::optional_input(ctx, 2);
      if (bool(cos) != bool(sin)) return fail("cos and sin come together");
      int64_t half = 0;
      if (cos) {
        const auto cs = cos.GetTensorTypeAndShapeInfo().GetShape();
        if (cs.size() != 2 || cs[0] != p || cs[1] < 1 || cs[1] * 2 > d)
          return fail("cos must be [rows " + std::to_string(p) + ", R / 2] with 2 <= R <= head_size " + std::to_string(d));
        if (sin.GetTensorTypeAndShapeInfo().GetShape() != cs) return fail("sin must have cos's shape");
        half = cs[1];
      }
      auto ids = ctx.GetInput(3);
      if (ids.GetTensorTypeAndShapeInfo().GetShape() != std::vector<int64_t>{p})
        return fail("segment_ids must be [rows " + std::to_string(p) + "]");
      auto y = ctx.GetOutput(0, {p, h * d});
      if (p == 0) return nullptr;
      const int64_t* id = ids.GetTensorData<int64_t>();
      std::vector<Task> tasks;
      for (int64_t s0 = 0, s1; s0 < p; s0 = s1) {
        for (s1 = s0 + 1; s1 < p && id[s1] == id[s0];) ++s1;
        for (int64_t head = 0; head < h; ++head)
          for (int64_t q0 = s0; q0 < s1; q0 += kRows) tasks.push_back({s0, s1, q0, std::min(s1, q0 + kRows), head});
      }
      const int64_t nb = (p + 7) / 8;
      std::vector<float> kt(static_cast<size_t>(h * nb * d * 8)), v(static_cast<size_t>(h * p * d));
      const float zero = 0.0f;  // (no rotary: a row's tables are never read)
      Job job{p, h, d, half, qkv.GetTensorData<float>(), cos ? cos.GetTensorData<float>() : &zero,
              sin ? sin.GetTensorData<float>() : &zero, scale > 0 ? scale : 1.0f / std::sqrt(static_cast<float>(d)),
              kt.data(), nb, v.data(), &tasks, y.GetTensorMutableData<float>()};
      trtllm_cpu::parallel_for(ctx, keys_task, static_cast<size_t>(h * nb), &job);
      trtllm_cpu::parallel_for(ctx, run_task, tasks.size(), &job);
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
      const int64_t h = ki.GetAttribute<int64_t>("num_heads");
      const float scale = trtllm_cpu::attribute_or<float>(ki, "scale", 0.0f);  // 0: 1 / sqrt(D)
      if (h < 1) return fail("num_heads must be >= 1");
      if (!(scale >= 0.0f) || std::isinf(scale)) return fail("scale must be a finite number >= 0 (0: 1 / sqrt(D))");
      *kernel = new Kernel{h, scale};
      return nullptr;
    } catch (const std::exception& e) {
      return fail(e.what());
    }
  }
  const char* GetName() const { return "SegmentAttention"; }
  const char* GetExecutionProviderType() const { return "CPUExecutionProvider"; }
  size_t GetInputTypeCount() const { return 4; }
  ONNXTensorElementDataType GetInputType(size_t i) const {
    return i == 3 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64 : ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
  }
  OrtCustomOpInputOutputCharacteristic GetInputCharacteristic(size_t i) const {
    return i == 1 || i == 2 ? INPUT_OUTPUT_OPTIONAL : INPUT_OUTPUT_REQUIRED;  // cos, sin
  }
  size_t GetOutputTypeCount() const { return 1; }
  ONNXTensorElementDataType GetOutputType(size_t) const { return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT; }
};

}  // namespace

namespace trtllm_cpu {
OrtCustomOp* segment_attention_op() {
  static Op op;
  return &op;
}
}  // namespace trtllm_cpu
