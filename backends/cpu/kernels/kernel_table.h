// The CPU kernels of one ISA level as a table of entry points (issue 23, isa.h).
//
// The kernel units (gemm_*.cpp, gemv_*.cpp, quantize_x.cpp, kernel_table.cpp, ops/vector_math.cpp,
// ops/attention.cpp) are compiled once per level with that level's -m flags and
// SX_CPU_ISA_NS=isa_<level>, so every symbol they define lives in sx::cpu::isa_<level> and the
// copies never meet at link time; each copy exports kernel_table(). Everything else is compiled for
// the baseline target and calls the kernels through kernels(), the table of the level chosen at
// start-up. (tests/isa_code_test checks the binary: no AVX instruction outside sx::cpu::isa_*.)
#pragma once

#include <cstdint>

#include "backends/cpu/kernels/matmul.h"
#include "backends/cpu/ops/cpu_ops.h"

namespace sx::cpu {

struct KernelTable {
  const char* level;        // "avx2", ...
  bool vector_interleaved;  // the CPU device's interleaved layouts (layouts.h) have vector kernels here
  // The GEMM of BF16 and F16 weights (every m: prefill and decode) rounds x (and F16 W) to BF16 and
  // multiplies with vdpbf16ps (avx512-bf16 and amx): |error| <= 2^-8 * sum_i |x_i w_i| beyond the
  // F32 path's for BF16 weights, (2^-7 + 2^-16) * sum_i |x_i w_i| for F16 ones (gemm_f32.cpp).
  bool bf16_dot_gemm;
  void (*matmul)(ThreadPool&, Scratch&, const MatmulProblem&, MatmulPath);
  void (*quantize_activations_q8)(const float* x, std::int64_t k, std::int8_t* qs, float* d);
  std::int64_t (*run_q8_microkernel_in_l1)(std::int64_t calls);
  void (*paged_attention)(ThreadPool&, const AttentionPtrs&, const AttentionShape&);
  void (*kv_write)(ThreadPool&, const float* k, const float* v, void* k_cache, void* v_cache, hal::DType cache_type,
                   const std::int32_t* slots, std::int64_t n_tokens, std::int64_t n_kv_heads, std::int64_t head_dim);
  float (*dot_f32)(const float* a, const float* b, std::int64_t n);
  void (*axpy_f32)(float a, const float* x, float* y, std::int64_t n);
  void (*load_row_f32)(hal::DType type, const void* row, float* dst, std::int64_t n);
  float (*exp_shifted_sum)(float* x, std::int64_t n, float shift);
  void (*silu_mul_row)(const float* gate, const float* up, float* out, std::int64_t n);
};

// The table of the level chosen for this process (cpu_isa(); on an invalid SEXTANT_CPU_ISA that
// nobody checked first, prints the error and exits with status 2).
const KernelTable& kernels();
// The table of a level by name (tests and benchmarks: every level this machine supports), or null
// when it is not built or not supported here.
const KernelTable* kernels_for(std::string_view level);

// Each built level's table (defined by its kernel_table.cpp).
#define SX_CPU_DECLARE_TABLE(ns) \
  namespace ns {                 \
  const KernelTable& kernel_table(); \
  }
SX_CPU_DECLARE_TABLE(isa_baseline)
SX_CPU_DECLARE_TABLE(isa_avx2)
SX_CPU_DECLARE_TABLE(isa_avxvnni)
SX_CPU_DECLARE_TABLE(isa_avx512)
SX_CPU_DECLARE_TABLE(isa_avx512vnni)
SX_CPU_DECLARE_TABLE(isa_avx512bf16)
SX_CPU_DECLARE_TABLE(isa_amx)  // gemm_q8_0_amx.cpp: avx512-bf16's table with the AMX int8 GEMM
#undef SX_CPU_DECLARE_TABLE

}  // namespace sx::cpu

// Inside a kernel unit: the entry points of its own level, for the units to call one another
// directly (no table in between).
#if defined(SX_CPU_ISA_NS)
namespace sx::cpu::SX_CPU_ISA_NS {
void run_matmul(ThreadPool& pool, Scratch& scratch, const MatmulProblem& p, MatmulPath path);
void quantize_activations_q8(const float* x, std::int64_t k, std::int8_t* qs, float* d);
std::int64_t run_q8_microkernel_in_l1(std::int64_t calls);
void paged_attention(ThreadPool& pool, const AttentionPtrs& p, const AttentionShape& s);
void kv_write(ThreadPool& pool, const float* k, const float* v, void* k_cache, void* v_cache, hal::DType cache_type,
              const std::int32_t* slots, std::int64_t n_tokens, std::int64_t n_kv_heads, std::int64_t head_dim);
float dot_f32(const float* a, const float* b, std::int64_t n);
void axpy_f32(float a, const float* x, float* y, std::int64_t n);
void load_row_f32(hal::DType type, const void* row, float* dst, std::int64_t n);
float exp_shifted_sum(float* x, std::int64_t n, float shift);
void silu_mul_row(const float* gate, const float* up, float* out, std::int64_t n);
}  // namespace sx::cpu::SX_CPU_ISA_NS
#endif
