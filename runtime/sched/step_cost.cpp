// The cost model of a forward step (step_cost.h).
#include "runtime/sched/step_cost.h"

#include <algorithm>
#include <array>
#include <cmath>

namespace sx::sched {

namespace {

constexpr int kTerms = 4;  // fixed, per decode, per prefill token, per attended row (in kContextUnit)
constexpr double kContextUnit = 1024;  // rows per unit: keeps the normal equations well scaled
using Vec = std::array<double, kTerms>;
using Mat = std::array<Vec, kTerms>;

// Solves A x = b for the coefficients marked in `use` (the others are 0); false when singular.
bool solve(Mat a, Vec b, const std::array<bool, kTerms>& use, Vec& x) {
  int idx[kTerms], n = 0;
  for (int i = 0; i < kTerms; ++i) {
    if (use[static_cast<std::size_t>(i)]) idx[n++] = i;
  }
  double m[kTerms][kTerms + 1] = {};
  for (int r = 0; r < n; ++r) {
    for (int c = 0; c < n; ++c) m[r][c] = a[static_cast<std::size_t>(idx[r])][static_cast<std::size_t>(idx[c])];
    m[r][n] = b[static_cast<std::size_t>(idx[r])];
  }
  for (int col = 0; col < n; ++col) {
    int pivot = col;
    for (int r = col + 1; r < n; ++r) {
      if (std::fabs(m[r][col]) > std::fabs(m[pivot][col])) pivot = r;
    }
    if (std::fabs(m[pivot][col]) < 1e-12) return false;
    for (int c = 0; c <= n; ++c) std::swap(m[col][c], m[pivot][c]);
    for (int r = 0; r < n; ++r) {
      if (r == col) continue;
      const double f = m[r][col] / m[col][col];
      for (int c = col; c <= n; ++c) m[r][c] -= f * m[col][c];
    }
  }
  x = {};
  for (int r = 0; r < n; ++r) x[static_cast<std::size_t>(idx[r])] = m[r][n] / m[r][r];
  return true;
}

}  // namespace

StepCostModel::StepCostModel(double decay, std::size_t window) : decay_(decay), window_(std::max<std::size_t>(window, 4)) {}

void StepCostModel::observe(std::int64_t decode_tokens, std::int64_t prefill_tokens, double seconds,
                            double prefill_context) {
  if (!(seconds >= 0) || !std::isfinite(seconds) || decode_tokens + prefill_tokens <= 0) return;
  if (!(prefill_context >= 0) || !std::isfinite(prefill_context)) prefill_context = 0;
  steps_.push_back({static_cast<double>(decode_tokens), static_cast<double>(prefill_tokens),
                    prefill_context / kContextUnit, seconds});
  if (prefill_tokens == 0) {
    c_.decode_step = c_.decode_step > 0 ? 0.8 * c_.decode_step + 0.2 * seconds : seconds;
    const auto [it, added] = decode_steps_.try_emplace(decode_tokens, seconds);
    if (!added) it->second = 0.8 * it->second + 0.2 * seconds;
  }
  if (steps_.size() > window_) steps_.pop_front();
  ++c_.observations;
  refit();
}

void StepCostModel::refit() {
  // Weighted normal equations over [1, decode, prefill, context], newest weight 1.
  Mat a{};
  Vec b{};
  double w = 1;
  bool prefill_seen = false;
  double p_min = 1e300, p_max = 0;
  // Steps with prefill only, once there are enough of two sizes.
  double mixed_min = 1e300, mixed_max = 0;
  int mixed = 0;
  for (const Step& s : steps_) {
    if (s.prefill <= 0) continue;
    ++mixed;
    mixed_min = std::min(mixed_min, s.prefill);
    mixed_max = std::max(mixed_max, s.prefill);
  }
  const bool mixed_only = mixed >= 4 && mixed_max > mixed_min;
  for (auto it = steps_.rbegin(); it != steps_.rend(); ++it, w *= decay_) {
    if (mixed_only && it->prefill <= 0) continue;
    const Vec x = {1.0, it->decode, it->prefill, it->context};
    for (std::size_t i = 0; i < kTerms; ++i) {
      for (std::size_t j = 0; j < kTerms; ++j) a[i][j] += w * x[i] * x[j];
      b[i] += w * x[i] * it->seconds;
    }
    if (it->prefill > 0) prefill_seen = true;
    p_min = std::min(p_min, it->prefill);
    p_max = std::max(p_max, it->prefill);
  }
  // A whisper of ridge on the per-token terms keeps a window without variety solvable.
  for (std::size_t i = 1; i < kTerms; ++i) a[i][i] += 1e-9 * (1 + a[i][i]);
  // The context term only where the steps tell it from the others: where the context column is
  // (almost) a combination of the other three over the steps fitted (a few prompt shapes), any
  // split between them fits, and it is left out.
  bool context_known = false;
  {
    Vec col{};
    for (std::size_t i = 0; i < 3; ++i) col[i] = a[i][3];
    Vec g{};
    if (a[3][3] > 0 && solve(a, col, {true, true, true, false}, g)) {
      const double explained = g[0] * a[0][3] + g[1] * a[1][3] + g[2] * a[2][3];
      context_known = a[3][3] - explained > 1e-4 * a[3][3];
    }
  }
  // Non-negative least squares: drop the most negative term and solve again.
  std::array<bool, kTerms> use = {true, true, true, context_known};
  Vec x{};
  for (int round = 0; round < kTerms; ++round) {
    if (!solve(a, b, use, x)) {
      use[1] = false;  // decode counts without variety: fold them into the fixed part
      use[3] = false;  // no context without variety either: into the per-token part
      if (!solve(a, b, use, x)) return;
    }
    int worst = -1;
    for (int i = 0; i < kTerms; ++i) {
      if (use[static_cast<std::size_t>(i)] && x[static_cast<std::size_t>(i)] < 0 &&
          (worst < 0 || x[static_cast<std::size_t>(i)] < x[static_cast<std::size_t>(worst)])) {
        worst = i;
      }
    }
    if (worst < 0) break;
    use[static_cast<std::size_t>(worst)] = false;
    x[static_cast<std::size_t>(worst)] = 0;
  }
  c_.fixed = std::max(0.0, x[0]);
  c_.per_decode = std::max(0.0, x[1]);
  c_.per_prefill = std::max(0.0, x[2]);
  c_.per_context = std::max(0.0, x[3]) / kContextUnit;
  // The per-token prefill cost is known once prefills of two sizes (0 included) were seen and it
  // came out positive.
  c_.ready = prefill_seen && p_max > p_min && (c_.per_prefill > 0 || c_.per_context > 0);
}

double StepCostModel::decode_step(std::int64_t decodes) const {
  if (const auto it = decode_steps_.find(decodes); it != decode_steps_.end()) return it->second;
  if (c_.ready) return predict(decodes, 0, 0);
  return c_.decode_step;
}

double StepCostModel::predict(std::int64_t decode_tokens, std::int64_t prefill_tokens, double prefill_context) const {
  return c_.fixed + c_.per_decode * static_cast<double>(decode_tokens) +
         c_.per_prefill * static_cast<double>(prefill_tokens) + c_.per_context * prefill_context;
}

std::int64_t StepCostModel::prefill_budget(std::int64_t decode_tokens, double target, std::int64_t min_chunk,
                                           std::int64_t cap, std::int64_t cold_chunk, std::int64_t start) const {
  const std::int64_t lo = std::min(std::max<std::int64_t>(min_chunk, 1), cap);
  if (!c_.ready) return std::clamp(cold_chunk, lo, std::max(lo, cap));
  const double left = target - predict(decode_tokens, 0);
  // The largest n with per_prefill n + per_context (n start + n (n + 1) / 2) <= left:
  // a n^2 + b n - left <= 0.
  const double qa = 0.5 * c_.per_context;
  const double qb = c_.per_prefill + c_.per_context * (static_cast<double>(std::max<std::int64_t>(start, 0)) + 0.5);
  const double tokens = left <= 0 ? 0 : qa > 0 ? (-qb + std::sqrt(qb * qb + 4 * qa * left)) / (2 * qa) : left / qb;
  if (!(tokens >= static_cast<double>(lo))) return lo;
  if (tokens >= static_cast<double>(cap)) return cap;
  return static_cast<std::int64_t>(tokens);
}

}  // namespace sx::sched
