#pragma once

#include "services/gpu-worker/layer.h"

#include <dlfcn.h>

namespace kforge::worker {

// Resolves `name` in a dlopen handle into a typed function pointer; false when it is missing.
template <typename F>
bool DlSymbol(void* handle, const char* name, F* out) {
  *out = reinterpret_cast<F>(dlsym(handle, name));
  return *out != nullptr;
}

}  // namespace kforge::worker
