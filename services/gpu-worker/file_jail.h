#pragma once

#include "services/gpu-worker/layer.h"

// Restricts which files the calling process (and everything it later starts) may open, with
// Linux Landlock. The sandbox applies it to itself before it opens a device or compiles anything,
// so a compiler fooled into `#include "/etc/passwd"` (past the include screen) cannot open the
// file: the screen is the first line, this is the second.

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "kforge/v1/problem.pb.h"

namespace kforge::worker {

struct FileJail {
  std::vector<std::string> read_only;   // folders and files that may be read (and executed)
  std::vector<std::string> read_write;  // folders and files that may also be written
  // Where the kernel's Landlock has them: no TCP bind or connect (ABI 4), and no signal to, nor
  // abstract unix socket of, a process outside the jail (ABI 6).
  bool deny_tcp = false;
  bool scope_signals_and_sockets = false;
};

// What ApplyFileJail could enforce on this kernel.
struct LandlockApplied {
  int abi = 0;
  bool tcp = false;     // deny_tcp took effect
  bool scoped = false;  // scope_signals_and_sockets took effect
};

// What a sandbox of `backend` needs: the system's libraries and tools, the ICD and driver files,
// device nodes (not /dev/shm or /dev/mqueue: no memory shared with processes outside), its own
// working folder, `extra_read` (sandbox.read_paths) and `extra_write` (the runtimes' kernel cache
// folders).
FileJail SandboxJail(v1::Backend backend, const std::string& work_dir,
                     const std::vector<std::string>& extra_read,
                     const std::vector<std::string>& extra_write = {});

// Whether this kernel supports Landlock (0 if not; else its ABI version).
int LandlockAbi();

// Applies the jail to this process for good. Paths that do not exist are skipped. Unavailable
// (old kernel, Landlock disabled) is an error the caller decides about. `applied` (optional) says
// which of the network and scope rules the kernel took.
[[nodiscard]] absl::Status ApplyFileJail(const FileJail& jail, LandlockApplied* applied = nullptr);

}  // namespace kforge::worker
