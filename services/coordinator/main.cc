// kforge-coordinator: serves CoordinatorService. Wires the store (SQLite file or PostgreSQL), the
// work queue (in-process or Redis Streams), the mutators (in-process, or kforge-llm-proxy), the
// job manager and, when configured, workers inside this process. SIGINT/SIGTERM: running jobs are
// interrupted (resumable: this coordinator restarted, or another, resumes them) and it exits 0.

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <iostream>
#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/kt_cache.h"
#include "common/logging.h"
#include "common/queue/lease_extender.h"
#include "common/queue/memory_queue.h"
#include "common/queue/redis_queue.h"
#include "common/queue/stream.h"
#include "common/server_util.h"
#include "common/tls.h"
#include "common/store/metered_store.h"
#include "common/store/open_store.h"
#include "common/store/postgres_store.h"
#include "services/coordinator/auth.h"
#include "services/coordinator/coordinator_config.h"
#include "services/coordinator/coordinator_metrics.h"
#include "services/coordinator/fallback_mutator.h"
#include "services/coordinator/coordinator_service.h"
#include "services/coordinator/job_api.h"
#include "services/coordinator/job_manager.h"
#include "services/coordinator/tenant_gate.h"
#include "services/gpu-worker/evaluator.h"
#include "services/gpu-worker/queue_worker.h"
#include "services/llm-proxy/parametric_mutator.h"
#include "services/llm-proxy/client/remote_mutator.h"

namespace {

using namespace kforge;

// The parametric mutator for a problem: a replay problem's recorded configurations only.
absl::StatusOr<std::shared_ptr<Mutator>> InProcessMutator(const v1::Problem& problem) {
  absl::StatusOr<ValidityFn> validity = ReplayValidity(problem);
  if (!validity.ok()) return validity.status();
  return std::make_shared<llm::ParametricMutator>(llm::ParametricOptions{}, *validity);
}

}  // namespace

int main(int argc, char** argv) {
  BlockTerminationSignals();  // before gRPC (credentials) starts threads: see server_util.h
  coordinator::CoordinatorOptions opts;
  ConfigSchema schema;
  coordinator::AddCoordinatorFields(schema, opts);
  if (auto rc = LoadServiceConfigFromArgs(argc, argv, "kforge-coordinator",
                                          "kforge coordinator: jobs, evolution, dispatch", "KFORGE_COORDINATOR",
                                          schema)) {
    return *rc;
  }
  // Tenants authenticate with API keys in the store; the port itself may be TLS (server.tls).
  auto security = LoadServerSecurity(opts.server.tls, /*token_file=*/"");
  if (!security.ok()) {
    std::cerr << "kforge-coordinator: " << security.status().message() << "\n";
    return 2;
  }
  auto proxy_credentials = ChannelCredentialsFor(opts.llm_proxy_tls);
  absl::StatusOr<std::string> proxy_token = ReadTokenFile(opts.llm_proxy_token_file);
  for (const absl::Status& st : {proxy_credentials.status(), proxy_token.status()}) {
    if (!st.ok()) {
      std::cerr << "kforge-coordinator: llm_proxy: " << st.message() << "\n";
      return 2;
    }
  }
  auto log = MakeLogger("coordinator", *ParseLogLevel(opts.server.log_level));
  RealClock clock;

  auto store = opts.store_kind == "postgres" && !IsPostgresUrl(opts.store_url)
                   ? absl::StatusOr<std::unique_ptr<Store>>(absl::InvalidArgumentError(
                         "store.url: a PostgreSQL database is named postgresql://user@host:port/db"))
                   : OpenStore(opts.store_url);
  if (!store.ok()) {
    std::cerr << "kforge-coordinator: store: " << store.status().message() << "\n";
    return absl::IsUnavailable(store.status()) ? 1 : 2;
  }
  // Every store call is timed and its failures counted (store latency and error series).
  auto registry = std::make_shared<prometheus::Registry>();
  MeteredStore metered_store(**store, *registry);
  constexpr double kLeaseSeconds = 30;
  std::unique_ptr<WorkQueue> queue;
  if (opts.queue_kind == "redis") {
    RedisQueueOptions ro;
    ro.queue.lease_seconds = kLeaseSeconds;
    ro.coordinator = opts.owner.empty() ? "coordinator" : opts.owner;
    auto password = ReadTokenFile(opts.queue_password_file);
    if (!password.ok()) {
      std::cerr << "kforge-coordinator: queue.password_file: " << password.status().message() << "\n";
      return 2;
    }
    ro.password = *std::move(password);
    auto redis = RedisWorkQueue::Connect(opts.queue_url, ro, log);
    if (!redis.ok()) {
      std::cerr << "kforge-coordinator: queue " << RedactUrlPassword(opts.queue_url) << ": " << redis.status().message()
                << "\n";
      return absl::IsInvalidArgument(redis.status()) || absl::IsUnauthenticated(redis.status()) ? 2 : 1;
    }
    queue = *std::move(redis);
  } else {
    queue = std::make_unique<MemoryWorkQueue>(clock, WorkQueueOptions{.lease_seconds = kLeaseSeconds});
  }

  coordinator::MutatorFactory mutators = InProcessMutator;
  std::shared_ptr<grpc::Channel> proxy_channel;
  if (!opts.llm_proxy_address.empty()) {
    // The proxy for every job; when it fails, the job's in-process parametric mutator answers
    // until it is back (a breaker per job).
    proxy_channel = llm::ProxyChannel(opts.llm_proxy_address, *proxy_credentials);
    auto remote = std::make_shared<llm::RemoteMutator>(proxy_channel, /*deadline_seconds=*/120, *proxy_token);
    mutators = [remote, &clock, log, address = opts.llm_proxy_address](
                   const v1::Problem& problem) -> absl::StatusOr<std::shared_ptr<Mutator>> {
      absl::StatusOr<std::shared_ptr<Mutator>> local = InProcessMutator(problem);
      if (!local.ok()) return local.status();
      return std::make_shared<coordinator::FallbackMutator>(remote, *local, absl::StrCat("kforge-llm-proxy at ", address),
                                                            BreakerOptions{}, clock, log);
    };
  }
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  const std::string owner = opts.owner.empty() ? absl::StrCat(host, ":", getpid()) : opts.owner;
  coordinator::CoordinatorMetrics metrics(*registry);
  coordinator::TenantGate gate(metered_store, clock, registry.get());
  coordinator::JobManager manager(metered_store, *queue, mutators, clock, log,
                                  {.owner = owner,
                                   .max_running = static_cast<int>(opts.max_jobs_running),
                                   .slots = static_cast<int>(opts.slots_per_job),
                                   .ready = static_cast<int>(opts.ready_per_job),
                                   .lease_seconds = kLeaseSeconds,
                                   .in_order = opts.in_order,
                                   .finalists = static_cast<int>(opts.finalists),
                                   .confirm_rounds = static_cast<int>(opts.confirm_rounds),
                                   .confirm_every = static_cast<int>(opts.confirm_every),
                                   .always_remeasure = opts.always_remeasure,
                                   .threads = static_cast<int>(opts.job_threads),
                                   .metrics = &metrics,
                                   .gate = &gate});
  // Submitted problems are written next to a SQLite database, or in the temporary folder.
  const std::string problems_dir =
      !opts.problems_dir.empty() ? opts.problems_dir
      : (opts.store_kind == "sqlite" && !IsPostgresUrl(opts.store_url) && opts.store_url != ":memory:")
          ? opts.store_url + ".problems"
          : (std::filesystem::temp_directory_path() / absl::StrCat("kforge-coordinator-", getpid())).string();
  coordinator::JobApi api(metered_store, *queue, manager, {.problems_dir = problems_dir});
  coordinator::Authenticator auth(metered_store, opts.auth_required);
  // Ready (the health of kforge.v1.CoordinatorService) while the store and the queue answer.
  Readiness readiness("kforge.v1.CoordinatorService");
  coordinator::SamplerOptions sampler_options{.on_ready = [&readiness](bool ready) { readiness.Set(ready); }};
  if (proxy_channel != nullptr) {
    sampler_options.proxy_probe = [proxy_channel, address = opts.llm_proxy_address]() -> absl::Status {
      if (proxy_channel->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(2))) {
        return absl::OkStatus();
      }
      return absl::UnavailableError(absl::StrCat("no connection to the llm-proxy at ", address, " within 2 s"));
    };
  }
  coordinator::MetricsSampler sampler(metered_store, *queue, metrics, clock, log, std::move(sampler_options));
  coordinator::CoordinatorServiceImpl service(api, auth);
  log->info(
      "owner={} store={} queue={} auth={} max_running={} slots={} ready={} threads={} in_order={} "
      "problems_dir={}",
      owner, RedactUrlPassword(opts.store_url), opts.queue_kind,
      opts.auth_required ? "required" : "off", opts.max_jobs_running, opts.slots_per_job,
      opts.ready_per_job, opts.job_threads, opts.in_order, problems_dir);
  if (!opts.auth_required) log->warn("authentication is off: every caller is tenant '{}'", coordinator::kDefaultTenant);

  // Workers in this process, on the replay and OpenCL streams (a one-process server).
  LeaseExtendingQueue worker_queue(*queue, kLeaseSeconds / 3, log);
  std::vector<std::unique_ptr<worker::Evaluator>> evaluators;
  std::vector<std::thread> workers;
  std::atomic<bool> workers_stop{false};
  // PyTorch references too when this machine has a torch (the workers' evaluators find it).
  std::vector<std::string> embedded_streams = {StreamOf(v1::BACKEND_REPLAY, false), StreamOf(v1::BACKEND_OPENCL, false)};
  if (opts.embedded_workers > 0) {
    worker::Evaluator probe(worker::EvaluatorOptions{}, clock, log);
    if (!probe.Probe(v1::BACKEND_OPENCL).device().torch_version().empty()) {
      embedded_streams.push_back(StreamOf(v1::BACKEND_OPENCL, true));
    }
  }
  for (const std::string& stream : embedded_streams) {
    for (int64_t i = 0; i < opts.embedded_workers; ++i) {
      const std::string name = absl::StrCat(owner, "/", stream, "-", i);
      worker::EvaluatorOptions eo;
      eo.worker_id = name;
      evaluators.push_back(std::make_unique<worker::Evaluator>(eo, clock, log));
      worker::Evaluator* ev = evaluators.back().get();
      workers.emplace_back([&worker_queue, ev, stream, name, &workers_stop, &log] {
        worker::QueueWorker w(worker_queue, *ev, stream, name, log);
        w.Run(workers_stop);
      });
    }
  }
  // The embedded workers announce themselves like fleet workers (ListWorkers, `kforge workers`).
  std::thread heartbeats;
  if (opts.embedded_workers > 0) {
    heartbeats = std::thread([&] {
      while (!workers_stop.load()) {
        for (const std::string& stream : embedded_streams) {
          v1::WorkerStatus st;
          st.set_worker_id(absl::StrCat(owner, "/", stream));
          st.set_slots(static_cast<int32_t>(opts.embedded_workers));
          st.add_streams(stream);
          if (absl::Status hb = queue->Heartbeat(st); !hb.ok()) log->warn("heartbeat failed: {}", hb.message());
        }
        for (int i = 0; i < 50 && !workers_stop.load(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
    });
  }
  manager.Start();
  sampler.Start();
  constexpr double kShutdownSeconds = 5;
  // A submit carries a problem folder (JobApi allows 64 MiB of files).
  constexpr int kMaxSubmitBytes = 72 << 20;
  const int rc = ServeUntilSignal(opts.server.listen, opts.server.metrics_listen, {&service},
                                  registry, log, kShutdownSeconds, [&manager] { manager.Stop(); },
                                  kMaxSubmitBytes, security->credentials, &readiness);
  manager.Stop();
  sampler.Stop();
  workers_stop = true;
  queue->Close();
  for (auto& t : workers) t.join();
  if (heartbeats.joinable()) heartbeats.join();
  return rc;
}
