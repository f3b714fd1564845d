// kforge-gpu-worker: reads its config, wires evaluator + sandbox + admin service + metrics, and (with
// queue.pull) the loops that pull candidates from the work queue.

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <vector>
#include <chrono>
#include <thread>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/queue/lease_extender.h"
#include "common/queue/redis_queue.h"
#include "common/queue/stream.h"
#include "common/clock.h"
#include "common/host_memory.h"
#include "common/logging.h"
#include "common/server_util.h"
#include "common/tls.h"
#include "services/gpu-worker/worker_config.h"
#include "services/gpu-worker/queue_worker.h"
#include "services/gpu-worker/worker_service.h"

int main(int argc, char** argv) {
  using namespace kforge;
  BlockTerminationSignals();  // before gRPC (credentials) starts threads: see server_util.h
  const bool heap_tuned = KeepLargeAllocationsInHeap();
  worker::WorkerOptions opts;
  ConfigSchema schema;
  worker::AddWorkerFields(schema, opts);
  if (auto rc = LoadServiceConfigFromArgs(argc, argv, "kforge-gpu-worker",
                                          "kforge GPU worker: compile, validate, benchmark", "KFORGE_WORKER",
                                          schema)) {
    return *rc;
  }
  auto security = LoadServerSecurity(opts.server.tls, opts.token_file);
  if (!security.ok()) {
    std::cerr << "kforge-gpu-worker: " << security.status().message() << "\n";
    return 2;
  }
  auto log = MakeLogger("gpu-worker", *ParseLogLevel(opts.server.log_level));
  if (!heap_tuned)
    log->warn("malloc settings refused: large kernel buffers are mapped afresh on every run");
  if (opts.worker_id.empty()) {
    char host[256] = {0};
    gethostname(host, sizeof(host) - 1);
    opts.worker_id = absl::StrCat(host, "-", getpid());
  }
  worker::EvaluatorOptions eval_opts;
  eval_opts.worker_id = opts.worker_id;
  eval_opts.run_timeout_seconds = opts.timeout_seconds;
  eval_opts.compile_timeout_seconds = opts.compile_timeout_seconds;
  eval_opts.max_timeout_seconds = std::max(opts.max_timeout_seconds, opts.timeout_seconds);
  eval_opts.problem_limits.max_buffer_bytes = opts.max_buffer_mb << 20;
  eval_opts.problem_limits.max_problem_bytes = opts.max_problem_mb << 20;
  eval_opts.max_held_bytes = opts.max_held_mb << 20;
  eval_opts.sandbox.memory_limit_mb = opts.memory_limit_mb;
  eval_opts.sandbox.restrict_files = opts.restrict_files;
  eval_opts.sandbox.require_jail = opts.require_jail;
  eval_opts.sandbox.run_as_uid = opts.run_as_uid;
  eval_opts.sandbox.runtime_cache_dir = opts.compile_cache_dir;
  // The worker's own (the sandboxes get the runtimes' subfolders, never this one); opt-in, see
  // compile_cache.binaries.
  if (!opts.compile_cache_dir.empty() && opts.kernel_binaries) {
    eval_opts.binary_cache_dir = opts.compile_cache_dir + "/binaries";
  }
  // Builders only help when candidates wait: more than one slot.
  eval_opts.compile_threads = opts.slots > 1 ? static_cast<int>(std::min(opts.compile_threads, opts.slots - 1)) : 0;
  eval_opts.compile_ahead_on_host_device = opts.compile_ahead_on_cpu;
  eval_opts.bench_rel_error = opts.bench_rel_error;
  eval_opts.reference_rel_error = opts.reference_rel_error;
  eval_opts.race_factor = opts.race_factor;
  eval_opts.race_samples = static_cast<int>(opts.race_samples);
  for (absl::string_view p : absl::StrSplit(opts.read_paths, ',', absl::SkipEmpty())) {
    eval_opts.sandbox.read_paths.emplace_back(p);
  }
  // A request names its replay cache by path: only inside the configured folders.
  eval_opts.replay_roots.emplace();
  for (absl::string_view d : absl::StrSplit(opts.replay_dirs, ',', absl::SkipEmpty())) {
    eval_opts.replay_roots->emplace_back(d);
  }
  if (eval_opts.replay_roots->empty()) {
    log->info("replay caches: none readable (set worker.replay_dirs to serve replay problems)");
  }
  // The resident copies count against an OpenCL sandbox's address-space limit: keep room for the
  // runs' own buffers.
  eval_opts.resident_input_bytes = std::min(opts.resident_input_mb, opts.memory_limit_mb / 4) << 20;
  RealClock clock;
  worker::Evaluator evaluator(eval_opts, clock, log);
  worker::WorkerCoreOptions core_opts;
  core_opts.worker_id = opts.worker_id;
  core_opts.slots = static_cast<int>(opts.slots);
  core_opts.backends.clear();
  for (absl::string_view b : absl::StrSplit(opts.backends, ',', absl::SkipEmpty())) {
    core_opts.backends.push_back(b == "opencl" ? v1::BACKEND_OPENCL : b == "cuda" ? v1::BACKEND_CUDA : v1::BACKEND_REPLAY);
  }
  auto registry = std::make_shared<prometheus::Registry>();
  worker::WorkerCore core(core_opts, evaluator, *registry, log);
  core.ProbeBackends();
  if (std::vector<std::string> unjailed = core.UnjailedBackends(); opts.require_jail && !unjailed.empty()) {
    std::cerr << "kforge-gpu-worker: sandbox.require_jail is on and the sandboxes cannot jail themselves, so this "
                 "worker does not start: "
              << absl::StrJoin(unjailed, "; ") << "\n";
    return 1;
  }
  worker::WorkerAdminServiceImpl service(core, security->token);
  log->info("worker_id={}", opts.worker_id);

  // A fleet worker: one loop per slot pulls from the streams of the backends it serves, extending
  // its leases while it evaluates; a drain stops the pulling and lets what is in flight finish.
  std::unique_ptr<RedisWorkQueue> queue;
  std::unique_ptr<LeaseExtendingQueue> leased;
  std::vector<std::thread> pullers;
  std::atomic<bool> stop_pulling{false};
  if (opts.queue_pull) {
    RedisQueueOptions ro;
    auto password = ReadTokenFile(opts.queue_password_file);
    if (!password.ok()) {
      std::cerr << "kforge-gpu-worker: queue.password_file: " << password.status().message() << "\n";
      return 2;
    }
    ro.password = *std::move(password);
    auto q = RedisWorkQueue::Connect(opts.queue_url, ro, log);
    if (!q.ok()) {
      std::cerr << "kforge-gpu-worker: queue " << RedactUrlPassword(opts.queue_url) << ": " << q.status().message()
                << "\n";
      return absl::IsInvalidArgument(q.status()) || absl::IsUnauthenticated(q.status()) ? 2 : 1;
    }
    queue = *std::move(q);
    leased = std::make_unique<LeaseExtendingQueue>(*queue, ro.queue.lease_seconds / 3, log);
    std::vector<std::string> streams;
    const v1::WorkerInfo info = core.Info();
    for (v1::Backend b : core_opts.backends) {
      streams.push_back(StreamOf(b, /*torch=*/false, opts.device_class));
      // PyTorch references too, where this worker's backend found a torch.
      for (const auto& d : info.devices()) {
        if (d.backend() == b && !d.torch_version().empty()) streams.push_back(StreamOf(b, true, opts.device_class));
      }
    }
    log->info("pulling from {} streams={} slots={}", RedactUrlPassword(opts.queue_url), absl::StrJoin(streams, ","), opts.slots);
    for (int64_t i = 0; i < opts.slots; ++i) {
      pullers.emplace_back([&, streams, i] {
        worker::QueueWorker w(*leased, evaluator, &core, streams, absl::StrCat(opts.worker_id, "/", i), log);
        w.Run(stop_pulling);
      });
    }
    // Heartbeats: the coordinator's ListWorkers (and `kforge workers`) shows the fleet from them.
    pullers.emplace_back([&, streams] {
      constexpr double kEverySeconds = 5;
      double next = 0;
      while (!stop_pulling.load()) {
        const double now = clock.MonotonicSeconds();
        if (now >= next) {
          const v1::WorkerInfo info = core.Info();
          v1::WorkerStatus st;
          st.set_worker_id(info.worker_id());
          *st.mutable_devices() = info.devices();
          st.set_slots(info.slots());
          st.set_busy(info.busy());
          st.set_draining(info.draining());
          st.set_version(info.version());
          *st.mutable_unavailable_backends() = info.unavailable_backends();
          st.set_evaluations_total(info.evaluations_total());
          for (const auto& s : streams) st.add_streams(s);
          if (absl::Status hb = queue->Heartbeat(st); !hb.ok()) log->warn("heartbeat failed: {}", hb.message());
          next = now + kEverySeconds;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
    });
  }
  // In-flight evaluations get drain_seconds to finish after a drain; then their sandboxes are
  // killed (they end as infra errors) so that the server's shutdown deadline holds.
  std::thread interrupter;
  const int rc = ServeUntilSignal(opts.server.listen, opts.server.metrics_listen, {&service}, registry, log,
                                  opts.drain_seconds + 5, [&] {
                                    core.Drain();
                                    interrupter = std::thread([&evaluator, &core, &opts] {
                                      const auto until = std::chrono::steady_clock::now() +
                                                         std::chrono::duration<double>(opts.drain_seconds);
                                      while (std::chrono::steady_clock::now() < until && core.Info().busy() > 0) {
                                        std::this_thread::sleep_for(std::chrono::milliseconds(100));
                                      }
                                      evaluator.Interrupt();
                                    });
                                  },
                                  kDefaultMaxReceiveBytes, security->credentials);
  if (interrupter.joinable()) interrupter.join();
  stop_pulling = true;
  if (queue != nullptr) queue->Close();
  for (auto& t : pullers) t.join();
  return rc;
}
