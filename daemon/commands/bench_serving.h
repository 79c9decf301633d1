// Serving benchmarks for `sextant bench`: N concurrent requests through the engine (aggregate
// decode tokens/s, TTFT and inter-token latency percentiles, against one request alone measured in
// the same run), and a second chat turn sharing a long prefix (TTFT with the prefix cache warm vs
// cold, outputs compared).
#pragma once

#include <cstdint>

#include "runtime/base/status.h"
#include "runtime/engine/model.h"
#include "runtime/tokenizer/tokenizer.h"

namespace sx::daemon {

Status bench_concurrency(engine::Model& model, const tokenizer::Tokenizer& tok, std::int64_t concurrency,
                         std::int64_t prompt_tokens, std::int64_t gen_tokens, std::uint64_t seed);

Status bench_prefix_cache(engine::Model& model, const tokenizer::Tokenizer& tok, std::int64_t prefix_tokens,
                          std::int64_t gen_tokens, std::uint64_t seed);

}  // namespace sx::daemon
