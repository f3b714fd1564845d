#pragma once

#include "services/gpu-worker/layer.h"

// CUDA: NVRTC compiles in-process (cuda_compiler.h), the driver API runs kernels. Both libraries
// are loaded with dlopen at run time, so binaries start (and report "no CUDA device") on machines
// without them.

#include <memory>

#include "services/gpu-worker/cuda_compiler.h"
#include "services/gpu-worker/device_backend.h"

namespace kforge::worker {

// The CUDA device backend (sandbox side). nullptr when built without CUDA support.
std::unique_ptr<DeviceBackend> MakeCudaBackend();

}  // namespace kforge::worker
