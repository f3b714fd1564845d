// kforge-sandbox: the process in which untrusted kernels are compiled and run. Started by the
// worker with a clean environment, resource limits and no inherited descriptors; speaks frames
// on stdin/stdout.
//
//   kforge-sandbox [--jail] [--backend opencl|cuda] [--read PATH]... [--write PATH]...
//
// --jail restricts the files this process may open (file_jail.h) once its device is open and
// before it sees a candidate: system libraries and tools, device nodes, its working folder, each
// --read PATH, and each --write PATH read-write (the runtimes' kernel caches).

#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "common/host_memory.h"
#include "services/gpu-worker/file_jail.h"
#include "services/gpu-worker/sandbox_server.h"

int main(int argc, char** argv) {
  using namespace kforge;
  bool jail = false;
  v1::Backend backend = v1::BACKEND_OPENCL;
  std::vector<std::string> extra_read, extra_write;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--jail") {
      jail = true;
    } else if (a == "--backend" && i + 1 < argc) {
      backend = std::strcmp(argv[++i], "cuda") == 0 ? v1::BACKEND_CUDA : v1::BACKEND_OPENCL;
    } else if (a == "--read" && i + 1 < argc) {
      extra_read.emplace_back(argv[++i]);
    } else if (a == "--write" && i + 1 < argc) {
      extra_write.emplace_back(argv[++i]);
    } else {
      std::fprintf(stderr, "kforge-sandbox: unknown argument '%s'\n", argv[i]);
      return 2;
    }
  }
  char cwd[4096];
  if (getcwd(cwd, sizeof(cwd)) == nullptr) return 126;
  const std::string work_dir = cwd;
  // After the device opened (drivers read their files first), before any candidate arrives.
  auto restrict = [&] {
    if (!jail) return;
    if (absl::Status st = worker::ApplyFileJail(worker::SandboxJail(backend, work_dir, extra_read, extra_write)); !st.ok()) {
      // The include screen still stands; the worker logs this line.
      std::fprintf(stderr, "kforge-sandbox: file access is not restricted: %s\n",
                   std::string(st.message()).c_str());
    }
  };
  (void)KeepLargeAllocationsInHeap();  // if refused, buffer moves are only slower
  // Keep stdout for frames only: anything a driver or a kernel's printf writes goes to stderr,
  // which the worker drains with a cap.
  const int frames_out = dup(1);
  dup2(2, 1);
  return worker::ServeSandbox(0, frames_out, worker::MakeBackend, restrict);
}
