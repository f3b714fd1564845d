#pragma once

// Whether this machine runs PyTorch references (a python3 that imports torch, and the
// kforge_torch package): "" when it does, else why not. Tests that need torch skip with it.

#include <string>

#include "services/gpu-worker/torch_runner.h"

namespace kforge {

inline std::string TorchMissing() {
  static const std::string why = [] {
    worker::TorchRunner r(worker::TorchOptions{});
    auto info = r.EnsureStarted();
    return info.ok() ? std::string() : std::string(info.status().message());
  }();
  return why;
}

}  // namespace kforge
