// CPU matmul kernels: y[m][n] = x[m][:] . W[n][:] (+ bias[n]) for every weight format, F32 accumulation.
//
// Threading: splits the work over `pool` (one call at a time per pool).
// Scratch: the kernels may need temporary memory (quantised activations, unpacked weight panels);
// they get it from `scratch`, which grows as needed and is reused across calls (not thread-safe:
// one per stream).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "backends/cpu/kernels/layouts.h"
#include "runtime/base/thread_pool.h"
#include "runtime/hal/dtype.h"

namespace sx::cpu {

struct MatmulProblem {
  const void* w = nullptr;  // [n][k] in w_type (row bytes = hal::row_bytes(w_type, k))
  hal::DType w_type = hal::DType::kF32;
  const float* x = nullptr;     // [m][k]
  const float* bias = nullptr;  // optional [n]
  float* y = nullptr;           // [m][n]
  std::int64_t m = 0, n = 0, k = 0;
};

class Scratch {
 public:
  // Returns at least `bytes` bytes, 64-byte aligned; invalidates earlier pointers of the same slot.
  void* get(int slot, std::size_t bytes);

 private:
  struct Slot {
    std::vector<std::byte> storage;
  };
  std::vector<Slot> slots_;
};

// True where the kernels in use (kernel_table.h) have vector code for the interleaved layouts
// (kQ8_0R16, kQ5_0R8, kQ4_0R8, kF32R16, ...: AVX2 + FMA + F16C and up); elsewhere they work through
// scalar code only, so the CPU device keeps weights as the file holds them.
bool vector_interleaved();

// Supported formats: F32, F16, BF16 (also as kF32R16 / kF16R16 / kBF16R16), Q8_0 and kQ8_0R16 (k a
// multiple of 32 for the last two), and every other GGML block format (Q4_0, Q4_1, Q5_0, Q5_1,
// Q2_K, Q3_K, Q4_K, Q5_K, Q6_K; k a multiple of the block), Q5_0 and Q4_0 also as kQ5_0R8 /
// kQ4_0R8. F32, F16 and BF16 run the GEMM (gemm_f32.cpp) at every m, whatever the path asked. Small
// m (kGemv) runs int8 kernels for the block formats where the level has vector code
// (gemv_quant.cpp has their error bound: activation quantisation per 256 / 32 elements) and
// dequantises rows to F32 elsewhere; large m packs W panels dequantised to F32 (kGemmF32) or takes
// the int8 GEMM.
// Inputs are validated by the caller (shapes, k % 32 == 0 for Q8_0, non-null pointers); x rows,
// y rows and W rows need no particular alignment.
//
// Numerics: F32 accumulation everywhere. F32/F16/BF16 weights, and Q8_0 on the kGemmF32 path, are
// exact products of the stored values (only the summation order differs from the reference),
// except F16 and BF16 on the levels with BF16 dot products (avx512-bf16, amx), where x, and F16
// W, are rounded to BF16 (kernel_table.h states the bound). F32, F16 and BF16 give a token the same
// bits whatever m (its batch) and whichever layout: each element is one chain of FMAs per k block
// of the GEMM, the blocks added in order (gemm_f32.cpp). The
// Q8_0 int8 paths (kGemv, kGemmQ8) first quantise each row of x with quantize_activations_q8;
// per element that adds at most amax(block of x) / 254 of error, so
//   |y_int8 - y_f32| <= sum over blocks b of (amax_b(x) / 254) * sum_{j in b} |w_j|
// (plus F32 rounding). The int8 paths are also bit-for-bit equal to each other and to
// matmul_reference_q8_activations (per block: exact int32 dot, then acc = fma(float(dot),
// d_w * d_x, acc) in block order, then + bias), whatever m, the thread count or the tiling: a
// token's output does not depend on the batch it is computed in.
void matmul(ThreadPool& pool, Scratch& scratch, const MatmulProblem& p);

// Which kernel family runs a matmul (kQ8_0R16 weights always take the int8 microkernels of
// gemm_q8_0.cpp, whatever the path). kAuto picks per (format, m) what measured fastest:
//   kGemv     small m (decode): rows of W split over threads, streamed once; Q8_0 quantises x and
//             uses int8 dot products, the other block formats int8 kernels or F32 rows; F32, F16
//             and BF16 the GEMM's few-token kernels (the same bits as kGemmF32).
//   kGemmF32  large m (prefill): W panels dequantised to F32 and packed, register-tiled FMA GEMM.
//   kGemmQ8   large m, Q8_0, and Q4_0 / Q5_0 (their values as Q8_0 blocks, layouts.h) where the
//             kernels in use are vector ones: x quantised once, int8 register-tiled GEMM.
enum class MatmulPath { kAuto, kGemv, kGemmF32, kGemmQ8 };

// Runs `p` on a given path (tests and benchmarks; kGemmQ8 falls back to kGemmF32 for the
// formats it does not take).
void matmul(ThreadPool& pool, Scratch& scratch, const MatmulProblem& p, MatmulPath path);

// The path kAuto takes for `p` (never kAuto).
MatmulPath select_matmul_path(const MatmulProblem& p);

// Plain scalar reference (double accumulation) for tests.
void matmul_reference(const MatmulProblem& p);

// Reference of the Q8_0 int8 paths: quantises x like they do, then their exact F32 arithmetic.
void matmul_reference_q8_activations(const MatmulProblem& p);

// The activation quantiser of the int8 paths, one row of k values (k % 32 == 0): per block of 32,
// d = max|x| / 127 (kept in F32, not rounded to fp16), q = nearbyint(x * (1 / d)) in [-127, 127]
// (q = 0 when d == 0). Vector and scalar builds give identical results.
void quantize_activations_q8(const float* x, std::int64_t k, std::int8_t* qs, float* d);

// For bench_matmul: the int8 GEMM microkernel (6 tokens x 16 rows of Q8_0, k = 256 per call, its
// F32 epilogue included) run `calls` times on one x panel and one W panel that stay in L1: no
// packing, no threads, no memory waits. Returns the multiply-adds done (0 where the AVX2 kernels
// are not built).
std::int64_t run_q8_microkernel_in_l1(std::int64_t calls);

}  // namespace sx::cpu
