// trtllm.cpu::LoraAdd: a fused projection's output plus its modules' LoRA deltas,
// y + (x @ a_j) @ b_j in the columns [lo_j, hi_j) of each module j, optionally then SwiGLU.
//
// Why: as standard ops each module's delta is two MatMuls, and the projection adds a Concat and an
// Add: 20 nodes a layer. On the demo model that made a LoRA engine without any adapter 18% slower
// at batch 1 (node overhead, and ONNX Runtime's MatMul on a skinny [1, K, r] operand), and one with
// a rank-16 adapter on every projection 39% slower. This node reads each adapter matrix once per
// step and skips modules of rank 0.
//
// Inputs:  y [B, S, N] float32 (the fused projection); x [B, S, K] float32 (its input); then per
//          module a_j [n, K, r_j] and b_j [n, r_j, hi_j - lo_j] float32, where n = 1 (one adapter
//          for the batch) or B (row b uses a_j[b], b_j[b]). Up to 3 modules (q|k|v).
// Output:  [B, S, N]; or, as trtllm.cpu::LoraAddSwiglu, silu(gate) * up of the sum, [B, S, N / 2]
//          (gate columns first).
// Attributes: columns [lo_0, hi_0, lo_1, hi_1, ...] (adjacent, from 0 to N).
//
// Decode (<= 16 rows): one dispatch of (module, part of K) tasks, the last of a module's adding
// t @ b_j (module_task). Longer inputs: t_j = x @ a_j in parts of K, the parts added together, then
// per chunk of output columns out = y + t_j @ b_j, reading each b_j chunk once per row from L1.
// SwiGLU, when asked, is one more pass (on the calling thread when small).
#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "matmul.h"

namespace {

using trtllm_cpu::matmul::fail;

constexpr char kName[] = "LoraAdd";
constexpr char kSwigluName[] = "LoraAddSwiglu";
constexpr int kMaxModules = 3;
constexpr int64_t kColumns = 128;  // output columns per phase-2 task (8 zmm accumulators)
constexpr int64_t kPartK = 128;    // inputs per phase-1 part
// Below this many floats of work (adapter matrices read, output written), the tasks run on the
// calling thread: waking ONNX Runtime's pool costs microseconds, as much as a decode step's copy.
constexpr int64_t kParallelFloats = 32 * 1024;
constexpr int64_t kFewRows = 16;  // up to this many rows (decode): one dispatch, see module_task
constexpr int64_t kMaxParts = 2;  // K is split in at most this many parts (tasks per module)

// The two products, for g <= 4 rows at once (rows that share an adapter share each load of it):
//   xa: t[i][0:r] += sum_k x[i][k] a[k][0:r]   (x rows ldx apart, t rows r apart)
//   tb: y[i][0:c] += sum_q t[i][q] b[q][0:c]   (t rows r apart, y rows ldy apart, b rows ldb apart)
using XaFn = void (*)(const float* x, int64_t ldx, const float* a, int64_t k_count, int64_t r, float* t);
using TbFn = void (*)(const float* t, const float* b, int64_t r, int64_t ldb, int64_t c, float* y, int64_t ldy);
constexpr int kGroup = 4;

// Each sum in two chains of k (k mod 2, an odd k's last term in the first), added to t at the end, as
// xa_avx512 sums: one running sum over k left GLM's LoRA logits 2.8e-4 from PEFT's, past the 1e-4
// the AVX-512 path keeps.
template <int G>
void xa_generic(const float* x, int64_t ldx, const float* a, int64_t k_count, int64_t r, float* t) {
  thread_local std::vector<float> chains;
  chains.resize(2 * r);
  for (int i = 0; i < G; ++i) {
    std::fill(chains.begin(), chains.end(), 0.0f);
    for (int64_t k = 0; k < k_count; ++k) {
      float* chain = chains.data() + (k % 2 && k < k_count - k_count % 2 ? r : 0);
      for (int64_t q = 0; q < r; ++q) chain[q] += x[i * ldx + k] * a[k * r + q];
    }
    for (int64_t q = 0; q < r; ++q) t[i * r + q] = (t[i * r + q] + chains[q]) + chains[r + q];
  }
}

template <int G>
void tb_generic(const float* t, const float* b, int64_t r, int64_t ldb, int64_t c, float* y, int64_t ldy) {
  for (int i = 0; i < G; ++i)
    for (int64_t q = 0; q < r; ++q)
      for (int64_t j = 0; j < c; ++j) y[i * ldy + j] += t[i * r + q] * b[q * ldb + j];
}

#ifdef TRTLLM_X86
inline __mmask16 tail_mask(int64_t left) {
  return left >= 16 ? 0xFFFF : left <= 0 ? 0 : static_cast<__mmask16>((1u << left) - 1);
}

// 32 ranks at a time (2 vectors, masked), each row's sum split in C chains of k (k mod C): short
// dependency chains, and less rounding than one long sum (the logit error against PEFT fell 3x).
// C is the same for every G, so a row's sum is the same however many rows share the call.
template <int G>
__attribute__((target("avx512f,avx512bw,avx512vl,fma"))) void xa_avx512(const float* x, int64_t ldx, const float* a,
                                                                         int64_t k_count, int64_t r, float* t) {
  constexpr int C = 2;
  for (int64_t q0 = 0; q0 < r; q0 += 32) {
    const __mmask16 mask[2] = {tail_mask(r - q0), tail_mask(r - q0 - 16)};
    __m512 acc[G][2][C];
    for (int i = 0; i < G; ++i)
      for (int v = 0; v < 2; ++v)
        for (int c = 0; c < C; ++c) acc[i][v][c] = _mm512_setzero_ps();
    // (a macro, not a lambda: a lambda does not take this function's target attribute)
#define TRTLLM_XA_STEP(kk, c)                                                                             \
  {                                                                                                       \
    const float* row = a + (kk) * r + q0;                                                                 \
    const __m512 a0 = _mm512_maskz_loadu_ps(mask[0], row), a1 = _mm512_maskz_loadu_ps(mask[1], row + 16); \
    for (int i = 0; i < G; ++i) {                                                                         \
      const __m512 xk = _mm512_set1_ps(x[i * ldx + (kk)]);                                                \
      acc[i][0][c] = _mm512_fmadd_ps(xk, a0, acc[i][0][c]);                                               \
      acc[i][1][c] = _mm512_fmadd_ps(xk, a1, acc[i][1][c]);                                               \
    }                                                                                                     \
  }
    int64_t k = 0;
    for (; k + C <= k_count; k += C)
      for (int c = 0; c < C; ++c) TRTLLM_XA_STEP(k + c, c)
    for (; k < k_count; ++k) TRTLLM_XA_STEP(k, 0)
#undef TRTLLM_XA_STEP
    for (int i = 0; i < G; ++i)
      for (int v = 0; v < 2; ++v) {
        __m512 sum = _mm512_maskz_loadu_ps(mask[v], t + i * r + q0 + 16 * v);
        for (int c = 0; c < C; ++c) sum = _mm512_add_ps(sum, acc[i][v][c]);
        _mm512_mask_storeu_ps(t + i * r + q0 + 16 * v, mask[v], sum);
      }
  }
}

// 64 columns at a time (4 vectors, masked): each load of b serves the G rows.
template <int G>
__attribute__((target("avx512f,avx512bw,avx512vl,fma"))) void tb_avx512(const float* t, const float* b, int64_t r,
                                                                         int64_t ldb, int64_t c, float* y, int64_t ldy) {
  for (int64_t c0 = 0; c0 < c; c0 += 64) {
    __mmask16 mask[4];
    __m512 acc[G][4];
    for (int v = 0; v < 4; ++v) {
      mask[v] = tail_mask(c - c0 - 16 * v);
      for (int i = 0; i < G; ++i) acc[i][v] = _mm512_maskz_loadu_ps(mask[v], y + i * ldy + c0 + 16 * v);
    }
    for (int64_t q = 0; q < r; ++q) {
      const float* row = b + q * ldb + c0;
      __m512 bv[4];
      for (int v = 0; v < 4; ++v) bv[v] = _mm512_maskz_loadu_ps(mask[v], row + 16 * v);
      for (int i = 0; i < G; ++i) {
        const __m512 tq = _mm512_set1_ps(t[i * r + q]);
        for (int v = 0; v < 4; ++v) acc[i][v] = _mm512_fmadd_ps(tq, bv[v], acc[i][v]);
      }
    }
    for (int i = 0; i < G; ++i)
      for (int v = 0; v < 4; ++v) _mm512_mask_storeu_ps(y + i * ldy + c0 + 16 * v, mask[v], acc[i][v]);
  }
}

// The AVX-512 kernels in 8 lanes, where AVX-512 is not (a row sums as there: the same chains of k,
// each term one fused multiply-add): xa 8 or 16 ranks at a time, tb 16 columns, accumulators for up
// to 4 rows within 16 registers.
template <int G>
TRTLLM_AVX2 void xa_avx2(const float* x, int64_t ldx, const float* a, int64_t k_count, int64_t r, float* t) {
  constexpr int C = 2, V = G <= 2 ? 2 : 1;  // 8 V ranks at a time: G x V x C accumulators
  for (int64_t q0 = 0; q0 < r; q0 += 8 * V) {
    __m256i mask[V];
    __m256 acc[G][V][C];
    for (int v = 0; v < V; ++v) mask[v] = _mm256_castps_si256(trtllm_cpu::lanes_avx2(q0 + 8 * v, 0, r));
    for (int i = 0; i < G; ++i)
      for (int v = 0; v < V; ++v)
        for (int c = 0; c < C; ++c) acc[i][v][c] = _mm256_setzero_ps();
#define TRTLLM_XA_STEP(kk, c)                                                                  \
  {                                                                                            \
    __m256 av[V];                                                                              \
    for (int v = 0; v < V; ++v) av[v] = _mm256_maskload_ps(a + (kk) * r + q0 + 8 * v, mask[v]); \
    for (int i = 0; i < G; ++i) {                                                              \
      const __m256 xk = _mm256_set1_ps(x[i * ldx + (kk)]);                                     \
      for (int v = 0; v < V; ++v) acc[i][v][c] = _mm256_fmadd_ps(xk, av[v], acc[i][v][c]);     \
    }                                                                                          \
  }
    int64_t k = 0;
    for (; k + C <= k_count; k += C)
      for (int c = 0; c < C; ++c) TRTLLM_XA_STEP(k + c, c)
    for (; k < k_count; ++k) TRTLLM_XA_STEP(k, 0)
#undef TRTLLM_XA_STEP
    for (int i = 0; i < G; ++i)
      for (int v = 0; v < V; ++v) {
        __m256 sum = _mm256_maskload_ps(t + i * r + q0 + 8 * v, mask[v]);
        for (int c = 0; c < C; ++c) sum = _mm256_add_ps(sum, acc[i][v][c]);
        _mm256_maskstore_ps(t + i * r + q0 + 8 * v, mask[v], sum);
      }
  }
}

template <int G>
TRTLLM_AVX2 void tb_avx2(const float* t, const float* b, int64_t r, int64_t ldb, int64_t c, float* y, int64_t ldy) {
  for (int64_t c0 = 0; c0 < c; c0 += 16) {
    __m256i mask[2];
    __m256 acc[G][2];
    for (int v = 0; v < 2; ++v) {
      mask[v] = _mm256_castps_si256(trtllm_cpu::lanes_avx2(c0 + 8 * v, 0, c));
      for (int i = 0; i < G; ++i) acc[i][v] = _mm256_maskload_ps(y + i * ldy + c0 + 8 * v, mask[v]);
    }
    for (int64_t q = 0; q < r; ++q) {
      const __m256 b0 = _mm256_maskload_ps(b + q * ldb + c0, mask[0]), b1 = _mm256_maskload_ps(b + q * ldb + c0 + 8, mask[1]);
      for (int i = 0; i < G; ++i) {
        const __m256 tq = _mm256_set1_ps(t[i * r + q]);
        acc[i][0] = _mm256_fmadd_ps(tq, b0, acc[i][0]);
        acc[i][1] = _mm256_fmadd_ps(tq, b1, acc[i][1]);
      }
    }
    for (int i = 0; i < G; ++i)
      for (int v = 0; v < 2; ++v) _mm256_maskstore_ps(y + i * ldy + c0 + 8 * v, mask[v], acc[i][v]);
  }
}
#endif

struct Kernels {
  XaFn xa[kGroup];
  TbFn tb[kGroup];
};

Kernels kernels() {
#ifdef TRTLLM_X86
  if (trtllm_cpu::use_avx512())
    return {{xa_avx512<1>, xa_avx512<2>, xa_avx512<3>, xa_avx512<4>}, {tb_avx512<1>, tb_avx512<2>, tb_avx512<3>, tb_avx512<4>}};
  if (trtllm_cpu::use_avx2())
    return {{xa_avx2<1>, xa_avx2<2>, xa_avx2<3>, xa_avx2<4>}, {tb_avx2<1>, tb_avx2<2>, tb_avx2<3>, tb_avx2<4>}};
#endif
  return {{xa_generic<1>, xa_generic<2>, xa_generic<3>, xa_generic<4>},
          {tb_generic<1>, tb_generic<2>, tb_generic<3>, tb_generic<4>}};
}

struct Module {
  const float *a, *b;
  int64_t r, lo, hi, a_step, b_step;  // a_step / b_step: floats from one batch row's matrix to the next (0: shared)
  int64_t t_offset;                   // where its partial sums start in Job::t
};

struct Job {
  const float *x, *y;
  float* sum;  // y + deltas: the output, or with swiglu the scratch it is taken from
  int64_t rows, seq, k, n, parts, part_k;  // K in `parts` parts of part_k inputs
  std::vector<Module> modules;  // those of rank > 0
  std::vector<Module> ranges;   // every module, rank 0 too (a, b null)
  std::vector<float> t;  // per module: [parts][rows][r]
  std::vector<std::pair<size_t, int64_t>> tasks;   // few rows: (range, part of K, or -1: copy y only)
  std::unique_ptr<std::atomic<int64_t>[]> left;  // few rows: per range, parts still running
  Kernels fn;
};

// How many rows from `row` on (at most kGroup) go through xa / tb together: all share a shared
// adapter; per-row adapters are shared by the S rows of one batch row only.
int64_t group(const Job& job, const Module& mod, int64_t row) {
  int64_t g = std::min<int64_t>(kGroup, job.rows - row);
  return mod.a_step ? std::min(g, job.seq - row % job.seq) : g;
}

// Rows [row, row + g) of a module's t: its parts summed, into `t` [g][r].
void sum_parts(const Job& job, const Module& mod, int64_t row, int64_t g, float* t) {
  std::fill(t, t + g * mod.r, 0.0f);
  for (int64_t part = 0; part < job.parts; ++part) {
    const float* tp = job.t.data() + mod.t_offset + (part * job.rows + row) * mod.r;
    for (int64_t q = 0; q < g * mod.r; ++q) t[q] += tp[q];
  }
}

// Rows [row, row + g) of x's part of K starting at k0, into that part's t.
void part_xa(Job& job, const Module& mod, int64_t part, int64_t row, int64_t g) {
  const int64_t k0 = part * job.part_k, count = std::min(job.part_k, job.k - k0);
  float* t = job.t.data() + mod.t_offset + (part * job.rows + row) * mod.r;
  std::fill(t, t + g * mod.r, 0.0f);
  job.fn.xa[g - 1](job.x + row * job.k + k0, job.k, mod.a + (row / job.seq) * mod.a_step + k0 * mod.r, count, mod.r, t);
}

// Phase 1, one task per (module, part of K): t_j[part][row] = x[row, part] @ a_j[part rows].
void phase_xa(void* data, size_t task) {
  Job& job = *static_cast<Job*>(data);
  const Module& mod = job.modules[task / job.parts];
  const int64_t part = static_cast<int64_t>(task % job.parts);
  for (int64_t row = 0, g; row < job.rows; row += g) part_xa(job, mod, part, row, g = group(job, mod, row));
}

constexpr int64_t kReduceRows = 64;  // rows per task adding the parts of t together

// Between the phases, one task per kReduceRows rows: each module's parts of t added into part 0
// (once, not again in every column task).
void phase_reduce(void* data, size_t task) {
  Job& job = *static_cast<Job*>(data);
  const int64_t r0 = static_cast<int64_t>(task) * kReduceRows, r1 = std::min(r0 + kReduceRows, job.rows);
  for (const Module& mod : job.modules) {
    float* t0 = job.t.data() + mod.t_offset + r0 * mod.r;
    for (int64_t part = 1; part < job.parts; ++part) {
      const float* tp = job.t.data() + mod.t_offset + (part * job.rows + r0) * mod.r;
      for (int64_t q = 0; q < (r1 - r0) * mod.r; ++q) t0[q] += tp[q];
    }
  }
}

// Phase 2, one task per kColumns output columns: sum = y + t_j @ b_j there (t_j in part 0).
void phase_tb(void* data, size_t task) {
  Job& job = *static_cast<Job*>(data);
  const int64_t c0 = static_cast<int64_t>(task) * kColumns, c1 = std::min(c0 + kColumns, job.n);
  for (int64_t row = 0; row < job.rows; ++row)
    std::memcpy(job.sum + row * job.n + c0, job.y + row * job.n + c0, (c1 - c0) * sizeof(float));
  for (const Module& mod : job.modules) {
    const int64_t lo = std::max(c0, mod.lo), hi = std::min(c1, mod.hi);
    if (lo >= hi) continue;
    for (int64_t row = 0, g; row < job.rows; row += g) {
      g = group(job, mod, row);
      const float* b = mod.b + (row / job.seq) * mod.b_step + (lo - mod.lo);
      job.fn.tb[g - 1](job.t.data() + mod.t_offset + row * mod.r, b, mod.r, mod.hi - mod.lo, hi - lo,
                       job.sum + row * job.n + lo, job.n);
    }
  }
}

// Few rows (decode), one dispatch a node (two cost more than a decode step's work): a task per
// (module, part of K) makes that part's t = x @ a_j, and whichever finishes a module's last part
// sums its parts and adds t @ b_j to the module's columns. So every a_j is read by both threads, and
// modules' b_j in parallel.
void module_task(void* data, size_t task) {
  Job& job = *static_cast<Job*>(data);
  const auto [range, part] = job.tasks[task];
  const Module& mod = job.ranges[range];
  if (part >= 0) {
    for (int64_t row = 0, g; row < job.rows; row += g) part_xa(job, mod, part, row, g = group(job, mod, row));
    if (job.left[range].fetch_sub(1, std::memory_order_acq_rel) != 1) return;  // not the last part
  }
  for (int64_t row = 0; row < job.rows; ++row)
    std::memcpy(job.sum + row * job.n + mod.lo, job.y + row * job.n + mod.lo, (mod.hi - mod.lo) * sizeof(float));
  if (!mod.r) return;
  std::vector<float> t(kGroup * mod.r);
  for (int64_t row = 0, g; row < job.rows; row += g) {
    sum_parts(job, mod, row, g = group(job, mod, row), t.data());
    job.fn.tb[g - 1](t.data(), mod.b + (row / job.seq) * mod.b_step, mod.r, mod.hi - mod.lo, mod.hi - mod.lo,
                     job.sum + row * job.n + mod.lo, job.n);
  }
}

// The tasks on ONNX Runtime's pool, or in a loop here when the work is too small to share.
void run_tasks(Ort::KernelContext& ctx, void (*task)(void*, size_t), size_t count, void* data, bool parallel) {
  if (parallel) return trtllm_cpu::parallel_for(ctx, task, count, data);
  for (size_t i = 0; i < count; ++i) task(data, i);
}

struct Swiglu {
  const float* sum;
  float* out;
  int64_t rows, half;
};

void phase_swiglu(void* data, size_t task) {
  const Swiglu& s = *static_cast<Swiglu*>(data);
  const int64_t c0 = static_cast<int64_t>(task) * kColumns, c = std::min(kColumns, s.half - c0);
  for (int64_t row = 0; row < s.rows; ++row) {
    const float* g = s.sum + row * 2 * s.half;
    trtllm_cpu::matmul::swiglu(g + c0, g + s.half + c0, c, s.out + row * s.half + c0);
  }
}

struct Kernel {
  std::vector<int64_t> columns;
  bool swiglu;
  const char* name;

  OrtStatusPtr ComputeV2(OrtKernelContext* raw) {
    try {
      Ort::KernelContext ctx(raw);
      auto y = ctx.GetInput(0), x = ctx.GetInput(1);
      const auto ys = y.GetTensorTypeAndShapeInfo().GetShape(), xs = x.GetTensorTypeAndShapeInfo().GetShape();
      const int64_t n = columns.back();
      if (xs.size() != 3 || ys.size() != 3 || ys[0] != xs[0] || ys[1] != xs[1] || ys[2] != n)
        return fail("x must be [B, S, K] and y [B, S, " + std::to_string(n) + "]", name);
      const int64_t rows = xs[0] * xs[1];
      // K's split depends on K alone: the parts are summed in order, so a row's result is the same
      // whatever the number of rows in the call (batch and saved-prefix invariance, as the MatMuls).
      // Two parts at most: a decode step's tasks stay few (one dispatch a node, module_task).
      const int64_t parts = std::clamp<int64_t>((xs[2] + kPartK - 1) / kPartK, 1, kMaxParts);
      Job job{x.GetTensorData<float>(), y.GetTensorData<float>(), nullptr, rows, std::max<int64_t>(xs[1], 1),
              xs[2], n, parts, (xs[2] + parts - 1) / parts, {}, {}, {}, {}, {}, kernels()};
      int64_t t_size = 0;
      for (size_t j = 0; j < columns.size() / 2; ++j) {
        auto a = ctx.GetInput(2 + 2 * j), b = ctx.GetInput(3 + 2 * j);
        const int64_t lo = columns[2 * j], hi = columns[2 * j + 1];
        if (!a || !b) return fail("module " + std::to_string(j) + " has no lora_a / lora_b input", name);
        const auto as = a.GetTensorTypeAndShapeInfo().GetShape(), bs = b.GetTensorTypeAndShapeInfo().GetShape();
        if (as.size() != 3 || bs.size() != 3 || as[0] != bs[0] || (as[0] != 1 && as[0] != xs[0]) || as[1] != xs[2] ||
            bs[1] != as[2] || bs[2] != hi - lo)
          return fail("module " + std::to_string(j) + ": lora_a must be [1 or B, K, r] and lora_b [same, r, " +
                          std::to_string(hi - lo) + "]", name);
        const bool shared = as[0] == 1;
        const Module mod{as[2] ? a.GetTensorData<float>() : nullptr, as[2] ? b.GetTensorData<float>() : nullptr,
                         as[2], lo, hi, shared ? 0 : as[1] * as[2], shared ? 0 : bs[1] * bs[2], t_size};
        job.ranges.push_back(mod);
        if (as[2] == 0 || job.rows == 0) continue;  // rank 0: no adapter on this module
        job.modules.push_back(mod);
        t_size += job.parts * job.rows * as[2];
      }
      std::vector<int64_t> out_shape = ys;
      if (swiglu) out_shape[2] = n / 2;
      auto out = ctx.GetOutput(0, out_shape);
      const bool adapted = !job.modules.empty();  // else the sum is y itself
      std::vector<float> scratch(swiglu && adapted ? job.rows * n : 0);
      job.sum = swiglu ? scratch.data() : out.GetTensorMutableData<float>();
      job.t.resize(t_size);
      if (job.rows == 0) return nullptr;
      int64_t work = job.rows * n;
      for (const Module& mod : job.modules)
        work += mod.r * (job.k + mod.hi - mod.lo) * (mod.a_step ? xs[0] : 1) + job.rows * mod.r * (job.k + mod.hi - mod.lo);
      const bool parallel = work >= kParallelFloats;
      const bool summed = adapted || !swiglu;  // else the output is swiglu(y), straight from y
      if (summed && job.rows <= kFewRows) {
        job.left.reset(new std::atomic<int64_t>[job.ranges.size()]);
        for (size_t j = 0; j < job.ranges.size(); ++j) {
          job.left[j].store(job.parts);
          if (job.ranges[j].r)
            for (int64_t p = 0; p < job.parts; ++p) job.tasks.emplace_back(j, p);
          else
            job.tasks.emplace_back(j, -1);  // y's columns only
        }
        run_tasks(ctx, module_task, job.tasks.size(), &job, parallel && job.tasks.size() > 1);
      } else if (summed) {
        if (adapted) run_tasks(ctx, phase_xa, job.modules.size() * job.parts, &job, parallel);
        if (adapted && job.parts > 1)
          run_tasks(ctx, phase_reduce, static_cast<size_t>((job.rows + kReduceRows - 1) / kReduceRows), &job, parallel);
        run_tasks(ctx, phase_tb, static_cast<size_t>((n + kColumns - 1) / kColumns), &job, parallel);
      }
      if (swiglu) {
        Swiglu s{adapted ? scratch.data() : job.y, out.GetTensorMutableData<float>(), job.rows, n / 2};
        run_tasks(ctx, phase_swiglu, static_cast<size_t>((n / 2 + kColumns - 1) / kColumns), &s,
                  job.rows * n / 2 >= kParallelFloats);
      }
      return nullptr;
    } catch (const std::exception& e) {
      return fail(e.what(), name);
    }
  }
};

template <bool kSwiglu>
struct Op : Ort::CustomOpBase<Op<kSwiglu>, Kernel, true> {
  static constexpr const char* kOpName = kSwiglu ? kSwigluName : kName;
  OrtStatusPtr CreateKernelV2(const OrtApi&, const OrtKernelInfo* info, void** kernel) const {
    try {
      Ort::ConstKernelInfo ki(info);
      const std::vector<int64_t> columns = ki.GetAttributes<int64_t>("columns");
      const size_t modules = columns.size() / 2;
      bool ok = columns.size() % 2 == 0 && modules >= 1 && modules <= kMaxModules && columns[0] == 0;
      for (size_t j = 0; ok && j < modules; ++j)
        ok = columns[2 * j + 1] > columns[2 * j] && (j == 0 || columns[2 * j] == columns[2 * j - 1]);
      if (!ok) return fail("columns must be 1 to 3 adjacent [lo, hi) ranges from 0", kOpName);
      if (ki.GetInputCount() != 2 + 2 * modules)
        return fail("needs y, x and a lora_a, lora_b pair per column range", kOpName);
      if (kSwiglu && columns.back() % 2) return fail("swiglu needs an even width (gate and up columns)", kOpName);
      *kernel = new Kernel{columns, kSwiglu, kOpName};
      return nullptr;
    } catch (const std::exception& e) {
      return fail(e.what(), kOpName);
    }
  }
  const char* GetName() const { return kOpName; }
  const char* GetExecutionProviderType() const { return "CPUExecutionProvider"; }
  size_t GetInputTypeCount() const { return 2 + 2 * kMaxModules; }
  ONNXTensorElementDataType GetInputType(size_t) const { return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT; }
  OrtCustomOpInputOutputCharacteristic GetInputCharacteristic(size_t i) const {
    return i < 4 ? INPUT_OUTPUT_REQUIRED : INPUT_OUTPUT_OPTIONAL;
  }
  size_t GetOutputTypeCount() const { return 1; }
  ONNXTensorElementDataType GetOutputType(size_t) const { return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT; }
};

}  // namespace

namespace trtllm_cpu {
OrtCustomOp* lora_add_op() {
  static Op<false> op;
  return &op;
}
OrtCustomOp* lora_add_swiglu_op() {
  static Op<true> op;
  return &op;
}
}  // namespace trtllm_cpu
