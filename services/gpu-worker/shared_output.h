#pragma once

#include "services/gpu-worker/layer.h"

// Run outputs handed from the sandbox to the worker through a shared memory file (the output
// arena) instead of inside the response frame. The device writes a buffer straight into the
// arena, the worker compares it where it lies: no protobuf copy on either side, no socket copy,
// no zeroing of those copies. The arena lives as long as the sandbox process and is reused run
// after run, so its pages are touched once (fresh pages cost more than the copies they save).
//
// What keeps it safe with hostile kernels in the sandbox (a CPU OpenCL device runs them in the
// sandbox's own address space):
// - The worker reads a run's outputs only between the response and its next request, while the
//   sandbox waits for that request and no kernel runs.
// - The sandbox zeroes what the last run wrote before it serves the next request, so no later
//   kernel finds an earlier answer there (a reference's or another candidate's).
// - The arena is sealed against shrinking and growing, and the worker maps it read-only: a
//   subverted sandbox cannot truncate it under the worker (SIGBUS) or reach the worker's memory.

#include <cstddef>
#include <string_view>

#include "absl/status/statusor.h"

namespace kforge::worker {

// An owned file descriptor, closed on destruction.
class OwnedFd {
 public:
  OwnedFd() = default;
  explicit OwnedFd(int fd) : fd_(fd) {}
  ~OwnedFd();
  OwnedFd(OwnedFd&& o) noexcept : fd_(o.Release()) {}
  OwnedFd& operator=(OwnedFd&& o) noexcept;
  OwnedFd(const OwnedFd&) = delete;
  OwnedFd& operator=(const OwnedFd&) = delete;

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int Release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }

 private:
  int fd_ = -1;
};

// The sandbox's side.
class OutputArena {
 public:
  OutputArena() = default;
  ~OutputArena();
  OutputArena(const OutputArena&) = delete;
  OutputArena& operator=(const OutputArena&) = delete;

  // Makes room for `bytes`. A larger arena replaces the current one (zeroed first, then
  // unmapped); its descriptor waits in TakeNewFile for the next response.
  [[nodiscard]] absl::Status Reserve(size_t bytes);
  char* data() { return data_; }
  size_t capacity() const { return capacity_; }
  // Records that [0, end) may hold results.
  void MarkWritten(size_t end) { dirty_ = end > dirty_ ? end : dirty_; }
  // Zeroes what runs wrote since the last call.
  void Clear();
  // The descriptor of an arena made since the last call (invalid if none), to send to the worker.
  OwnedFd TakeNewFile();

 private:
  void Unmap();

  OwnedFd new_fd_;
  char* data_ = nullptr;
  size_t capacity_ = 0;
  size_t dirty_ = 0;
};

// The worker's side: an arena from the sandbox, mapped read-only. Map refuses anything else a
// sandbox could send (another kind of file, a file it could still shrink or grow).
class ArenaMapping {
 public:
  [[nodiscard]] static absl::StatusOr<ArenaMapping> Map(const OwnedFd& fd, size_t max_bytes);
  ArenaMapping() = default;
  ~ArenaMapping();
  ArenaMapping(ArenaMapping&& o) noexcept;
  ArenaMapping& operator=(ArenaMapping&& o) noexcept;
  ArenaMapping(const ArenaMapping&) = delete;
  ArenaMapping& operator=(const ArenaMapping&) = delete;

  std::string_view bytes() const { return {data_, size_}; }

 private:
  ArenaMapping(const char* data, size_t size) : data_(data), size_(size) {}
  void Unmap();

  const char* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace kforge::worker
