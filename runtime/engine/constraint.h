// A request's output held to a grammar (structured output: a JSON schema, a regex, a choice, tool-call
// arguments): before each token is sampled, the tokens the grammar allows are the only ones left.
//
// The engine knows only this interface (the grammar engine lives in the daemon, daemon/chat/
// structured.h). Each step it asks every constrained request for its mask on a thread of its own
// while the forward runs (the mask depends only on the tokens accepted so far), sets the logits of
// the tokens the mask refuses to -infinity, samples, and tells the constraint the token. A request
// with a constraint is sampled from its whole row of logits (never from a device's top-k).
//
// Threading: fill_mask and accept are called by the engine's step, one at a time per constraint,
// from the step's thread or the mask thread (never both at once).
#pragma once

#include <cstdint>
#include <span>

namespace sx::engine {

class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  // The tokens allowed next: bit (t % 32) of words[t / 32] set for token t. `words` covers the
  // model's vocabulary and comes zeroed (tokens the constraint does not know stay refused).
  virtual void fill_mask(std::span<std::uint32_t> words) = 0;
  // The token sampled (one the mask allowed, a stop token at the grammar's end).
  virtual void accept(std::int32_t token) = 0;
};

}  // namespace sx::engine
