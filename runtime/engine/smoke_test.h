// "Small model first" (issue 22 item 4): before the real weights are read, the bundled memorised
// model (models/memorise: 2 layers, 14 heads / 2 KV heads, head_dim 16, F16) runs through the exact
// TP x PP layout on the target devices, joined by the same channels, and must give back its text
// token for token. A rank that computes wrong results, a channel that sums wrong, a device or a
// link that does not work shows here in seconds, with the step and the tokens, instead of after
// minutes of loading or as wrong answers.
//
// The bundled model allows TP up to 14 and PP up to 2; larger layouts are reported as not
// testable (the caller logs it and goes on).
//
// Threading: as Model::load (the caller's thread; the devices not in use elsewhere).
#pragma once

#include <span>
#include <string>

#include "runtime/base/status.h"
#include "runtime/hal/registry.h"

namespace sx::engine {

// The bundled model for the smoke test: $SEXTANT_SMOKE_MODEL, else memorise-f16.gguf in
// <the binary's directory>/../share/sextant, else in the source tree beside a build directory
// (<build>/daemon/sextant -> models/memorise). Empty when none is found.
std::string find_smoke_model();

struct SmokeResult {
  int steps = 0;          // greedy tokens compared with the text
  double seconds = 0;     // load + run
  std::string skipped;    // why the layout could not be tested (steps == 0), e.g. "pp 3 > 2 layers"
};

// Runs the model at `model_path` (text.txt beside it) on `devices` (tp x pp, rank order) of
// `backend`: its first 8 tokens as the prompt, then `steps` greedy tokens, each compared with the
// text. FAILED_PRECONDITION naming the layout, the devices, the step and both tokens when one
// differs; the load's or a step's error otherwise.
Result<SmokeResult> run_smoke_test(const std::string& model_path, hal::Backend& backend,
                                   std::span<hal::Device* const> devices, int tp, int pp, int steps = 24);

}  // namespace sx::engine
