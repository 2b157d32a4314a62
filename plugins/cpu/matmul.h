// The MatMul kernels behind trtllm.cpu::MatMulBlockQuant and MatMulHalf (matmul.cc): weights of
// N rows by K inputs, float32 activations, the work split into tasks of kChunkRows weight rows.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common.h"

namespace trtllm_cpu::matmul {

constexpr int64_t kBlock = 32;
constexpr int kRows = 4;     // weight rows per tile (NR)
constexpr int kBatch = 6;    // activation rows per tile (MR): 6 x 4 accumulators + 4 weights + 1 x <= 32 zmm
constexpr int64_t kChunkRows = 32;  // weight rows per parallel task
constexpr int64_t kPanel = 48;      // activation rows kept in L2 while a chunk's rows are reused
constexpr int64_t kSmallBatch = 16; // up to this many activation rows, the weights are dequantized in registers

struct Weights {
  const uint8_t* codes;    // bits 16: float16 (or bfloat16) weights [n, k]; bits 32: float32 ones
  const uint16_t* scale;   // float16 bits
  const uint16_t* offset;  // float16 bits; may be null
  int64_t n, k, bits;     // 4, 8, 16 (MatMulHalf) or 32 (MoE's float32 experts)
  bool brain = false;     // bits 16: the codes are bfloat16, not float16
  int64_t blocks() const { return k / kBlock; }
};

struct Job {
  Weights w;
  const float* x;
  const float* xs;  // x's block sums [m, K / 32] (the fused path's offsets)
  const float* xt;  // 4 bits, decode: x split as fused_avx512 takes it, [m, K]
  float* y;
  int64_t m;
  bool swiglu;
  // Integer activations (matmul_int8.cc), decode: x quantized by quantize_rows, int_row(K) per row.
  const int8_t* xq = nullptr;
  const float* xd = nullptr;
  int levels = 0;  // 1: int8, 2: int16 (two int8 parts)
  // The rows' role, from the node's `generated` input (generated_flag): a prompt's rows take the
  // prefill path however few they are, and `generated` rows the decode path however many, so each
  // row is computed the same whatever its neighbours. Neither: by size, m <= kSmallBatch.
  bool prompt = false, generated = false;
  bool decode_path() const { return !prompt && (generated || m <= kSmallBatch); }
  // Decode rows of quantized weights computed the same whatever their number: 1-2 rows at a time,
  // whose dot products take the scale out (3-4 dequantize first, which rounds otherwise, and share
  // each dequantized weight: faster). MoE's generated rows where asked: how many share an expert
  // depends on the rest of the batch.
  bool row_exact = false;
};

// The node's optional `generated` input (int64 [1]) at `index`: 1 (generated tokens), 0 (a
// prompt's), or -1 when the node has none (engines from before it).
int generated_flag(Ort::KernelContext& ctx, size_t index);

// x [..., K] as m rows of k inputs, and y's shape (n outputs, or n / 2 with swiglu); `error` says
// what is wrong with x, or is empty.
struct Rows {
  int64_t m = 1, k = 0;
  std::vector<int64_t> y_shape;
  std::string error;
};
Rows rows_of(std::vector<int64_t> x_shape, int64_t n, bool swiglu);

// Integer activations (matmul_int8.cc): x's m rows quantized per block of 32 in `levels` int8
// digits, laid out for weights of `bits`, and nr weight rows from `row` times them (out[m * ldy + r]);
// the job's xq, xd, levels and xs must be set. IntRow: one row's quantized size (bytes, of which
// `part` per digit) and count of scales.
struct IntRow {
  int64_t bytes, scales, part;
};
// The layout's sizes (one digit of a row): a run of 16 blocks is 512 bytes and holds its d in 16
// lanes (4-bit) or 32 (8-bit); a unit of the rest is 4 blocks (4-bit) or 2 (8-bit), 16 lanes of d.
constexpr int64_t kRun = 16, kRunBytes = kRun * kBlock, kUnitScales = 16;
constexpr int64_t run_scales(int bits) { return bits == 4 ? 16 : 32; }
constexpr int64_t unit_blocks(int bits) { return bits == 4 ? 4 : 2; }
constexpr int64_t unit_bytes(int bits) { return unit_blocks(bits) * kBlock; }
IntRow int_row(int64_t k, int bits, int levels);
void quantize_rows(const float* x, int64_t m, int64_t k, int bits, int levels, int8_t* q, float* d);
void int_tile(const Job& job, int64_t row, int nr, float* out, int64_t ldy);

// What decode rows of block-quantized weights take besides x [m, k]: its block sums [m, k / 32]
// (the offsets' share, Job::xs) and, where `split` is not null, x split as fused_avx512 reads
// 4-bit codes with 1-2 rows (Job::xt, [m, k]).
void decode_inputs(const float* x, int64_t m, int64_t k, float* sums, float* split);

#ifdef TRTLLM_X86
// The AVX2 path (matmul_avx2.cc), where AVX-512 is not. decode: `nr` (<= kRows) weight rows from
// `row` times the job's m rows (x, xs and xt) into y[i * ldy + r]. prefill: a chunk's float32 rows
// [kChunkRows][k] (zeros past nr) times x [m][k], through `panel` (kChunkRows * k floats).
// dequant_rows: nr rows from `row` as float32 [nr][K].
namespace avx2 {
void decode(const Job& job, int64_t row, int nr, float* y, int64_t ldy);
void prefill(const float* rows, int64_t k, int nr, const float* x, int64_t m, float* y, int64_t ldy, float* panel);
void dequant_rows(const Weights& w, int64_t row, int nr, float* out);
void swiglu(const float* gate, const float* up, int64_t count, float* out);
// int_tile's (matmul_int8_avx2.cc): the AVX-512 layout read as two 256-bit halves per vector.
void int_tile(const Job& job, int64_t row, int nr, float* out, int64_t ldy);
}  // namespace avx2
#endif

// out[i] = silu(gate[i]) * up[i] (AVX-512, AVX2 or portable).
void swiglu(const float* gate, const float* up, int64_t count, float* out);

// The job on ONNX Runtime's threads, in tasks of kChunkRows weight rows; a task's exception is
// thrown again here (parallel_for).
void run(Ort::KernelContext& ctx, Job& job);
// Its tasks one at a time, for a caller that runs the tasks of several jobs in one parallel_for
// (MoE: every chosen expert's rows at once): how many, and task `chunk`.
int64_t chunks(const Job& job);
void run_task(const Job& job, int64_t chunk);

// An ONNX Runtime status naming the op; check_activation: "" when `activation` is valid for n.
OrtStatusPtr fail(const std::string& message, const char* op);
std::string check_activation(const std::string& activation, int64_t n);

}  // namespace trtllm_cpu::matmul
