// Reference (de)quantisers of the GGML block formats (layouts in quant.h).
//
// Dequantisers: ggml's formulas with the same float operations in the same order (this library is
// compiled with -ffp-contract=off, so no multiply-add is fused), hence bit-identical results.
//
// Quantisers:
//   Q4_0, Q4_1, Q5_0, Q5_1: ggml's reference quantisers (quantize_row_*_ref) operation for
//     operation, so the bytes match ggml's and gguf-py's.
//   Q4_K, Q5_K: per sub-block of 32 the offset m = max(0, -min x) and the step needed to cover
//     [min, max] with nmax (15 / 31) levels; the super-block dmin and d are max / 63 rounded *up* to
//     fp16, and each 6-bit min and scale is rounded *up* (the min first, so the step covers the
//     quantised min), so every value lies inside its sub-block's grid and the error of each weight is
//     at most half of its sub-block's step d * sc. (llama.cpp instead searches for the scale that
//     minimises the weighted error; that is better by a few per cent RMS, not needed here.)
//   Q6_K: per sub-block of 16 the step amax / 31.5 (so q = round(x / step) lies in -32..31), the
//     int8 scales rounded up against d = max step / 127 (d rounded up to fp16): error <= step / 2.
#include "runtime/hal/quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "runtime/base/half.h"

namespace sx::hal {

namespace {

// The smallest fp16 >= v (v >= 0 and finite in fp16's range).
std::uint16_t f16_ceil(float v) {
  std::uint16_t h = f32_to_f16(v);
  if (f16_to_f32(h) < v) ++h;
  return h;
}

// ceil(v / step) clamped to [0, hi]; 0 when step is 0.
int ceil_div_clamped(float v, float step, int hi) {
  if (step <= 0.0f || v <= 0.0f) return 0;
  const int q = static_cast<int>(std::ceil(v / step));
  return std::clamp(q, 0, hi);
}

int round_clamped(float v, int lo, int hi) {
  return std::clamp(static_cast<int>(std::lround(v)), lo, hi);
}

// Shared by Q2_K / Q4_K / Q5_K: the kSubs sub-block scales and mins (kLen elements each, each in
// 0..kScaleMax of the super-block's d / dmin) of one super-block of x, quantised; q gets the 256
// quants (0..nmax).
template <int kSubs, int kLen, int kScaleMax>
void quantize_k_scale_min(const float* x, int nmax, std::uint16_t* d_out, std::uint16_t* dmin_out,
                          std::uint8_t (&ls)[kSubs], std::uint8_t (&lm)[kSubs], std::uint8_t q[kQK_K]) {
  static_assert(kSubs * kLen == kQK_K);
  float off[kSubs], hi[kSubs];
  float max_off = 0.0f;
  for (int s = 0; s < kSubs; ++s) {
    float mn = x[kLen * s], mx = x[kLen * s];
    for (int l = 1; l < kLen; ++l) {
      mn = std::min(mn, x[kLen * s + l]);
      mx = std::max(mx, x[kLen * s + l]);
    }
    off[s] = std::max(0.0f, -mn);
    hi[s] = mx;
    max_off = std::max(max_off, off[s]);
  }
  const std::uint16_t dmin_h = f16_ceil(max_off / static_cast<float>(kScaleMax));
  const float dmin = f16_to_f32(dmin_h);
  float need[kSubs], max_need = 0.0f;
  for (int s = 0; s < kSubs; ++s) {
    lm[s] = static_cast<std::uint8_t>(ceil_div_clamped(off[s], dmin, kScaleMax));
    const float m = dmin * lm[s];
    need[s] = std::max(0.0f, (hi[s] + m) / static_cast<float>(nmax));
    max_need = std::max(max_need, need[s]);
  }
  const std::uint16_t d_h = f16_ceil(max_need / static_cast<float>(kScaleMax));
  const float d = f16_to_f32(d_h);
  for (int s = 0; s < kSubs; ++s) {
    ls[s] = static_cast<std::uint8_t>(ceil_div_clamped(need[s], d, kScaleMax));
    const float step = d * ls[s];
    const float m = dmin * lm[s];
    for (int l = 0; l < kLen; ++l) {
      q[kLen * s + l] =
          static_cast<std::uint8_t>(step > 0.0f ? round_clamped((x[kLen * s + l] + m) / step, 0, nmax) : 0);
    }
  }
  *d_out = d_h;
  *dmin_out = dmin_h;
}

// Shared by Q3_K / Q6_K: per sub-block of 16 the step that puts max |x| at `half_range` steps,
// need[s]; returns the super-block's d (fp16), the smallest with every step within scale_max of it.
std::uint16_t symmetric_steps(const float* x, float half_range, int scale_max, float (&need)[16]) {
  float max_need = 0.0f;
  for (int s = 0; s < 16; ++s) {
    float amax = 0.0f;
    for (int l = 0; l < 16; ++l) amax = std::max(amax, std::fabs(x[16 * s + l]));
    need[s] = amax / half_range;
    max_need = std::max(max_need, need[s]);
  }
  return f16_ceil(max_need / static_cast<float>(scale_max));
}

// Inverse of q4k_scale_min.
void pack_k_scale_min(const std::uint8_t ls[8], const std::uint8_t lm[8], std::uint8_t s[12]) {
  std::memset(s, 0, 12);
  for (int j = 0; j < 8; ++j) {
    if (j < 4) {
      s[j] |= ls[j] & 63;
      s[j + 4] |= lm[j] & 63;
    } else {
      s[j + 4] = static_cast<std::uint8_t>((ls[j] & 0xF) | ((lm[j] & 0xF) << 4));
      s[j - 4] |= static_cast<std::uint8_t>((ls[j] >> 4) << 6);
      s[j] |= static_cast<std::uint8_t>((lm[j] >> 4) << 6);
    }
  }
}

}  // namespace

void unpack_q5_pair(const std::uint8_t* qs, std::uint32_t qh, int j, int& x0, int& x1) {
  x0 = (qs[j] & 0x0F) | static_cast<int>(((qh >> j) << 4) & 0x10);
  x1 = (qs[j] >> 4) | static_cast<int>((qh >> (j + 12)) & 0x10);
}

void q3k_scales(const std::uint8_t* p, std::int8_t out[16]) {
  for (int i = 0; i < 16; ++i) {
    const int lo = i < 8 ? (p[i] & 0xF) : (p[i - 8] >> 4);
    const int hi = (p[8 + (i % 4)] >> (2 * (i / 4))) & 3;
    out[i] = static_cast<std::int8_t>((lo | (hi << 4)) - 32);
  }
}

// ---- dequantisation (ggml-quants.c dequantize_row_*) ----

// y = (q - 8) * d
void dequantize_row_q4_0(const BlockQ4_0* x, float* y, std::int64_t n) {
  for (std::int64_t i = 0; i < n / kQK; ++i) {
    const float d = f16_to_f32(x[i].d);
    for (int j = 0; j < kQK / 2; ++j) {
      const int x0 = (x[i].qs[j] & 0x0F) - 8;
      const int x1 = (x[i].qs[j] >> 4) - 8;
      y[i * kQK + j] = static_cast<float>(x0) * d;
      y[i * kQK + j + kQK / 2] = static_cast<float>(x1) * d;
    }
  }
}

// y = q * d + m
void dequantize_row_q4_1(const BlockQ4_1* x, float* y, std::int64_t n) {
  for (std::int64_t i = 0; i < n / kQK; ++i) {
    const float d = f16_to_f32(x[i].d);
    const float m = f16_to_f32(x[i].m);
    for (int j = 0; j < kQK / 2; ++j) {
      const int x0 = x[i].qs[j] & 0x0F;
      const int x1 = x[i].qs[j] >> 4;
      y[i * kQK + j] = static_cast<float>(x0) * d + m;
      y[i * kQK + j + kQK / 2] = static_cast<float>(x1) * d + m;
    }
  }
}

// y = (q - 16) * d
void dequantize_row_q5_0(const BlockQ5_0* x, float* y, std::int64_t n) {
  for (std::int64_t i = 0; i < n / kQK; ++i) {
    const float d = f16_to_f32(x[i].d);
    std::uint32_t qh;
    std::memcpy(&qh, x[i].qh, sizeof(qh));
    for (int j = 0; j < kQK / 2; ++j) {
      int x0, x1;
      unpack_q5_pair(x[i].qs, qh, j, x0, x1);
      y[i * kQK + j] = static_cast<float>(x0 - 16) * d;
      y[i * kQK + j + kQK / 2] = static_cast<float>(x1 - 16) * d;
    }
  }
}

// y = q * d + m
void dequantize_row_q5_1(const BlockQ5_1* x, float* y, std::int64_t n) {
  for (std::int64_t i = 0; i < n / kQK; ++i) {
    const float d = f16_to_f32(x[i].d);
    const float m = f16_to_f32(x[i].m);
    std::uint32_t qh;
    std::memcpy(&qh, x[i].qh, sizeof(qh));
    for (int j = 0; j < kQK / 2; ++j) {
      int x0, x1;
      unpack_q5_pair(x[i].qs, qh, j, x0, x1);
      y[i * kQK + j] = static_cast<float>(x0) * d + m;
      y[i * kQK + j + kQK / 2] = static_cast<float>(x1) * d + m;
    }
  }
}

// dl = d * (sc & 0xF), ml = dmin * (sc >> 4); y = dl * q - ml
void dequantize_row_q2_k(const BlockQ2_K* x, float* y, std::int64_t n) {
  for (std::int64_t i = 0; i < n / kQK_K; ++i) {
    const float d = f16_to_f32(x[i].d);
    const float min = f16_to_f32(x[i].dmin);
    const std::uint8_t* q = x[i].qs;
    int is = 0;
    for (int c = 0; c < kQK_K; c += 128) {
      int shift = 0;
      for (int j = 0; j < 4; ++j) {
        for (int half = 0; half < 2; ++half) {
          const std::uint8_t sc = x[i].scales[is++];
          const float dl = d * static_cast<float>(sc & 0xF);
          const float ml = min * static_cast<float>(sc >> 4);
          for (int l = 0; l < 16; ++l) *y++ = dl * static_cast<float>((q[l + 16 * half] >> shift) & 3) - ml;
        }
        shift += 2;
      }
      q += 32;
    }
  }
}

// dl = d * (sc - 32); y = dl * (q2 - (hbit ? 0 : 4))
void dequantize_row_q3_k(const BlockQ3_K* x, float* y, std::int64_t n) {
  for (std::int64_t i = 0; i < n / kQK_K; ++i) {
    const float d_all = f16_to_f32(x[i].d);
    std::int8_t scales[16];
    q3k_scales(x[i].scales, scales);
    const std::uint8_t* q = x[i].qs;
    const std::uint8_t* hm = x[i].hmask;
    std::uint8_t m = 1;
    int is = 0;
    for (int c = 0; c < kQK_K; c += 128) {
      int shift = 0;
      for (int j = 0; j < 4; ++j) {
        for (int half = 0; half < 2; ++half) {
          const float dl = d_all * static_cast<float>(scales[is++]);
          for (int l = 16 * half; l < 16 * half + 16; ++l) {
            const int v = ((q[l] >> shift) & 3) - ((hm[l] & m) ? 0 : 4);
            *y++ = dl * static_cast<float>(v);
          }
        }
        shift += 2;
        m = static_cast<std::uint8_t>(m << 1);
      }
      q += 32;
    }
  }
}

// d1 = d * sc, m1 = dmin * m; y = d1 * q - m1
void dequantize_row_q4_k(const BlockQ4_K* x, float* y, std::int64_t n) {
  for (std::int64_t i = 0; i < n / kQK_K; ++i) {
    const float d = f16_to_f32(x[i].d);
    const float min = f16_to_f32(x[i].dmin);
    const std::uint8_t* q = x[i].qs;
    for (int c = 0; c < 4; ++c) {
      std::uint8_t sc, m;
      q4k_scale_min(2 * c, x[i].scales, &sc, &m);
      const float d1 = d * static_cast<float>(sc), m1 = min * static_cast<float>(m);
      q4k_scale_min(2 * c + 1, x[i].scales, &sc, &m);
      const float d2 = d * static_cast<float>(sc), m2 = min * static_cast<float>(m);
      for (int l = 0; l < 32; ++l) *y++ = d1 * static_cast<float>(q[l] & 0xF) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * static_cast<float>(q[l] >> 4) - m2;
      q += 32;
    }
  }
}

// As Q4_K with a fifth bit from qh: y = d1 * (q + 16 * bit) - m1
void dequantize_row_q5_k(const BlockQ5_K* x, float* y, std::int64_t n) {
  for (std::int64_t i = 0; i < n / kQK_K; ++i) {
    const float d = f16_to_f32(x[i].d);
    const float min = f16_to_f32(x[i].dmin);
    const std::uint8_t* ql = x[i].qs;
    const std::uint8_t* qh = x[i].qh;
    std::uint8_t u1 = 1, u2 = 2;
    for (int c = 0; c < 4; ++c) {
      std::uint8_t sc, m;
      q4k_scale_min(2 * c, x[i].scales, &sc, &m);
      const float d1 = d * static_cast<float>(sc), m1 = min * static_cast<float>(m);
      q4k_scale_min(2 * c + 1, x[i].scales, &sc, &m);
      const float d2 = d * static_cast<float>(sc), m2 = min * static_cast<float>(m);
      for (int l = 0; l < 32; ++l) *y++ = d1 * static_cast<float>((ql[l] & 0xF) + ((qh[l] & u1) ? 16 : 0)) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * static_cast<float>((ql[l] >> 4) + ((qh[l] & u2) ? 16 : 0)) - m2;
      ql += 32;
      u1 = static_cast<std::uint8_t>(u1 << 2);
      u2 = static_cast<std::uint8_t>(u2 << 2);
    }
  }
}

// y = d * sc * (q - 32), evaluated as (d * sc) * q
void dequantize_row_q6_k(const BlockQ6_K* x, float* y, std::int64_t n) {
  for (std::int64_t i = 0; i < n / kQK_K; ++i) {
    const float d = f16_to_f32(x[i].d);
    const std::uint8_t* ql = x[i].ql;
    const std::uint8_t* qh = x[i].qh;
    const std::int8_t* sc = x[i].scales;
    for (int h = 0; h < 2; ++h) {
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        y[l + 0] = d * static_cast<float>(sc[is + 0]) * static_cast<float>(q1);
        y[l + 32] = d * static_cast<float>(sc[is + 2]) * static_cast<float>(q2);
        y[l + 64] = d * static_cast<float>(sc[is + 4]) * static_cast<float>(q3);
        y[l + 96] = d * static_cast<float>(sc[is + 6]) * static_cast<float>(q4);
      }
      y += 128;
      ql += 64;
      qh += 32;
      sc += 8;
    }
  }
}

// ---- quantisation ----

namespace {

// The value of largest magnitude in a block of kQK, sign kept (the first on ties): the Q4_0 / Q5_0
// scale's source in ggml's reference quantisers.
float signed_absmax(const float* x) {
  float amax = 0.0f, max = 0.0f;
  for (int j = 0; j < kQK; ++j) {
    if (amax < std::fabs(x[j])) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  return max;
}

// The smallest and largest value of a block of kQK (Q4_1 / Q5_1).
void block_min_max(const float* x, float& mn, float& mx) {
  mn = x[0];
  mx = x[0];
  for (int j = 1; j < kQK; ++j) {
    mn = std::min(mn, x[j]);
    mx = std::max(mx, x[j]);
  }
}

}  // namespace

void pack_q5_pair(int xi0, int xi1, int j, std::uint8_t* qs, std::uint32_t& qh) {
  qs[j] = static_cast<std::uint8_t>((xi0 & 0x0F) | ((xi1 & 0x0F) << 4));
  qh |= static_cast<std::uint32_t>((xi0 & 0x10) >> 4) << j;
  qh |= static_cast<std::uint32_t>((xi1 & 0x10) >> 4) << (j + kQK / 2);
}

// ggml quantize_row_q4_0_ref: d = (value of largest magnitude) / -8, q = min(15, trunc(x / d + 8.5)).
void quantize_row_q4_0(const float* x, BlockQ4_0* y, std::int64_t n) {
  for (std::int64_t i = 0; i < n / kQK; ++i, x += kQK) {
    const float d = signed_absmax(x) / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[i].d = f32_to_f16(d);
    for (int j = 0; j < kQK / 2; ++j) {
      const int xi0 = std::min(15, static_cast<int>(static_cast<std::int8_t>(x[j] * id + 8.5f)));
      const int xi1 = std::min(15, static_cast<int>(static_cast<std::int8_t>(x[j + kQK / 2] * id + 8.5f)));
      y[i].qs[j] = static_cast<std::uint8_t>(xi0 | (xi1 << 4));
    }
  }
}

// ggml quantize_row_q4_1_ref: d = (max - min) / 15, m = min, q = min(15, trunc((x - min) / d + 0.5)).
void quantize_row_q4_1(const float* x, BlockQ4_1* y, std::int64_t n) {
  for (std::int64_t i = 0; i < n / kQK; ++i, x += kQK) {
    float mn, mx;
    block_min_max(x, mn, mx);
    const float d = (mx - mn) / 15.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[i].d = f32_to_f16(d);
    y[i].m = f32_to_f16(mn);
    for (int j = 0; j < kQK / 2; ++j) {
      const int xi0 = std::min(15, static_cast<int>(static_cast<std::int8_t>((x[j] - mn) * id + 0.5f)));
      const int xi1 = std::min(15, static_cast<int>(static_cast<std::int8_t>((x[j + kQK / 2] - mn) * id + 0.5f)));
      y[i].qs[j] = static_cast<std::uint8_t>(xi0 | (xi1 << 4));
    }
  }
}

// ggml quantize_row_q5_0_ref: d = (value of largest magnitude) / -16, q = min(31, trunc(x / d + 16.5)).
void quantize_row_q5_0(const float* x, BlockQ5_0* y, std::int64_t n) {
  for (std::int64_t i = 0; i < n / kQK; ++i, x += kQK) {
    const float d = signed_absmax(x) / -16.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[i].d = f32_to_f16(d);
    std::uint32_t qh = 0;
    for (int j = 0; j < kQK / 2; ++j) {
      const int xi0 = std::min(31, static_cast<int>(static_cast<std::int8_t>(x[j] * id + 16.5f)));
      const int xi1 = std::min(31, static_cast<int>(static_cast<std::int8_t>(x[j + kQK / 2] * id + 16.5f)));
      pack_q5_pair(xi0, xi1, j, y[i].qs, qh);
    }
    std::memcpy(y[i].qh, &qh, sizeof(qh));
  }
}

// ggml quantize_row_q5_1_ref: d = (max - min) / 31, m = min, q = trunc((x - min) / d + 0.5).
void quantize_row_q5_1(const float* x, BlockQ5_1* y, std::int64_t n) {
  for (std::int64_t i = 0; i < n / kQK; ++i, x += kQK) {
    float mn, mx;
    block_min_max(x, mn, mx);
    const float d = (mx - mn) / 31.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[i].d = f32_to_f16(d);
    y[i].m = f32_to_f16(mn);
    std::uint32_t qh = 0;
    for (int j = 0; j < kQK / 2; ++j) {
      const int xi0 = static_cast<int>(static_cast<std::uint8_t>((x[j] - mn) * id + 0.5f));
      const int xi1 = static_cast<int>(static_cast<std::uint8_t>((x[j + kQK / 2] - mn) * id + 0.5f));
      pack_q5_pair(xi0, xi1, j, y[i].qs, qh);
    }
    std::memcpy(y[i].qh, &qh, sizeof(qh));
  }
}

// Q2_K: per sub-block of 16 an offset (4-bit m of dmin) and a step (4-bit sc of d) covering its
// range with 2 bits, then q = round((x + m) / step), as Q4_K does per 32.
void quantize_row_q2_k(const float* x, BlockQ2_K* y, std::int64_t n) {
  for (std::int64_t i = 0; i < n / kQK_K; ++i, x += kQK_K) {
    std::uint8_t ls[16], lm[16], q[kQK_K];
    quantize_k_scale_min<16, 16, 15>(x, 3, &y[i].d, &y[i].dmin, ls, lm, q);
    std::memset(y[i].qs, 0, sizeof(y[i].qs));
    for (int s = 0; s < 16; ++s) y[i].scales[s] = static_cast<std::uint8_t>(ls[s] | (lm[s] << 4));
    for (int e = 0; e < kQK_K; ++e) {  // element 128c + 32j + l sits in qs[32c + l] at bits 2j
      y[i].qs[32 * (e / 128) + e % 32] |= static_cast<std::uint8_t>(q[e] << (2 * ((e % 128) / 32)));
    }
  }
}

// Q3_K: per sub-block of 16 a step (6-bit sc of d, stored + 32) with v = round(x / step) in -4..3,
// kept as v + 4: the low 2 bits in qs (as Q2_K), the third in hmask.
void quantize_row_q3_k(const float* x, BlockQ3_K* y, std::int64_t n) {
  for (std::int64_t i = 0; i < n / kQK_K; ++i, x += kQK_K) {
    float need[16];
    y[i].d = symmetric_steps(x, 3.5f, 31, need);
    const float d = f16_to_f32(y[i].d);
    std::memset(y[i].qs, 0, sizeof(y[i].qs));
    std::memset(y[i].hmask, 0, sizeof(y[i].hmask));
    std::memset(y[i].scales, 0, sizeof(y[i].scales));
    for (int s = 0; s < 16; ++s) {
      const int sc = ceil_div_clamped(need[s], d, 31);
      const int stored = sc + 32;  // q3k_scales: low 4 bits in byte s % 8 (high nibble for s >= 8),
      y[i].scales[s % 8] |= static_cast<std::uint8_t>((stored & 0xF) << (s < 8 ? 0 : 4));  // high 2 bits
      y[i].scales[8 + s % 4] |= static_cast<std::uint8_t>((stored >> 4) << (2 * (s / 4)));  // in byte 8 + s % 4
      const float step = d * static_cast<float>(sc);
      for (int l = 0; l < 16; ++l) {
        const int e = 16 * s + l;
        const int v = (step > 0.0f ? round_clamped(x[e] / step, -4, 3) : 0) + 4;
        const int c = e / 128, j = (e % 128) / 32, at = e % 32;
        y[i].qs[32 * c + at] |= static_cast<std::uint8_t>((v & 3) << (2 * j));
        y[i].hmask[at] |= static_cast<std::uint8_t>((v >> 2) << (4 * c + j));
      }
    }
  }
}

void quantize_row_q4_k(const float* x, BlockQ4_K* y, std::int64_t n) {
  for (std::int64_t i = 0; i < n / kQK_K; ++i, x += kQK_K) {
    std::uint8_t ls[8], lm[8], q[kQK_K];
    quantize_k_scale_min<8, 32, 63>(x, 15, &y[i].d, &y[i].dmin, ls, lm, q);
    pack_k_scale_min(ls, lm, y[i].scales);
    for (int c = 0; c < 4; ++c) {
      for (int l = 0; l < 32; ++l) {
        y[i].qs[32 * c + l] = static_cast<std::uint8_t>(q[64 * c + l] | (q[64 * c + 32 + l] << 4));
      }
    }
  }
}

void quantize_row_q5_k(const float* x, BlockQ5_K* y, std::int64_t n) {
  for (std::int64_t i = 0; i < n / kQK_K; ++i, x += kQK_K) {
    std::uint8_t ls[8], lm[8], q[kQK_K];
    quantize_k_scale_min<8, 32, 63>(x, 31, &y[i].d, &y[i].dmin, ls, lm, q);
    pack_k_scale_min(ls, lm, y[i].scales);
    std::memset(y[i].qh, 0, sizeof(y[i].qh));
    for (int c = 0; c < 4; ++c) {
      for (int l = 0; l < 32; ++l) {
        const int a = q[64 * c + l], b = q[64 * c + 32 + l];
        y[i].qs[32 * c + l] = static_cast<std::uint8_t>((a & 0xF) | ((b & 0xF) << 4));
        y[i].qh[l] |= static_cast<std::uint8_t>(((a >> 4) << (2 * c)) | ((b >> 4) << (2 * c + 1)));
      }
    }
  }
}

void quantize_row_q6_k(const float* x, BlockQ6_K* y, std::int64_t n) {
  for (std::int64_t i = 0; i < n / kQK_K; ++i, x += kQK_K) {
    float need[16];
    y[i].d = symmetric_steps(x, 31.5f, 127, need);
    const float d = f16_to_f32(y[i].d);
    std::uint8_t q[kQK_K];
    for (int s = 0; s < 16; ++s) {
      const int sc = ceil_div_clamped(need[s], d, 127);
      y[i].scales[s] = static_cast<std::int8_t>(sc);
      const float step = d * static_cast<float>(sc);
      for (int l = 0; l < 16; ++l) {
        q[16 * s + l] = static_cast<std::uint8_t>((step > 0.0f ? round_clamped(x[16 * s + l] / step, -32, 31) : 0) + 32);
      }
    }
    for (int h = 0; h < 2; ++h) {
      const std::uint8_t* qq = q + 128 * h;
      for (int l = 0; l < 32; ++l) {
        y[i].ql[64 * h + l] = static_cast<std::uint8_t>((qq[l] & 0xF) | ((qq[l + 64] & 0xF) << 4));
        y[i].ql[64 * h + l + 32] = static_cast<std::uint8_t>((qq[l + 32] & 0xF) | ((qq[l + 96] & 0xF) << 4));
        y[i].qh[32 * h + l] = static_cast<std::uint8_t>((qq[l] >> 4) | ((qq[l + 32] >> 4) << 2) |
                                                        ((qq[l + 64] >> 4) << 4) | ((qq[l + 96] >> 4) << 6));
      }
    }
  }
}

}  // namespace sx::hal
