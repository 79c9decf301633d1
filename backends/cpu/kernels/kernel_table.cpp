// One ISA level's kernel table (kernel_table.h): compiled once per level, like the kernels.
#include "backends/cpu/kernels/kernel_table.h"

#include "backends/cpu/kernels/matmul_internal.h"

#if !defined(SX_CPU_ISA_NS) || !defined(SX_CPU_ISA_LEVEL)
#error "kernel_table.cpp is compiled once per ISA level (backends/cpu/kernels/meson.build)"
#endif

namespace sx::cpu::SX_CPU_ISA_NS {

void run_matmul(ThreadPool& pool, Scratch& scratch, const MatmulProblem& p, MatmulPath path) {
  if (p.w_type == kQ8_0R16) {
    detail::matmul_q8_0_r16(pool, scratch, p);
    return;
  }
  if (path == MatmulPath::kAuto) path = select_matmul_path(p);
  const bool q8 = p.w_type == hal::DType::kQ8_0;
  switch (path) {
    case MatmulPath::kGemv:
      if (q8) {
        detail::gemv_q8_0(pool, scratch, p);
      } else if (hal::dtype_info(layout_source(p.w_type)).quantized) {
        detail::gemv_quant(pool, scratch, p);
      } else {
        detail::gemm_f32(pool, scratch, p);  // F32, F16, BF16: the GEMM's arithmetic at every m
      }
      return;
    case MatmulPath::kGemmQ8:
      if (q8 || (gemm_q8_reads(p.w_type) && kernel_table().vector_interleaved)) {
        detail::gemm_q8_0(pool, scratch, p);
        return;
      }
      [[fallthrough]];
    case MatmulPath::kGemmF32:
    case MatmulPath::kAuto:
      detail::gemm_f32(pool, scratch, p);
      return;
  }
}

const KernelTable& kernel_table() {
  static const KernelTable t = {
      SX_CPU_ISA_LEVEL,
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
      true,
#else
      false,
#endif
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__) && defined(__AVX512F__) && defined(__AVX512BF16__)
      true,
#else
      false,
#endif
      &run_matmul,
      &quantize_activations_q8,
      &run_q8_microkernel_in_l1,
      &paged_attention,
      &kv_write,
      &dot_f32,
      &axpy_f32,
      &load_row_f32,
      &exp_shifted_sum,
      &silu_mul_row,
  };
  return t;
}

}  // namespace sx::cpu::SX_CPU_ISA_NS
