// kforge-test-fake-sandbox: speaks the sandbox protocol like a subverted kforge-sandbox could, to
// test what the worker accepts back. It answers a hello as an available device and every run with
// one buffer "y" whose bytes ("answers") lie in an output arena, sent the way
// $KFORGE_FAKE_SANDBOX says:
//   honest        a sealed arena with the first response, y at offset 0
//   unsealed      an arena the sandbox could still truncate under the worker
//   out-of-range  y names bytes past the arena's end
//   huge-offset   y names bytes at offset INT64_MAX
//   no-arena      y names arena bytes, but no arena was ever sent
//   two-files     two files with one response

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "kforge/v1/sandbox.pb.h"
#include "services/gpu-worker/framing.h"
#include "services/gpu-worker/shared_output.h"

using namespace kforge;
using namespace kforge::worker;

int main() {
  const char* env = std::getenv("KFORGE_FAKE_SANDBOX");
  const std::string mode = env != nullptr ? env : "honest";
  const std::string answers = "answers";
  OutputArena arena;
  while (true) {
    v1::SandboxRequest req;
    if (!ReadFrame(0, &req).ok()) return 0;
    v1::SandboxResponse resp;
    std::vector<OwnedFd> files;
    if (req.has_hello()) {
      resp.mutable_hello()->set_available(true);
      resp.mutable_hello()->mutable_device()->set_name("fake");
    } else {
      auto* run = resp.mutable_run();
      run->set_outcome(v1::OUTCOME_OK);
      run->add_samples_seconds(1e-3);
      auto* y = run->add_buffers();
      y->set_name("y");
      y->set_arena_bytes(static_cast<int64_t>(answers.size()));
      if (mode == "unsealed") {
        OwnedFd fd(memfd_create("fake", MFD_CLOEXEC | MFD_ALLOW_SEALING));
        if (ftruncate(fd.get(), 4096) != 0) return 1;
        files.push_back(std::move(fd));
      } else if (mode != "no-arena") {
        if (!arena.Reserve(answers.size()).ok()) return 1;
        std::memcpy(arena.data(), answers.data(), answers.size());
        if (OwnedFd fd = arena.TakeNewFile(); fd.valid()) files.push_back(std::move(fd));
        if (mode == "two-files") {
          OutputArena other;
          if (!other.Reserve(1).ok()) return 1;
          files.push_back(other.TakeNewFile());
        }
      }
      if (mode == "out-of-range") y->set_arena_offset(static_cast<int64_t>(arena.capacity()) - 3);
      if (mode == "huge-offset") y->set_arena_offset(INT64_MAX);
    }
    std::vector<int> fds;
    for (const auto& f : files) fds.push_back(f.get());
    if (!WriteFrame(1, resp, false, fds).ok()) return 1;
  }
}
