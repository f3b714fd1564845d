#pragma once

#include "services/llm-proxy/layer.h"

#include <functional>

namespace kforge::llm {

// True once the work's result is no longer wanted (the caller's deadline passed, it hung up, or
// the process is shutting down). Called often, from the working thread: keep it cheap.
using CancelledFn = std::function<bool()>;

}  // namespace kforge::llm
