// `kforge run` end to end through the built binary: a replay problem (reports and files), a tiny
// OpenCL problem (skipped without an OpenCL device), resuming after a hard kill, and bad input.

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/launch.h"
#include "common/logging.h"
#include "common/queue/redis_queue.h"
#include "common/store/postgres_store.h"
#include "common/store/sqlite_store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/integration/replay_fixture.h"
#include "tests/testutil/background_process.h"
#include "tests/testutil/postgres_server.h"
#include "tests/testutil/redis_server.h"
#include "tests/testutil/subprocess.h"
#include "tests/testutil/temp_dir.h"

namespace kforge {
namespace {

namespace fs = std::filesystem;

using ::kforge::testing::BinaryDir;
using ::kforge::testing::RunProgram;
using ::kforge::testing::FreePort;
using ::kforge::testing::PostgresServer;
using ::kforge::testing::RedisServer;
using ::kforge::testing::RunResult;
using ::kforge::testing::SourceDir;
using ::kforge::testing::SynthSpace;
using ::kforge::testing::TempDir;
using ::kforge::testing::WriteSynthReplayProblem;
using ::testing::HasSubstr;
using ::testing::Not;

std::string Kforge() { return BinaryDir() + "/cli/kforge"; }

std::string Describe(const RunResult& r) {
  return absl::StrCat("exit ", r.exit_code, "\n--- stdout:\n", r.out, "--- stderr:\n", r.err);
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

nlohmann::json ReadJson(const std::string& path) {
  return nlohmann::json::parse(ReadFile(path), nullptr, /*allow_exceptions=*/false);
}

std::vector<v1::Job> Jobs(Store& store) {
  auto jobs = store.ListJobs({});
  EXPECT_TRUE(jobs.ok()) << jobs.status();
  return jobs.ok() ? *jobs : std::vector<v1::Job>{};
}

// Every candidate of the job has exactly one evaluation (when `finished`), no two candidates
// share a content hash or params, and sequences are 0..n-1.
void ExpectStoredJobConsistent(Store& store, const std::string& job_id, bool finished) {
  auto cands = store.ListCandidates(job_id);
  auto evals = store.ListEvaluations(job_id);
  ASSERT_TRUE(cands.ok()) << cands.status();
  ASSERT_TRUE(evals.ok()) << evals.status();
  std::set<std::string> ids, hashes, params;
  for (size_t i = 0; i < cands->size(); ++i) {
    const auto& c = (*cands)[i];
    EXPECT_EQ(c.sequence(), static_cast<int64_t>(i));
    EXPECT_TRUE(ids.insert(c.id()).second) << c.id();
    EXPECT_TRUE(hashes.insert(c.content_hash()).second) << "duplicate content hash at " << i;
    EXPECT_TRUE(params.insert(FormatParams(ParamAssignment(c.params().begin(), c.params().end()))).second) << i;
  }
  std::map<std::string, int> per;
  for (const auto& e : *evals) {
    ++per[e.candidate_id()];
    EXPECT_TRUE(ids.contains(e.candidate_id())) << e.candidate_id();
  }
  for (const auto& [id, n] : per) EXPECT_EQ(n, 1) << id;
  if (finished) {
    EXPECT_EQ(evals->size(), cands->size());
  } else {
    EXPECT_LE(evals->size(), cands->size());
  }
}

std::vector<std::string> ParamTrace(SqliteStore& store, const std::string& job_id) {
  std::vector<std::string> out;
  auto cands = store.ListCandidates(job_id);
  EXPECT_TRUE(cands.ok()) << cands.status();
  if (!cands.ok()) return out;
  for (const auto& c : *cands) out.push_back(FormatParams(ParamAssignment(c.params().begin(), c.params().end())));
  return out;
}

// ---------------------------------------------------------------------------------------------
// (a) A replay problem.

TEST(KforgeRunTest, ReplayProblemWritesTheReports) {
  TempDir dir;
  const std::string problem = WriteSynthReplayProblem(dir);
  const std::string db = dir.path() + "/k.db";
  const std::string out = dir.path() + "/out";
  RunResult r = RunProgram(Kforge(), {"run", problem, "--budget", "30", "--db", db, "--out", out, "--seed", "4"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_THAT(r.out, HasSubstr("completed"));
  EXPECT_THAT(r.out, HasSubstr("30 evaluations"));
  for (const char* f : {"report.json", "report.md", "progress.svg", "best.json"}) {
    EXPECT_TRUE(fs::is_regular_file(fs::path(out) / f)) << f;
  }
  EXPECT_FALSE(fs::exists(fs::path(out) / "best.cl")) << "a replay problem has no kernel source";

  nlohmann::json report = ReadJson(out + "/report.json");
  ASSERT_FALSE(report.is_discarded()) << "report.json is not JSON";
  ASSERT_TRUE(report.contains("top"));
  ASSERT_TRUE(report["top"].is_array());
  EXPECT_GE(report["top"].size(), 1u);
  EXPECT_LE(report["top"].size(), 10u);
  double prev = 1e300;
  for (const auto& row : report["top"]) {
    ASSERT_TRUE(row.contains("speedup"));
    EXPECT_LE(row["speedup"].get<double>(), prev) << "top is sorted by speedup";
    prev = row["speedup"].get<double>();
    EXPECT_TRUE(row.contains("params"));
  }
  ASSERT_TRUE(report.contains("outcome_counts"));
  int64_t total = 0;
  for (const auto& [k, v] : report["outcome_counts"].items()) total += v.get<int64_t>();
  EXPECT_EQ(total, 30);
  EXPECT_GE(report["outcome_counts"].value("ok", 0), 1);
  ASSERT_TRUE(report["job"].contains("progress"));
  const double best = report["job"]["progress"].value("best_speedup", 0.0);
  EXPECT_GE(best, 1.0);
  EXPECT_DOUBLE_EQ(report["top"][0]["speedup"].get<double>(), best);
  EXPECT_EQ(report["best_so_far"].size(), 30u);
  EXPECT_EQ(report["problem"]["backend"], "replay");

  nlohmann::json bj = ReadJson(out + "/best.json");
  ASSERT_FALSE(bj.is_discarded());
  EXPECT_DOUBLE_EQ(bj["speedup"].get<double>(), best);
  EXPECT_TRUE(bj["params"].contains("X"));
  EXPECT_THAT(ReadFile(out + "/report.md"), HasSubstr("best speedup"));
  const std::string svg = ReadFile(out + "/progress.svg");
  EXPECT_THAT(svg, HasSubstr("<svg"));
  EXPECT_THAT(svg, HasSubstr("</svg>"));

  auto store = SqliteStore::Open(db);
  ASSERT_TRUE(store.ok()) << store.status();
  auto jobs = Jobs(**store);
  ASSERT_EQ(jobs.size(), 1u);
  EXPECT_EQ(jobs[0].state(), v1::JOB_STATE_COMPLETED);
  EXPECT_EQ(jobs[0].progress().evaluations(), 30);
  ExpectStoredJobConsistent(**store, jobs[0].id(), /*finished=*/true);

  // The same seed in another database proposes the same candidates.
  const std::string db2 = dir.path() + "/k2.db";
  RunResult r2 = RunProgram(Kforge(), {"run", problem, "--budget", "30", "--db", db2, "--out", dir.path() + "/out2",
                                       "--seed", "4", "--quiet"});
  ASSERT_EQ(r2.exit_code, 0) << Describe(r2);
  auto store2 = SqliteStore::Open(db2);
  ASSERT_TRUE(store2.ok()) << store2.status();
  auto jobs2 = Jobs(**store2);
  ASSERT_EQ(jobs2.size(), 1u);
  EXPECT_EQ(ParamTrace(**store2, jobs2[0].id()), ParamTrace(**store, jobs[0].id()));
}

// ---------------------------------------------------------------------------------------------
// (b) A tiny OpenCL problem.

constexpr char kScaleYaml[] = R"yaml(name: vector-scale-test
backend: opencl
description: y = 2 * x
sizes: {N: 65536}
buffers:
  x: {dtype: f32, shape: [N], role: in}
  y: {dtype: f32, shape: [N], role: out}
check: {atol: 1e-6, rtol: 1e-6, trials: 1}
reference:
  source: reference.cl
  launches:
    - {kernel: scale_ref, global: ["ceil_div(N, 64) * 64"], local: [64], args: [x, y, N]}
seed:
  source: seed.cl
  params: {WG: [32, 64, 128], ITEMS: [1, 2, 4]}
  launches:
    - {kernel: scale, global: ["ceil_div(N, WG * ITEMS) * WG"], local: [WG], args: [x, y, N]}
)yaml";

constexpr char kScaleRef[] = R"cl(kernel void scale_ref(global const float* x, global float* y, int n) {
  int i = get_global_id(0);
  if (i < n) y[i] = 2.0f * x[i];
}
)cl";

constexpr char kScaleSeed[] = R"cl(#ifndef WG
#define WG 64
#endif
#ifndef ITEMS
#define ITEMS 1
#endif
kernel void scale(global const float* x, global float* y, int n) {
  int base = (int)get_group_id(0) * WG * ITEMS + (int)get_local_id(0);
  for (int i = 0; i < ITEMS; ++i) {
    int idx = base + i * WG;
    if (idx < n) y[idx] = 2.0f * x[idx];
  }
}
)cl";

// The same kernel in a second problem folder (another recording of it) finds the first job in the
// --db: the run says so, and the report; --cold starts from nothing.
TEST(KforgeRunTest, ASecondProblemOfTheSameKernelStartsWarmUnlessCold) {
  TempDir dir;
  const std::string first = WriteSynthReplayProblem(dir, "first", {}, "synth-first");
  const std::string second = WriteSynthReplayProblem(dir, "second", {}, "synth-second");
  const std::string db = dir.path() + "/k.db";
  RunResult r = RunProgram(Kforge(), {"run", first, "--budget", "12", "--db", db, "--out", dir.path() + "/o1"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_THAT(r.out, Not(HasSubstr("warm start")));
  r = RunProgram(Kforge(), {"run", second, "--budget", "8", "--db", db, "--out", dir.path() + "/o2"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_THAT(r.out, HasSubstr("warm start: 12 evaluations from 1 earlier job on Synthetic GPU (run with --cold"));
  EXPECT_THAT(ReadFile(dir.path() + "/o2/report.md"), HasSubstr("- warm start: 12 evaluations"));
  EXPECT_THAT(ReadJson(dir.path() + "/o2/report.json").value("warm_start", ""), HasSubstr("from 1 earlier job"));
  r = RunProgram(Kforge(), {"run", second, "--budget", "8", "--db", db, "--out", dir.path() + "/o3", "--cold"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_THAT(r.out, Not(HasSubstr("warm start")));
  EXPECT_THAT(ReadFile(dir.path() + "/o3/report.md"), Not(HasSubstr("warm start")));
}

TEST(KforgeRunTest, SmallOpenClProblem) {
  TempDir dir;
  dir.Write("scale/problem.yaml", kScaleYaml);
  dir.Write("scale/reference.cl", kScaleRef);
  dir.Write("scale/seed.cl", kScaleSeed);
  RunResult v = RunProgram(Kforge(), {"validate", dir.path() + "/scale"});
  ASSERT_EQ(v.exit_code, 0) << Describe(v);
  const std::string out = dir.path() + "/out";
  const std::string db = dir.path() + "/cl.db";
  // --always-remeasure: even finalists their benchmarks separate (the next test leaves them).
  RunResult r = RunProgram(Kforge(), {"run", dir.path() + "/scale", "--budget", "6", "--timeout", "20", "--db", db,
                                      "--out", out, "--quiet", "--cache-dir", dir.path() + "/cache",
                                      "--always-remeasure"});
  if (r.exit_code == 1 && r.err.find("not available") != std::string::npos) {
    GTEST_SKIP() << "no OpenCL device: " << r.err;
  }
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  // The finalists (3 by default) were re-measured side by side, and the best is the winner there.
  EXPECT_THAT(r.out, HasSubstr("side-by-side rounds"));
  {
    nlohmann::json rep = ReadJson(out + "/report.json");
    const nlohmann::json& best = rep["best"];
    ASSERT_TRUE(best.is_object()) << rep.dump();
    EXPECT_TRUE(best["confirmed"].get<bool>()) << best.dump();
    EXPECT_EQ(best["confirm_rounds"].get<int>(), 9) << best.dump();
    EXPECT_LE(best["speedup_interval"][0].get<double>(), best["speedup"].get<double>()) << best.dump();
    EXPECT_GE(best["speedup_interval"][1].get<double>(), best["speedup"].get<double>()) << best.dump();
    const nlohmann::json& finalists = rep["job"]["confirmation"]["finalists"];
    ASSERT_TRUE(finalists.is_array()) << rep["job"].dump();
    EXPECT_GE(finalists.size(), 1u);
    EXPECT_LE(finalists.size(), 3u);
    EXPECT_EQ(finalists[0]["candidate_id"], best["candidate_id"]) << finalists.dump();
    EXPECT_EQ(rep["job"]["best"]["id"], best["candidate_id"]);
    nlohmann::json best_json = ReadJson(out + "/best.json");
    EXPECT_EQ(best_json["speedup"], best["speedup"]);
    // best.cl carries the knob values best.json gives (the seed's own #ifndef defaults would
    // otherwise compile it with others).
    const std::string cl = ReadFile(out + "/best.cl");
    ASSERT_TRUE(best_json["params"].is_object()) << best_json.dump();
    for (const auto& [knob, value] : best_json["params"].items()) {
      EXPECT_THAT(cl, HasSubstr(absl::StrCat("#define ", knob, " ", value.get<std::string>(), "\n"))) << cl;
    }
    EXPECT_TRUE(best_json["speedup_interval"].is_array()) << best_json.dump();
    EXPECT_THAT(ReadFile(out + "/report.md"), HasSubstr("## Finalists, re-measured side by side"));
    // The runtime's kernel cache went to --cache-dir, where the next run finds it.
    EXPECT_TRUE(fs::is_directory(dir.path() + "/cache/runtime/pocl")) << Describe(r);
  }
  EXPECT_TRUE(fs::is_regular_file(fs::path(out) / "best.cl"));
  EXPECT_TRUE(fs::is_regular_file(fs::path(out) / "best.json"));
  EXPECT_TRUE(fs::is_regular_file(fs::path(out) / "report.json"));
  nlohmann::json report = ReadJson(out + "/report.json");
  ASSERT_FALSE(report.is_discarded());
  int64_t total = 0;
  for (const auto& [k, v] : report["outcome_counts"].items()) total += v.get<int64_t>();
  EXPECT_EQ(total, 6) << report["outcome_counts"].dump();
  EXPECT_GE(report["outcome_counts"].value("ok", 0), 1) << report["outcome_counts"].dump();
  EXPECT_EQ(report["outcome_counts"].value("wrong_answer", 0), 0) << "every knob setting of the kernel is correct";
  // Where the time went: every evaluation passed through every stage it reached, in order.
  const nlohmann::json& stages = report["timing"]["stages"];
  ASSERT_TRUE(stages.is_object()) << report["timing"].dump();
  for (const char* s : {"screen", "compile", "validate", "benchmark"}) {
    ASSERT_TRUE(stages.contains(s)) << s << ": " << stages.dump();
    EXPECT_GE(stages[s]["evaluations"].get<int64_t>(), report["outcome_counts"].value("ok", 0))
        << s;
    EXPECT_LE(stages[s]["evaluations"].get<int64_t>(), 6) << s;
    EXPECT_GT(stages[s]["total_seconds"].get<double>(), 0) << s;
    EXPECT_NEAR(stages[s]["mean_seconds"].get<double>() * stages[s]["evaluations"].get<double>(),
                stages[s]["total_seconds"].get<double>(), 1e-9)
        << s;
  }
  EXPECT_THAT(ReadFile(out + "/report.md"), HasSubstr("## Where the time went"));
  EXPECT_THAT(ReadFile(out + "/report.md"), HasSubstr("| validate | "));
  EXPECT_GT(report["timing"]["sandbox_bytes_per_evaluation"]["sent"].get<double>(), 0);
  EXPECT_GT(report["timing"]["sandbox_bytes_per_evaluation"]["received"].get<double>(), 0);
  EXPECT_THAT(ReadFile(out + "/report.md"),
              HasSubstr("Moved to and from the sandbox per evaluation"));
  EXPECT_THAT(ReadFile(out + "/best.cl"), HasSubstr("kernel void scale"));
  auto store = SqliteStore::Open(db);
  ASSERT_TRUE(store.ok()) << store.status();
  auto jobs = Jobs(**store);
  ASSERT_EQ(jobs.size(), 1u);
  EXPECT_EQ(jobs[0].progress().evaluations(), 6);
  ExpectStoredJobConsistent(**store, jobs[0].id(), /*finished=*/true);
  const std::string first_job = jobs[0].id();
  store->reset();

  // Again with the same --db: nothing runs again, the earlier measurements are reused and say so.
  const std::string again = dir.path() + "/again";
  r = RunProgram(Kforge(), {"run", dir.path() + "/scale", "--budget", "6", "--timeout", "20", "--db", db, "--out",
                            again, "--quiet", "--cache-dir", dir.path() + "/cache"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_THAT(r.out, HasSubstr("6 of the evaluations were reused from earlier jobs"));
  report = ReadJson(again + "/report.json");
  EXPECT_EQ(report["timing"]["reused_evaluations"].get<int64_t>(), 6) << report["timing"].dump();
  EXPECT_EQ(report["reused_from_jobs"], nlohmann::json::array({first_job}));
  EXPECT_EQ(report["job"]["confirmation"]["reused_from_job"], first_job) << report["job"].dump();
  EXPECT_THAT(ReadFile(again + "/report.md"), HasSubstr("6 of them reused from earlier jobs"));
  EXPECT_TRUE(report["timing"]["stages"].empty()) << "nothing ran: " << report["timing"].dump();

  // --fresh measures every candidate anew.
  const std::string fresh = dir.path() + "/fresh";
  r = RunProgram(Kforge(), {"run", dir.path() + "/scale", "--budget", "6", "--timeout", "20", "--db", db, "--out",
                            fresh, "--quiet", "--fresh", "--cache-dir", dir.path() + "/cache"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_THAT(r.out, Not(HasSubstr("reused")));
  report = ReadJson(fresh + "/report.json");
  EXPECT_EQ(report["timing"]["reused_evaluations"].get<int64_t>(), 0);
  EXPECT_EQ(report["timing"]["stages"]["compile"]["evaluations"].get<int64_t>(), 6) << report["timing"].dump();
}

// ---------------------------------------------------------------------------------------------
// (c) Resume after kill -9.

pid_t Spawn(const std::vector<std::string>& args, const std::string& log_path) {
  const pid_t pid = fork();
  if (pid == 0) {
    const int fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
    }
    std::vector<char*> argv;
    const std::string prog = Kforge();
    argv.push_back(const_cast<char*>(prog.c_str()));
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(prog.c_str(), argv.data());
    _exit(127);
  }
  return pid;
}

// Polls the database (WAL: readable while the child writes) until the child's job has at least
// `want` stored evaluations or the child exits; true when it exited (status set).
bool WaitForEvaluations(pid_t pid, const std::string& db, int64_t want, int* status, int64_t* seen) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (std::chrono::steady_clock::now() < deadline) {
    if (waitpid(pid, status, WNOHANG) == pid) return true;
    if (fs::exists(db)) {
      auto store = SqliteStore::Open(db);
      if (store.ok()) {
        auto jobs = (*store)->ListJobs({});
        if (jobs.ok() && !jobs->empty()) {
          auto evals = (*store)->ListEvaluations(jobs->front().id());
          if (evals.ok()) *seen = static_cast<int64_t>(evals->size());
        }
      }
    }
    if (*seen >= want) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return false;
}

// A finalist its benchmark puts far below the best (60 times the work) is not re-measured: its
// benchmark's row closes the confirmation (rounds 0); the others are re-measured unless their
// benchmarks separate them too.
TEST(KforgeRunTest, FinalistsTheirBenchmarksSeparateAreNotReMeasured) {
  TempDir dir;
  dir.Write("rep/problem.yaml", R"yaml(name: repeated-scale
backend: opencl
sizes: {N: 65536}
buffers:
  x: {dtype: f32, shape: [N], role: in}
  y: {dtype: f32, shape: [N], role: out}
check: {atol: 1e-6, rtol: 1e-6, trials: 1}
reference:
  source: k.cl
  defines: {REP: 1}
  launches: [{kernel: scale, global: [N], local: [64], args: [x, y, N]}]
seed:
  source: k.cl
  params: {WG: [64, 128], REP: [1, 60]}
  launches: [{kernel: scale, global: [N], local: [WG], args: [x, y, N]}]
)yaml");
  dir.Write("rep/k.cl", R"cl(kernel void scale(global const float* x, global float* y, int n) {
  int i = get_global_id(0);
  if (i >= n) return;
  float s = 0.0f;
  for (int r = 0; r < REP; ++r) s = 2.0f * x[i] + s * 0.0f;
  y[i] = s;
}
)cl");
  const std::string out = dir.path() + "/out";
  RunResult r = RunProgram(Kforge(), {"run", dir.path() + "/rep", "--budget", "4", "--db", dir.path() + "/k.db",
                                      "--out", out, "--quiet", "--cache-dir", dir.path() + "/cache"});
  if (r.exit_code == 1 && r.err.find("not available") != std::string::npos) {
    GTEST_SKIP() << "no OpenCL device: " << r.err;
  }
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  nlohmann::json rep = ReadJson(out + "/report.json");
  const nlohmann::json& finalists = rep["job"]["confirmation"]["finalists"];
  ASSERT_TRUE(finalists.is_array()) << rep["job"].dump();
  ASSERT_EQ(finalists.size(), 3u) << finalists.dump();
  const nlohmann::json& slow = finalists[2];
  EXPECT_EQ(slow.value("rounds", 0), 0) << finalists.dump();
  EXPECT_LT(slow["speedup"].get<double>() * 10, finalists[0]["speedup"].get<double>()) << finalists.dump();
  EXPECT_GT(slow["speedup_high"].get<double>(), 0) << "its benchmark's interval";
  const int first_rounds = finalists[0].value("rounds", 0);
  EXPECT_TRUE(first_rounds == 0 || first_rounds == 9) << finalists.dump();
  EXPECT_THAT(ReadFile(out + "/report.md"), HasSubstr("## Finalists"));
}

TEST(KforgeRunTest, ResumeAfterKillNine) {
  TempDir dir;
  SynthSpace space;
  space.extra_z = 14;  // Z: 20 values, 400 configurations (380 recorded)
  const std::string problem = WriteSynthReplayProblem(dir, "big", space, "synth-big");
  const int64_t budget = 300;
  const std::string db = dir.path() + "/kill.db";
  const std::vector<std::string> args = {"run", problem, "--budget", absl::StrCat(budget), "--db", db,
                                         "--out", dir.path() + "/out1", "--seed", "9", "--quiet"};
  const pid_t pid = Spawn(args, dir.path() + "/child.log");
  ASSERT_GT(pid, 0);

  // Wait until the job has some evaluations (or the child is gone), then kill -9.
  int status = 0;
  int64_t seen_evals = 0;
  bool exited = WaitForEvaluations(pid, db, 25, &status, &seen_evals);
  if (!exited) {
    ASSERT_EQ(kill(pid, SIGKILL), 0);
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFSIGNALED(status) || WIFEXITED(status));
  }
  const bool killed_mid_job = !exited && WIFSIGNALED(status);

  std::string job_id;
  bool finished_before_kill = false;
  {
    auto store = SqliteStore::Open(db);
    ASSERT_TRUE(store.ok()) << store.status();
    auto jobs = Jobs(**store);
    ASSERT_EQ(jobs.size(), 1u) << "the job should be stored before it evaluates anything";
    job_id = jobs[0].id();
    finished_before_kill = jobs[0].state() == v1::JOB_STATE_COMPLETED;
    ExpectStoredJobConsistent(**store, job_id, finished_before_kill);
    if (killed_mid_job && !finished_before_kill) {
      EXPECT_EQ(jobs[0].state(), v1::JOB_STATE_RUNNING) << "a killed run leaves its job RUNNING";
    }
  }
  if (!finished_before_kill) {
    RunResult r = RunProgram(Kforge(), {"run", problem, "--resume", "--db", db, "--out", dir.path() + "/out2",
                                        "--quiet"});
    ASSERT_EQ(r.exit_code, 0) << Describe(r);
    EXPECT_THAT(r.out, HasSubstr(job_id));
  } else {
    std::cerr << "note: the job finished before the kill landed; checking consistency only\n";
  }
  auto store = SqliteStore::Open(db);
  ASSERT_TRUE(store.ok()) << store.status();
  auto jobs = Jobs(**store);
  ASSERT_EQ(jobs.size(), 1u) << "--resume must not start a new job";
  EXPECT_EQ(jobs[0].state(), v1::JOB_STATE_COMPLETED) << jobs[0].state_reason();
  EXPECT_EQ(jobs[0].progress().evaluations(), budget);
  auto evals = (*store)->ListEvaluations(job_id);
  ASSERT_TRUE(evals.ok());
  EXPECT_EQ(static_cast<int64_t>(evals->size()), budget);
  ExpectStoredJobConsistent(**store, job_id, /*finished=*/true);

  // One worker, one slot: the crash changes nothing in the candidate sequence.
  const std::string db2 = dir.path() + "/clean.db";
  RunResult clean = RunProgram(Kforge(), {"run", problem, "--budget", absl::StrCat(budget), "--db", db2, "--out",
                                          dir.path() + "/out3", "--seed", "9", "--quiet"});
  ASSERT_EQ(clean.exit_code, 0) << Describe(clean);
  auto store2 = SqliteStore::Open(db2);
  ASSERT_TRUE(store2.ok()) << store2.status();
  auto jobs2 = Jobs(**store2);
  ASSERT_EQ(jobs2.size(), 1u);
  EXPECT_EQ(ParamTrace(**store, job_id), ParamTrace(**store2, jobs2[0].id()));
  std::cerr << "kill landed after " << seen_evals << " evaluations seen (killed mid-job: " << killed_mid_job
            << ")\n";
}

TEST(KforgeRunTest, SigtermStopsResumably) {
  TempDir dir;
  SynthSpace space;
  space.extra_z = 14;
  const std::string problem = WriteSynthReplayProblem(dir, "big", space, "synth-big");
  const int64_t budget = 300;
  const std::string db = dir.path() + "/term.db";
  const std::string log = dir.path() + "/child.log";
  const pid_t pid = Spawn({"run", problem, "--budget", absl::StrCat(budget), "--db", db, "--out",
                           dir.path() + "/out1", "--seed", "2", "--quiet"},
                          log);
  ASSERT_GT(pid, 0);
  int status = 0;
  int64_t seen = 0;
  bool exited = WaitForEvaluations(pid, db, 25, &status, &seen);
  if (!exited) {
    ASSERT_EQ(kill(pid, SIGTERM), 0);
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
  }
  ASSERT_TRUE(WIFEXITED(status)) << "SIGTERM must stop the run cleanly, not kill it";
  EXPECT_EQ(WEXITSTATUS(status), 0) << ReadFile(log);
  std::string job_id;
  {
    auto store = SqliteStore::Open(db);
    ASSERT_TRUE(store.ok()) << store.status();
    auto jobs = Jobs(**store);
    ASSERT_EQ(jobs.size(), 1u);
    job_id = jobs[0].id();
    ExpectStoredJobConsistent(**store, job_id, /*finished=*/jobs[0].state() == v1::JOB_STATE_COMPLETED);
    if (jobs[0].state() == v1::JOB_STATE_COMPLETED) {
      std::cerr << "note: the job finished before SIGTERM landed\n";
      return;
    }
    EXPECT_EQ(jobs[0].state(), v1::JOB_STATE_INTERRUPTED);
    EXPECT_LT(jobs[0].progress().evaluations(), budget);
    EXPECT_GE(jobs[0].progress().evaluations(), 1);
  }
  EXPECT_THAT(ReadFile(log), HasSubstr("--resume"));
  // Reports are written for the stopped job too.
  EXPECT_TRUE(fs::is_regular_file(fs::path(dir.path()) / "out1" / "report.json"));

  RunResult r = RunProgram(Kforge(), {"run", problem, "--resume", "--db", db, "--out", dir.path() + "/out2",
                                      "--quiet"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  auto store = SqliteStore::Open(db);
  ASSERT_TRUE(store.ok()) << store.status();
  auto jobs = Jobs(**store);
  ASSERT_EQ(jobs.size(), 1u);
  EXPECT_EQ(jobs[0].state(), v1::JOB_STATE_COMPLETED);
  EXPECT_EQ(jobs[0].progress().evaluations(), budget);
  ExpectStoredJobConsistent(**store, job_id, /*finished=*/true);
}

// ---------------------------------------------------------------------------------------------
// (d) Bad input.

TEST(KforgeRunTest, BadInputExitsTwo) {
  TempDir dir;
  const std::string problem = WriteSynthReplayProblem(dir);
  const std::string db = dir.path() + "/bad.db";
  const std::string out = dir.path() + "/out";

  RunResult r = RunProgram(Kforge(), {"run", dir.path() + "/nope", "--db", db, "--out", out});
  EXPECT_EQ(r.exit_code, 2) << Describe(r);

  r = RunProgram(Kforge(), {"run", problem, "--budget", "0", "--db", db, "--out", out});
  EXPECT_EQ(r.exit_code, 2) << Describe(r);
  EXPECT_THAT(r.err, HasSubstr("budget"));

  r = RunProgram(Kforge(), {"run", problem, "--resume", "--db", db, "--out", out});
  EXPECT_EQ(r.exit_code, 2) << Describe(r);
  EXPECT_THAT(r.err, HasSubstr("no unfinished job"));

  r = RunProgram(Kforge(), {"run", problem, "--workers", "0", "--db", db, "--out", out});
  EXPECT_EQ(r.exit_code, 2) << Describe(r);

  r = RunProgram(Kforge(), {"run", problem, "--resume", "--job", "job-doesnotexist", "--db", db, "--out", out});
  EXPECT_EQ(r.exit_code, 2) << Describe(r);

  r = RunProgram(Kforge(), {"run", problem, "--budget", "abc", "--db", db, "--out", out});
  EXPECT_EQ(r.exit_code, 2) << Describe(r);

  // None of these left a job behind or wrote reports.
  EXPECT_FALSE(fs::exists(fs::path(out) / "report.json"));
  if (fs::exists(db)) {
    auto store = SqliteStore::Open(db);
    ASSERT_TRUE(store.ok()) << store.status();
    EXPECT_TRUE(Jobs(**store).empty());
  }

  // A completed job is not resumable.
  r = RunProgram(Kforge(), {"run", problem, "--budget", "5", "--db", db, "--out", out, "--quiet"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  r = RunProgram(Kforge(), {"run", problem, "--resume", "--db", db, "--out", out, "--quiet"});
  EXPECT_EQ(r.exit_code, 2) << Describe(r);
  EXPECT_THAT(r.err, HasSubstr("no unfinished job"));
}

// ---------------------------------------------------------------------------------------------
// (e) The work on Redis Streams (--queue), against a throwaway redis-server.

TEST(KforgeRunTest, ReplayProblemThroughARedisQueue) {
  if (!RedisServer::Available()) GTEST_SKIP() << RedisServer::kAbsent;
  RedisServer redis;
  ASSERT_TRUE(redis.Start()) << redis.error();
  TempDir dir;
  const std::string db = dir.path() + "/k.db";
  RunResult r = RunProgram(Kforge(), {"run", SourceDir() + "/examples/replay/pnpoly", "--budget", "20", "--queue",
                                      redis.url(), "--workers", "2", "--db", db, "--out", dir.path() + "/out"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_THAT(r.out, HasSubstr("completed"));
  EXPECT_THAT(r.out, HasSubstr("20 evaluations"));
  auto store = SqliteStore::Open(db);
  ASSERT_TRUE(store.ok()) << store.status();
  std::vector<v1::Job> jobs = Jobs(**store);
  ASSERT_EQ(jobs.size(), 1u);
  EXPECT_EQ(jobs[0].state(), v1::JOB_STATE_COMPLETED);
  EXPECT_EQ(jobs[0].progress().evaluations(), 20);
  ExpectStoredJobConsistent(**store, jobs[0].id(), /*finished=*/true);
  auto evals = (*store)->ListEvaluations(jobs[0].id());
  ASSERT_TRUE(evals.ok());
  EXPECT_EQ(evals->size(), 20u);
  // Nothing left behind: no queued work, every result acknowledged.
  RedisQueueOptions ro;
  ro.coordinator = "kforge-run";
  auto q = RedisWorkQueue::Connect(redis.url(), ro, MakeLogger("test", spdlog::level::err));
  ASSERT_TRUE(q.ok()) << q.status();
  auto item = (*q)->Dequeue("replay", "probe", 0.1);
  ASSERT_TRUE(item.ok()) << item.status();
  EXPECT_FALSE(item->has_value());
  auto result = (*q)->NextResult(jobs[0].id(), 0.1);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_FALSE(result->has_value());

  // A queue URL that is not one, or a server that is not there.
  RunResult bad = RunProgram(Kforge(), {"run", SourceDir() + "/examples/replay/pnpoly", "--budget", "5", "--queue",
                                        "http://127.0.0.1:1", "--db", db});
  EXPECT_EQ(bad.exit_code, 2) << Describe(bad);
  EXPECT_THAT(bad.err, HasSubstr("host:port[/db]"));
}

// ---------------------------------------------------------------------------------------------
// (f) The cluster backends together: PostgreSQL for the store, Redis Streams for the work; a
// second run resumes nothing and the database holds exactly one evaluation per candidate.

TEST(KforgeRunTest, ReplayProblemOnPostgresAndRedis) {
  if (!RedisServer::Available()) GTEST_SKIP() << RedisServer::kAbsent;
  if (PostgresServer::BinDir().empty()) GTEST_SKIP() << "PostgreSQL is not installed";
  RedisServer redis;
  ASSERT_TRUE(redis.Start()) << redis.error();
  PostgresServer pg;
  ASSERT_TRUE(pg.Start().ok());
  ASSERT_TRUE(pg.Sql("CREATE DATABASE kforge").ok());
  TempDir dir;
  RunResult r = RunProgram(Kforge(), {"run", SourceDir() + "/examples/replay/pnpoly", "--budget", "20", "--db",
                                      pg.Url("kforge"), "--queue", redis.url(), "--out", dir.path() + "/out",
                                      "--quiet"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  auto store = PostgresStore::Open(pg.Url("kforge"));
  ASSERT_TRUE(store.ok()) << store.status();
  std::vector<v1::Job> jobs = Jobs(**store);
  ASSERT_EQ(jobs.size(), 1u);
  EXPECT_EQ(jobs[0].state(), v1::JOB_STATE_COMPLETED);
  ExpectStoredJobConsistent(**store, jobs[0].id(), /*finished=*/true);
  auto cands = (*store)->ListCandidates(jobs[0].id());
  auto evals = (*store)->ListEvaluations(jobs[0].id());
  ASSERT_TRUE(cands.ok() && evals.ok());
  EXPECT_EQ(evals->size(), 20u);
  std::set<std::string> evaluated;
  for (const auto& e : *evals) EXPECT_TRUE(evaluated.insert(e.candidate_id()).second) << e.candidate_id();
  // A database that is not there: one clear line, exit 1, no password echoed.
  RunResult bad = RunProgram(Kforge(), {"run", SourceDir() + "/examples/replay/pnpoly", "--budget", "5", "--db",
                                        absl::StrCat("postgresql://kforge:hunter2@127.0.0.1:", FreePort(), "/x"),
                                        "--out", dir.path() + "/out2", "--quiet"});
  EXPECT_NE(bad.exit_code, 0) << Describe(bad);
  EXPECT_EQ(bad.err.find("hunter2"), std::string::npos) << bad.err;
}

}  // namespace
}  // namespace kforge
