// Sampler implementation.
#include "runtime/engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "runtime/hal/ops.h"

namespace sx::engine {

Status SamplingParams::validate() const {
  if (!(temperature >= 0.0f) || !std::isfinite(temperature)) {
    return invalid_argument_error("temperature must be a finite number >= 0, got {}", temperature);
  }
  if (!(top_p > 0.0f && top_p <= 1.0f)) return invalid_argument_error("top_p must be in (0, 1], got {}", top_p);
  if (!(min_p >= 0.0f && min_p <= 1.0f)) return invalid_argument_error("min_p must be in [0, 1], got {}", min_p);
  if (!(repetition_penalty > 0.0f) || !std::isfinite(repetition_penalty)) {
    return invalid_argument_error("repetition_penalty must be > 0, got {}", repetition_penalty);
  }
  if (!(presence_penalty >= -2.0f && presence_penalty <= 2.0f)) {
    return invalid_argument_error("presence_penalty must be in [-2, 2], got {}", presence_penalty);
  }
  if (!(frequency_penalty >= -2.0f && frequency_penalty <= 2.0f)) {
    return invalid_argument_error("frequency_penalty must be in [-2, 2], got {}", frequency_penalty);
  }
  return ok_status();
}

std::int32_t argmax(std::span<const float> logits) {
  std::size_t best = 0;
  for (std::size_t i = 1; i < logits.size(); ++i) {
    if (hal::top_k_before(logits[i], static_cast<std::int64_t>(i), logits[best], static_cast<std::int64_t>(best))) {
      best = i;
    }
  }
  return static_cast<std::int32_t>(best);
}

Sampler::Sampler(SamplingParams params, std::span<const std::int32_t> prompt_tokens)
    : params_(params), rng_(params.seed.value_or(std::random_device{}())) {
  if (params_.repetition_penalty != 1.0f) {
    prompt_unique_.assign(prompt_tokens.begin(), prompt_tokens.end());
    std::sort(prompt_unique_.begin(), prompt_unique_.end());
    prompt_unique_.erase(std::unique(prompt_unique_.begin(), prompt_unique_.end()), prompt_unique_.end());
  }
}

void Sampler::accept(std::int32_t token) { ++output_counts_[token]; }

void Sampler::apply_penalties(std::span<float> logits) const {
  const auto n = static_cast<std::int32_t>(logits.size());
  auto in_range = [n](std::int32_t t) { return t >= 0 && t < n; };
  if (params_.repetition_penalty != 1.0f) {
    const float rp = params_.repetition_penalty;
    auto penalise = [&](std::int32_t t) {
      float& l = logits[static_cast<std::size_t>(t)];
      l = l > 0.0f ? l / rp : l * rp;
    };
    // Each token once, whether it appears in the prompt, the output or both.
    for (std::int32_t t : prompt_unique_) {
      if (in_range(t)) penalise(t);
    }
    for (const auto& [t, count] : output_counts_) {
      if (in_range(t) && !std::binary_search(prompt_unique_.begin(), prompt_unique_.end(), t)) penalise(t);
    }
  }
  if (params_.presence_penalty != 0.0f || params_.frequency_penalty != 0.0f) {
    for (const auto& [t, count] : output_counts_) {
      if (!in_range(t)) continue;
      logits[static_cast<std::size_t>(t)] -= params_.presence_penalty + params_.frequency_penalty * static_cast<float>(count);
    }
  }
}

bool Sampler::on_device_candidates(int limit, int* k) const {
  if (params_.repetition_penalty != 1.0f || params_.presence_penalty != 0.0f || params_.frequency_penalty != 0.0f) {
    return false;
  }
  const bool greedy = params_.temperature == 0.0f || params_.top_k == 1;
  if (!greedy && (params_.top_k <= 0 || params_.top_k > limit)) return false;
  *k = greedy ? 1 : params_.top_k;
  return true;
}

std::int32_t Sampler::sample(std::span<float> logits) {
  apply_penalties(logits);
  std::int32_t chosen;
  if (params_.temperature == 0.0f || params_.top_k == 1) {
    chosen = argmax(logits);
  } else {
    const auto n = static_cast<std::int32_t>(logits.size());
    auto by_logit = [&](std::int32_t a, std::int32_t b) {
      const float la = logits[static_cast<std::size_t>(a)], lb = logits[static_cast<std::size_t>(b)];
      return la > lb || (la == lb && a < b);
    };
    // The top-k set (the whole vocabulary when top-k is off).
    const std::int32_t k = params_.top_k > 0 ? std::min(params_.top_k, n) : n;
    ids_.resize(static_cast<std::size_t>(n));
    std::iota(ids_.begin(), ids_.end(), 0);
    if (k < n) std::nth_element(ids_.begin(), ids_.begin() + k, ids_.end(), by_logit);
    // Best first as far as draw() reads first (the first 1024; the rest when it gets there).
    const std::int32_t head = std::min(k, 1024);
    std::partial_sort(ids_.begin(), ids_.begin() + head, ids_.begin() + k, by_logit);
    candidates_.resize(static_cast<std::size_t>(k));
    for (std::int32_t i = 0; i < k; ++i) {
      const std::int32_t id = ids_[static_cast<std::size_t>(i)];
      candidates_[static_cast<std::size_t>(i)] = {logits[static_cast<std::size_t>(id)], id};
    }
    chosen = draw(head);
  }
  accept(chosen);
  return chosen;
}

std::int32_t Sampler::sample_top(std::span<const float> values, std::span<const std::int32_t> ids) {
  int k = 0;
  const bool ok = on_device_candidates(static_cast<int>(values.size()), &k);
  std::int32_t chosen = ids.empty() ? 0 : ids[0];
  if (ok && k > 1) {
    candidates_.resize(static_cast<std::size_t>(k));
    for (int i = 0; i < k; ++i) candidates_[static_cast<std::size_t>(i)] = {values[static_cast<std::size_t>(i)], ids[static_cast<std::size_t>(i)]};
    chosen = draw(k);
  }
  accept(chosen);
  return chosen;
}

std::int32_t Sampler::draw(std::int32_t sorted) {
  const auto k = static_cast<std::int32_t>(candidates_.size());
  const float inv_t = 1.0f / params_.temperature;
  const float max_logit = candidates_[0].logit;
  auto weight = [&](std::int32_t i) {
    return std::exp(static_cast<double>((candidates_[static_cast<std::size_t>(i)].logit - max_logit) * inv_t));
  };
  auto before = [](const Candidate& a, const Candidate& b) {
    return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
  };
  // The softmax denominator over the set, summed best first as far as it is sorted.
  double total = 0.0;
  for (std::int32_t i = 0; i < k; ++i) total += weight(i);
  // Walk the set best first (sorting the rest once the walk passes the sorted head).
  const double top_prob = 1.0 / total;  // the best token has weight exp(0) = 1
  probs_.clear();
  double cum = 0.0;
  for (std::int32_t i = 0; i < k; ++i) {
    if (i == sorted) {
      std::sort(candidates_.begin() + sorted, candidates_.end(), before);
      sorted = k;
    }
    const double p = weight(i) / total;
    if (i > 0 && params_.min_p > 0.0f && p < params_.min_p * top_prob) break;
    probs_.push_back(static_cast<float>(p));
    cum += p;
    if (cum >= params_.top_p) break;
  }
  double mass = 0.0;
  for (float p : probs_) mass += p;
  const double u = static_cast<double>(rng_() >> 11) * 0x1.0p-53 * mass;
  double acc = 0.0;
  std::int32_t chosen = candidates_[probs_.size() - 1].id;
  for (std::size_t i = 0; i < probs_.size(); ++i) {
    acc += probs_[i];
    if (u < acc) {
      chosen = candidates_[i].id;
      break;
    }
  }
  return chosen;
}

}  // namespace sx::engine
