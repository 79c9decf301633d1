// CPU matmul: scratch memory, the per-(format, m) path choice, and the scalar references.
#include "backends/cpu/kernels/matmul.h"

#include <cmath>
#include <cstdint>
#include <vector>

#include "backends/cpu/kernels/kernel_table.h"
#include "runtime/base/half.h"

namespace sx::cpu {

void* Scratch::get(int slot, std::size_t bytes) {
  constexpr std::size_t kAlign = 64;
  if (static_cast<std::size_t>(slot) >= slots_.size()) slots_.resize(static_cast<std::size_t>(slot) + 1);
  std::vector<std::byte>& s = slots_[static_cast<std::size_t>(slot)].storage;
  if (s.size() < bytes + kAlign) {
    s.clear();
    s.shrink_to_fit();
    s.resize(bytes + kAlign);
  }
  const auto addr = reinterpret_cast<std::uintptr_t>(s.data());
  return s.data() + (kAlign - addr % kAlign) % kAlign;
}

namespace {

// Below these m the GEMV kernels (W streamed once per call, tokens tiled in registers) beat
// packing W panels (measured on Zen 3, Qwen2.5-0.5B shapes, batched decode through
// `sextant bench --concurrency`: at m = 8 the int8 GEMV gave 75 vs 66 tokens/s, at m = 16 the
// packed GEMM 86 vs 73). The two int8 paths compute identical bits, so the threshold changes speed
// only. F32, F16 and BF16 run gemm_f32 on either path (it picks its few-token kernels below 8
// tokens itself): their threshold only names the path.
constexpr std::int64_t kGemmMinM_Q8 = 12;
constexpr std::int64_t kGemmMinM_Float = 8;

}  // namespace

MatmulPath select_matmul_path(const MatmulProblem& p) {
  if (p.w_type == kQ8_0R16) return MatmulPath::kGemmQ8;
  if (p.w_type == hal::DType::kQ8_0) {
    return p.m < kGemmMinM_Q8 ? MatmulPath::kGemv : MatmulPath::kGemmQ8;
  }
  // Q4_0 and Q5_0 hold Q8_0 values, the K-quants are re-quantised to them: the int8 GEMM where the
  // kernels in use have it.
  if (gemm_q8_reads(p.w_type) && vector_interleaved()) {
    return p.m < kGemmMinM_Q8 ? MatmulPath::kGemv : MatmulPath::kGemmQ8;
  }
  return p.m < kGemmMinM_Float ? MatmulPath::kGemv : MatmulPath::kGemmF32;
}

void matmul(ThreadPool& pool, Scratch& scratch, const MatmulProblem& p, MatmulPath path) {
  if (p.m <= 0 || p.n <= 0) return;
  if (p.k <= 0) {  // empty dot products: y = bias (or 0)
    for (std::int64_t i = 0; i < p.m; ++i)
      for (std::int64_t j = 0; j < p.n; ++j) p.y[i * p.n + j] = p.bias != nullptr ? p.bias[j] : 0.0f;
    return;
  }
  kernels().matmul(pool, scratch, p, path);
}

void matmul(ThreadPool& pool, Scratch& scratch, const MatmulProblem& p) {
  matmul(pool, scratch, p, MatmulPath::kAuto);
}

namespace {

// Row j of W as plain Q8_0 blocks (a pointer into W, or `tmp` filled from a kQ8_0R16 W).
const hal::BlockQ8_0* q8_row(const MatmulProblem& p, std::int64_t j, std::vector<hal::BlockQ8_0>& tmp) {
  const std::int64_t nb = p.k / hal::kQ8_0Block;
  if (p.w_type == hal::DType::kQ8_0) return static_cast<const hal::BlockQ8_0*>(p.w) + j * nb;
  tmp.resize(static_cast<std::size_t>(nb));
  unpack_row_q8_0_r16(static_cast<const BlockQ8_0x16*>(p.w), p.k, j, tmp.data());
  return tmp.data();
}

}  // namespace

void matmul_reference(const MatmulProblem& p) {
  std::vector<float> w(static_cast<std::size_t>(p.k));
  for (std::int64_t j = 0; j < p.n; ++j) {
    dequantize_tensor_row(p.w_type, p.w, p.k, j, p.n, w.data());
    for (std::int64_t i = 0; i < p.m; ++i) {
      const float* x = p.x + i * p.k;
      double acc = p.bias != nullptr ? p.bias[j] : 0.0;
      for (std::int64_t c = 0; c < p.k; ++c) acc += static_cast<double>(x[c]) * w[c];
      p.y[i * p.n + j] = static_cast<float>(acc);
    }
  }
}

void matmul_reference_q8_activations(const MatmulProblem& p) {
  constexpr int kB = hal::kQ8_0Block;
  const std::int64_t nb = p.k / kB;
  std::vector<std::int8_t> qs(static_cast<std::size_t>(p.m * p.k));
  std::vector<float> d(static_cast<std::size_t>(p.m * nb));
  for (std::int64_t i = 0; i < p.m; ++i) quantize_activations_q8(p.x + i * p.k, p.k, qs.data() + i * p.k, d.data() + i * nb);
  std::vector<hal::BlockQ8_0> tmp;
  for (std::int64_t j = 0; j < p.n; ++j) {
    const hal::BlockQ8_0* w = q8_row(p, j, tmp);
    for (std::int64_t i = 0; i < p.m; ++i) {
      float acc = 0.0f;
      for (std::int64_t b = 0; b < nb; ++b) {
        const hal::BlockQ8_0& wb = w[b];
        std::int32_t s = 0;
        for (int c = 0; c < kB; ++c) s += static_cast<std::int32_t>(wb.qs[c]) * qs[i * p.k + b * kB + c];
        acc = std::fma(static_cast<float>(s), f16_to_f32(wb.d) * d[i * nb + b], acc);
      }
      p.y[i * p.n + j] = acc + (p.bias != nullptr ? p.bias[j] : 0.0f);
    }
  }
}

}  // namespace sx::cpu
