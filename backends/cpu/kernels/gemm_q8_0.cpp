// Large-m matmul (prefill) for Q8_0 weights on the integer units: x rows are quantised to int8
// blocks (quantize_activations_q8) and W panels of 16 rows are widened to int16 pairs, so one
// vpmaddwd does 16 multiply-adds and, with its vpaddd, uses other ports than the FMAs (AVX2 has
// no VNNI; on Zen 3 this runs ~1.3x the packed F32 FMA GEMM, ~18 int8 MACs per cycle per core).
// Per block of 32 the exact int32 sums are converted and scaled by d_w * d_x into F32
// accumulators in block order, so the result equals the GEMV int8 path bit for bit.
//
// Blocking: a task owns up to 16 W panels (16 rows each) and packs them per k block (<= 512,
// ~16 KiB per panel, L2-resident); for each 6-token x panel (L1) it runs the 6x16 microkernel
// over its panels. x is quantised and packed once per call, shared by all threads.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <vector>

#include "backends/cpu/kernels/matmul_internal.h"
#include "runtime/base/half.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define SX_GEMM_Q8_AVX2 1
#include <immintrin.h>
#endif

namespace sx::cpu::detail {

#if SX_GEMM_Q8_AVX2
namespace {

using hal::BlockQ8_0;
constexpr int kB = hal::kQ8_0Block;
constexpr int kMR = 6;                 // tokens per microtile (12 int32 accumulators)
constexpr int kNR = 16;                // W rows per microtile (two ymm of int32 lanes)
constexpr int kKC = 512;               // max k per packed block: a panel is 16 KiB of int16
constexpr int kMaxPanelsPerTask = 16;  // <= 256 KiB of packed W per task and k block (L2)

// Packed W panel for one k block of kc (a multiple of 32): kc / 2 k-pairs x 16 rows x 2 int16
// (rows 0-7 in the first 32 bytes of each k-pair, rows 8-15 in the next), then kc / 32 x 16 F32
// scales. Bytes: kc * 32 + kc * 2, rounded up to 64 so consecutive panels stay aligned.
std::size_t panel_bytes(std::int64_t kc) {
  return (static_cast<std::size_t>(kc) * 32 + static_cast<std::size_t>(kc) / kB * kNR * sizeof(float) + 63) / 64 * 64;
}

// 8x8 transpose of 32-bit elements.
inline void transpose8(__m256i v[8]) {
  __m256 r[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm256_castsi256_ps(v[i]);
  const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
  const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
  const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
  const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
  const __m256 s0 = _mm256_shuffle_ps(t0, t2, 0x44), s1 = _mm256_shuffle_ps(t0, t2, 0xEE);
  const __m256 s2 = _mm256_shuffle_ps(t1, t3, 0x44), s3 = _mm256_shuffle_ps(t1, t3, 0xEE);
  const __m256 s4 = _mm256_shuffle_ps(t4, t6, 0x44), s5 = _mm256_shuffle_ps(t4, t6, 0xEE);
  const __m256 s6 = _mm256_shuffle_ps(t5, t7, 0x44), s7 = _mm256_shuffle_ps(t5, t7, 0xEE);
  v[0] = _mm256_castps_si256(_mm256_permute2f128_ps(s0, s4, 0x20));
  v[1] = _mm256_castps_si256(_mm256_permute2f128_ps(s1, s5, 0x20));
  v[2] = _mm256_castps_si256(_mm256_permute2f128_ps(s2, s6, 0x20));
  v[3] = _mm256_castps_si256(_mm256_permute2f128_ps(s3, s7, 0x20));
  v[4] = _mm256_castps_si256(_mm256_permute2f128_ps(s0, s4, 0x31));
  v[5] = _mm256_castps_si256(_mm256_permute2f128_ps(s1, s5, 0x31));
  v[6] = _mm256_castps_si256(_mm256_permute2f128_ps(s2, s6, 0x31));
  v[7] = _mm256_castps_si256(_mm256_permute2f128_ps(s3, s7, 0x31));
}

// Packs rows [row0, row0 + 16) x blocks [b0, b0 + nb) of W; rows at or past n are zero.
// Each half of a block (16 k) of 8 rows is widened and transposed on its own, which keeps the
// working set in registers (with both halves live GCC spills, and the pack ran ~5x slower).
void pack_w_panel(const BlockQ8_0* w, std::int64_t blocks_per_row, std::int64_t row0, std::int64_t n,
                  std::int64_t b0, std::int64_t nb, std::byte* dst) {
  static const BlockQ8_0 kZeroBlock = {};
  auto* q = reinterpret_cast<__m256i*>(dst);  // [k-pair][2] vectors
  auto* scales = reinterpret_cast<float*>(dst + static_cast<std::size_t>(nb) * kB * 32);
  const BlockQ8_0* rows[kNR];
  std::int64_t row_step[kNR];  // 1 for real rows, 0 for the zero block
  for (int r = 0; r < kNR; ++r) {
    const bool valid = row0 + r < n;
    rows[r] = valid ? w + (row0 + r) * blocks_per_row + b0 : &kZeroBlock;
    row_step[r] = valid ? 1 : 0;
  }
  // W usually comes from DRAM (each matrix is used once per layer): fetch the same blocks of the
  // next 16 rows (the next panel, contiguous after this one) while this one is converted.
  const std::int64_t next_rows = std::max<std::int64_t>(0, std::min<std::int64_t>(kNR, n - (row0 + kNR)));
  const BlockQ8_0* next = w + (row0 + kNR) * blocks_per_row + b0;
  for (std::int64_t b = 0; b < nb; ++b) {
    for (std::int64_t r = 0; r < next_rows; ++r) {
      _mm_prefetch(reinterpret_cast<const char*>(next + r * blocks_per_row + b), _MM_HINT_T1);
    }
    __m256i* out = q + b * kB;  // k-pair p of this block at out[2 * p + h]
    for (int h = 0; h < 2; ++h) {
      for (int part = 0; part < 2; ++part) {
        __m256i v[8];
        for (int r = 0; r < 8; ++r) {
          const BlockQ8_0& blk = rows[h * 8 + r][b * row_step[h * 8 + r]];
          v[r] = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk.qs + part * 16)));
        }
        transpose8(v);
        for (int p = 0; p < 8; ++p) _mm256_store_si256(out + 2 * (part * 8 + p) + h, v[p]);
      }
    }
    for (int r = 0; r < kNR; ++r) scales[b * kNR + r] = _cvtsh_ss(rows[r][b * row_step[r]].d);
  }
}

// Packed x panel of kMR tokens: [k-pair][kMR] int32 (two int16), then [block][kMR] F32 scales.
std::size_t x_panel_bytes(std::int64_t k) {
  return (static_cast<std::size_t>(k / 2) * kMR * 4 + static_cast<std::size_t>(k / kB) * kMR * sizeof(float) + 63) / 64 * 64;
}

void pack_x_panel(const std::int8_t* xq, const float* xd, std::int64_t m, std::int64_t k, std::int64_t t0,
                  std::byte* dst) {
  auto* pairs = reinterpret_cast<std::int32_t*>(dst);
  auto* scales = reinterpret_cast<float*>(dst + static_cast<std::size_t>(k / 2) * kMR * 4);
  const std::int64_t nb = k / kB;
  for (int t = 0; t < kMR; ++t) {
    if (t0 + t >= m) {  // padding tokens: zero pairs and scales
      for (std::int64_t p = 0; p < k / 2; ++p) pairs[p * kMR + t] = 0;
      for (std::int64_t b = 0; b < nb; ++b) scales[b * kMR + t] = 0.0f;
      continue;
    }
    const std::int8_t* q = xq + (t0 + t) * k;
    // 16 k (8 pairs) at a time (k is a multiple of 32): int8 sign-extended to int16 are the
    // little-endian pairs (lo | hi << 16) as int32.
    for (std::int64_t p0 = 0; p0 < k / 2; p0 += 8) {
      alignas(32) std::int32_t v[8];
      _mm256_store_si256(reinterpret_cast<__m256i*>(v),
                         _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 2 * p0))));
      for (int i = 0; i < 8; ++i) pairs[(p0 + i) * kMR + t] = v[i];
    }
    for (std::int64_t b = 0; b < nb; ++b) scales[b * kMR + t] = xd[(t0 + t) * nb + b];
  }
}

// c[mr][nr] (row stride ldc): acc = (accumulate ? c : 0), then for each of nb blocks in order
//   acc = fma(float(int32 dot of the block), d_w * d_x, acc), then c = acc (+ bias when given: the
//   caller passes it with the last k block only). For 6 tokens x 16 W rows: 12 int32 accumulators
//   per block (x pairs broadcast from memory, W pairs from the panel), F32 accumulators in L1.
//   This is exactly the arithmetic of the GEMV (gemv_q8_0.cpp), so a token's result does not
//   depend on the batch it is computed in.
void kernel_6x16(std::int64_t nb, const std::int32_t* a, const float* adx, const std::byte* bpanel, float* c,
                 std::int64_t ldc, int mr, int nr, const float* bias, bool accumulate) {
  // The tile of y is needed only at the end: start fetching it now (it is usually in L3).
  for (int r = 0; r < mr; ++r) {
    _mm_prefetch(reinterpret_cast<const char*>(c + r * ldc), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(c + r * ldc + kNR - 1), _MM_HINT_T0);
  }
  const auto* bq = reinterpret_cast<const __m256i*>(bpanel);
  const auto* bdw = reinterpret_cast<const float*>(bpanel + static_cast<std::size_t>(nb) * kB * 32);
  alignas(32) float facc[kMR][kNR] = {};
  if (accumulate) {
    for (int r = 0; r < mr; ++r) {
      for (int j = 0; j < nr; ++j) facc[r][j] = c[r * ldc + j];
    }
  }
  for (std::int64_t b = 0; b < nb; ++b) {
    __m256i i00 = _mm256_setzero_si256(), i01 = i00, i10 = i00, i11 = i00, i20 = i00, i21 = i00;
    __m256i i30 = i00, i31 = i00, i40 = i00, i41 = i00, i50 = i00, i51 = i00;
    const __m256i* wq = bq + b * kB;  // 16 k-pairs x 2 vectors
    const std::int32_t* xa = a + b * (kB / 2) * kMR;
    // One k-pair for 6 tokens x 16 rows in inline asm: with intrinsics GCC 12 keeps a copy of
    // the 12 accumulators on the stack (12 stores per k-pair, which then bound the loop).
    for (int p = 0; p < kB / 2; ++p) {
      __m256i w0, w1, xv, t;
      const __m256i* wp = wq + 2 * p;
      const std::int32_t* xp = xa + p * kMR;
      __asm__(
          "vmovdqa (%[w]), %[w0]\n\t"
          "vmovdqa 32(%[w]), %[w1]\n\t"
          "vpbroadcastd (%[x]), %[xv]\n\t"
          "vpmaddwd %[xv], %[w0], %[t]\n\t"
          "vpmaddwd %[xv], %[w1], %[xv]\n\t"
          "vpaddd %[t], %[a00], %[a00]\n\t"
          "vpaddd %[xv], %[a01], %[a01]\n\t"
          "vpbroadcastd 4(%[x]), %[xv]\n\t"
          "vpmaddwd %[xv], %[w0], %[t]\n\t"
          "vpmaddwd %[xv], %[w1], %[xv]\n\t"
          "vpaddd %[t], %[a10], %[a10]\n\t"
          "vpaddd %[xv], %[a11], %[a11]\n\t"
          "vpbroadcastd 8(%[x]), %[xv]\n\t"
          "vpmaddwd %[xv], %[w0], %[t]\n\t"
          "vpmaddwd %[xv], %[w1], %[xv]\n\t"
          "vpaddd %[t], %[a20], %[a20]\n\t"
          "vpaddd %[xv], %[a21], %[a21]\n\t"
          "vpbroadcastd 12(%[x]), %[xv]\n\t"
          "vpmaddwd %[xv], %[w0], %[t]\n\t"
          "vpmaddwd %[xv], %[w1], %[xv]\n\t"
          "vpaddd %[t], %[a30], %[a30]\n\t"
          "vpaddd %[xv], %[a31], %[a31]\n\t"
          "vpbroadcastd 16(%[x]), %[xv]\n\t"
          "vpmaddwd %[xv], %[w0], %[t]\n\t"
          "vpmaddwd %[xv], %[w1], %[xv]\n\t"
          "vpaddd %[t], %[a40], %[a40]\n\t"
          "vpaddd %[xv], %[a41], %[a41]\n\t"
          "vpbroadcastd 20(%[x]), %[xv]\n\t"
          "vpmaddwd %[xv], %[w0], %[t]\n\t"
          "vpmaddwd %[xv], %[w1], %[xv]\n\t"
          "vpaddd %[t], %[a50], %[a50]\n\t"
          "vpaddd %[xv], %[a51], %[a51]\n\t"
          : [a00] "+x"(i00), [a01] "+x"(i01), [a10] "+x"(i10), [a11] "+x"(i11), [a20] "+x"(i20),
            [a21] "+x"(i21), [a30] "+x"(i30), [a31] "+x"(i31), [a40] "+x"(i40), [a41] "+x"(i41),
            [a50] "+x"(i50), [a51] "+x"(i51), [w0] "=&x"(w0), [w1] "=&x"(w1), [xv] "=&x"(xv), [t] "=&x"(t)
          : [w] "r"(wp), [x] "r"(xp)
          : "memory");  // reads wp[0..1] and xp[0..5] (30 operands is the limit: no "m" inputs)
    }
    const __m256 dw0 = _mm256_load_ps(bdw + b * kNR), dw1 = _mm256_load_ps(bdw + b * kNR + 8);
    const float* dx = adx + b * kMR;
#define SX_SCALE(t, i0, i1)                                                                          \
  {                                                                                                   \
    const __m256 d = _mm256_broadcast_ss(dx + (t));                                                   \
    _mm256_store_ps(facc[t], _mm256_fmadd_ps(_mm256_cvtepi32_ps(i0), _mm256_mul_ps(dw0, d),           \
                                             _mm256_load_ps(facc[t])));                               \
    _mm256_store_ps(facc[t] + 8, _mm256_fmadd_ps(_mm256_cvtepi32_ps(i1), _mm256_mul_ps(dw1, d),       \
                                                 _mm256_load_ps(facc[t] + 8)));                       \
  }
    SX_SCALE(0, i00, i01)
    SX_SCALE(1, i10, i11)
    SX_SCALE(2, i20, i21)
    SX_SCALE(3, i30, i31)
    SX_SCALE(4, i40, i41)
    SX_SCALE(5, i50, i51)
#undef SX_SCALE
  }
  for (int r = 0; r < mr; ++r) {
    float* cr = c + r * ldc;
    if (nr == kNR) {
      __m256 v0 = _mm256_load_ps(facc[r]), v1 = _mm256_load_ps(facc[r] + 8);
      if (bias != nullptr) {
        v0 = _mm256_add_ps(v0, _mm256_loadu_ps(bias));
        v1 = _mm256_add_ps(v1, _mm256_loadu_ps(bias + 8));
      }
      _mm256_storeu_ps(cr, v0);
      _mm256_storeu_ps(cr + 8, v1);
    } else {
      for (int j = 0; j < nr; ++j) cr[j] = facc[r][j] + (bias != nullptr ? bias[j] : 0.0f);
    }
  }
}

}  // namespace

void gemm_q8_0(ThreadPool& pool, Scratch& scratch, const MatmulProblem& p) {
  const std::int64_t m = p.m, n = p.n, k = p.k;
  const std::int64_t nb_row = k / kB;
  const std::int64_t x_panels = ceil_div(m, kMR);
  const std::int64_t w_panels = ceil_div(n, kNR);
  const std::int64_t k_blocks = ceil_div(k, kKC);
  const std::int64_t kc_step = std::min<std::int64_t>(kKC, ceil_div(ceil_div(k, k_blocks), kB) * kB);

  const int threads = pool.size();
  const std::size_t acts_bytes = static_cast<std::size_t>(m * k) + static_cast<std::size_t>(m * nb_row) * sizeof(float);
  auto* xq = static_cast<std::int8_t*>(scratch.get(kSlotActs, acts_bytes));
  auto* xd = reinterpret_cast<float*>(xq + m * k);
  const std::size_t xpb = x_panel_bytes(k);
  auto* xp = static_cast<std::byte*>(scratch.get(kSlotPackedX, xpb * static_cast<std::size_t>(x_panels)));
  const std::size_t wpb = panel_bytes(kc_step);
  std::vector<std::byte*> wbuf(static_cast<std::size_t>(threads));
  for (int t = 0; t < threads; ++t) {
    wbuf[static_cast<std::size_t>(t)] =
        static_cast<std::byte*>(scratch.get(kSlotThread0 + t, wpb * kMaxPanelsPerTask));
  }

  pool.parallel_for(x_panels, [&](std::int64_t i) {
    const std::int64_t t0 = i * kMR, t1 = std::min(m, t0 + kMR);
    quantize_rows_q8(p.x, t0, t1, k, xq, xd);
    pack_x_panel(xq, xd, m, k, t0, xp + xpb * static_cast<std::size_t>(i));
  });

  const std::int64_t n_tasks = std::min<std::int64_t>(
      w_panels, threads * ceil_div(w_panels, static_cast<std::int64_t>(threads) * kMaxPanelsPerTask));
  const auto* w = static_cast<const BlockQ8_0*>(p.w);
  std::atomic<std::int64_t> next{0};
  pool.run_on_all([&](int thread, int) {
    std::byte* wp = wbuf[static_cast<std::size_t>(thread)];
    for (std::int64_t task = next.fetch_add(1); task < n_tasks; task = next.fetch_add(1)) {
      const std::int64_t j0 = task * w_panels / n_tasks, j1 = (task + 1) * w_panels / n_tasks;
      for (std::int64_t pc = 0; pc < k; pc += kc_step) {
        const std::int64_t kc = std::min(kc_step, k - pc);
        const std::int64_t nb = kc / kB;
        const std::size_t pb = panel_bytes(kc);
        for (std::int64_t j = j0; j < j1; ++j) pack_w_panel(w, nb_row, j * kNR, n, pc / kB, nb, wp + (j - j0) * pb);
        for (std::int64_t i = 0; i < x_panels; ++i) {
          const std::byte* xpi = xp + xpb * static_cast<std::size_t>(i);
          const auto* a = reinterpret_cast<const std::int32_t*>(xpi) + (pc / 2) * kMR;
          const auto* adx = reinterpret_cast<const float*>(xpi + static_cast<std::size_t>(k / 2) * kMR * 4) + (pc / kB) * kMR;
          const int mr = static_cast<int>(std::min<std::int64_t>(kMR, m - i * kMR));
          for (std::int64_t j = j0; j < j1; ++j) {
            const int nr = static_cast<int>(std::min<std::int64_t>(kNR, n - j * kNR));
            const bool last = pc + kc == k;  // the bias joins the finished sum
            kernel_6x16(nb, a, adx, wp + (j - j0) * pb, p.y + i * kMR * n + j * kNR, n, mr, nr,
                        last && p.bias != nullptr ? p.bias + j * kNR : nullptr, pc > 0);
          }
        }
      }
    }
  });
}

#else  // portable build: the GEMV int8 kernels compute the same thing (tokens tiled in registers)

void gemm_q8_0(ThreadPool& pool, Scratch& scratch, const MatmulProblem& p) { gemv_q8_0(pool, scratch, p); }

#endif

}  // namespace sx::cpu::detail
