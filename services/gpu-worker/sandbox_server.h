#pragma once

// The sandbox process's side: serves Hello / Compile / Run requests from the worker over
// stdin/stdout using a device backend. Untrusted kernels run here and nowhere else.

#include <functional>
#include <memory>

#include "services/gpu-worker/device_backend.h"
#include "services/gpu-worker/resident_inputs.h"

namespace kforge::worker {

using BackendFactory = std::function<std::unique_ptr<DeviceBackend>(v1::Backend)>;

// The backends compiled into this build.
std::unique_ptr<DeviceBackend> MakeBackend(v1::Backend backend);

// Serves requests until end of input. Returns the process exit code.
int ServeSandbox(int in_fd, int out_fd, const BackendFactory& factory);

// Handles one run request (exposed for tests that drive a backend in-process). `store` holds the
// resident inputs of this sandbox's lifetime.
v1::RunResponse ExecuteRun(DeviceBackend& backend, ResidentStore& store, const v1::RunRequest& req);

}  // namespace kforge::worker
