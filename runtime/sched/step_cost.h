// The cost of a forward step on this engine's devices (issue 24): step seconds as
//   fixed + per_decode x decode tokens + per_prefill x prefill tokens
//         + per_context x (the rows the prefill tokens attend to: a token at position i, i + 1),
// the last term the attention of a chunk that grows with its place in a long prompt (without it,
// a prompt's late chunks took a third longer than predicted and overshot the target),
// fitted by least squares over the recent steps that carried prefill tokens (once there are a few
// of two sizes: a step of decodes alone is bound by reading the weights, not by its tokens, and
// would bend the line; until then over all of them), each weighted by `decay` per step of age (so
// the model follows a device that gets slower or faster: another replica, a thermal limit, a longer
// context), with the four coefficients kept non-negative. Steps of decodes alone are averaged
// apart, per count of decodes (decode_step(n)): the streams' pace, which the scheduler may set its
// target against. The
// scheduler asks it how many prefill tokens fit beside the decodes of a step within the target.
//
// Until it has seen a step with prefill tokens (and one without, or enough variety to tell the
// fixed part from the per-token one), prefill_budget() answers `cold_chunk`: a small first chunk,
// so that a long prompt arriving first does not stall the streams while the model learns.
//
// Threading: not thread-safe (the engine thread).
#pragma once

#include <cstdint>
#include <deque>
#include <map>

namespace sx::sched {

// The rows a chunk of n prompt tokens from position `start` attends to: n x start + n (n + 1) / 2.
inline double prefill_context_rows(std::int64_t start, std::int64_t n) {
  return static_cast<double>(n) * static_cast<double>(start) + 0.5 * static_cast<double>(n) * static_cast<double>(n + 1);
}

class StepCostModel {
 public:
  struct Coefficients {
    double fixed = 0, per_decode = 0, per_prefill = 0;  // seconds, seconds per token
    double per_context = 0;                              // seconds per attended row of a prefill token
    std::uint64_t observations = 0;                      // steps seen (all time)
    bool ready = false;                                  // a prefill token's cost is known
    double decode_step = 0;  // seconds of a step with decodes only, any count (moving average; 0: none seen)
  };

  explicit StepCostModel(double decay = 0.95, std::size_t window = 64);

  // prefill_context: the rows the step's prefill tokens attend to, summed (prefill_context_rows).
  void observe(std::int64_t decode_tokens, std::int64_t prefill_tokens, double seconds,
               double prefill_context = 0);
  // Predicted seconds of a step.
  double predict(std::int64_t decode_tokens, std::int64_t prefill_tokens, double prefill_context = 0) const;
  // The most prefill tokens a step with `decode_tokens` decodes may take to end within `target`
  // seconds, the chunk starting at position `start` of its prompt: at least `min_chunk` (prefills
  // always progress, even when the decodes alone take longer than the target), at most `cap`;
  // `cold_chunk` (clamped the same way) until ready.
  std::int64_t prefill_budget(std::int64_t decode_tokens, double target, std::int64_t min_chunk, std::int64_t cap,
                              std::int64_t cold_chunk = 64, std::int64_t start = 0) const;
  const Coefficients& coefficients() const { return c_; }
  // Seconds of a step of `decodes` decodes alone: the moving average of such steps where some were
  // seen; else the fitted prediction once ready (a pace measured with fewer streams would
  // understate it); else decode_step (0 when none was seen).
  double decode_step(std::int64_t decodes) const;

 private:
  struct Step {
    double decode, prefill, context, seconds;  // context in kContextUnit rows
  };
  void refit();

  double decay_;
  std::size_t window_;
  std::deque<Step> steps_;  // newest last
  std::map<std::int64_t, double> decode_steps_;  // decodes -> moving average of such steps alone
  Coefficients c_;
};

}  // namespace sx::sched
