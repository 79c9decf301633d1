// Registers the backends compiled into this build (CPU always; Vulkan and CUDA when built).
// Threading: default_registry() is initialised once, thread-safely, on first use.
#pragma once

#include "runtime/hal/registry.h"

namespace sx::backends {

void register_compiled_backends(hal::Registry& registry);
hal::Registry& default_registry();

}  // namespace sx::backends
