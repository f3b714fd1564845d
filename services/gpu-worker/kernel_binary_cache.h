#pragma once

#include "services/gpu-worker/layer.h"

// The worker's kernel binary cache: what a device runtime built from a compile request (a CUDA
// cubin, an OpenCL program binary), on disk under a key of the request and the device, so that
// the same kernel compiled again (a re-tune, another sandbox of the worker, after a restart) is
// loaded instead of compiled. The worker writes it and the sandboxes cannot reach the folder, but
// the bytes come from a sandbox, which compiles every job's candidates in turn: one that a
// kernel or compiler exploit took over could answer a later request with a forged binary, and the
// cache would keep it past that sandbox's life. So it is for one user's runs (`kforge run`, `kforge
// eval`) and, opted in (compile_cache.binaries), for a fleet whose tenants trust each other.
//
// A file holds a header (format, key, size and SHA-256 of the bytes) and the bytes; one that does
// not match is a miss and goes. Writes go to a temporary file renamed into place, so readers never
// see half a file; past `max_bytes` the least recently written files go.

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kforge::worker {

class KernelBinaryCache {
 public:
  // Opens (and creates, 0700) `dir`.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<KernelBinaryCache>> Open(const std::string& dir,
                                                                            int64_t max_bytes);

  // The bytes stored under `key`, or nullopt (absent, damaged: a damaged file is removed).
  std::optional<std::string> Get(absl::string_view key);
  // Whether a file is stored under `key`, without reading it (Get still checks it).
  bool Contains(absl::string_view key) const;
  // Stores `bytes` under `key` (replacing what was there). A failure leaves the cache as it was.
  absl::Status Put(absl::string_view key, absl::string_view bytes);

  const std::string& dir() const { return dir_; }

 private:
  KernelBinaryCache(std::string dir, int64_t max_bytes) : dir_(std::move(dir)), max_bytes_(max_bytes) {}
  std::string PathOf(absl::string_view key) const;
  // Removes the oldest files until the total is at most max_bytes_ (under mu_).
  void Trim();

  const std::string dir_;
  const int64_t max_bytes_;
  std::mutex mu_;
  int64_t total_bytes_ = -1;  // -1: not counted yet
};

}  // namespace kforge::worker
