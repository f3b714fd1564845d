#pragma once

#include "services/gpu-worker/layer.h"

#include <memory>

#include "services/gpu-worker/device_backend.h"

namespace kforge::worker {

// OpenCL through the ICD loader (PoCL on CPUs). nullptr when built without OpenCL.
std::unique_ptr<DeviceBackend> MakeOpenClBackend();

}  // namespace kforge::worker
