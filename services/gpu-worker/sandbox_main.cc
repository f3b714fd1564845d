// kforge-sandbox: the process in which untrusted kernels are compiled and run. Started by the
// worker with a clean environment, resource limits and no inherited descriptors; speaks frames
// on stdin/stdout.
//
//   kforge-sandbox [--jail [--require-jail]] [--backend opencl|cuda] [--read PATH]... [--write PATH]...
//   kforge-sandbox --python PYTHON --package DIR [--allow-fork] [--jail [--require-jail]] [--read PATH]...
//
// --jail: once its device is open and before it sees a candidate, the process jails itself
// (sandbox_jail.h: files, network, signals, shared memory): system libraries and tools, device
// nodes, its working folder, each --read PATH, and each --write PATH read-write (the runtimes'
// kernel caches). --require-jail: a sandbox that cannot jail itself fully serves nothing (its hello
// says why, and it exits with status 5).
//
// --python: the launcher of a PyTorch reference (torch_runner.h). It jails itself at once (no
// device of its own to open first), without new processes unless --allow-fork (torch.compile
// starts compilers), with DIR (the kforge_torch package) readable, then executes PYTHON running
// kforge_torch.runner: the tenant's module runs inside the jail.

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/host_memory.h"
#include "services/gpu-worker/sandbox_jail.h"
#include "services/gpu-worker/sandbox_server.h"

namespace {

using namespace kforge;

// Jails this process's files and becomes PYTHON running kforge_torch.runner (which speaks on
// stdin and stdout). The runner applies the rest of the jail (seccomp: network, signals, IPC, new
// processes; the plan in KFORGE_JAIL_PLAN) once torch has opened its device and before it reads a
// request: the CUDA driver does not initialise inside the whole jail, and the tenant's module
// arrives only in a request. Status 5 (kExitNotJailed) when a required jail cannot be had (the
// runner exits so too); 127 when PYTHON cannot be executed.
int RunPython(const std::string& python, const std::string& package, bool allow_fork, bool jail, bool require_jail,
              worker::JailOptions jo) {
  if (jail) {
    jo.allow_fork = allow_fork;
    jo.extra_read.push_back(package);
    // The interpreter's own configuration (Debian's sitecustomize).
    for (const char* etc : {"/etc/python3", "/etc/python3.11", "/etc/python3.12", "/etc/python3.13"}) {
      jo.extra_read.emplace_back(etc);
    }
    worker::LandlockApplied files;
    if (absl::Status st = worker::JailFiles(jo, &files); !st.ok()) {
      std::fprintf(stderr, "kforge-sandbox: the PyTorch process is not jailed: %s\n", std::string(st.message()).c_str());
      if (require_jail) return worker::kExitNotJailed;
    }
    setenv("KFORGE_JAIL_PLAN", worker::SeccompPlanJson(jo, files).c_str(), 1);
    setenv("KFORGE_JAIL_REQUIRED", require_jail ? "1" : "0", 1);
  } else if (require_jail) {
    std::fprintf(stderr, "kforge-sandbox: the PyTorch process is not jailed (sandbox.restrict_files is off)\n");
    return worker::kExitNotJailed;
  } else {
    unsetenv("KFORGE_JAIL_PLAN");
    unsetenv("KFORGE_JAIL_REQUIRED");
  }
  const std::string code = absl::StrCat("import sys; sys.path.insert(0, ", "'", package, "'",
                                        "); from kforge_torch import runner; runner.main()");
  std::vector<char*> argv = {const_cast<char*>(python.c_str()), const_cast<char*>("-I"), const_cast<char*>("-B"),
                             const_cast<char*>("-c"), const_cast<char*>(code.c_str()), nullptr};
  execv(python.c_str(), argv.data());
  std::fprintf(stderr, "kforge-sandbox: cannot execute %s: %s\n", python.c_str(), std::strerror(errno));
  return 127;
}

}  // namespace

int main(int argc, char** argv) {
  bool jail = false;
  bool require_jail = false;
  std::string python, package;
  bool allow_fork = false;
  worker::JailOptions jo;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--jail") {
      jail = true;
    } else if (a == "--require-jail") {
      require_jail = true;
    } else if (a == "--backend" && i + 1 < argc) {
      jo.backend = std::strcmp(argv[++i], "cuda") == 0 ? v1::BACKEND_CUDA : v1::BACKEND_OPENCL;
    } else if (a == "--read" && i + 1 < argc) {
      jo.extra_read.emplace_back(argv[++i]);
    } else if (a == "--write" && i + 1 < argc) {
      jo.extra_write.emplace_back(argv[++i]);
    } else if (a == "--python" && i + 1 < argc) {
      python = argv[++i];
    } else if (a == "--package" && i + 1 < argc) {
      package = argv[++i];
    } else if (a == "--allow-fork") {
      allow_fork = true;
    } else {
      std::fprintf(stderr, "kforge-sandbox: unknown argument '%s'\n", argv[i]);
      return 2;
    }
  }
  char cwd[4096];
  if (getcwd(cwd, sizeof(cwd)) == nullptr) return 126;
  jo.work_dir = cwd;
  if (!python.empty()) return RunPython(python, package, allow_fork, jail, require_jail, jo);
  // After the device opened (drivers read their files first), before any candidate arrives.
  auto restrict = [&](v1::HelloResponse* hello) -> absl::Status {
    if (!jail) {
      hello->set_jail_message("not jailed: sandbox.restrict_files is off");
      return require_jail ? absl::FailedPreconditionError("the sandbox is not jailed (sandbox.restrict_files is off)")
                          : absl::OkStatus();
    }
    absl::StatusOr<worker::JailReport> r = worker::JailSelf(jo);
    if (r.ok()) {
      hello->set_jailed(true);
      hello->set_jail_message(r->summary);
      return absl::OkStatus();
    }
    hello->set_jail_message(std::string(r.status().message()));
    if (require_jail) {
      return absl::FailedPreconditionError(
          absl::StrCat("the sandbox cannot jail itself (sandbox.require_jail is on): ", r.status().message()));
    }
    // The worker logs this line and shows it in its metrics; the include screen still stands.
    std::fprintf(stderr, "kforge-sandbox: not jailed: %s\n", std::string(r.status().message()).c_str());
    return absl::OkStatus();
  };
  (void)KeepLargeAllocationsInHeap();  // if refused, buffer moves are only slower
  // Keep stdout for frames only: anything a driver or a kernel's printf writes goes to stderr,
  // which the worker drains with a cap.
  const int frames_out = dup(1);
  dup2(2, 1);
  return worker::ServeSandbox(0, frames_out, worker::MakeBackend, restrict);
}
