#pragma once

#include "services/gpu-worker/layer.h"

// The worker's side of the sandbox: a kforge-sandbox child process per backend, started with a
// clean environment, resource limits, its own process group and an empty working folder, and
// killed by a wall-clock watchdog when a request overruns. A crash or hang costs the child, never
// the worker; the next request starts a fresh one.

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "kforge/v1/sandbox.pb.h"
#include "services/gpu-worker/shared_output.h"

namespace kforge::worker {

struct SandboxOptions {
  std::string binary;             // path to kforge-sandbox
  // RLIMIT_AS of OpenCL sandboxes; 0 = none. Not applied to CUDA sandboxes: the CUDA driver
  // reserves address space far beyond any physical memory.
  int64_t memory_limit_mb = 16384;
  // RLIMIT_CPU per request: before each request the child's limit is moved to the CPU time it has
  // used plus this many CPU-seconds per wall-clock second of the request's timeout (a backstop
  // behind the wall-clock watchdog: a spinning kernel dies of SIGXCPU at the latest). 0 = none.
  double cpu_seconds_per_timeout_second = 4;
  double start_timeout_seconds = 30;
  // Environment variables passed through (a trailing '*' matches a prefix). Nothing else is.
  // Restrict the files the child may open (Landlock; see file_jail.h), plus these paths.
  bool restrict_files = true;
  std::vector<std::string> read_paths;
  // A child that cannot jail itself fully (sandbox_jail.h) serves nothing: EnsureStarted says it is
  // unavailable, with the reason (sandbox.require_jail; on in the cluster's configs).
  bool require_jail = false;
  // The user a child runs as when the worker runs as root: -1 = "nobody" (65534), 0 = root itself.
  // A worker that is not root starts children as itself.
  int64_t run_as_uid = -1;
  // Where the device runtimes keep their compiled-kernel caches (PoCL's POCL_CACHE_DIR, the CUDA
  // driver's CUDA_CACHE_PATH), writable by the child: a folder that outlives the sandbox and the
  // worker, so a kernel compiled once is not compiled again by the next process. "" = the
  // sandbox's own folder (lost with the Sandbox object).
  std::string runtime_cache_dir;
  // What the child may write to its stderr (drivers' messages, a kernel's printf) per request;
  // the rest is counted and dropped, so a printf flood cannot fill the worker's log.
  int64_t max_output_bytes = 64 << 10;
  // The largest output arena (shared_output.h) accepted from a child: a bound on the memory a
  // subverted one can make this process map. Enough for one run of the largest problem allowed.
  int64_t max_output_arena_bytes = int64_t{10} << 30;
  std::vector<std::string> env_allow = {"PATH", "LD_LIBRARY_PATH", "POCL_*", "OCL_ICD_*",
                                        "OPENCL_VENDOR_PATH", "CUDA_VISIBLE_DEVICES", "CUDA_HOME",
                                        "CUDA_PATH", "KFORGE_OPENCL_DEVICE", "KFORGE_CUDA_DEVICE"};
};

// Finds kforge-sandbox: $KFORGE_SANDBOX_BINARY, then beside the running executable, then the
// build tree layout, then PATH.
std::string FindSandboxBinary();

class Sandbox {
 public:
  enum class CallStatus { kOk, kTimeout, kCrashed, kInfraError };
  struct CallResult {
    CallStatus status = CallStatus::kInfraError;
    v1::SandboxResponse response;
    std::string message;  // why, when not ok ("killed by signal SIGSEGV", ...)
    // The sandbox's output arena as this response left it (Call checked every buffer's range).
    std::string_view arena;

    // A returned buffer's bytes, inline or in the arena. Arena bytes are valid until the next
    // Call: the sandbox reuses the arena for the next run.
    std::string_view Bytes(const v1::BufferData& b) const {
      return b.arena_bytes() > 0 ? arena.substr(static_cast<size_t>(b.arena_offset()),
                                                static_cast<size_t>(b.arena_bytes()))
                                 : std::string_view(b.data());
    }
  };

  Sandbox(SandboxOptions options, v1::Backend backend);
  ~Sandbox();
  Sandbox(const Sandbox&) = delete;
  Sandbox& operator=(const Sandbox&) = delete;

  // Starts the child if none runs and returns its hello (device info or why unavailable).
  [[nodiscard]] absl::StatusOr<v1::HelloResponse> EnsureStarted();
  // Sends one request and waits up to timeout_seconds. On timeout or crash the child is gone and
  // the next call starts a new one.
  CallResult Call(const v1::SandboxRequest& request, double timeout_seconds);
  void Kill();
  // Kills the child from another thread (shutdown): the call in flight returns as crashed.
  void Interrupt();

  // Increments with every child started: reference timings are only comparable within one.
  int generation() const { return generation_; }
  bool running() const { return pid_ > 0; }
  pid_t pid() const { return pid_; }
  double last_start_seconds() const { return last_start_seconds_; }
  const v1::HelloResponse& hello() const { return hello_; }
  // Bytes written to and read from children (frames, and outputs read from the arena), over this
  // object's lifetime.
  int64_t bytes_sent() const { return bytes_sent_; }
  int64_t bytes_received() const { return bytes_received_; }
  // What children wrote to their stderr beyond max_output_bytes per request, and was dropped.
  int64_t output_bytes_dropped() const { return output_dropped_total_; }
  const std::string& work_dir() const { return work_dir_; }

 private:
  absl::Status Spawn();
  // Takes the output arena a response came with, if any (the child's new one), and checks that
  // the response's buffers lie inside the current arena. DataLoss when either is wrong.
  absl::Status AcceptArena(const std::vector<OwnedFd>& fds, const v1::SandboxResponse& response);
  std::string Reap(bool kill_first);  // waits for the child; returns how it ended
  void LimitCpu(double timeout_seconds);
  // Copies the child's stderr to ours, up to max_output_bytes per request.
  void DrainOutput(int fd);
  void StopDrain();

  SandboxOptions options_;
  v1::Backend backend_;
  std::string work_dir_;
  std::atomic<pid_t> pid_{-1};
  int fd_ = -1;
  std::thread drain_;
  std::atomic<bool> drain_stop_{false};
  std::atomic<int64_t> output_budget_{0};
  std::atomic<int64_t> output_dropped_{0};
  std::atomic<int64_t> output_dropped_total_{0};
  int generation_ = 0;
  double last_start_seconds_ = 0;
  int64_t bytes_sent_ = 0;
  int64_t bytes_received_ = 0;
  v1::HelloResponse hello_;
  ArenaMapping arena_;  // the child's output arena, read-only
};

}  // namespace kforge::worker
