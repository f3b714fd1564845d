#pragma once

#include "services/gpu-worker/layer.h"

// What the sandbox process needs from a device API. Implementations: OpenCL, CUDA. They run
// only inside kforge-sandbox, never in the worker process.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "kforge/v1/sandbox.pb.h"

namespace kforge::worker {

using DeviceBuf = uintptr_t;

// A kernel call with its buffer arguments bound to device buffers (0 for scalar args).
struct BoundCall {
  const v1::KernelCall* call = nullptr;
  std::vector<DeviceBuf> buffers;  // parallel to call->args()
};

// The compile cache key: hash(source, defines, entry points, device + compiler version). Both
// backends key their in-process program caches with it.
std::string CompileCacheKey(const v1::CompileRequest& request, const std::string& compiler_id);

class DeviceBackend {
 public:
  virtual ~DeviceBackend() = default;

  // Opens the device; an unavailable backend says why in the response, it is not an error.
  virtual v1::HelloResponse Init() = 0;
  // Builds (or finds in the cache) a program with the given entry points.
  virtual v1::CompileResponse Compile(const v1::CompileRequest& request) = 0;

  [[nodiscard]] virtual absl::StatusOr<DeviceBuf> Alloc(size_t bytes) = 0;
  virtual void Free(DeviceBuf buf) = 0;
  // Zeroes the first `bytes` of a buffer and waits for it. The sandbox clears every buffer that
  // held results before freeing it: a later kernel reading freed memory the driver still maps
  // finds no answer (a reference's or another candidate's) to copy out.
  [[nodiscard]] virtual absl::Status Clear(DeviceBuf buf, size_t bytes) = 0;
  [[nodiscard]] virtual absl::Status Upload(DeviceBuf buf, std::string_view data) = 0;
  // Fills the first `bytes` of a buffer (a multiple of element.size(), which is 1 to 8) with
  // copies of `element` and waits: poisoned outputs start on the device without tens of MB of
  // known bytes crossing to it before every run. This default expands them on the host and
  // uploads.
  [[nodiscard]] virtual absl::Status Fill(DeviceBuf buf, size_t bytes, std::string_view element);
  // Copies the first `bytes` of a buffer to `dst` (host memory the caller owns: a string, or a
  // shared output file's mapping).
  [[nodiscard]] virtual absl::Status Download(DeviceBuf buf, size_t bytes, char* dst) = 0;

  // Runs the calls in order and waits for them. Returns device seconds from the start of the
  // first to the end of the last. InvalidArgument: the launch was refused (launch error);
  // Aborted: the device is in a sticky error state and this process must exit (crashed).
  [[nodiscard]] virtual absl::StatusOr<double> Launch(int program_id,
                                                      const std::vector<BoundCall>& calls) = 0;

  // Evicts caches between benchmark samples (GPUs: an L2-sized write).
  virtual void FlushCache() {}
};

}  // namespace kforge::worker
