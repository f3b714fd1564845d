#include "absl/strings/string_view.h"
#include "services/gpu-worker/worker_config.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace kforge::worker {

void AddWorkerFields(ConfigSchema& schema, WorkerOptions& opts) {
  AddServerFields(schema, opts.server, "127.0.0.1:7072", "127.0.0.1:9472");
  schema.Add("worker.id", &opts.worker_id, "worker id; empty = hostname-pid");
  schema.Add("worker.backends", &opts.backends, "comma-separated: opencl, cuda, replay", [&opts] {
    for (absl::string_view b : absl::StrSplit(opts.backends, ',', absl::SkipEmpty())) {
      if (b != "opencl" && b != "cuda" && b != "replay") {
        return absl::StrCat("unknown backend '", b, "' (expected opencl, cuda or replay)");
      }
    }
    return std::string();
  });
  schema.Add("worker.slots", &opts.slots, "candidates evaluated at once",
             [&opts] { return opts.slots >= 1 && opts.slots <= 256 ? std::string() : std::string("must be 1 to 256"); });
  schema.Add("queue.url", &opts.queue_url, "redis://host:port of the work queue");
  schema.Add("sandbox.timeout_seconds", &opts.timeout_seconds, "wall-clock limit per candidate",
             [&opts] { return opts.timeout_seconds > 0 ? std::string() : std::string("must be > 0"); });
  schema.Add("sandbox.memory_limit_mb", &opts.memory_limit_mb, "address-space limit of OpenCL sandboxes (CUDA ones are not limited)",
             [&opts] { return opts.memory_limit_mb >= 256 ? std::string() : std::string("must be >= 256"); });
  schema.Add(
      "sandbox.resident_input_mb", &opts.resident_input_mb,
      "input MB a sandbox keeps between runs so they cross the pipe once (0 = resend every run; "
      "at most a quarter of sandbox.memory_limit_mb is used)",
      [&opts] {
        return opts.resident_input_mb >= 0 ? std::string() : std::string("must be >= 0");
      });
  schema.Add("compile_cache.dir", &opts.compile_cache_dir, "on-disk compile cache; empty = memory only");
}

}  // namespace kforge::worker
