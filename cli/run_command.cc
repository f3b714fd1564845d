#include "cli/run_command.h"

#include <filesystem>

#include "cli/import_command.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <future>
#include <iostream>
#include <memory>
#include <thread>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "common/tls.h"
#include "absl/strings/str_format.h"
#include "cli/eval_command.h"
#include "cli/report.h"
#include "cli/validate_command.h"
#include "common/clock.h"
#include "common/dtype.h"
#include "common/kt_cache.h"
#include "common/logging.h"
#include "common/problem_loader.h"
#include "common/queue/lease_extender.h"
#include "common/queue/memory_queue.h"
#include "common/queue/redis_queue.h"
#include "common/queue/stream.h"
#include "common/store/open_store.h"
#include "common/store/postgres_store.h"
#include "common/store/sqlite_store.h"
#include "services/coordinator/fallback_mutator.h"
#include "services/coordinator/job_runner.h"
#include "services/gpu-worker/evaluator.h"
#include "services/gpu-worker/queue_worker.h"
#include "services/llm-proxy/llm_mutator.h"
#include "services/llm-proxy/parametric_mutator.h"
#include "services/llm-proxy/client/remote_mutator.h"

namespace kforge::cli {

namespace {

std::atomic<bool> g_stop{false};

void OnSignal(int) { g_stop.store(true); }

}  // namespace

bool RunInterrupted() { return g_stop.load(); }

namespace {

// Whether a worker with this device compiles a waiting candidate while another runs (the
// evaluator's builders work only where the device is not the host's CPU).
bool CompilesAhead(const RunArgs& args, const v1::HelloResponse& hello) {
  return args.compile_ahead && hello.available() && !hello.host_device();
}

int BadInput(const std::string& msg) {
  std::cerr << "kforge run: " << msg << "\n";
  return 2;
}

std::string Counts(const std::map<std::string, int64_t>& counts) {
  std::string out;
  for (const auto& [k, v] : counts) absl::StrAppend(&out, out.empty() ? "" : " ", k, " ", v);
  return out;
}

}  // namespace

int RunJob(const RunArgs& given) {
  RunArgs args = given;
  // A PyTorch module file is imported first (kforge import), into the output folder.
  if (IsModuleFile(args.problem_dir)) {
    ImportArgs ia{.file = args.problem_dir, .backend = args.backend, .sets = args.sets, .fit = args.fit,
                  .out_dir = (std::filesystem::path(args.out_dir.empty() ? "." : args.out_dir) / "problem").string(),
                  .force = true, .quiet = true};
    auto imported = ImportModule(ia);
    if (!imported.ok()) {
      if (absl::IsInvalidArgument(imported.status())) return BadInput(std::string(imported.status().message()));
      std::cerr << "kforge run: " << imported.status().message() << "\n";
      return 1;
    }
    if (!args.quiet) {
      std::cout << "imported " << args.problem_dir << " -> " << imported->dir << " (sizes " << imported->sizes
                << "; seed: " << (imported->family.empty() ? "none, a model writes the kernels" : imported->family)
                << ")\n";
    }
    args.problem_dir = imported->dir;
  }
  auto problem = LoadProblem(args.problem_dir);
  if (!problem.ok()) return BadInput(std::string(problem.status().message()));
  // The checks of `kforge validate`: a folder it refuses is refused here with the same exit code.
  if (auto summary = SummariseProblem(*problem); !summary.ok()) {
    return BadInput(absl::StrCat(args.problem_dir, ": ", summary.status().message()));
  }
  if (args.db.empty()) {
    return BadInput("--db: give a database file (an empty name would keep nothing)");
  }
  if (!(args.timeout_seconds > 0 && args.timeout_seconds <= kMaxTimeoutSeconds)) {
    return BadInput(
        absl::StrCat("--timeout must be more than 0 and at most ", kMaxTimeoutSeconds, " seconds"));
  }
  if (!(args.compile_timeout_seconds > 0 && args.compile_timeout_seconds <= 3600)) {
    return BadInput("--compile-timeout must be more than 0 and at most 3600 seconds");
  }
  if (args.budget <= 0 && args.time_seconds <= 0 && args.target <= 0 && args.patience <= 0) {
    return BadInput("give a budget: --budget N, --time S, --target X or --patience N");
  }
  if (args.workers < 1 || args.workers > 64) return BadInput("--workers must be between 1 and 64");
  const std::string db_shown = RedactUrlPassword(args.db);
  auto log = MakeLogger("kforge", spdlog::level::warn);
  RealClock clock;

  // Workers: each a thread with its own evaluator and so its own sandbox process, started (probed)
  // while the store opens: a runtime's start is a good part of a short run (PoCL's ~0.15 s here).
  // The thread that probed serves the queue afterwards: the sandbox dies with the thread that
  // started it (PR_SET_PDEATHSIG). The device the probe finds is the job's device class: earlier
  // jobs' evaluations on it are reused (unless --fresh).
  std::vector<std::unique_ptr<worker::Evaluator>> evaluators;
  std::vector<std::promise<v1::HelloResponse>> hellos(static_cast<size_t>(args.workers));
  std::vector<std::future<v1::HelloResponse>> hello_futures;
  for (auto& h : hellos) hello_futures.push_back(h.get_future());
  // The stream to serve once the job is set up; "" (any early return): nothing, stop.
  std::promise<std::string> stream_promise;
  std::shared_future<std::string> stream_ready = stream_promise.get_future().share();
  WorkQueue* worker_queue_ptr = nullptr;  // set before the stream is
  std::atomic<bool> workers_stop{false};
  std::vector<std::jthread> threads;
  absl::Cleanup release_workers = [&] {
    workers_stop.store(true);
    stream_promise.set_value("");
  };
  for (int i = 0; i < args.workers; ++i) {
    worker::EvaluatorOptions eo;
    eo.worker_id = absl::StrCat("local-", i);
    eo.run_timeout_seconds = args.timeout_seconds;
    eo.compile_timeout_seconds = args.compile_timeout_seconds;
    eo.sandbox.runtime_cache_dir = RuntimeCacheDir(args.cache_dir);
    eo.binary_cache_dir = BinaryCacheDir(args.cache_dir);
    // Python and torch only for a PyTorch reference: importing torch is over a second of a short
    // run (Probe starts the runner to learn the torch version the device reports).
    eo.torch_enabled = problem->reference().has_pytorch();
    // Builder and runner: on a device that is not the host's CPU, a worker takes a second candidate
    // and a builder sandbox compiles it while the first runs (the Evaluator keeps it off on PoCL).
    eo.compile_threads = args.compile_ahead ? 1 : 0;
    evaluators.push_back(std::make_unique<worker::Evaluator>(eo, clock, log));
    worker::Evaluator* evaluator = evaluators.back().get();  // the vector may grow meanwhile
    threads.emplace_back([&, i, evaluator] {
      const v1::HelloResponse hello = problem->backend() == v1::BACKEND_REPLAY
                                          ? v1::HelloResponse()
                                          : evaluator->Probe(problem->backend());
      hellos[i].set_value(hello);
      const std::string stream = stream_ready.get();
      if (stream.empty()) return;
      std::jthread second;
      if (CompilesAhead(args, hello)) {
        second = std::jthread([&, i, evaluator, stream] {
          worker::QueueWorker w(*worker_queue_ptr, *evaluator, stream, absl::StrCat("local-", i, "b"), log);
          w.Run(workers_stop);
        });
      }
      worker::QueueWorker w(*worker_queue_ptr, *evaluator, stream, absl::StrCat("local-", i), log);
      w.Run(workers_stop);
    });
  }

  // A SQLite file (embedded), or the cluster's PostgreSQL (postgresql://user@host:port/db).
  absl::StatusOr<std::unique_ptr<Store>> store = OpenStore(args.db);
  if (!store.ok()) {
    // A PostgreSQL server that is not there is a failure; a bad URL or SQLite file is bad input.
    if (IsPostgresUrl(args.db)) {
      std::cerr << "kforge run: " << store.status().message() << "\n";
      return absl::IsUnavailable(store.status()) ? 1 : 2;
    }
    return BadInput(std::string(store.status().message()));
  }

  // The in-process queue, or Redis Streams. Workers extend their leases every lease / 3 while
  // they evaluate, so a Redis lease can be short: a dead worker's item comes back quickly.
  std::unique_ptr<WorkQueue> queue_owner;
  double lease_seconds = args.timeout_seconds * 20 + 600;
  if (args.queue.empty()) {
    queue_owner = std::make_unique<MemoryWorkQueue>(clock, lease_seconds);
  } else {
    lease_seconds = 30;
    RedisQueueOptions ro;
    ro.queue.lease_seconds = lease_seconds;
    ro.coordinator = "kforge-run";
    auto redis = RedisWorkQueue::Connect(args.queue, ro, log);
    if (!redis.ok()) {
      if (absl::IsInvalidArgument(redis.status())) return BadInput(absl::StrCat("--queue: ", redis.status().message()));
      std::cerr << "kforge run: --queue " << RedactUrlPassword(args.queue) << ": " << redis.status().message() << "\n";
      return 1;
    }
    queue_owner = *std::move(redis);
  }
  WorkQueue& queue = *queue_owner;
  LeaseExtendingQueue worker_queue(queue, lease_seconds / 3, log);

  // Replay problems know which configurations exist: the mutator proposes only those.
  absl::StatusOr<ValidityFn> validity = ReplayValidity(*problem);
  if (!validity.ok()) return BadInput(std::string(validity.status().message()));
  auto parametric = std::make_shared<llm::ParametricMutator>(llm::ParametricOptions{}, *validity);
  // With --llm, a mix: the model writes mutations with the configured probability, the knob
  // tuner the rest (and whenever the model fails).
  std::unique_ptr<llm::CurlHttpClient> http;
  llm::ConfiguredLlm model;
  double llm_probability = 0;
  std::string mutator_line = "mutator: parametric (no LLM configured)";
  if (!args.llm_config.empty()) {
    auto cfg = llm::LoadLlmConfig(args.llm_config);
    if (!cfg.ok()) return BadInput(std::string(cfg.status().message()));
    http = std::make_unique<llm::CurlHttpClient>();
    auto made = llm::MakeLlmMutator(*cfg, *http, args.seed, log);
    if (!made.ok()) return BadInput(std::string(made.status().message()));
    model = *std::move(made);
    if (absl::Status st = model.mutator->CheckPromptFits(*problem); !st.ok()) {
      return BadInput(absl::StrCat(args.llm_config, ": ", st.message()));
    }
    llm_probability = cfg->probability;
    mutator_line = absl::StrFormat("mutator: llm (%s) for %.0f%% of mutations, parametric for the rest",
                                   model.provider_names, 100 * llm_probability);
  }
  llm::MixedMutator mixed(*parametric, model.mutator.get(), llm_probability);
  // A remote proxy that fails (down, unreachable, erring) is replaced by the parametric mutator
  // until it answers again: the job goes on.
  std::unique_ptr<coordinator::FallbackMutator> remote;
  if (!args.llm_proxy.empty()) {
    if (!args.llm_config.empty()) return BadInput("give --llm or --llm-proxy, not both");
    auto credentials = ChannelCredentialsFor(args.llm_proxy_tls);
    if (!credentials.ok()) {
      return BadInput(absl::StrCat("--llm-proxy-ca/--llm-proxy-cert/--llm-proxy-key: ", credentials.status().message()));
    }
    absl::StatusOr<std::string> token = ReadTokenFile(args.llm_proxy_token_file);
    if (!token.ok()) return BadInput(absl::StrCat("--llm-proxy-token-file: ", token.status().message()));
    remote = std::make_unique<coordinator::FallbackMutator>(
        std::make_shared<llm::RemoteMutator>(
            llm::ProxyChannel(args.llm_proxy, *credentials), /*deadline_seconds=*/600, *token),
        parametric, absl::StrCat("kforge-llm-proxy at ", args.llm_proxy), BreakerOptions{}, clock, log);
    mutator_line = absl::StrCat("mutator: remote kforge-llm-proxy at ", args.llm_proxy);
  }
  Mutator& mutator = remote ? static_cast<Mutator&>(*remote) : static_cast<Mutator&>(mixed);
  std::string device_class;
  int in_flight = 0;  // candidates the workers take at once: two where one compiles ahead
  for (int i = 0; i < args.workers; ++i) {
    const v1::HelloResponse hello = hello_futures[i].get();
    in_flight += CompilesAhead(args, hello) ? 2 : 1;
    if (problem->backend() != v1::BACKEND_REPLAY) {
      if (!hello.available()) {
        std::cerr << "kforge run: " << BackendName(problem->backend()) << " is not available here: "
                  << hello.unavailable_reason() << "\n";
        return 1;
      }
      if (i == 0) {
        device_class = hello.device().name();
        if (!args.quiet) {
          std::cout << "device: " << hello.device().name() << " (" << BackendName(problem->backend()) << ")\n";
        }
      }
    }
  }
  coordinator::JobRunner runner(**store, queue, mutator, clock, log,
                                {.slots = in_flight,
                                 .device_class = device_class,
                                 .finalists = args.finalists,
                                 .confirm_rounds = args.confirm_rounds,
                                 .confirm_every = args.confirm_every,
                                 .always_remeasure = args.always_remeasure});

  std::string job_id = args.job_id;
  if (args.resume && job_id.empty()) {
    auto jobs = (*store)->ListJobs({.problem_hash = problem->content_hash(), .limit = 20});
    if (!jobs.ok()) return BadInput(std::string(jobs.status().message()));
    for (const auto& j : *jobs) {
      if (j.state() != v1::JOB_STATE_COMPLETED && j.state() != v1::JOB_STATE_FAILED &&
          j.state() != v1::JOB_STATE_CANCELLED) {
        job_id = j.id();
        break;
      }
    }
    if (job_id.empty()) return BadInput(absl::StrCat("no unfinished job of ", problem->name(), " in ", db_shown));
  }
  if (job_id.empty()) {
    v1::JobSpec spec;
    *spec.mutable_problem() = *problem;
    spec.mutable_budget()->set_max_candidates(args.budget);
    spec.mutable_budget()->set_max_wall_seconds(args.time_seconds);
    spec.mutable_budget()->set_target_speedup(args.target);
    spec.mutable_budget()->set_patience(args.patience);
    spec.mutable_budget()->set_max_llm_tokens(args.max_llm_tokens);
    spec.mutable_budget()->set_max_llm_cost_usd(args.max_llm_cost);
    spec.mutable_evolution()->set_islands(args.islands);
    spec.mutable_evolution()->set_screen_children(args.screen);
    spec.set_seed(args.seed);
    spec.set_fresh(args.fresh);
    spec.set_cold(args.cold);
    spec.set_tenant("local");
    auto job = runner.Submit(spec);
    if (!job.ok()) return BadInput(std::string(job.status().message()));
    job_id = job->id();
  } else {
    auto job = (*store)->GetJob(job_id);
    if (!job.ok()) return BadInput(std::string(job.status().message()));
    if (job->spec().problem().content_hash() != problem->content_hash()) {
      return BadInput(absl::StrCat("job ", job_id, " belongs to another version of the problem (",
                                   job->spec().problem().name(), "); start a new job instead of --resume"));
    }
  }

  worker_queue_ptr = &worker_queue;
  std::move(release_workers).Cancel();
  stream_promise.set_value(StreamFor(*problem, device_class));

  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  const bool tty = isatty(STDOUT_FILENO) != 0;
  if (!args.quiet) {
    auto stored = (*store)->GetJob(job_id);
    const int64_t budget = stored.ok() ? stored->spec().budget().max_candidates() : args.budget;
    std::cout << (args.resume ? "resuming " : "job ") << job_id << ": " << problem->name() << ", budget "
              << budget << " evaluations, " << args.workers << " worker(s), db " << db_shown << "\n"
              << mutator_line << "\n";
  }
  auto progress = [&](const coordinator::Progress& p) {
    if (args.quiet) return;
    const double rate = p.elapsed_seconds > 0 ? p.evaluations / p.elapsed_seconds : 0;
    if (tty) {
      std::cout << absl::StrFormat("\r\033[K[%d/%d] %.2f eval/s  best %.3fx  %s", p.evaluations, p.budget, rate,
                                   p.best_speedup, Counts(p.outcome_counts))
                << std::flush;
    }
    if (p.improved) {
      const ParamAssignment params(p.candidate->params().begin(), p.candidate->params().end());
      if (tty) std::cout << "\n";
      std::cout << absl::StrFormat("eval %d: new best %.3fx (%s)\n", p.evaluations, p.best_speedup,
                                   params.empty() ? "seed" : FormatParams(params));
    }
  };
  auto job = runner.Run(job_id, g_stop, progress);
  workers_stop.store(true);
  queue.Close();
  for (auto& t : threads) t.join();
  if (tty && !args.quiet) std::cout << "\n";
  if (!job.ok()) {
    std::cerr << "kforge run: " << job.status().message() << "\n";
    return 1;
  }
  auto cands = (*store)->ListCandidates(job_id);
  auto evals = (*store)->ListEvaluations(job_id);
  if (cands.ok() && evals.ok()) {
    if (absl::Status st = WriteReport(args.out_dir, *job, *cands, *evals); !st.ok()) {
      std::cerr << "kforge run: " << st.message() << "\n";
      return 1;
    }
  }
  std::map<std::string, int64_t> counts(job->progress().outcome_counts().begin(),
                                        job->progress().outcome_counts().end());
  const ReportedSpeedup best = JobBestSpeedup(*job);
  const std::string baseline = job->has_best() ? BaselineText(*problem, job->best_result()) : "";
  std::cout << absl::StrFormat("%s: %s (%s). %d evaluations in %.2f s; best speedup %s%s; %s\n", job_id,
                               job->state() == v1::JOB_STATE_COMPLETED   ? "completed"
                               : job->state() == v1::JOB_STATE_INTERRUPTED ? "stopped"
                               : job->state() == v1::JOB_STATE_CANCELLED   ? "cancelled"
                                                                           : "failed",
                               job->state_reason(), job->progress().evaluations(),
                               job->progress().elapsed_seconds(), SpeedupText(best), baseline, Counts(counts));
  if (!best.note.empty()) std::cout << "note: " << best.note << "\n";
  if (const int64_t reused = job->progress().reused(); reused > 0) {
    std::cout << reused << " of the evaluations were reused from earlier jobs in " << db_shown
              << " (run with --fresh to measure every candidate)\n";
  }
  if (!job->warm_start().empty()) std::cout << job->warm_start() << " (run with --cold to start from nothing)\n";
  if (job->state() == v1::JOB_STATE_INTERRUPTED) {
    std::cout << "resume with: kforge run " << args.problem_dir << " --resume --db " << db_shown << "\n";
  }
  std::cout << "report: " << args.out_dir << "/report.md\n";
  return job->state() == v1::JOB_STATE_FAILED ? 1 : 0;
}

}  // namespace kforge::cli
