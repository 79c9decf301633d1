// The "amx" kernel level (isa.h): the avx512-bf16 kernels, with the int8 GEMM of weights that hold
// Q8_0 values (kQ8_0R16, Q8_0, Q4_0, Q5_0, kQ5_0R8, kQ4_0R8; layouts.h converts_to_q8_0) on Intel
// AMX tiles from kAmxMinM tokens up: prefill, and the mixed steps of paced scheduling (issue 24),
// where a few decodes and a prefill chunk share one step and its cost per token decides how much of
// a long prompt fits beside the streams. Compiled once, with the avx512-bf16 flags plus AMX-TILE/INT8.
//
// Arithmetic (the same bits as every other level, matmul.h): per block of 32, one tdpbssd gives the
// exact int32 dots of 16 x rows with 16 W rows (C[m][n] += sum_e A[m][4q + e] * B[q][4n + e], A the
// x rows' int8 block, B the W rows' block as k-quads), then acc = fma(float(dot), d_w * d_x, acc)
// in block order, then + bias. A tile's 16 rows of x are read in place from the quantised rows
// (padded with zero rows to a multiple of 16); W is repacked per task into B-tile order with its
// scales as F32 (PackedBlock), either a whole panel at a time (small m: W streams from memory once)
// or the task's panels one k range at a time (large m: they stay in L2 while every x tile passes).
//
// Threading: the tiles are configured on each thread of the pool at the start of a call and
// released at its end (AMX state is per thread; the OS permission, per process, was asked by
// isa.cpp before any kernel runs).
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <vector>

#include "backends/cpu/kernels/kernel_table.h"
#include "backends/cpu/kernels/layouts.h"
#include "runtime/base/half.h"

#if !defined(__AMX_TILE__) || !defined(__AMX_INT8__) || !defined(__AVX512BW__)
#error "gemm_q8_0_amx.cpp is compiled with -mamx-tile -mamx-int8 and the avx512-bf16 flags (kernels/meson.build)"
#endif

namespace sx::cpu::isa_amx {

namespace {

using hal::BlockQ8_0;
constexpr int kB = hal::kQ8_0Block;
constexpr int kT = 16;                     // x rows per A tile, W rows per panel (B tile columns)
constexpr std::int64_t kAmxMinM = 8;       // below: the avx512-bf16 kernels (W-streaming int8 GEMV / GEMM)
constexpr std::int64_t kStreamingTiles = 4;  // up to 64 tokens a panel is packed whole, W streams once
constexpr std::int64_t kKCBlocks = 16;     // beyond: k ranges of 512 (the task's panels: <= 144 KiB)
constexpr std::int64_t kMaxPanelsPerTask = 16;
// Streaming: W panels this far ahead are prefetched (to L2) a little per block while the tiles
// work, so that the stream's misses overlap the arithmetic; on their own (the hardware prefetchers)
// they mostly add to it (bench_matmul gemv/q8_0_r16 m16-m64: 5-13% faster).
constexpr std::int64_t kPrefetchPanels = 2;

// One block of a 16-row W panel in B-tile order: q[quad][4 * row + e] is element 4 * quad + e of
// the row's block, then the 16 rows' scales as F32. 576 bytes.
struct alignas(64) PackedBlock {
  std::int8_t q[kB / 4][4 * kT];
  float d[kT];
};

// Scratch slots (the same meaning as the other levels' matmul_internal.h).
constexpr int kSlotActs = 0;
constexpr int kSlotThread0 = 2;

struct TileConfig {
  std::uint8_t palette = 1, start_row = 0;
  std::uint8_t reserved[14] = {};
  std::uint16_t colsb[16] = {};
  std::uint8_t rows[16] = {};
};

// tmm0, tmm1: C (16 x 16 int32); tmm2, tmm3: A (16 x rows, 32 int8: one block); tmm4, tmm5: B (8
// k-quads x 16 W rows x 4 int8). Two of each, so that consecutive blocks do not wait on each other.
void configure_tiles() {
  alignas(64) TileConfig c;
  for (int t = 0; t < 2; ++t) {
    c.rows[t] = kT;
    c.colsb[t] = kT * 4;
    c.rows[2 + t] = kT;
    c.colsb[2 + t] = kB;
    c.rows[4 + t] = kB / 4;
    c.colsb[4 + t] = kT * 4;
  }
  _tile_loadconfig(&c);
}

inline std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

// Panel j, blocks [b0, b0 + nb) of a kQ8_0R16 W (each k-pair of the 16 rows in 32 bytes) into
// B-tile order: output word 2r + h of a quad is input word 16h + r of its 64 bytes.
void pack_panel_r16(const BlockQ8_0x16* w, std::int64_t nb, PackedBlock* dst) {
  alignas(64) static constexpr std::uint16_t kIdx[32] = {0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23,
                                                          8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  const __m512i idx = _mm512_load_si512(kIdx);
  for (std::int64_t b = 0; b < nb; ++b) {
    for (int q = 0; q < kB / 4; ++q) {
      const __m512i v = _mm512_loadu_si512(w[b].qs + 64 * q);
      _mm512_store_si512(dst[b].q[q], _mm512_permutexvar_epi16(idx, v));
    }
    _mm512_store_ps(dst[b].d, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[b].d))));
  }
}

// The same from rows of a format whose blocks hold Q8_0 values (plain Q8_0, Q4_0, Q5_0, kQ5_0R8,
// kQ4_0R8), rows [row0, row0 + 16) (those at or past n: zero).
void pack_panel_rows(hal::DType t, const void* w, std::int64_t k, std::int64_t n, std::int64_t row0, std::int64_t b0,
                     std::int64_t nb, PackedBlock* dst) {
  for_panel_blocks_as_q8_0(t, w, k, n, row0, b0, nb, [&](int r, std::int64_t b, const BlockQ8_0& blk) {
    PackedBlock& out = dst[b];
    out.d[r] = f16_to_f32(blk.d);
    for (int q = 0; q < kB / 4; ++q) std::memcpy(out.q[q] + 4 * r, blk.qs + 4 * q, 4);
  });
}

// acc[r] = fma(float(dot of row r), d_w * d_x[r], acc[r]) for a block's 16 x 16 int32 dots, rows
// r < MR (those past the x rows are zero: nobody needs their sums).
template <int MR>
__attribute__((always_inline)) inline void scale_block(const std::int32_t (&c)[kT][kT], const float* dw, const float* dx,
                                                       std::int64_t dx_stride, __m512 (&acc)[kT]) {
  const __m512 w = _mm512_load_ps(dw);
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) {
    const __m512 s = _mm512_cvtepi32_ps(_mm512_load_si512(c[r]));
    acc[r] = _mm512_fmadd_ps(s, _mm512_mul_ps(w, _mm512_set1_ps(dx[r * dx_stride])), acc[r]);
  }
}

// The dots of block b into tile 0 (A in 2, B in 4) or 1 (3, 5), stored to c. (The tile numbers
// must be literals: GCC's intrinsics paste them into the instruction.)
#define SX_AMX_BLOCK_ON(tc, ta, tb, b, c)   \
  do {                                      \
    _tile_zero(tc);                         \
    _tile_loadd(ta, a + (b) * kB, k);       \
    _tile_loadd(tb, w[(b)].q, 4 * kT);      \
    _tile_dpbssd(tc, ta, tb);               \
    _tile_stored(tc, (c), 4 * kT);          \
  } while (0)
#define SX_AMX_BLOCK_0(b, c) SX_AMX_BLOCK_ON(0, 2, 4, b, c)
#define SX_AMX_BLOCK_1(b, c) SX_AMX_BLOCK_ON(1, 3, 5, b, c)

// One x tile (rows [i0, i0 + 16) of the quantised x: xq with row stride k, xd with row stride
// nb_row, both padded with zero rows) times one packed panel over blocks [b0, b0 + nb): y[i0 + r][j0
// + c] for r < mr, c < nr (row stride ldy) = (first ? 0 : y) + the blocks' scaled dots (+ bias when
// `bias` is given: the last k range). Software-pipelined: the tiles compute blocks b + 2 and b + 3
// while the vector units scale blocks b and b + 1 (four dot buffers). With `prefetch`, its
// `prefetch_bytes` are prefetched to L2 in equal parts as the blocks go. The vector work runs for
// the first MR rows only (mr rounded up to 4: tile_kernel_rows), a quarter of it at a time: the
// tiles' last x tile is seldom full.
template <int MR>
void tile_kernel(const std::int8_t* xq, const float* xd, std::int64_t k, std::int64_t nb_row, std::int64_t b0,
                 std::int64_t nb, const PackedBlock* w, float* y, std::int64_t ldy, int mr, int nr, bool first,
                 const float* bias, const char* prefetch = nullptr, std::int64_t prefetch_bytes = 0) {
  const std::int64_t pf_step = prefetch != nullptr ? (prefetch_bytes + nb - 1) / nb : 0;
  std::int64_t pf_at = 0;
  auto prefetch_to = [&](std::int64_t blocks_done) {
    if (prefetch == nullptr) return;
    const std::int64_t end = std::min(prefetch_bytes, blocks_done * pf_step);
    for (; pf_at < end; pf_at += 64) _mm_prefetch(prefetch + pf_at, _MM_HINT_T1);
  };
  alignas(64) std::int32_t c[4][kT][kT];
  const __mmask16 mask = static_cast<__mmask16>((1u << nr) - 1u);
  __m512 acc[kT];
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) acc[r] = first || r >= mr ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(mask, y + r * ldy);
  const std::int8_t* a = xq + b0 * kB;
  const float* dx = xd + b0;
  if (nb >= 2) {
    SX_AMX_BLOCK_0(0, c[0]);
    SX_AMX_BLOCK_1(1, c[1]);
  }
  std::int64_t b = 0;
  int h = 0;  // blocks b, b + 1 are in c[2h], c[2h + 1]
  for (; b + 1 < nb; b += 2, h ^= 1) {
    prefetch_to(b + 2);
    if (b + 3 < nb) {
      SX_AMX_BLOCK_0(b + 2, c[2 * (h ^ 1)]);
      SX_AMX_BLOCK_1(b + 3, c[2 * (h ^ 1) + 1]);
    } else if (b + 2 < nb) {
      SX_AMX_BLOCK_0(b + 2, c[2 * (h ^ 1)]);
    }
    scale_block<MR>(c[2 * h], w[b].d, dx + b, nb_row, acc);
    scale_block<MR>(c[2 * h + 1], w[b + 1].d, dx + b + 1, nb_row, acc);
  }
  if (b < nb) {  // the last of an odd count: computed above (or alone when nb == 1)
    if (nb == 1) SX_AMX_BLOCK_0(0, c[2 * h]);
    scale_block<MR>(c[2 * h], w[b].d, dx + b, nb_row, acc);
  }
  const __m512 bv = bias != nullptr ? _mm512_maskz_loadu_ps(mask, bias) : _mm512_setzero_ps();
  for (int r = 0; r < mr; ++r) {
    _mm512_mask_storeu_ps(y + r * ldy, mask, bias != nullptr ? _mm512_add_ps(acc[r], bv) : acc[r]);
  }
}
#undef SX_AMX_BLOCK_0
#undef SX_AMX_BLOCK_1
#undef SX_AMX_BLOCK_ON

using TileKernel = decltype(&tile_kernel<kT>);
TileKernel tile_kernel_rows(int mr) {
  switch ((mr + 3) / 4) {
    case 1: return &tile_kernel<4>;
    case 2: return &tile_kernel<8>;
    case 3: return &tile_kernel<12>;
    default: return &tile_kernel<kT>;
  }
}

void gemm_amx(ThreadPool& pool, Scratch& scratch, const MatmulProblem& p) {
  const std::int64_t m = p.m, n = p.n, k = p.k;
  const std::int64_t nb_row = k / kB;
  const std::int64_t x_tiles = ceil_div(m, kT), m_pad = x_tiles * kT;
  const std::int64_t panels = ceil_div(n, kT);
  const bool streaming = x_tiles <= kStreamingTiles;
  const std::int64_t kc_blocks = streaming ? nb_row : std::min(kKCBlocks, nb_row);

  // x quantised once (rows padded with zeros to the tile height), shared by all threads.
  const std::size_t xq_bytes = static_cast<std::size_t>(m_pad * k);
  auto* xq = static_cast<std::int8_t*>(scratch.get(kSlotActs, xq_bytes + sizeof(float) * static_cast<std::size_t>(m_pad * nb_row)));
  auto* xd = reinterpret_cast<float*>(xq + xq_bytes);
  const auto quantize = isa_avx512bf16::kernel_table().quantize_activations_q8;
  pool.parallel_for(x_tiles, [&](std::int64_t i) {
    for (std::int64_t r = i * kT; r < (i + 1) * kT; ++r) {
      if (r < m) {
        quantize(p.x + r * k, k, xq + r * k, xd + r * nb_row);
      } else {
        std::memset(xq + r * k, 0, static_cast<std::size_t>(k));
        std::fill(xd + r * nb_row, xd + (r + 1) * nb_row, 0.0f);
      }
    }
  });

  const int threads = pool.size();
  const std::int64_t task_blocks = streaming ? nb_row : kMaxPanelsPerTask * kc_blocks;
  std::vector<PackedBlock*> wbuf(static_cast<std::size_t>(threads));
  for (int t = 0; t < threads; ++t) {
    wbuf[static_cast<std::size_t>(t)] =
        static_cast<PackedBlock*>(scratch.get(kSlotThread0 + t, sizeof(PackedBlock) * static_cast<std::size_t>(task_blocks)));
  }
  // Streaming: two runs of panels per thread (the prefetch runs ahead within a run, and the pair
  // still evens out a thread that is held up); else runs of at most kMaxPanelsPerTask (L2).
  const std::int64_t n_tasks =
      streaming ? std::min<std::int64_t>(panels, 2 * threads)
                : std::min<std::int64_t>(
                      panels, threads * ceil_div(panels, static_cast<std::int64_t>(threads) * kMaxPanelsPerTask));
  const bool r16 = p.w_type == kQ8_0R16;
  std::atomic<std::int64_t> next{0};
  pool.run_on_all([&](int thread, int) {
    configure_tiles();
    PackedBlock* wb = wbuf[static_cast<std::size_t>(thread)];
    auto pack = [&](std::int64_t j, std::int64_t b0, std::int64_t nb, PackedBlock* dst) {
      if (r16) {
        pack_panel_r16(static_cast<const BlockQ8_0x16*>(p.w) + j * nb_row + b0, nb, dst);
      } else {
        pack_panel_rows(p.w_type, p.w, k, n, j * kT, b0, nb, dst);
      }
    };
    for (std::int64_t task = next.fetch_add(1); task < n_tasks; task = next.fetch_add(1)) {
      const std::int64_t j0 = task * panels / n_tasks, j1 = (task + 1) * panels / n_tasks;
      for (std::int64_t b0 = 0; b0 < nb_row; b0 += kc_blocks) {
        const std::int64_t nb = std::min(kc_blocks, nb_row - b0);
        const bool last = b0 + nb == nb_row;
        auto tile = [&](std::int64_t i, std::int64_t j, const PackedBlock* w, const char* pf = nullptr,
                        std::int64_t pf_bytes = 0) {
          const int mr = static_cast<int>(std::min<std::int64_t>(kT, m - i * kT));
          const int nr = static_cast<int>(std::min<std::int64_t>(kT, n - j * kT));
          tile_kernel_rows(mr)(xq + i * kT * k, xd + i * kT * nb_row, k, nb_row, b0, nb, w, p.y + i * kT * n + j * kT,
                               n, mr, nr, b0 == 0, last && p.bias != nullptr ? p.bias + j * kT : nullptr, pf, pf_bytes);
        };
        if (streaming) {  // one panel at a time, whole: W read once, in order
          for (std::int64_t j = j0; j < j1; ++j) {
            pack(j, b0, nb, wb);
            // The first x tile prefetches a kQ8_0R16 panel kPrefetchPanels ahead as it goes.
            if (r16 && j + kPrefetchPanels < j1) {
              const auto* ahead = static_cast<const BlockQ8_0x16*>(p.w) + (j + kPrefetchPanels) * nb_row;
              tile(0, j, wb, reinterpret_cast<const char*>(ahead),
                   static_cast<std::int64_t>(sizeof(BlockQ8_0x16)) * nb_row);
            } else {
              tile(0, j, wb);
            }
            for (std::int64_t i = 1; i < x_tiles; ++i) tile(i, j, wb);
          }
        } else {  // the task's panels of this k range together, every x tile over them
          for (std::int64_t j = j0; j < j1; ++j) pack(j, b0, nb, wb + (j - j0) * nb);
          for (std::int64_t i = 0; i < x_tiles; ++i)
            for (std::int64_t j = j0; j < j1; ++j) tile(i, j, wb + (j - j0) * nb);
        }
      }
    }
    _tile_release();
  });
}

bool amx_takes(const MatmulProblem& p, MatmulPath path) {
  if (p.m < kAmxMinM || p.k % kB != 0) return false;
  if (p.w_type == kQ8_0R16) return true;  // every path: the int8 kernels, as on the other levels
  if (!gemm_q8_reads(p.w_type)) return false;
  if (path == MatmulPath::kAuto) path = select_matmul_path(p);
  return path == MatmulPath::kGemmQ8;
}

void run_matmul(ThreadPool& pool, Scratch& scratch, const MatmulProblem& p, MatmulPath path) {
  if (amx_takes(p, path)) {
    gemm_amx(pool, scratch, p);
    return;
  }
  isa_avx512bf16::kernel_table().matmul(pool, scratch, p, path);
}

}  // namespace

const KernelTable& kernel_table() {
  static const KernelTable t = [] {
    KernelTable k = isa_avx512bf16::kernel_table();
    k.level = "amx";
    k.matmul = &run_matmul;
    return k;
  }();
  return t;
}

}  // namespace sx::cpu::isa_amx
