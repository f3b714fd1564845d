// kforge-sandbox: the process in which untrusted kernels are compiled and run. Started by the
// worker with a clean environment, resource limits and no inherited descriptors; speaks frames
// on stdin/stdout.

#include <unistd.h>

#include "common/host_memory.h"
#include "services/gpu-worker/sandbox_server.h"

int main() {
  (void)kforge::KeepLargeAllocationsInHeap();  // if refused, buffer moves are only slower
  // Keep stdout for frames only: anything a driver prints goes to stderr.
  const int frames_out = dup(1);
  dup2(2, 1);
  return kforge::worker::ServeSandbox(0, frames_out, kforge::worker::MakeBackend);
}
