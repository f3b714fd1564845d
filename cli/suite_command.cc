#include "cli/suite_command.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cli/client_commands.h"
#include "cli/import_command.h"
#include "cli/report.h"
#include "common/problem_loader.h"
#include "services/coordinator/job_runner.h"
#include "nlohmann/json.hpp"

namespace kforge::cli {

namespace fs = std::filesystem;
using Json = nlohmann::json;

namespace {

// KernelBench's files sort by their number: 2_ before 10_.
bool NaturalLess(const std::string& a, const std::string& b) {
  int64_t na = 0, nb = 0;
  const std::string fa = fs::path(a).filename().string(), fb = fs::path(b).filename().string();
  const bool ha = absl::SimpleAtoi(fa.substr(0, fa.find('_')), &na);
  const bool hb = absl::SimpleAtoi(fb.substr(0, fb.find('_')), &nb);
  if (ha && hb && na != nb) return na < nb;
  return a < b;
}

std::vector<std::string> Expand(const std::vector<std::string>& paths) {
  std::vector<std::string> out;
  for (const auto& p : paths) {
    std::error_code ec;
    if (fs::is_directory(p, ec) && !fs::exists(fs::path(p) / "problem.yaml", ec)) {
      std::vector<std::string> files;
      // Its module files and its problem folders.
      for (const auto& e : fs::directory_iterator(p, ec)) {
        std::error_code ec2;
        if (e.path().extension() == ".py" || fs::exists(e.path() / "problem.yaml", ec2)) {
          files.push_back(e.path().string());
        }
      }
      std::sort(files.begin(), files.end(), NaturalLess);
      out.insert(out.end(), files.begin(), files.end());
    } else {
      out.push_back(p);
    }
  }
  return out;
}

struct Row {
  std::string name;
  std::string family;   // the seed's template, "model" (no template), or "" for a problem folder
  std::string outcome;  // correct | wrong | failed | refused
  std::string reason;
  double eager = 0;     // speedup over eager (the reported, confirmed one)
  double compile = 0;   // over torch.compile; 0 = not measured
  int64_t evaluations = 0;
  double seconds = 0;
};

// Checked reads of report.json: a missing or odd field is a zero, never an exception.
const Json& Member(const Json& j, const char* key) {
  static const Json kNull;
  if (!j.is_object()) return kNull;
  auto it = j.find(key);
  return it == j.end() ? kNull : *it;
}

double Number(const Json& j) {
  if (j.is_number()) return j.get<double>();
  double v = 0;
  if (j.is_string() && absl::SimpleAtod(j.get<std::string>(), &v)) return v;
  return 0;
}

Json ReadJson(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return Json::parse(ss.str(), nullptr, false);
}

std::string NameOf(const std::string& path) {
  return fs::is_directory(path) ? fs::path(path).filename().string() : fs::path(path).stem().string();
}

// Runs one problem; the row of the table. The run's own output goes to OUT/<name>/run.log.
Row RunOne(const SuiteArgs& args, const std::string& path) {
  Row row;
  row.name = NameOf(path);
  const fs::path out = fs::path(args.out_dir) / row.name;
  std::error_code ec;
  fs::create_directories(out, ec);
  RunArgs run = args.run;
  run.out_dir = out.string();
  run.quiet = true;
  run.problem_dir = path;
  if (IsModuleFile(path)) {
    ImportArgs ia{.file = path, .backend = run.backend, .sets = run.sets, .fit = run.fit,
                  .out_dir = (out / "problem").string(), .force = true, .quiet = true};
    auto imported = ImportModule(ia);
    if (!imported.ok()) {
      row.outcome = "refused";
      row.reason = std::string(imported.status().message());
      return row;
    }
    row.family = imported->family.empty() ? "model" : imported->family;
    run.problem_dir = imported->dir;
  }
  // The run's own lines go to a log of its own; the suite prints its table.
  const std::string log = (out / "run.log").string();
  std::streambuf* saved_out = std::cout.rdbuf();
  std::streambuf* saved_err = std::cerr.rdbuf();
  std::ofstream log_file(log);
  std::cout.rdbuf(log_file.rdbuf());
  std::cerr.rdbuf(log_file.rdbuf());
  const int rc = RunJob(run);
  std::cout.rdbuf(saved_out);
  std::cerr.rdbuf(saved_err);
  const Json report = ReadJson(out / "report.json");
  if (!report.is_object()) {
    row.outcome = "failed";
    std::ifstream in(log);
    std::string line, last;
    while (std::getline(in, line)) {
      if (!line.empty()) last = line;
    }
    row.reason = last.empty() ? absl::StrCat("kforge run exited ", rc) : last;
    return row;
  }
  // report.json holds the job as protobuf's JSON: field names as in the .proto, 64-bit integers
  // as strings.
  const Json& job = Member(report, "job");
  const Json& progress = Member(job, "progress");
  row.evaluations = static_cast<int64_t>(Number(Member(progress, "evaluations")));
  row.seconds = Number(Member(progress, "elapsed_seconds"));
  const Json& state = Member(job, "state");
  const Json& best = Member(report, "best");
  if (best.is_object()) {
    row.outcome = "correct";
    row.eager = Number(best.contains("speedup_over_eager") ? best["speedup_over_eager"] : Member(best, "speedup"));
    row.compile = Number(Member(best, "speedup_over_compile"));
  } else {
    row.outcome = state.is_string() && state.get<std::string>() == "JOB_STATE_FAILED" ? "failed" : "wrong";
    const Json& why = Member(job, "state_reason");
    row.reason = why.is_string() ? why.get<std::string>() : "";
    if (row.reason.empty()) row.reason = "no candidate was correct";
  }
  return row;
}

// The row of a job the cluster ran, from its ended state and its best.
Row RowOfJob(CoordinatorClient& client, const v1::Job& job, Row row) {
  row.evaluations = job.progress().evaluations();
  row.seconds = job.progress().elapsed_seconds();
  auto best = FetchBest(client, job.id());
  if (best.ok() && !best->best().candidate().id().empty()) {
    row.outcome = "correct";
    row.eager = ReportedSpeedupOf(job, best->best().candidate(), best->best().result()).speedup;
    row.compile = best->best().result().speedup_compiled();
    return row;
  }
  row.outcome = job.state() == v1::JOB_STATE_FAILED || job.state() == v1::JOB_STATE_CANCELLED ? "failed" : "wrong";
  row.reason = best.ok() ? job.state_reason() : std::string(best.status().message());
  if (row.reason.empty()) row.reason = "no candidate was correct";
  return row;
}

std::string Bar(size_t done, size_t total) {
  const int width = 30;
  const int filled = total == 0 ? width : static_cast<int>(width * done / total);
  return absl::StrCat("[", std::string(filled, '#'), std::string(width - filled, '.'), "] ", done, "/", total);
}

void Announce(bool tty, bool json, size_t done, size_t total, const Row& r) {
  if (tty || json) return;
  std::cerr << absl::StrFormat("kforge suite: %d/%d %s: %s", done, total, r.name, r.outcome)
            << (r.outcome == "correct" ? absl::StrFormat(" %.3fx", r.eager) : "") << "\n";
}

// Every problem run here, one after another.
std::vector<Row> RunEmbedded(const SuiteArgs& args, const std::vector<std::string>& paths, bool tty) {
  std::vector<Row> rows;
  for (size_t i = 0; i < paths.size(); ++i) {
    if (tty) std::cerr << "\r" << Bar(i, paths.size()) << " " << fs::path(paths[i]).filename().string() << "\033[K";
    rows.push_back(RunOne(args, paths[i]));
    if (RunInterrupted()) {  // its job stopped, resumable: not a result, and no more problems
      rows.pop_back();
      break;
    }
    Announce(tty, args.json, i + 1, paths.size(), rows.back());
  }
  return rows;
}

// Every problem submitted to the cluster at once, then waited for; nullopt (said why) when the
// cluster cannot be reached at all.
std::optional<std::vector<Row>> RunRemote(const SuiteArgs& args, const std::vector<std::string>& paths, bool tty) {
  auto client = CoordinatorClient::Create(args.client);
  if (!client.ok()) {
    std::cerr << "kforge suite: " << client.status().message() << "\n";
    return std::nullopt;
  }
  std::vector<Row> rows(paths.size());
  std::vector<std::string> job_ids(paths.size());
  for (size_t i = 0; i < paths.size(); ++i) {
    Row& row = rows[i];
    row.name = NameOf(paths[i]);
    if (tty) std::cerr << "\rsubmitting " << Bar(i, paths.size()) << " " << row.name << "\033[K";
    SubmitArgs sa{.problem_dir = paths[i], .budget = args.run.budget, .time_seconds = args.run.time_seconds,
                  .seed = args.run.seed, .sets = args.run.sets, .fit = args.run.fit, .backend = args.run.backend};
    auto submitted = SubmitProblem(**client, sa);
    if (submitted.ok() && IsModuleFile(paths[i])) row.family = submitted->family.empty() ? "model" : submitted->family;
    if (!submitted.ok() || !submitted->rpc.ok()) {
      row.outcome = "refused";
      row.reason = submitted.ok() ? (*client)->Describe(submitted->rpc) : std::string(submitted.status().message());
      if (submitted.ok() && submitted->rpc.error_code() == grpc::StatusCode::UNAVAILABLE && i == 0) {
        std::cerr << (tty ? "\n" : "") << "kforge suite: " << row.reason << "\n";
        return std::nullopt;
      }
      continue;
    }
    job_ids[i] = submitted->job.id();
  }
  // Wait for every job to end; a job the coordinator cannot answer for is asked again.
  size_t ended = 0, total = 0;
  for (const auto& id : job_ids) total += id.empty() ? 0 : 1;
  std::vector<bool> done(paths.size(), false);
  while (ended < total) {
    for (size_t i = 0; i < paths.size(); ++i) {
      if (job_ids[i].empty() || done[i]) continue;
      auto job = FetchJob(**client, job_ids[i]);
      if (!job.ok() || !coordinator::IsFinalJobState(job->state())) continue;
      rows[i] = RowOfJob(**client, *job, rows[i]);
      done[i] = true;
      ++ended;
      Announce(tty, args.json, ended, total, rows[i]);
    }
    if (tty) std::cerr << "\r" << Bar(ended, total) << " jobs ended\033[K";
    if (ended < total) std::this_thread::sleep_for(std::chrono::duration<double>(args.poll_seconds));
  }
  return rows;
}

}  // namespace

int RunSuite(const SuiteArgs& args) {
  const std::vector<std::string> paths = Expand(args.paths);
  if (paths.empty()) {
    std::cerr << "kforge suite: no problems (give module files, folders of them, or problem folders)\n";
    return 2;
  }
  const bool remote = !args.client.server.empty();
  if (remote && !args.run.llm_config.empty()) {
    std::cerr << "kforge suite: --llm is for embedded runs; a cluster uses its own kforge-llm-proxy\n";
    return 2;
  }
  std::error_code ec;
  fs::create_directories(args.out_dir, ec);
  if (ec) {
    std::cerr << "kforge suite: cannot create " << args.out_dir << ": " << ec.message() << "\n";
    return 2;
  }
  const bool tty = isatty(STDERR_FILENO) != 0;
  std::vector<Row> rows;
  if (remote) {
    auto got = RunRemote(args, paths, tty);
    if (!got.has_value()) return 1;
    rows = std::move(*got);
  } else {
    rows = RunEmbedded(args, paths, tty);
  }
  if (tty) std::cerr << "\r" << Bar(rows.size(), paths.size()) << "\033[K\n";
  const bool interrupted = rows.size() < paths.size();
  if (interrupted) {
    std::cerr << "kforge suite: interrupted after " << rows.size() << " of " << paths.size()
              << " problems; the figures are over those\n";
  }
  // The figures: over every problem given (a refused or failed one counts as not correct).
  int correct = 0, fast_eager = 0, compiled = 0, fast_compile = 0;
  double log_sum = 0, log_sum_compile = 0;
  for (const Row& r : rows) {
    if (r.outcome != "correct") continue;
    ++correct;
    fast_eager += r.eager > 1 ? 1 : 0;
    log_sum += std::log(std::max(r.eager, 1e-12));
    if (r.compile > 0) {
      ++compiled;
      fast_compile += r.compile > 1 ? 1 : 0;
      log_sum_compile += std::log(r.compile);
    }
  }
  const double n = static_cast<double>(std::max<size_t>(rows.size(), 1));
  Json j = {{"problems", rows.size()},
            {"correct", correct},
            {"correct_share", correct / n},
            {"fast_1_eager", fast_eager},
            {"fast_1_eager_share", fast_eager / n},
            {"geomean_speedup_eager", correct > 0 ? std::exp(log_sum / correct) : 0.0},
            {"compile_measured", compiled},
            {"fast_1_compile", fast_compile},
            {"geomean_speedup_compile", compiled > 0 ? std::exp(log_sum_compile / compiled) : 0.0},
            {"budget", args.run.budget},
            {"interrupted", interrupted}};
  Json table = Json::array();
  for (const Row& r : rows) {
    table.push_back({{"problem", r.name},
                     {"template", r.family},
                     {"outcome", r.outcome},
                     {"reason", r.reason},
                     {"speedup_eager", r.eager},
                     {"speedup_compile", r.compile > 0 ? Json(r.compile) : Json()},
                     {"evaluations", r.evaluations},
                     {"seconds", r.seconds}});
  }
  j["table"] = table;
  std::ofstream(fs::path(args.out_dir) / "suite.json") << j.dump(2) << "\n";
  if (args.json) {
    std::cout << j.dump(2) << "\n";
    return interrupted ? 1 : 0;
  }
  std::cout << absl::StrFormat(
      "%d problems, budget %d each: correct %d (%.0f%%), fast_1 over eager %d (%.0f%% of all, %.0f%% of correct), "
      "geometric-mean speedup over eager %.3fx",
      rows.size(), args.run.budget, correct, 100 * correct / n, fast_eager, 100 * fast_eager / n,
      correct > 0 ? 100.0 * fast_eager / correct : 0.0, correct > 0 ? std::exp(log_sum / correct) : 0.0);
  if (compiled > 0) {
    std::cout << absl::StrFormat("; over torch.compile (%d measured): fast_1 %d, geometric mean %.3fx", compiled,
                                 fast_compile, std::exp(log_sum_compile / compiled));
  } else {
    std::cout << "; torch.compile not measured (this torch has none)";
  }
  std::cout << "\n\n| problem | template | outcome | speedup over eager | over compile |\n|---|---|---|---|---|\n";
  for (const Row& r : rows) {
    std::cout << "| " << r.name << " | " << (r.family.empty() ? "-" : r.family) << " | " << r.outcome
              << (r.reason.empty() ? "" : absl::StrCat(": ", r.reason.substr(0, 160))) << " | "
              << (r.outcome == "correct" ? absl::StrFormat("%.3fx", r.eager) : "-") << " | "
              << (r.compile > 0 ? absl::StrFormat("%.3fx", r.compile) : "-") << " |\n";
  }
  return interrupted ? 1 : 0;
}

}  // namespace kforge::cli
