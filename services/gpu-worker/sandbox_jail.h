#pragma once

#include "services/gpu-worker/layer.h"

// The jail a sandbox process puts itself in before it sees a candidate (kforge-sandbox after its
// device opened; the PyTorch reference's launcher before it executes Python), inherited by all
// it executes. Model-written kernels and tenants' modules run in it, so it closes more than files:
//   files     Landlock: system libraries and tools, device nodes (not /dev/shm), its own folder
//   network   seccomp: no socket of any family is created (so no TCP, UDP or abstract unix
//             socket), and Landlock's TCP rules where the kernel has them (ABI 4)
//   signals   seccomp: kill and its kin reach only the process itself; Landlock's scope where
//             the kernel has it (ABI 6) also keeps abstract sockets and signals inside
//   IPC       seccomp: no System V shared memory, semaphores or message queues, no POSIX message
//             queues, no ptrace or process_vm_* of another process
//   fork      optionally (the Python reference): no new processes, threads only
// The worker also starts it as an unprivileged user when the worker runs as root (sandbox.h).

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "services/gpu-worker/file_jail.h"
#include "kforge/v1/problem.pb.h"

namespace kforge::worker {

struct JailOptions {
  v1::Backend backend = v1::BACKEND_OPENCL;
  std::string work_dir;                  // read-write: HOME and TMPDIR
  std::vector<std::string> extra_read;   // sandbox.read_paths
  std::vector<std::string> extra_write;  // the runtimes' kernel caches
  bool allow_fork = true;                // PoCL runs the system linker as a child process
};

// What was enforced, for the worker's log and metrics ("files, network, signals, ipc").
struct JailReport {
  std::string summary;
  int landlock_abi = 0;
};

// Jails the calling process for good. An error (no Landlock on this kernel, a filter refused)
// means the process is NOT fully jailed; what did apply stays applied.
[[nodiscard]] absl::StatusOr<JailReport> JailSelf(const JailOptions& options);

// The jail in two steps, for the PyTorch process, whose device must open between them (the
// CUDA driver does not initialise inside the whole jail): JailFiles applies the files part now,
// before Python starts, so that every thread the process will have is under it (Landlock binds
// the threads that exist when it is applied and what they start); SeccompPlanJson is the rest,
// which the process applies to all its threads at once (seccomp's thread sync) once torch has
// opened its device, before it reads a request (python/kforge_torch/jail.py). JSON: the seccomp
// system call's number, the filter (hex of its sock_filter instructions) and the summary JailSelf
// would report.
[[nodiscard]] absl::Status JailFiles(const JailOptions& options, LandlockApplied* applied);
std::string SeccompPlanJson(const JailOptions& options, const LandlockApplied& files);

// Only the seccomp part (the tests of the filter use it alone).
[[nodiscard]] absl::Status ApplySeccompJail(bool allow_fork);

}  // namespace kforge::worker
