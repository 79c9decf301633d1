// Token sampling from logits: penalties, temperature, top-k, top-p, min-p, seeded randomness.
//
// Semantics follow vLLM / the OpenAI API:
// - repetition_penalty (> 0, 1 = off) divides positive and multiplies negative logits of every
//   token seen in the prompt or the output;
// - presence_penalty subtracts once for every token present in the output, frequency_penalty
//   subtracts once per occurrence in the output;
// - temperature 0 means greedy (argmax, lowest id on ties); otherwise logits are divided by it,
//   then top-k, top-p (smallest set whose probability reaches top_p) and min-p (drop tokens whose
//   probability is below min_p x the top probability) filter, and one token is drawn;
// - the same seed gives the same tokens for the same logits.
//
// Threading: a Sampler belongs to one request.
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <span>
#include <unordered_map>
#include <vector>

#include "runtime/base/status.h"

namespace sx::engine {

struct SamplingParams {
  float temperature = 1.0f;
  std::int32_t top_k = 0;  // 0 or negative: off
  float top_p = 1.0f;
  float min_p = 0.0f;
  float repetition_penalty = 1.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  std::optional<std::uint64_t> seed;

  // INVALID_ARGUMENT naming the field when a value is out of range.
  Status validate() const;
};

class Sampler {
 public:
  Sampler(SamplingParams params, std::span<const std::int32_t> prompt_tokens);

  // Picks the next token from logits (modified in place), given the tokens generated so far
  // (the sampler records the token it returns).
  std::int32_t sample(std::span<float> logits);

  // Whether this request's choice can be made from its best candidates alone, as a device
  // selects them (hal::TopKArgs), at most `limit` of them: no penalties, and greedy (*k = 1) or
  // top-k of at most limit (*k = top_k). Otherwise it needs the whole row of logits.
  bool on_device_candidates(int limit, int* k) const;
  // Picks the next token from the row's best candidates, best first (the order of
  // hal::TopKArgs), at least the k that on_device_candidates gave; the same token sample()
  // picks from the whole row (and the same draw for the same seed).
  std::int32_t sample_top(std::span<const float> values, std::span<const std::int32_t> ids);

  // Records a token chosen elsewhere (keeps penalty state in step).
  void accept(std::int32_t token);

  const SamplingParams& params() const { return params_; }

 private:
  struct Candidate {
    float logit;
    std::int32_t id;
  };
  void apply_penalties(std::span<float> logits) const;
  // Temperature, top-p, min-p and the draw over candidates_ (the top-k set), of which the first
  // `sorted` are in order, best first.
  std::int32_t draw(std::int32_t sorted);

  SamplingParams params_;
  std::vector<std::int32_t> prompt_unique_;
  std::unordered_map<std::int32_t, std::int32_t> output_counts_;
  std::mt19937_64 rng_;
  std::vector<std::int32_t> ids_;
  std::vector<Candidate> candidates_;
  std::vector<float> probs_;
};

// Lowest index of the largest value (NaN below every number: hal::top_k_before).
std::int32_t argmax(std::span<const float> logits);

}  // namespace sx::engine
