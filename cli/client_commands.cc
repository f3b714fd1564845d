#include "cli/client_commands.h"

#include <stdlib.h>

#include <filesystem>
#include <iostream>
#include <optional>

#include "CLI/CLI.hpp"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "cli/import_command.h"
#include "cli/problem_files.h"
#include "cli/progress_lines.h"
#include "cli/report.h"
#include "cli/validate_command.h"
#include "cli/watch_command.h"
#include "common/dtype.h"
#include "common/launch.h"
#include "common/problem_loader.h"
#include "google/protobuf/util/json_util.h"

namespace kforge::cli {

namespace fs = std::filesystem;

namespace {

// A folder of its own under TMPDIR, removed with the object.
class TempFolder {
 public:
  TempFolder() {
    const char* tmp = std::getenv("TMPDIR");
    path_ = std::string(tmp != nullptr && *tmp ? tmp : "/tmp") + "/kforge-import-XXXXXX";
    if (mkdtemp(path_.data()) == nullptr) path_ = "kforge-import";
  }
  ~TempFolder() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempFolder(const TempFolder&) = delete;
  TempFolder& operator=(const TempFolder&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace

namespace {

constexpr int kListPageSize = 50;
constexpr int kCountPages = 4;  // `list` counts at most this many pages past its limit

int BadInput(absl::string_view command, absl::string_view message) {
  std::cerr << "kforge " << command << ": " << message << "\n";
  return 2;
}

// The client for a command, or the exit code of a refused --server / --token.
absl::StatusOr<std::unique_ptr<CoordinatorClient>> Connect(absl::string_view command,
                                                           const ClientArgs& args, int* exit_code) {
  auto client = CoordinatorClient::Create(args);
  if (!client.ok()) *exit_code = BadInput(command, client.status().message());
  return client;
}

std::string Json(const google::protobuf::Message& m) {
  std::string s;
  google::protobuf::util::JsonPrintOptions o;
  o.preserve_proto_field_names = true;
  o.add_whitespace = true;
  o.always_print_primitive_fields = true;
  (void)google::protobuf::util::MessageToJsonString(m, &s, o);
  return s;
}

// A job without its problem's contents (sources, shapes): what a listing needs.
v1::Job Slim(const v1::Job& job) {
  v1::Job out = job;
  v1::Problem slim;
  const v1::Problem& p = job.spec().problem();
  slim.set_name(p.name());
  slim.set_backend(p.backend());
  slim.set_description(p.description());
  slim.set_content_hash(p.content_hash());
  *out.mutable_spec()->mutable_problem() = std::move(slim);
  return out;
}

std::map<std::string, int64_t> Counts(const v1::JobProgress& p) {
  return {p.outcome_counts().begin(), p.outcome_counts().end()};
}

std::string BudgetText(const v1::Budget& b) {
  std::vector<std::string> parts;
  if (b.max_candidates() > 0) parts.push_back(absl::StrCat(b.max_candidates(), " evaluations"));
  if (b.max_wall_seconds() > 0) parts.push_back(absl::StrCat(b.max_wall_seconds(), " s"));
  if (b.target_speedup() > 0) parts.push_back(absl::StrFormat("target %.3gx", b.target_speedup()));
  if (b.patience() > 0) parts.push_back(absl::StrCat("patience ", b.patience()));
  if (b.max_llm_tokens() > 0) parts.push_back(absl::StrCat(b.max_llm_tokens(), " model tokens"));
  if (b.max_llm_cost_usd() > 0)
    parts.push_back(absl::StrFormat("$%.2f of model calls", b.max_llm_cost_usd()));
  return parts.empty() ? "none" : absl::StrJoin(parts, ", ");
}

std::string ParamsText(const v1::Candidate& c) {
  const ParamAssignment params(c.params().begin(), c.params().end());
  return params.empty() ? "seed" : FormatParams(params);
}

// The calls themselves, for the commands (which exit on a failure) and for FetchJob/FetchBest.
grpc::Status CallGetJob(CoordinatorClient& client, const std::string& job_id, v1::Job* job) {
  v1::GetJobRequest req;
  req.set_job_id(job_id);
  auto ctx = client.NewContext();
  return client.stub().GetJob(ctx.get(), req, job);
}

grpc::Status CallGetBest(CoordinatorClient& client, const std::string& job_id, v1::GetBestResponse* resp) {
  v1::GetBestRequest req;
  req.set_job_id(job_id);
  auto ctx = client.NewContext();
  return client.stub().GetBest(ctx.get(), req, resp);
}

// One page of the caller's jobs (in `state`, or all) from `token` on.
grpc::Status CallListJobs(CoordinatorClient& client, v1::JobState state, const std::string& token, int page_size,
                          v1::ListJobsResponse* page) {
  v1::ListJobsRequest req;
  req.set_page_size(page_size);
  req.set_page_token(token);
  req.set_state(state);
  auto ctx = client.NewContext();
  return client.stub().ListJobs(ctx.get(), req, page);
}

int GetJob(CoordinatorClient& client, absl::string_view command, const std::string& job_id,
           v1::Job* job) {
  const grpc::Status st = CallGetJob(client, job_id, job);
  return st.ok() ? 0 : client.Fail(command, st);
}

bool CheckJobId(absl::string_view command, const std::string& job_id, int* exit_code) {
  if (!job_id.empty()) return true;
  *exit_code = BadInput(command, "give a job id (kforge list shows them)");
  return false;
}

}  // namespace

absl::StatusOr<v1::JobState> ParseJobState(const std::string& text) {
  std::string name = absl::AsciiStrToUpper(absl::StripAsciiWhitespace(text));
  if (!absl::StartsWith(name, "JOB_STATE_")) name = absl::StrCat("JOB_STATE_", name);
  v1::JobState state;
  if (name != "JOB_STATE_UNSPECIFIED" && v1::JobState_Parse(name, &state)) return state;
  std::vector<std::string> names;
  for (int i = v1::JobState_MIN; i <= v1::JobState_MAX; ++i) {
    if (v1::JobState_IsValid(i) && i != v1::JOB_STATE_UNSPECIFIED) {
      names.push_back(
          absl::AsciiStrToLower(v1::JobState_Name(static_cast<v1::JobState>(i)).substr(10)));
    }
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown job state '", text, "' (expected one of ",
                                                 absl::StrJoin(names, ", "), ")"));
}

absl::StatusOr<Submitted> SubmitProblem(CoordinatorClient& client, const SubmitArgs& args) {
  Submitted out;
  // A PyTorch module file is imported here (its Python runs in the local jailed process, never on
  // the coordinator), into a folder beside nothing of the user's: the submit sends that folder.
  std::string problem_dir = args.problem_dir;
  std::optional<TempFolder> imported_into;
  if (IsModuleFile(args.problem_dir)) {
    imported_into.emplace();
    ImportArgs ia{.file = args.problem_dir, .backend = args.backend, .sets = args.sets, .fit = args.fit,
                  .out_dir = imported_into->path(), .force = true, .quiet = true};
    auto imported = ImportModule(ia);
    if (!imported.ok()) return absl::InvalidArgumentError(imported.status().message());
    out.imported = true;
    out.family = imported->family;
    out.sizes = imported->sizes;
    problem_dir = imported->dir;
  }
  // The checks of `kforge validate` and `kforge run`, here: a refused folder costs no round trip.
  auto problem = LoadProblem(problem_dir);
  if (!problem.ok()) return absl::InvalidArgumentError(problem.status().message());
  if (auto summary = SummariseProblem(*problem); !summary.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(problem_dir, ": ", summary.status().message()));
  }
  if (args.budget <= 0 && args.time_seconds <= 0 && args.target <= 0 && args.patience <= 0) {
    return absl::InvalidArgumentError("give a budget: --budget N, --time S, --target X or --patience N");
  }
  if (args.budget < 0 || args.time_seconds < 0 || args.target < 0 || args.patience < 0) {
    return absl::InvalidArgumentError("--budget, --time, --target and --patience must not be negative");
  }
  auto files = ReadProblemFiles(problem_dir);
  if (!files.ok()) return absl::InvalidArgumentError(files.status().message());

  v1::SubmitJobRequest req;
  v1::JobSpec& spec = *req.mutable_spec();
  spec.mutable_budget()->set_max_candidates(args.budget);
  spec.mutable_budget()->set_max_wall_seconds(args.time_seconds);
  spec.mutable_budget()->set_target_speedup(args.target);
  spec.mutable_budget()->set_patience(args.patience);
  spec.mutable_evolution()->set_screen_children(args.screen);
  spec.set_seed(args.seed);
  spec.set_fresh(args.fresh);
  spec.set_cold(args.cold);
  spec.set_priority(args.priority);
  spec.set_display_name(problem->name());
  req.set_idempotency_key(args.idempotency_key);
  int64_t bytes = 0;
  for (auto& [rel, body] : *files) {
    bytes += static_cast<int64_t>(body.size());
    (*req.mutable_problem_files())[rel] = std::move(body);
  }
  v1::SubmitJobResponse resp;
  auto ctx = client.NewContext();
  // Room to upload a large folder on a slow link: 1 s per MiB beyond the usual deadline.
  ctx->set_deadline(std::chrono::system_clock::now() +
                    std::chrono::milliseconds(static_cast<int64_t>(kRpcDeadlineSeconds * 1000) +
                                              (bytes >> 20) * 1000));
  const grpc::Status st = client.stub().SubmitJob(ctx.get(), req, &resp);
  if (!st.ok()) {
    out.rpc = st;
    return out;
  }
  out.job = std::move(*resp.mutable_job());
  return out;
}

int SubmitCommand(const ClientArgs& client_args, const SubmitArgs& args) {
  constexpr absl::string_view kCmd = "submit";
  int rc = 0;
  auto client = Connect(kCmd, client_args, &rc);
  if (!client.ok()) return rc;
  auto submitted = SubmitProblem(**client, args);
  if (!submitted.ok()) return BadInput(kCmd, submitted.status().message());
  if (submitted->imported) {
    std::cout << "imported " << args.problem_dir << " (sizes " << submitted->sizes << "; seed: "
              << (submitted->family.empty() ? "none, a model writes the kernels" : submitted->family) << ")\n";
  }
  if (!submitted->rpc.ok()) return (*client)->Fail(kCmd, submitted->rpc);
  if (!args.watch) {
    std::cout << submitted->job.id() << "\n";
    return 0;
  }
  std::cout << WatchHeader(submitted->job, (*client)->server()) << "\n" << std::flush;
  return WatchUntilEnd(**client, kCmd, submitted->job);
}

absl::StatusOr<v1::GetBestResponse> FetchBest(CoordinatorClient& client, const std::string& job_id) {
  v1::GetBestResponse resp;
  const grpc::Status st = CallGetBest(client, job_id, &resp);
  if (!st.ok()) return absl::UnavailableError(client.Describe(st));
  return resp;
}

absl::StatusOr<v1::Job> FetchJob(CoordinatorClient& client, const std::string& job_id) {
  v1::Job job;
  const grpc::Status st = CallGetJob(client, job_id, &job);
  if (!st.ok()) return absl::UnavailableError(client.Describe(st));
  return job;
}

int ListCommand(const ClientArgs& client_args, const ListArgs& args) {
  constexpr absl::string_view kCmd = "list";
  int rc = 0;
  auto client = Connect(kCmd, client_args, &rc);
  if (!client.ok()) return rc;
  v1::JobState state = v1::JOB_STATE_UNSPECIFIED;
  if (!args.state.empty()) {
    auto parsed = ParseJobState(args.state);
    if (!parsed.ok()) return BadInput(kCmd, absl::StrCat("--state: ", parsed.status().message()));
    state = *parsed;
  }
  if (args.limit < 1) return BadInput(kCmd, "--limit must be at least 1");
  v1::ListJobsResponse all;
  std::string token;
  while (all.jobs_size() < args.limit) {
    v1::ListJobsResponse page;
    const grpc::Status st =
        CallListJobs(**client, state, token, std::min(kListPageSize, args.limit - all.jobs_size()), &page);
    if (!st.ok()) return (*client)->Fail(kCmd, st);
    for (const v1::Job& j : page.jobs()) {
      if (all.jobs_size() < args.limit) *all.add_jobs() = Slim(j);
    }
    token = page.next_page_token();
    if (token.empty() || page.jobs().empty()) break;
  }
  if (args.json) {
    if (!token.empty()) all.set_next_page_token(token);
    std::cout << Json(all) << "\n";
    return 0;
  }
  if (all.jobs().empty()) {
    std::cout << "no jobs\n";
    return 0;
  }
  // BEST: the confirmed speedup with its ~95% interval, or the first measurement, marked.
  std::cout << absl::StrFormat("%-18s %-10s %7s %-24s %-24s %s\n", "JOB", "STATE", "EVALS", "BEST (95% INTERVAL)",
                               "PROBLEM", "CREATED (UTC)");
  for (const v1::Job& j : all.jobs()) {
    std::cout << absl::StrFormat("%-18s %-10s %7d %-24s %-24s %s\n", j.id(), JobStateWord(j.state()),
                                 j.progress().evaluations(), SpeedupCell(JobBestSpeedup(j)),
                                 j.spec().problem().name(), FormatUtc(j.created_at()));
  }
  if (!token.empty()) {
    // How many more there are: count the next few pages so the hint is exact (a server's pages
    // carry whole jobs, so not without end).
    int64_t rest = 0;
    for (int pages = 0; !token.empty() && pages < kCountPages; ++pages) {
      v1::ListJobsResponse page;
      if (!CallListJobs(**client, state, token, kListPageSize, &page).ok() || page.jobs().empty()) break;
      rest += page.jobs_size();
      token = page.next_page_token();
    }
    if (token.empty() && rest > 0) {
      std::cout << "(" << rest << " more: --limit " << all.jobs_size() + rest << " lists them all)\n";
    } else if (rest > 0) {
      std::cout << "(over " << rest << " more: --limit " << all.jobs_size() + rest << " lists the next " << rest
                << ")\n";
    } else {  // the server stopped answering the count
      std::cout << "(more: --limit " << args.limit * 2 << ")\n";
    }
  }
  return 0;
}

int StatusCommand(const ClientArgs& client_args, const std::string& job_id, bool json) {
  constexpr absl::string_view kCmd = "status";
  int rc = 0;
  if (!CheckJobId(kCmd, job_id, &rc)) return rc;
  auto client = Connect(kCmd, client_args, &rc);
  if (!client.ok()) return rc;
  v1::Job job;
  if (int get = GetJob(**client, kCmd, job_id, &job); get != 0) return get;
  if (json) {
    std::cout << Json(job) << "\n";
    return 0;
  }
  const v1::JobProgress& p = job.progress();
  std::cout << "job " << job.id() << ": " << job.spec().problem().name() << " ("
            << BackendName(job.spec().problem().backend()) << ")"
            << (job.spec().tenant().empty() ? "" : absl::StrCat(", tenant ", job.spec().tenant()))
            << "\n";
  std::cout << "state: " << JobStateWord(job.state())
            << (job.state_reason().empty() ? "" : absl::StrCat(" (", job.state_reason(), ")"))
            << "\n";
  std::cout << absl::StrFormat("progress: %d evaluations (%d in flight) in %.1f s, best %s", p.evaluations(),
                               p.in_flight(), p.elapsed_seconds(), SpeedupText(JobBestSpeedup(job)));
  if (!p.outcome_counts().empty()) std::cout << "; " << FormatCounts(Counts(p));
  std::cout << "\n";
  std::cout << "budget: " << BudgetText(job.spec().budget()) << "\n";
  if (!job.warm_start().empty()) std::cout << job.warm_start() << "\n";
  if (p.llm_tokens() > 0 || p.llm_cost_usd() > 0) {
    std::cout << absl::StrFormat("model calls: %d tokens, %.4f USD\n", p.llm_tokens(), p.llm_cost_usd());
  }
  if (job.has_best()) {
    std::cout << "best: candidate " << job.best().id() << " (" << ParamsText(job.best()) << ")\n";
  }
  std::cout << "created " << FormatUtc(job.created_at()) << ", started "
            << FormatUtc(job.started_at()) << ", finished " << FormatUtc(job.finished_at())
            << " (UTC)\n";
  return 0;
}

int WatchCommand(const ClientArgs& client_args, const std::string& job_id) {
  constexpr absl::string_view kCmd = "watch";
  int rc = 0;
  if (!CheckJobId(kCmd, job_id, &rc)) return rc;
  auto client = Connect(kCmd, client_args, &rc);
  if (!client.ok()) return rc;
  v1::Job job;
  if (int get = GetJob(**client, kCmd, job_id, &job); get != 0) return get;
  std::cout << WatchHeader(job, (*client)->server()) << "\n" << std::flush;
  return WatchUntilEnd(**client, kCmd, job);
}

int BestCommand(const ClientArgs& client_args, const std::string& job_id,
                const std::string& out_dir) {
  constexpr absl::string_view kCmd = "best";
  int rc = 0;
  if (!CheckJobId(kCmd, job_id, &rc)) return rc;
  if (out_dir.empty()) return BadInput(kCmd, "--out: give a folder for the best kernel");
  auto client = Connect(kCmd, client_args, &rc);
  if (!client.ok()) return rc;
  v1::Job job;
  if (int get = GetJob(**client, kCmd, job_id, &job); get != 0) return get;
  v1::GetBestResponse resp;
  if (const grpc::Status st = CallGetBest(**client, job_id, &resp); !st.ok()) return (*client)->Fail(kCmd, st);
  const v1::Candidate& best = resp.best().candidate();
  if (best.id().empty()) {
    std::cerr << "kforge best: job " << job_id << " has no successful evaluation yet ("
              << JobStateWord(job.state()) << ")\n";
    return 1;
  }
  const v1::Problem& problem = job.spec().problem();
  if (problem.backend() != v1::BACKEND_REPLAY && best.source().empty()) {
    std::cerr << "kforge best: the coordinator sent candidate " << best.id()
              << " without its source\n";
    return 1;
  }
  const ReportedSpeedup speedup = ReportedSpeedupOf(job, best, resp.best().result());
  if (absl::Status w = WriteBest(out_dir, problem, best, resp.best().result(), speedup); !w.ok()) {
    std::cerr << "kforge best: " << w.message() << "\n";
    return 1;
  }
  std::cout << absl::StrFormat("%s: best %s%s, candidate %s (%s)\n", job_id, SpeedupText(speedup),
                               BaselineText(problem, resp.best().result()), best.id(),
                               ParamsText(best));
  if (!speedup.note.empty()) std::cout << "note: " << speedup.note << "\n";
  std::string files;
  if (problem.backend() != v1::BACKEND_REPLAY) {
    absl::StrAppend(
        &files,
        (fs::path(out_dir) / (problem.backend() == v1::BACKEND_CUDA ? "best.cu" : "best.cl"))
            .string(),
        ", ");
  }
  absl::StrAppend(&files, (fs::path(out_dir) / "best.json").string());
  std::cout << "wrote " << files << "\n";
  return 0;
}

int CancelCommand(const ClientArgs& client_args, const std::string& job_id,
                  const std::string& reason) {
  constexpr absl::string_view kCmd = "cancel";
  int rc = 0;
  if (!CheckJobId(kCmd, job_id, &rc)) return rc;
  auto client = Connect(kCmd, client_args, &rc);
  if (!client.ok()) return rc;
  v1::CancelJobRequest req;
  req.set_job_id(job_id);
  req.set_reason(reason);
  v1::Job job;
  auto ctx = (*client)->NewContext();
  const grpc::Status st = (*client)->stub().CancelJob(ctx.get(), req, &job);
  if (!st.ok()) return (*client)->Fail(kCmd, st);
  std::cout << job.id() << ": " << JobStateWord(job.state())
            << (job.state_reason().empty() ? "" : absl::StrCat(" (", job.state_reason(), ")"))
            << "\n";
  return 0;
}

int WorkersCommand(const ClientArgs& client_args, bool json) {
  constexpr absl::string_view kCmd = "workers";
  int rc = 0;
  auto client = Connect(kCmd, client_args, &rc);
  if (!client.ok()) return rc;
  v1::ListWorkersResponse resp;
  auto ctx = (*client)->NewContext();
  const grpc::Status st = (*client)->stub().ListWorkers(ctx.get(), v1::ListWorkersRequest(), &resp);
  if (!st.ok()) return (*client)->Fail(kCmd, st);
  if (json) {
    std::cout << Json(resp) << "\n";
    return 0;
  }
  if (resp.workers().empty()) {
    std::cout << "no workers heard from\n";
    return 0;
  }
  std::cout << absl::StrFormat("%-28s %-9s %-6s %-16s %-28s %s\n", "WORKER", "STATE", "BUSY", "STREAMS", "DEVICES",
                               "HEARD");
  for (const auto& w : resp.workers()) {
    std::vector<std::string> devices;
    for (const auto& d : w.devices()) devices.push_back(d.name());
    const char* state = w.draining() ? "draining" : w.busy() > 0 ? "busy" : "idle";
    std::cout << absl::StrFormat("%-28s %-9s %-6s %-16s %-28s %.1f s ago\n", w.worker_id(), state,
                                 absl::StrCat(w.busy(), "/", w.slots()), absl::StrJoin(w.streams(), ","),
                                 devices.empty() ? "-" : absl::StrJoin(devices, ","), w.seconds_since_heartbeat());
  }
  return 0;
}

void ClientCommands::Register(CLI::App& app) {
  auto add_client_options = [this](CLI::App* cmd) {
    cmd->add_option(
        "--server", client_.server,
        absl::StrCat("coordinator host:port (default: $KFORGE_SERVER, else ", kDefaultServer, ")"));
    cmd->add_option("--token", client_.token, "API key (default: $KFORGE_TOKEN)");
    cmd->add_option("--tls-ca", client_.tls.ca,
                    "CA (PEM file) of a coordinator serving TLS (default: $KFORGE_TLS_CA; none: plaintext)");
    cmd->add_option("--tls-cert", client_.tls.cert,
                    "client certificate (PEM file) for a coordinator asking for one (default: $KFORGE_TLS_CERT)");
    cmd->add_option("--tls-key", client_.tls.key, "its private key (PEM file; default: $KFORGE_TLS_KEY)");
  };
  submit_cmd_ =
      app.add_subcommand("submit", "submit a problem folder as a job to a kforge-coordinator");
  submit_cmd_
      ->add_option("PROBLEM_DIR", submit_.problem_dir,
                   "problem folder (problem.yaml + sources), or a PyTorch module file (FILE.py) to import")
      ->required();
  submit_cmd_->add_option("--budget", submit_.budget,
                          "evaluations, the seed included (0 = no limit)");
  submit_cmd_->add_option("--time", submit_.time_seconds, "wall-clock budget in seconds");
  submit_cmd_->add_option("--seed", submit_.seed,
                          "random seed: the same seed gives the same search");
  submit_cmd_->add_option("--priority", submit_.priority,
                          "higher runs first when the fleet is contended");
  submit_cmd_->add_option("--target", submit_.target, "stop once this speedup is reached");
  submit_cmd_->add_option("--set", submit_.sets, "with FILE.py: NAME=VALUE, a module constant (a size), repeatable");
  submit_cmd_->add_option("--fit", submit_.fit,
                          "with FILE.py: halve the largest constants until every tensor holds at most N elements");
  submit_cmd_->add_option("--backend", submit_.backend, "with FILE.py: opencl or cuda (default opencl)");
  submit_cmd_->add_option("--patience", submit_.patience,
                          "stop after N evaluations without improvement");
  submit_cmd_
      ->add_option(
          "--screen", submit_.screen,
          "parametric children the surrogate model screens per proposal (default 16, 1 = off)")
      ->check(CLI::NonNegativeNumber);
  submit_cmd_->add_option("--idempotency-key", submit_.idempotency_key,
                          "a retried submit with the same key gets the same job");
  submit_cmd_->add_flag("--fresh", submit_.fresh,
                        "measure every candidate anew (by default a candidate one of your earlier jobs evaluated on "
                        "the same problem and device class is not run again: that evaluation is reused)");
  submit_cmd_->add_flag("--cold", submit_.cold,
                        "start from nothing (by default the search is warmed by your earlier jobs of the same kernel "
                        "on other devices or shapes)");
  submit_cmd_->add_flag("--watch", submit_.watch, "follow the job's progress until it ends");
  add_client_options(submit_cmd_);

  list_cmd_ = app.add_subcommand("list", "list your jobs on a kforge-coordinator, newest first");
  list_cmd_->add_option("--state", list_.state,
                        "only jobs in this state (queued, running, completed, ...)");
  list_cmd_->add_flag("--json", list_.json, "print the jobs as JSON");
  list_cmd_->add_option("--limit", list_.limit, "at most this many jobs (default 50)");
  add_client_options(list_cmd_);

  status_cmd_ = app.add_subcommand("status", "show a job's state and progress");
  status_cmd_->add_option("JOB", job_id_, "job id")->required();
  status_cmd_->add_flag("--json", json_, "print the job as JSON");
  add_client_options(status_cmd_);

  watch_cmd_ = app.add_subcommand("watch", "follow a job's progress until it ends");
  watch_cmd_->add_option("JOB", job_id_, "job id")->required();
  add_client_options(watch_cmd_);

  best_cmd_ =
      app.add_subcommand("best", "write a job's best kernel, params and launch plan to a folder");
  best_cmd_->add_option("JOB", job_id_, "job id")->required();
  best_cmd_->add_option("--out", out_dir_, "folder for best.cl / best.cu and best.json")
      ->required();
  add_client_options(best_cmd_);

  cancel_cmd_ = app.add_subcommand("cancel", "stop a job; its evaluations are kept");
  cancel_cmd_->add_option("JOB", job_id_, "job id")->required();
  cancel_cmd_->add_option("--reason", reason_, "why (kept with the job)");
  add_client_options(cancel_cmd_);

  workers_cmd_ = app.add_subcommand("workers", "list the fleet: each worker's state, slots and last heartbeat");
  workers_cmd_->add_flag("--json", json_, "print the workers as JSON");
  add_client_options(workers_cmd_);
}

std::optional<int> ClientCommands::Run() const {
  if (*submit_cmd_) return SubmitCommand(client_, submit_);
  if (*list_cmd_) return ListCommand(client_, list_);
  if (*status_cmd_) return StatusCommand(client_, job_id_, json_);
  if (*watch_cmd_) return WatchCommand(client_, job_id_);
  if (*best_cmd_) return BestCommand(client_, job_id_, out_dir_);
  if (*cancel_cmd_) return CancelCommand(client_, job_id_, reason_);
  if (*workers_cmd_) return WorkersCommand(client_, json_);
  return std::nullopt;
}

}  // namespace kforge::cli
