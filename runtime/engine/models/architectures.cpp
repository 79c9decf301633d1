// The engine's architectures by name (architecture.h).
#include "runtime/engine/models/architecture.h"

namespace sx::engine {

const Architecture* find_architecture(std::string_view name) {
  for (const Architecture* a : {&qwen2_architecture(), &qwen3_architecture(), &qwen3moe_architecture(),
                                &qwen35_architecture(), &qwen35moe_architecture()}) {
    if (a->name == name) return a;
  }
  return nullptr;
}

}  // namespace sx::engine
