#pragma once

#include "services/gpu-worker/layer.h"

// Builder and runner, as TVM's MetaSchedule splits them: while one candidate holds the device, a
// candidate waiting for it is compiled in a builder sandbox of its own, on the host's CPUs, and its
// compile stage then loads what the builder built instead of compiling. A builder never runs a
// kernel. Where the device is the host's CPU itself (PoCL) its compiles would share the cores the
// timed kernels run on: the evaluator leaves builders off there unless asked
// (EvaluatorOptions::compile_ahead_on_host_device). On a GPU a builder is a full sandbox: it holds
// a context of its own and loads each module it builds (to read the kernels' limits), a copy to
// the device beside the timed run, never a kernel on it (a compile-only CUDA sandbox would drop
// even that; not built yet).
//
// What a builder hands over was built from a tenant's source by a sandbox that also compiles other
// tenants' sources. It is used once, by the compile request it was built from, held in memory only
// (never in the kernel binary cache, which outlives sandboxes), and then run and validated like any
// kernel: the trust is the runner sandbox's own, which likewise serves every tenant in turn.

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "kforge/v1/problem.pb.h"
#include "kforge/v1/sandbox.pb.h"
#include "services/gpu-worker/sandbox.h"
#include "services/gpu-worker/screen.h"

namespace kforge::worker {

// The compile request of a screened candidate: its source, defines and the kernels its launches
// name. The run and the builders make it the same way, so that both name the same binary.
v1::CompileRequest CandidateCompileRequest(const std::string& source, const ScreenedCandidate& screened);

// The key a compile request's binary is kept under (the kernel binary cache's, and the builders'):
// the request as the sandbox's compile cache keys it, on this backend, device and compiler.
std::string KernelBinaryKey(const v1::CompileRequest& request, v1::Backend backend,
                            const v1::HelloResponse& hello);

struct BuiltKernel {
  std::string binary;
  std::string log;               // the build's compiler log, which the run reports as its own
  v1::ResourceUsage resources;   // as the build read them (a loaded cubin has no spill count)
};

class CompileAhead {
 public:
  // `builders` sandboxes at most, started when first needed; at most `max_kept` built kernels wait
  // to be taken (the oldest go first).
  CompileAhead(SandboxOptions options, v1::Backend backend, int builders, int max_kept = 16);
  ~CompileAhead();
  CompileAhead(const CompileAhead&) = delete;
  CompileAhead& operator=(const CompileAhead&) = delete;

  // Screens and compiles the candidate in a free builder and keeps its binary. False when every
  // builder is busy, or the candidate does not screen or compile (its run will say why), or the
  // runtime gave no binary.
  // `skip` (may be empty): keys not worth building (the kernel binary cache has them).
  bool Build(const v1::Problem& problem, const v1::Candidate& candidate, const ScreenOptions& screen,
             double timeout_seconds, const std::function<bool(const std::string&)>& skip = {});

  // The kernel built for this key, once.
  std::optional<BuiltKernel> Take(const std::string& key);

  // Kills the builders' children (shutdown): builds in flight end now, and none starts after.
  void Interrupt();

  int64_t built() const;  // kernels built and kept, over this object's lifetime

 private:
  struct Builder {
    std::unique_ptr<Sandbox> sandbox;
    bool busy = false;
  };

  SandboxOptions options_;
  v1::Backend backend_;
  const int max_kept_;
  mutable std::mutex mu_;
  std::vector<Builder> builders_;
  std::map<std::string, BuiltKernel> kept_;
  std::deque<std::string> order_;  // keys of kept_, oldest first
  int64_t built_ = 0;
  bool interrupted_ = false;
};

}  // namespace kforge::worker
