#pragma once

#include "services/gpu-worker/layer.h"

// The sandbox process's side: serves Hello / Compile / Run requests from the worker over
// stdin/stdout using a device backend. Untrusted kernels run here and nowhere else.

#include <functional>
#include <memory>
#include <vector>

#include "services/gpu-worker/device_backend.h"
#include "services/gpu-worker/resident_inputs.h"
#include "services/gpu-worker/shared_output.h"

namespace kforge::worker {

using BackendFactory = std::function<std::unique_ptr<DeviceBackend>(v1::Backend)>;

// The backends compiled into this build.
std::unique_ptr<DeviceBackend> MakeBackend(v1::Backend backend);

// Restricts the process once its device is open; fills the hello's jailed / jail_message. An
// error stops the sandbox: the hello says it is unavailable, with the reason.
using AfterOpenFn = std::function<absl::Status(v1::HelloResponse* hello)>;

// The exit code of a sandbox that refused to serve because it could not jail itself.
inline constexpr int kExitNotJailed = 5;

// Serves requests until end of input. Returns the process exit code. `after_open` runs once a
// backend has opened its device (after a successful Hello), before any candidate is seen: the
// place to restrict the process further (kforge-sandbox jails itself there, so that drivers open
// what they need first).
int ServeSandbox(int in_fd, int out_fd, const BackendFactory& factory, const AfterOpenFn& after_open = {});

// Handles one run request (exposed for tests that drive a backend in-process). `store` holds the
// resident inputs of this sandbox's lifetime. With `arena`, buffers of at least
// req.share_outputs_min_bytes come back there (BufferData.arena_offset); without, every buffer
// comes back inline.
v1::RunResponse ExecuteRun(DeviceBackend& backend, ResidentStore& store, const v1::RunRequest& req,
                           OutputArena* arena = nullptr);

}  // namespace kforge::worker
