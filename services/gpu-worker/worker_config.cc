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
  schema.Add("worker.slots", &opts.slots,
             "candidates in flight: one at a time runs on a backend's device, the others wait for it "
             "(compiled meanwhile by worker.compile_threads builders)",
             [&opts] { return opts.slots >= 1 && opts.slots <= 256 ? std::string() : std::string("must be 1 to 256"); });
  schema.Add("worker.compile_threads", &opts.compile_threads,
             "builder sandboxes per backend that compile candidates waiting for the device while another runs; "
             "0 = off; only where the device is not the host's CPU (see worker.compile_ahead_on_cpu)",
             [&opts] { return opts.compile_threads >= 0 && opts.compile_threads <= 64 ? std::string() : std::string("must be 0 to 64"); });
  schema.Add("worker.compile_ahead_on_cpu", &opts.compile_ahead_on_cpu,
             "builders also where the device is the host's CPU (PoCL): their compiles then share the cores "
             "the timed kernels run on, which disturbs the timings");
  schema.Add("queue.url", &opts.queue_url, "redis://[[user]:password@]host:port[/db] of the work queue");
  schema.Add("queue.password_file", &opts.queue_password_file,
             "file holding the Redis password (requirepass or the URL's ACL user's); overrides the URL's");
  schema.Add("queue.pull", &opts.queue_pull,
             "pull candidates from the work queue (one loop per slot, over the streams of worker.backends)");
  schema.Add("queue.device_class", &opts.device_class,
             "serve the streams of this device class (as the coordinator's); empty = any device");
  schema.Add("sandbox.timeout_seconds", &opts.timeout_seconds, "wall-clock limit per candidate",
             [&opts] { return opts.timeout_seconds > 0 ? std::string() : std::string("must be > 0"); });
  schema.Add("sandbox.compile_timeout_seconds", &opts.compile_timeout_seconds,
             "wall-clock limit per compilation (a macro bomb costs this much, not more)",
             [&opts] { return opts.compile_timeout_seconds > 0 ? std::string() : std::string("must be > 0"); });
  schema.Add("worker.drain_seconds", &opts.drain_seconds,
             "on SIGTERM, how long evaluations in flight may go on before their sandboxes are killed",
             [&opts] { return opts.drain_seconds >= 0 && opts.drain_seconds <= 3600 ? std::string() : std::string("must be 0 to 3600"); });
  schema.Add("sandbox.max_timeout_seconds", &opts.max_timeout_seconds,
             "the largest timeout_seconds a request may ask for (larger ones are refused)",
             [&opts] { return opts.max_timeout_seconds > 0 ? std::string() : std::string("must be > 0"); });
  schema.Add("sandbox.restrict_files", &opts.restrict_files,
             "restrict the files sandboxes may open to system libraries, devices and their own folder (Landlock)");
  schema.Add("sandbox.require_jail", &opts.require_jail,
             "refuse to start (and show it in kforge_worker_sandbox_jailed) unless every sandbox jails itself: "
             "files, network, signals and shared memory (Landlock and seccomp); on in the cluster's configs");
  schema.Add("sandbox.run_as_uid", &opts.run_as_uid,
             "the user sandboxes run as when the worker runs as root: -1 = nobody, 0 = root (not recommended)",
             [&opts] { return opts.run_as_uid >= -1 && opts.run_as_uid < (int64_t{1} << 31) ? std::string() : std::string("must be -1 or a uid"); });
  schema.Add("sandbox.read_paths", &opts.read_paths,
             "comma-separated extra paths a restricted sandbox may read (a driver installed elsewhere)");
  schema.Add("worker.replay_dirs", &opts.replay_dirs,
             "comma-separated folders replay problems' caches may be read from; empty = no replay caches");
  schema.Add("auth.token_file", &opts.token_file,
             "file holding the bearer token callers of the admin port (GetInfo, Drain, Evaluate) must present; "
             "empty: no check");
  schema.Add("limits.max_buffer_mb", &opts.max_buffer_mb, "largest buffer of a request's problem, MB",
             [&opts] { return opts.max_buffer_mb >= 1 ? std::string() : std::string("must be >= 1"); });
  schema.Add("limits.max_problem_mb", &opts.max_problem_mb, "all buffers of one size set together, MB",
             [&opts] { return opts.max_problem_mb >= 1 ? std::string() : std::string("must be >= 1"); });
  schema.Add("limits.max_held_mb", &opts.max_held_mb,
             "inputs and reference outputs the worker keeps for all problems together, MB",
             [&opts] { return opts.max_held_mb >= 1 ? std::string() : std::string("must be >= 1"); });
  schema.Add("sandbox.memory_limit_mb", &opts.memory_limit_mb, "address-space limit of OpenCL sandboxes (CUDA ones are not limited)",
             [&opts] { return opts.memory_limit_mb >= 256 ? std::string() : std::string("must be >= 256"); });
  schema.Add(
      "sandbox.resident_input_mb", &opts.resident_input_mb,
      "input MB a sandbox keeps between runs so they cross the pipe once (0 = resend every run; "
      "at most a quarter of sandbox.memory_limit_mb is used)",
      [&opts] {
        return opts.resident_input_mb >= 0 ? std::string() : std::string("must be >= 0");
      });
  schema.Add("benchmark.rel_error", &opts.bench_rel_error,
             "a candidate stops sampling once its median is known to +- this fraction (~95% interval); 0 = "
             "always sample the full device time",
             [&opts] { return opts.bench_rel_error >= 0 && opts.bench_rel_error < 1 ? std::string() : std::string("must be 0 to 1"); });
  schema.Add("benchmark.reference_rel_error", &opts.reference_rel_error,
             "the reference, which every candidate is judged against, stops sampling once its median is known "
             "to +- this fraction (~95% interval); 0 = always sample the full device time",
             [&opts] {
               return opts.reference_rel_error >= 0 && opts.reference_rel_error < 1 ? std::string()
                                                                                    : std::string("must be 0 to 1");
             });
  schema.Add("benchmark.race_factor", &opts.race_factor,
             "a candidate whose fastest of benchmark.race_samples samples is this many times the "
             "job's best time stops sampling (1.1: every sample over 1.1x the best's); 0 = off",
             [&opts] {
               return opts.race_factor == 0 || opts.race_factor >= 1 ? std::string() : std::string("must be 0 or >= 1");
             });
  schema.Add("benchmark.race_samples", &opts.race_samples,
             "samples a candidate takes before racing may stop it (5: one faster than race_factor "
             "times the best's time is stopped with probability under 1/32)",
             [&opts] {
               return opts.race_samples >= 1 && opts.race_samples <= 1000
                          ? std::string()
                          : std::string("must be 1 to 1000");
             });
  schema.Add("compile_cache.dir", &opts.compile_cache_dir,
             "folder for the device runtimes' compiled-kernel caches (PoCL, the CUDA driver's JIT), kept "
             "across sandboxes and restarts; empty = each sandbox's own folder");
  schema.Add("compile_cache.binaries", &opts.kernel_binaries,
             "also keep the binaries the runtimes build (a CUDA cubin, an OpenCL GPU driver's binary) in "
             "compile_cache.dir/binaries and load them instead of compiling the same kernel again. Off by "
             "default: a sandbox serves every tenant's candidates in turn, so one that a kernel or compiler "
             "exploit took over could hand back forged binaries for other tenants' sources, and the cache "
             "would keep them past its restart; turn on where the tenants trust each other");
}

}  // namespace kforge::worker
