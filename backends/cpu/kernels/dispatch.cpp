// The kernel table in use and the public kernel entry points that go through it (kernel_table.h).
// Compiled for the baseline target.
#include <cstdio>
#include <cstdlib>

#include "backends/cpu/kernels/isa.h"
#include "backends/cpu/kernels/kernel_table.h"

namespace sx::cpu {

namespace {

const KernelTable* table_of(std::string_view level) {
  if (level == "baseline" || level == "native") return &isa_baseline::kernel_table();
#if defined(SX_CPU_ISA_VARIANTS) && !defined(SX_CPU_ISA_NATIVE)
  if (level == "avx2") return &isa_avx2::kernel_table();
  if (level == "avx-vnni") return &isa_avxvnni::kernel_table();
  if (level == "avx512") return &isa_avx512::kernel_table();
  if (level == "avx512-vnni") return &isa_avx512vnni::kernel_table();
  if (level == "avx512-bf16") return &isa_avx512bf16::kernel_table();
#endif
#if defined(SX_CPU_ISA_AMX)
  if (level == "amx") return &isa_amx::kernel_table();
#endif
  return nullptr;
}

}  // namespace

const KernelTable* kernels_for(std::string_view level) {
  return isa_supported(level, detected_features()) ? table_of(level) : nullptr;
}

const KernelTable& kernels() {
  static const KernelTable* const table = [] {
    const Result<IsaChoice>& c = cpu_isa();
    if (!c.ok()) {
      std::fprintf(stderr, "sextant: %s\n", c.status().message().c_str());
      std::exit(2);
    }
    return table_of(c->level);
  }();
  return *table;
}

bool vector_interleaved() { return kernels().vector_interleaved; }

void quantize_activations_q8(const float* x, std::int64_t k, std::int8_t* qs, float* d) {
  kernels().quantize_activations_q8(x, k, qs, d);
}

std::int64_t run_q8_microkernel_in_l1(std::int64_t calls) { return kernels().run_q8_microkernel_in_l1(calls); }

void paged_attention(ThreadPool& pool, const AttentionPtrs& p, const AttentionShape& s) {
  kernels().paged_attention(pool, p, s);
}

void kv_write(ThreadPool& pool, const float* k, const float* v, void* k_cache, void* v_cache, hal::DType cache_type,
              const std::int32_t* slots, std::int64_t n_tokens, std::int64_t n_kv_heads, std::int64_t head_dim) {
  kernels().kv_write(pool, k, v, k_cache, v_cache, cache_type, slots, n_tokens, n_kv_heads, head_dim);
}

float dot_f32(const float* a, const float* b, std::int64_t n) { return kernels().dot_f32(a, b, n); }
void axpy_f32(float a, const float* x, float* y, std::int64_t n) { kernels().axpy_f32(a, x, y, n); }
void load_row_f32(hal::DType type, const void* row, float* dst, std::int64_t n) {
  kernels().load_row_f32(type, row, dst, n);
}
float exp_shifted_sum(float* x, std::int64_t n, float shift) { return kernels().exp_shifted_sum(x, n, shift); }
void silu_mul_row(const float* gate, const float* up, float* out, std::int64_t n) {
  kernels().silu_mul_row(gate, up, out, n);
}

}  // namespace sx::cpu
