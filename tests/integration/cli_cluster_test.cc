// The cluster side of the kforge binary: `kforge admin` on a SQLite store, the client commands
// (submit, list, status, watch, best, cancel) against an in-process fake CoordinatorService that
// checks what the client sends and can drop a watch stream, and end to end against a real
// kforge-coordinator.

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/problem_loader.h"
#include "common/server_util.h"
#include "common/store/api_key.h"
#include "common/store/sqlite_store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kforge/v1/coordinator.grpc.pb.h"
#include "nlohmann/json.hpp"
#include "tests/integration/replay_fixture.h"
#include "tests/integration/torch_available.h"
#include "tests/testutil/background_process.h"
#include "tests/testutil/subprocess.h"
#include "tests/testutil/temp_dir.h"

namespace kforge {
namespace {

namespace fs = std::filesystem;

using ::kforge::testing::BinaryDir;
using ::kforge::testing::RunResult;
using ::kforge::testing::SourceDir;
using ::kforge::testing::TempDir;
using ::testing::ElementsAre;
using ::testing::EndsWith;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

std::string Kforge() { return BinaryDir() + "/cli/kforge"; }

std::string Describe(const RunResult& r) {
  return absl::StrCat("exit ", r.exit_code, "\n--- stdout:\n", r.out, "--- stderr:\n", r.err);
}

// Runs kforge with the caller's KFORGE_* settings cleared, so the tests see only their own.
RunResult RunKforge(const std::vector<std::string>& args, std::vector<std::string> env = {}) {
  std::vector<std::string> all = {"KFORGE_SERVER=", "KFORGE_TOKEN=", "KFORGE_DB="};
  all.insert(all.end(), env.begin(), env.end());
  return testing::RunProgram(Kforge(), args, all);
}

std::vector<std::string> Lines(const std::string& text) {
  return absl::StrSplit(text, '\n', absl::SkipEmpty());
}

int Count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// ---------------------------------------------------------------------------------------------
// kforge admin

class AdminTest : public ::testing::Test {
 protected:
  std::string Db() const { return dir_.path() + "/k.db"; }
  RunResult Admin(std::vector<std::string> args) {
    args.insert(args.begin(), "admin");
    args.push_back("--db");
    args.push_back(Db());
    return RunKforge(args);
  }

  TempDir dir_;
};

TEST_F(AdminTest, TenantQuotasAreSetListedAndChecked) {
  RunResult r = Admin({"tenant-create", "acme", "--max-in-flight", "8", "--max-evaluations-per-hour", "500"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  r = Admin({"tenant-quota", "acme", "--max-running-jobs", "2", "--max-in-flight", "0"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_THAT(r.out, HasSubstr("max running jobs 2, max in flight -, max evaluations per hour 500, history own"));
  r = Admin({"tenant-quota", "acme", "--share-history", "true"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_THAT(r.out, HasSubstr("max evaluations per hour 500, history pooled"));
  r = Admin({"tenant-list"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_THAT(r.out, HasSubstr("EVALS/HOUR"));
  EXPECT_THAT(r.out, ::testing::ContainsRegex("acme .* 2 +- +500 +pooled"));
  {
    auto store = SqliteStore::Open(Db());
    ASSERT_TRUE(store.ok()) << store.status();
    auto t = (*store)->GetTenant("acme");
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_EQ(t->quota().max_running_jobs(), 2);
    EXPECT_EQ(t->quota().max_in_flight(), 0);
    EXPECT_EQ(t->quota().max_evaluations_per_hour(), 500);
    EXPECT_TRUE(t->share_history());
  }
  r = Admin({"tenant-quota", "acme", "--max-in-flight", "-1"});
  EXPECT_EQ(r.exit_code, 2) << Describe(r);
  EXPECT_THAT(r.err, HasSubstr("--max-in-flight must be in [0, 2147483647]"));
  r = Admin({"tenant-quota", "nobody", "--max-in-flight", "1"});
  EXPECT_EQ(r.exit_code, 1) << Describe(r);
  EXPECT_THAT(r.err, HasSubstr("no tenant nobody"));
}

TEST_F(AdminTest, TenantAndKeyLifecycle) {
  RunResult r = Admin({"tenant-create", "acme", "--display-name", "Acme Kernels"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  r = Admin({"tenant-list"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_THAT(r.out, HasSubstr("acme"));
  EXPECT_THAT(r.out, HasSubstr("Acme Kernels"));

  r = Admin({"key-create", "acme", "--name", "ci"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  // The token alone on stdout, the warning on stderr.
  const std::vector<std::string> out = Lines(r.out);
  ASSERT_EQ(out.size(), 1u) << Describe(r);
  const std::string token = out[0];
  EXPECT_THAT(token, StartsWith("kf_"));
  EXPECT_THAT(r.err, HasSubstr("shown only this once"));
  EXPECT_THAT(r.err, Not(HasSubstr(token)));

  std::string key_id;
  {
    auto store = SqliteStore::Open(Db());
    ASSERT_TRUE(store.ok()) << store.status();
    auto key = (*store)->FindApiKey(ApiKeyHash(token));
    ASSERT_TRUE(key.ok()) << key.status();
    EXPECT_EQ(key->tenant(), "acme");
    EXPECT_EQ(key->name(), "ci");
    EXPECT_FALSE(key->service());
    EXPECT_GT(key->created_at().seconds(), 1600000000);
    EXPECT_NE(key->secret_sha256(), token);
    EXPECT_THAT(token, StartsWith(key->id() + "_"));
    key_id = key->id();
  }

  r = Admin({"key-list", "acme"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_THAT(r.out, HasSubstr(key_id));
  EXPECT_THAT(r.out, HasSubstr("live"));
  EXPECT_THAT(r.out, Not(HasSubstr(token)));

  r = Admin({"key-revoke", key_id});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  {
    auto store = SqliteStore::Open(Db());
    ASSERT_TRUE(store.ok()) << store.status();
    EXPECT_TRUE(absl::IsNotFound((*store)->FindApiKey(ApiKeyHash(token)).status()));
  }
  r = Admin({"key-list", "acme"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_THAT(r.out, HasSubstr("revoked"));
}

TEST_F(AdminTest, ServiceKeyAndTheDatabaseFromTheEnvironment) {
  RunResult r = RunKforge({"admin", "tenant-create", "ops"}, {"KFORGE_DB=" + Db()});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  r = RunKforge({"admin", "key-create", "ops", "--service"}, {"KFORGE_DB=" + Db()});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  auto store = SqliteStore::Open(Db());
  ASSERT_TRUE(store.ok()) << store.status();
  auto key = (*store)->FindApiKey(ApiKeyHash(Lines(r.out).at(0)));
  ASSERT_TRUE(key.ok()) << key.status();
  EXPECT_TRUE(key->service());
  EXPECT_EQ(key->tenant(), "ops");
}

TEST_F(AdminTest, BadInputExitsTwoAndRefusalsExitOne) {
  // Tenant names: [a-z0-9-], not starting with '-'.
  for (const std::string& name :
       std::vector<std::string>{"Acme", "a_b", "-x", "a b", std::string(65, 'a')}) {
    // After "--", so that CLI11 takes "-x" for the name, not for a flag.
    RunResult r = RunKforge({"admin", "tenant-create", "--db", Db(), "--", name});
    EXPECT_EQ(r.exit_code, 2) << name << "\n" << Describe(r);
    EXPECT_THAT(r.err, HasSubstr("tenant name")) << name;
    EXPECT_EQ(Lines(r.err).size(), 1u) << Describe(r);
  }
  RunResult r = Admin({"key-create", "Nope"});
  EXPECT_EQ(r.exit_code, 2) << Describe(r);
  // No database given: nothing is created in the working folder.
  r = RunKforge({"admin", "tenant-list"});
  EXPECT_EQ(r.exit_code, 2) << Describe(r);
  EXPECT_THAT(r.err, HasSubstr("--db"));
  // A database that is not there is not made by a listing.
  r = Admin({"tenant-list"});
  EXPECT_EQ(r.exit_code, 2) << Describe(r);
  EXPECT_FALSE(fs::exists(Db()));

  ASSERT_EQ(Admin({"tenant-create", "acme"}).exit_code, 0);
  r = Admin({"tenant-create", "acme"});
  EXPECT_EQ(r.exit_code, 1) << Describe(r);
  EXPECT_THAT(r.err, HasSubstr("exists"));
  r = Admin({"key-create", "ghost"});
  EXPECT_EQ(r.exit_code, 1) << Describe(r);
  EXPECT_THAT(r.err, HasSubstr("no tenant ghost"));
  EXPECT_EQ(r.out, "");
  r = Admin({"key-revoke", "kf_000000000000"});
  EXPECT_EQ(r.exit_code, 1) << Describe(r);
  r = Admin({"key-list", "ghost"});
  EXPECT_EQ(r.exit_code, 1) << Describe(r);
}

// ---------------------------------------------------------------------------------------------
// Client commands without a server

TEST(ClientTest, UnreachableServerFailsFastWithOneLine) {
  TempDir dir;
  const std::string problem = testing::WriteSynthReplayProblem(dir);
  const std::string server = absl::StrCat("127.0.0.1:", testing::FreePort());
  const std::vector<std::vector<std::string>> commands = {
      {"list"},
      {"status", "job-1"},
      {"watch", "job-1"},
      {"cancel", "job-1"},
      {"best", "job-1", "--out", dir.path() + "/out"},
      {"submit", problem}};
  for (std::vector<std::string> args : commands) {
    args.push_back("--server");
    args.push_back(server);
    const auto start = std::chrono::steady_clock::now();
    RunResult r = RunKforge(args, {"KFORGE_TOKEN=kf_0_0"});
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_EQ(r.exit_code, 1) << args[0] << "\n" << Describe(r);
    EXPECT_EQ(Lines(r.err).size(), 1u) << Describe(r);
    EXPECT_THAT(r.err, HasSubstr("cannot reach the coordinator at " + server)) << args[0];
    EXPECT_EQ(r.out, "") << args[0];
    EXPECT_LT(seconds, 5) << args[0];
  }
}

TEST(ClientTest, ServerFromTheEnvironment) {
  const std::string server = absl::StrCat("127.0.0.1:", testing::FreePort());
  RunResult r = RunKforge({"list"}, {"KFORGE_SERVER=" + server});
  EXPECT_EQ(r.exit_code, 1) << Describe(r);
  EXPECT_THAT(r.err, HasSubstr(server));
  // The flag wins over the environment.
  const std::string other = absl::StrCat("127.0.0.1:", testing::FreePort());
  r = RunKforge({"list", "--server", other}, {"KFORGE_SERVER=" + server});
  EXPECT_THAT(r.err, HasSubstr(other));
}

TEST(ClientTest, BadInputExitsTwoBeforeAnyCall) {
  TempDir dir;
  const std::string problem = testing::WriteSynthReplayProblem(dir);
  const std::string server = absl::StrCat("127.0.0.1:", testing::FreePort());
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"list", "--token", "kf_a b"}, "--token"},
      {{"list", "--token", "kf_\xc3\xa9"}, "--token"},
      {{"list", "--state", "sleeping"}, "unknown job state"},
      {{"list", "--limit", "0"}, "--limit"},
      {{"submit", dir.path() + "/nowhere"}, "nowhere"},
      {{"submit", problem, "--budget", "0"}, "give a budget"},
      {{"submit", problem, "--budget", "-3"}, "budget"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args = c.args;
    if (std::find(args.begin(), args.end(), "--server") == args.end()) {
      args.push_back("--server");
      args.push_back(server);
    }
    RunResult r = RunKforge(args);
    EXPECT_EQ(r.exit_code, 2) << c.args[0] << " " << c.message << "\n" << Describe(r);
    EXPECT_THAT(r.err, HasSubstr(c.message)) << Describe(r);
  }
  // CLI11's own refusals are bad input too.
  EXPECT_EQ(RunKforge({"best", "job-1"}).exit_code, 2);
  EXPECT_EQ(RunKforge({"watch"}).exit_code, 2);
}

// ---------------------------------------------------------------------------------------------
// Client commands against a fake coordinator

constexpr char kToken[] = "kf_0123456789ab_feedface";

// A CoordinatorService that keeps jobs in memory, checks the bearer token, records what clients
// send, and plays each job's scripted events on WatchJob (optionally dropping the first stream).
class FakeCoordinator final : public v1::CoordinatorService::Service {
 public:
  grpc::Status SubmitJob(grpc::ServerContext* ctx, const v1::SubmitJobRequest* req,
                         v1::SubmitJobResponse* resp) override {
    if (grpc::Status st = Auth(ctx); !st.ok()) return st;
    // Load the files as the coordinator does: in a folder of their own.
    TempDir dir;
    for (const auto& [rel, body] : req->problem_files()) dir.Write(rel, body);
    auto problem = LoadProblem(dir.path());
    if (!problem.ok())
      return {grpc::StatusCode::INVALID_ARGUMENT, std::string(problem.status().message())};
    std::lock_guard<std::mutex> lock(mu);
    submits.push_back(*req);
    v1::Job job;
    job.set_id(absl::StrCat("job-", 100000000000 + jobs.size()));
    *job.mutable_spec() = req->spec();
    *job.mutable_spec()->mutable_problem() = *problem;
    job.mutable_spec()->set_tenant("acme");
    job.set_state(v1::JOB_STATE_QUEUED);
    job.set_idempotency_key(req->idempotency_key());
    job.mutable_created_at()->set_seconds(1700000000);
    AddLocked(job);
    *resp->mutable_job() = job;
    return grpc::Status::OK;
  }

  grpc::Status GetJob(grpc::ServerContext* ctx, const v1::GetJobRequest* req,
                      v1::Job* resp) override {
    if (grpc::Status st = Auth(ctx); !st.ok()) return st;
    std::lock_guard<std::mutex> lock(mu);
    auto it = jobs.find(req->job_id());
    if (it == jobs.end())
      return {grpc::StatusCode::NOT_FOUND, absl::StrCat("job ", req->job_id(), " not found")};
    *resp = it->second;
    return grpc::Status::OK;
  }

  grpc::Status ListJobs(grpc::ServerContext* ctx, const v1::ListJobsRequest* req,
                        v1::ListJobsResponse* resp) override {
    if (grpc::Status st = Auth(ctx); !st.ok()) return st;
    std::lock_guard<std::mutex> lock(mu);
    list_requests.push_back(*req);
    std::vector<const v1::Job*> matching;
    for (const std::string& id : newest_first) {
      const v1::Job& j = jobs.at(id);
      if (req->state() == v1::JOB_STATE_UNSPECIFIED || j.state() == req->state())
        matching.push_back(&j);
    }
    size_t from = 0;
    if (!req->page_token().empty() && !absl::SimpleAtoi(req->page_token(), &from)) {
      return {grpc::StatusCode::INVALID_ARGUMENT, "bad page token"};
    }
    const size_t size = req->page_size() > 0 ? static_cast<size_t>(req->page_size()) : 50;
    for (size_t i = from; i < matching.size() && i < from + size; ++i)
      *resp->add_jobs() = *matching[i];
    if (from + size < matching.size()) resp->set_next_page_token(absl::StrCat(from + size));
    return grpc::Status::OK;
  }

  grpc::Status CancelJob(grpc::ServerContext* ctx, const v1::CancelJobRequest* req,
                         v1::Job* resp) override {
    if (grpc::Status st = Auth(ctx); !st.ok()) return st;
    std::lock_guard<std::mutex> lock(mu);
    auto it = jobs.find(req->job_id());
    if (it == jobs.end())
      return {grpc::StatusCode::NOT_FOUND, absl::StrCat("job ", req->job_id(), " not found")};
    it->second.set_state(v1::JOB_STATE_CANCELLED);
    it->second.set_state_reason(absl::StrCat("cancelled by user: ", req->reason()));
    *resp = it->second;
    return grpc::Status::OK;
  }

  grpc::Status WatchJob(grpc::ServerContext* ctx, const v1::WatchJobRequest* req,
                        grpc::ServerWriter<v1::JobEvent>* writer) override {
    if (grpc::Status st = Auth(ctx); !st.ok()) return st;
    std::vector<v1::JobEvent> script;
    int drop = 0;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (!jobs.contains(req->job_id())) {
        return {grpc::StatusCode::NOT_FOUND, absl::StrCat("job ", req->job_id(), " not found")};
      }
      watch_from.push_back(req->from_sequence());
      script = events[req->job_id()];
      if (watch_from.size() == 1) drop = drop_first_stream_after;
    }
    int sent = 0;
    for (const v1::JobEvent& ev : script) {
      if (ev.sequence() < req->from_sequence()) continue;
      if (drop > 0 && sent == drop)
        return {grpc::StatusCode::UNAVAILABLE, "connection reset by the test"};
      writer->Write(ev);
      ++sent;
    }
    // The script played out: the job has ended.
    std::lock_guard<std::mutex> lock(mu);
    v1::Job& job = jobs.at(req->job_id());
    if (!script.empty()) {
      job.set_state(script.back().state_changed());
      job.set_state_reason("budget: max_candidates");
      *job.mutable_progress() = script.back().progress();
    }
    return grpc::Status::OK;
  }

  grpc::Status GetBest(grpc::ServerContext* ctx, const v1::GetBestRequest* req,
                       v1::GetBestResponse* resp) override {
    if (grpc::Status st = Auth(ctx); !st.ok()) return st;
    std::lock_guard<std::mutex> lock(mu);
    if (!jobs.contains(req->job_id())) {
      return {grpc::StatusCode::NOT_FOUND, absl::StrCat("job ", req->job_id(), " not found")};
    }
    if (best.contains(req->job_id())) *resp->mutable_best() = best.at(req->job_id());
    return grpc::Status::OK;
  }

  void Add(const v1::Job& job) {
    std::lock_guard<std::mutex> lock(mu);
    AddLocked(job);
  }

  std::mutex mu;
  std::map<std::string, v1::Job> jobs;
  std::vector<std::string> newest_first;
  std::map<std::string, std::vector<v1::JobEvent>> events;  // by job; a default script for submits
  std::map<std::string, v1::ScoredCandidate> best;
  std::vector<v1::SubmitJobRequest> submits;
  std::vector<v1::ListJobsRequest> list_requests;
  std::vector<int64_t> watch_from;
  std::vector<std::string> tokens_seen;
  int drop_first_stream_after = 0;

 private:
  grpc::Status Auth(grpc::ServerContext* ctx) {
    const auto& md = ctx->client_metadata();
    auto it = md.find("authorization");
    std::lock_guard<std::mutex> lock(mu);
    if (it == md.end()) {
      tokens_seen.push_back("");
      return {grpc::StatusCode::UNAUTHENTICATED, "missing bearer token"};
    }
    const std::string value(it->second.data(), it->second.size());
    tokens_seen.push_back(value);
    if (value != absl::StrCat("Bearer ", kToken))
      return {grpc::StatusCode::UNAUTHENTICATED, "unknown API key"};
    return grpc::Status::OK;
  }

  void AddLocked(const v1::Job& job) {
    jobs[job.id()] = job;
    newest_first.insert(newest_first.begin(), job.id());
    if (!events.contains(job.id())) events[job.id()] = Script(job.id());
  }

  // Running; the seed (1.0x); two more evaluations, the last a new best; completed.
  static std::vector<v1::JobEvent> Script(const std::string& job_id) {
    std::vector<v1::JobEvent> out;
    auto add = [&](int64_t evals, double best) -> v1::JobEvent& {
      v1::JobEvent& ev = out.emplace_back();
      ev.set_job_id(job_id);
      ev.set_sequence(static_cast<int64_t>(out.size()));
      ev.mutable_progress()->set_evaluations(evals);
      ev.mutable_progress()->set_best_speedup(best);
      ev.mutable_progress()->set_elapsed_seconds(0.5 * static_cast<double>(evals));
      (*ev.mutable_progress()->mutable_outcome_counts())["ok"] = evals;
      return ev;
    };
    add(0, 0).set_state_changed(v1::JOB_STATE_RUNNING);
    add(1, 1.0).mutable_evaluated()->set_speedup(1.0);
    add(1, 1.0).mutable_improved()->set_id("c-seed");
    add(2, 1.0).mutable_evaluated()->set_speedup(0.7);
    add(3, 2.5).mutable_evaluated()->set_speedup(2.5);
    v1::Candidate& c = *add(3, 2.5).mutable_improved();
    c.set_id("c-3");
    (*c.mutable_params())["X"] = 8;
    (*c.mutable_params())["Y"] = 64;
    add(3, 2.5).set_state_changed(v1::JOB_STATE_COMPLETED);
    return out;
  }
};

class FakeCoordinatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto started = StartGrpcServer("127.0.0.1:0", {&fake_});
    ASSERT_TRUE(started.ok()) << started.status();
    server_ = std::move(started->server);
    address_ = absl::StrCat("127.0.0.1:", started->port);
  }
  void TearDown() override {
    if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  }

  // kforge with --server and the token (from the environment, as a user would set it).
  RunResult Client(std::vector<std::string> args, const std::string& token = kToken) {
    args.push_back("--server");
    args.push_back(address_);
    return RunKforge(args, {"KFORGE_TOKEN=" + token});
  }

  v1::Job MakeJob(const std::string& id, v1::JobState state, const std::string& problem_dir) {
    auto problem = LoadProblem(problem_dir);
    EXPECT_TRUE(problem.ok()) << problem.status();
    v1::Job job;
    job.set_id(id);
    *job.mutable_spec()->mutable_problem() = *problem;
    job.mutable_spec()->mutable_budget()->set_max_candidates(40);
    job.set_state(state);
    job.mutable_progress()->set_evaluations(7);
    job.mutable_progress()->set_best_speedup(1.75);
    job.mutable_created_at()->set_seconds(1700000000);
    return job;
  }

  FakeCoordinator fake_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
  TempDir dir_;
};

TEST_F(FakeCoordinatorTest, SubmitSendsTheFolderTheSpecAndTheToken) {
  const std::string problem = testing::WriteSynthReplayProblem(dir_);
  dir_.Write("synth/.git/HEAD", "ref: refs/heads/main\n");  // hidden: not sent
  dir_.Write("synth/notes/readme.txt", "notes\n");          // a subfolder: sent
  RunResult r = Client({"submit", problem, "--budget", "30", "--time", "90", "--seed", "7",
                        "--priority", "3", "--target", "4.5", "--patience", "11", "--screen", "5",
                        "--idempotency-key", "ci-42"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  const std::vector<std::string> out = Lines(r.out);
  ASSERT_EQ(out.size(), 1u) << Describe(r);
  std::lock_guard<std::mutex> lock(fake_.mu);
  ASSERT_EQ(fake_.submits.size(), 1u);
  EXPECT_TRUE(fake_.jobs.contains(out[0])) << out[0];
  const v1::SubmitJobRequest& req = fake_.submits[0];
  std::vector<std::string> files;
  for (const auto& [rel, body] : req.problem_files()) files.push_back(rel);
  std::sort(files.begin(), files.end());
  EXPECT_THAT(files, ElementsAre("cache.json", "notes/readme.txt", "problem.yaml"));
  EXPECT_EQ(req.problem_files().at("cache.json"), testing::SynthCacheJson());
  EXPECT_EQ(req.idempotency_key(), "ci-42");
  const v1::JobSpec& spec = req.spec();
  EXPECT_EQ(spec.budget().max_candidates(), 30);
  EXPECT_DOUBLE_EQ(spec.budget().max_wall_seconds(), 90);
  EXPECT_DOUBLE_EQ(spec.budget().target_speedup(), 4.5);
  EXPECT_EQ(spec.budget().patience(), 11);
  EXPECT_EQ(spec.evolution().screen_children(), 5);
  EXPECT_EQ(spec.seed(), 7u);
  EXPECT_EQ(spec.priority(), 3);
  EXPECT_TRUE(spec.tenant().empty()) << "the server sets the tenant";
  EXPECT_THAT(fake_.tokens_seen, ElementsAre(absl::StrCat("Bearer ", kToken)));
}

TEST_F(FakeCoordinatorTest, SubmitAndWatchPrintsProgressUntilTheJobEnds) {
  const std::string problem = testing::WriteSynthReplayProblem(dir_);
  RunResult r = Client({"submit", problem, "--budget", "3", "--watch"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  const std::vector<std::string> out = Lines(r.out);
  ASSERT_GE(out.size(), 4u) << Describe(r);
  EXPECT_THAT(out[0], StartsWith("job job-"));
  EXPECT_THAT(out[0], HasSubstr("synth-replay"));
  EXPECT_THAT(out[0], HasSubstr("budget 3 evaluations"));
  EXPECT_THAT(r.out, HasSubstr("eval 1: new best 1.000x (seed)\n"));
  EXPECT_THAT(r.out, HasSubstr("eval 3: new best 2.500x (X=8,Y=64)\n"));
  EXPECT_THAT(
      out.back(),
      HasSubstr(": completed (budget: max_candidates). 3 evaluations in 1.50 s; best speedup "
                "2.500x (unconfirmed: one evaluation's measurement); ok 3"));
  EXPECT_EQ(r.err, "");
}

TEST_F(FakeCoordinatorTest, WatchReconnectsFromTheLastEventAfterADroppedStream) {
  fake_.Add(MakeJob("job-w", v1::JOB_STATE_RUNNING, testing::WriteSynthReplayProblem(dir_)));
  fake_.drop_first_stream_after = 3;  // the seed's improvement arrives, then the stream breaks
  RunResult r = Client({"watch", "job-w"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  {
    std::lock_guard<std::mutex> lock(fake_.mu);
    EXPECT_THAT(fake_.watch_from, ElementsAre(1, 4));
  }
  EXPECT_THAT(r.err, HasSubstr("watching again from event 4"));
  EXPECT_EQ(Count(r.out, "new best 1.000x"), 1) << Describe(r);
  EXPECT_EQ(Count(r.out, "new best 2.500x"), 1) << Describe(r);
  EXPECT_THAT(Lines(r.out).back(), StartsWith("job-w: completed"));
}

TEST_F(FakeCoordinatorTest, WatchShowsAnImprovementThatCameWithoutCounts) {
  fake_.Add(MakeJob("job-np", v1::JOB_STATE_RUNNING, testing::WriteSynthReplayProblem(dir_)));
  {
    std::lock_guard<std::mutex> lock(fake_.mu);
    std::vector<v1::JobEvent>& script = fake_.events["job-np"];
    script.clear();
    v1::JobEvent& improved = script.emplace_back();
    improved.set_sequence(1);
    improved.mutable_improved()->set_id("c-9");
    (*improved.mutable_improved()->mutable_params())["X"] = 2;
    v1::JobEvent& done = script.emplace_back();
    done.set_sequence(2);
    done.set_state_changed(v1::JOB_STATE_COMPLETED);
    done.mutable_progress()->set_evaluations(9);
  }
  RunResult r = Client({"watch", "job-np"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_THAT(r.out, HasSubstr("new best: candidate c-9 (X=2)\n"));
  EXPECT_THAT(r.out, Not(HasSubstr("eval 7:"))) << "no counts from before the event";
  EXPECT_THAT(r.out, Not(HasSubstr("state: completed"))) << "the summary line says it";
  EXPECT_THAT(Lines(r.out).back(), StartsWith("job-np: completed"));
}

TEST_F(FakeCoordinatorTest, TokensAndUnknownJobs) {
  fake_.Add(MakeJob("job-a", v1::JOB_STATE_RUNNING, testing::WriteSynthReplayProblem(dir_)));
  // A wrong token, and none: exit 2, one line that says what to do.
  RunResult r = Client({"status", "job-a"}, "kf_000000000000_bad");
  EXPECT_EQ(r.exit_code, 2) << Describe(r);
  EXPECT_THAT(r.err, HasSubstr("refused the token"));
  EXPECT_EQ(Lines(r.err).size(), 1u);
  r = Client({"list"}, "");
  EXPECT_EQ(r.exit_code, 2) << Describe(r);
  EXPECT_THAT(r.err, HasSubstr("KFORGE_TOKEN"));
  EXPECT_EQ(Lines(r.err).size(), 1u);
  r = Client({"watch", "job-a"}, "kf_000000000000_bad");
  EXPECT_EQ(r.exit_code, 2) << Describe(r);
  // The token from --token wins over the environment.
  r = RunKforge({"status", "job-a", "--server", address_, "--token", kToken},
                {"KFORGE_TOKEN=kf_wrong"});
  EXPECT_EQ(r.exit_code, 0) << Describe(r);

  for (const std::vector<std::string>& args :
       std::vector<std::vector<std::string>>{{"status", "job-zz"},
                                             {"watch", "job-zz"},
                                             {"cancel", "job-zz"},
                                             {"best", "job-zz", "--out", dir_.path() + "/o"}}) {
    r = Client(args);
    EXPECT_EQ(r.exit_code, 1) << args[0] << "\n" << Describe(r);
    EXPECT_THAT(r.err, HasSubstr("job job-zz not found")) << args[0];
    EXPECT_EQ(Lines(r.err).size(), 1u) << Describe(r);
  }
}

TEST_F(FakeCoordinatorTest, ListPagesFiltersAndPrintsJson) {
  const std::string problem = testing::WriteSynthReplayProblem(dir_);
  for (int i = 0; i < 5; ++i) {
    fake_.Add(MakeJob(absl::StrCat("job-l", i),
                      i % 2 == 0 ? v1::JOB_STATE_COMPLETED : v1::JOB_STATE_RUNNING, problem));
  }
  RunResult r = Client({"list"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  for (int i = 0; i < 5; ++i) EXPECT_THAT(r.out, HasSubstr(absl::StrCat("job-l", i)));
  EXPECT_THAT(r.out, HasSubstr("synth-replay"));
  EXPECT_THAT(r.out, HasSubstr("1.750x"));

  r = Client({"list", "--limit", "2"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_THAT(r.out, HasSubstr("job-l4"));
  EXPECT_THAT(r.out, HasSubstr("job-l3"));
  EXPECT_THAT(r.out, Not(HasSubstr("job-l2")));
  // The hint names the limit that lists the rest.
  EXPECT_THAT(r.out, HasSubstr("(3 more: --limit 5 lists them all)")) << Describe(r);
  EXPECT_THAT(Client({"list", "--limit", "5"}).out, Not(HasSubstr("more"))) << Describe(r);

  r = Client({"list", "--state", "completed", "--json"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  {
    std::lock_guard<std::mutex> lock(fake_.mu);
    EXPECT_EQ(fake_.list_requests.back().state(), v1::JOB_STATE_COMPLETED);
  }
  nlohmann::json j = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  ASSERT_EQ(j["jobs"].size(), 3u) << r.out;
  EXPECT_EQ(j["jobs"][0]["id"], "job-l4");
  EXPECT_EQ(j["jobs"][0]["state"], "JOB_STATE_COMPLETED");
  EXPECT_EQ(j["jobs"][0]["spec"]["problem"]["name"], "synth-replay");
  EXPECT_TRUE(j["jobs"][0]["spec"]["problem"]["size_sets"].empty())
      << "a listing leaves the problem out";

  // Pages of the server's size are followed to the end.
  for (int i = 5; i < 130; ++i)
    fake_.Add(MakeJob(absl::StrCat("job-m", i), v1::JOB_STATE_QUEUED, problem));
  r = Client({"list", "--limit", "120", "--json"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  j = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded());
  EXPECT_EQ(j["jobs"].size(), 120u);
}

TEST_F(FakeCoordinatorTest, StatusAndCancel) {
  fake_.Add(MakeJob("job-s", v1::JOB_STATE_RUNNING, testing::WriteSynthReplayProblem(dir_)));
  RunResult r = Client({"status", "job-s"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_THAT(r.out, HasSubstr("job job-s: synth-replay (replay)"));
  EXPECT_THAT(r.out, HasSubstr("state: running"));
  EXPECT_THAT(r.out, HasSubstr("7 evaluations"));
  EXPECT_THAT(r.out, HasSubstr("budget: 40 evaluations"));
  EXPECT_THAT(r.out, HasSubstr("best 1.750x (unconfirmed: one evaluation's measurement)")) << Describe(r);
  EXPECT_THAT(r.out, Not(HasSubstr("model calls"))) << "no model used";

  // A job whose finalists were re-measured shows the confirmed speedup with its interval, not the
  // best's first measurement, in status and in list.
  v1::Job confirmed = MakeJob("job-c", v1::JOB_STATE_COMPLETED, testing::WriteSynthReplayProblem(dir_));
  confirmed.mutable_progress()->set_best_speedup(9.719);
  confirmed.mutable_progress()->set_llm_tokens(1234);
  confirmed.mutable_progress()->set_llm_cost_usd(0.0125);
  confirmed.mutable_best()->set_id("c-3");
  confirmed.mutable_best_result()->set_speedup(9.719);
  v1::FinalistTiming* f = confirmed.mutable_confirmation()->add_finalists();
  f->set_candidate_id("c-3");
  f->set_outcome(v1::OUTCOME_OK);
  f->set_speedup(6.14);
  f->set_speedup_low(6.01);
  f->set_speedup_high(6.29);
  f->set_rounds(9);
  fake_.Add(confirmed);
  r = Client({"status", "job-c"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_THAT(r.out, HasSubstr("best 6.140x (95% interval 6.010-6.290x, 9 side-by-side rounds)")) << Describe(r);
  EXPECT_THAT(r.out, HasSubstr("model calls: 1234 tokens, 0.0125 USD")) << Describe(r);
  EXPECT_THAT(r.out, Not(HasSubstr("9.719"))) << Describe(r);
  r = Client({"list"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_THAT(r.out, HasSubstr("6.140x (6.010-6.290)")) << Describe(r);
  EXPECT_THAT(r.out, HasSubstr("1.750x unconfirmed")) << Describe(r);
  EXPECT_THAT(r.out, Not(HasSubstr("9.719"))) << Describe(r);

  r = Client({"status", "job-s", "--json"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  nlohmann::json j = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  EXPECT_EQ(j["state"], "JOB_STATE_RUNNING");
  EXPECT_EQ(j["progress"]["evaluations"], "7");  // int64 in proto JSON is a string

  r = Client({"cancel", "job-s", "--reason", "wrong problem"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_EQ(r.out, "job-s: cancelled (cancelled by user: wrong problem)\n");
  r = Client({"status", "job-s"});
  EXPECT_THAT(r.out, HasSubstr("state: cancelled"));
}

TEST_F(FakeCoordinatorTest, BestWritesTheKernelAndItsPlanAsRunDoes) {
  const std::string matmul = SourceDir() + "/examples/opencl/matmul";
  v1::Job job = MakeJob("job-b", v1::JOB_STATE_COMPLETED, matmul);
  fake_.Add(job);
  v1::ScoredCandidate best;
  best.mutable_candidate()->set_id("c-17");
  best.mutable_candidate()->set_source("__kernel void best(void) {}\n");
  (*best.mutable_candidate()->mutable_params())["TILE"] = 16;
  best.mutable_result()->set_speedup(3.25);
  best.mutable_result()->set_candidate_id("c-17");
  {
    std::lock_guard<std::mutex> lock(fake_.mu);
    fake_.best["job-b"] = best;
  }
  const std::string out = dir_.path() + "/best";
  RunResult r = Client({"best", "job-b", "--out", out});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_THAT(r.out, HasSubstr("best 3.250x"));
  // The knob values it was timed with lead the file, so it compiles on its own.
  const std::string cl = dir_.Read("best/best.cl");
  EXPECT_THAT(cl, HasSubstr("#ifndef TILE\n#define TILE 16\n#endif\n")) << cl;
  EXPECT_THAT(cl, EndsWith("\n__kernel void best(void) {}\n")) << cl;
  EXPECT_LT(cl.find("#define TILE 16"), cl.find("__kernel")) << cl;
  nlohmann::json j = nlohmann::json::parse(dir_.Read("best/best.json"), nullptr, false);
  ASSERT_FALSE(j.is_discarded());
  EXPECT_EQ(j["candidate_id"], "c-17");
  EXPECT_DOUBLE_EQ(j["speedup"].get<double>(), 3.25);
  EXPECT_EQ(j["params"]["TILE"], "16");
  // The candidate has no plan of its own: the seed's launches, as `kforge run --out` writes them.
  EXPECT_FALSE(j["launch_plan"]["launches"].empty()) << j.dump(2);

  // A job with no successful evaluation has nothing to write.
  fake_.Add(MakeJob("job-n", v1::JOB_STATE_RUNNING, matmul));
  r = Client({"best", "job-n", "--out", dir_.path() + "/none"});
  EXPECT_EQ(r.exit_code, 1) << Describe(r);
  EXPECT_THAT(r.err, HasSubstr("no successful evaluation"));
  EXPECT_FALSE(fs::exists(dir_.path() + "/none"));
}

// ---------------------------------------------------------------------------------------------
// End to end: kforge admin makes a tenant and a key, a kforge-coordinator serves the store.

class CoordinatorE2eTest : public ::testing::Test {
 protected:
  void SetUp() override {
    db_ = dir_.path() + "/k.db";
    ASSERT_EQ(RunKforge({"admin", "tenant-create", "acme", "--db", db_}).exit_code, 0);
    ASSERT_EQ(RunKforge({"admin", "tenant-create", "other", "--db", db_}).exit_code, 0);
    token_ = MakeToken("acme");
    other_token_ = MakeToken("other");
    const std::string config = dir_.Write(
        "coordinator.yaml",
        absl::StrCat(
            "server: {listen: \"127.0.0.1:0\", metrics_listen: \"127.0.0.1:0\", log_level: warn}\n"
            "store: {kind: sqlite, url: \"",
            db_,
            "\"}\n"
            "queue: {kind: memory}\n"
            "workers: {embedded: 2}\n"
            "auth: {required: true}\n"));
    coordinator_ = std::make_unique<testing::BackgroundProcess>(
        BinaryDir() + "/services/coordinator/kforge-coordinator",
        std::vector<std::string>{"--config", config});
    ASSERT_TRUE(coordinator_->started());
    const std::string line = coordinator_->WaitForLine("listening ", 60);
    if (line.empty()) {
      const int rc = coordinator_->Kill(SIGKILL);
      if (rc == 0)
        GTEST_SKIP() << "kforge-coordinator does not serve in this build yet (it exited at once)";
      FAIL() << "kforge-coordinator did not start (exit " << rc << ")";
    }
    int grpc_port = 0;
    ASSERT_EQ(std::sscanf(line.c_str(), "listening grpc=%d", &grpc_port), 1) << line;
    address_ = absl::StrCat("127.0.0.1:", grpc_port);
  }

  std::string MakeToken(const std::string& tenant) {
    RunResult r = RunKforge({"admin", "key-create", tenant, "--db", db_});
    EXPECT_EQ(r.exit_code, 0) << Describe(r);
    const std::vector<std::string> lines = Lines(r.out);
    return lines.empty() ? "" : lines[0];
  }

  RunResult Client(std::vector<std::string> args, const std::string& token) {
    args.push_back("--server");
    args.push_back(address_);
    return RunKforge(args, {"KFORGE_TOKEN=" + token});
  }
  RunResult Client(std::vector<std::string> args) { return Client(std::move(args), token_); }

  TempDir dir_;
  std::string db_;
  std::string token_;
  std::string other_token_;
  std::string address_;
  std::unique_ptr<testing::BackgroundProcess> coordinator_;
};

// The job id from the first line of `submit --watch`: "job ID: ...".
std::string JobIdFromHeader(const std::string& out) {
  const std::vector<std::string> lines = Lines(out);
  if (lines.empty() || !absl::StartsWith(lines[0], "job ")) return "";
  const std::string rest = lines[0].substr(4);
  return rest.substr(0, rest.find(':'));
}

TEST_F(CoordinatorE2eTest, SubmitWatchStatusListBest) {
  const std::string problem = testing::WriteSynthReplayProblem(dir_);
  RunResult r = Client({"submit", problem, "--budget", "20", "--seed", "3", "--watch"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  const std::string job_id = JobIdFromHeader(r.out);
  ASSERT_THAT(job_id, StartsWith("job-")) << r.out;
  EXPECT_THAT(r.out, HasSubstr("new best"));
  EXPECT_THAT(Lines(r.out).back(), HasSubstr(absl::StrCat(job_id, ": completed")));
  EXPECT_THAT(Lines(r.out).back(), HasSubstr("20 evaluations"));

  r = Client({"status", job_id});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_THAT(r.out, HasSubstr("state: completed"));
  EXPECT_THAT(r.out, HasSubstr("tenant acme"));
  r = Client({"status", job_id, "--json"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  nlohmann::json j = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  EXPECT_EQ(j["state"], "JOB_STATE_COMPLETED");
  EXPECT_EQ(j["progress"]["evaluations"], "20");

  r = Client({"list"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_THAT(r.out, HasSubstr(job_id));
  r = Client({"list", "--state", "completed", "--json"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_THAT(r.out, HasSubstr(job_id));
  // Another tenant sees none of it.
  r = Client({"list"}, other_token_);
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_THAT(r.out, Not(HasSubstr(job_id)));
  r = Client({"status", job_id}, other_token_);
  EXPECT_EQ(r.exit_code, 1) << Describe(r);

  r = Client({"best", job_id, "--out", dir_.path() + "/best"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  j = nlohmann::json::parse(dir_.Read("best/best.json"), nullptr, false);
  ASSERT_FALSE(j.is_discarded());
  EXPECT_TRUE(j["params"].contains("X")) << j.dump(2);
  EXPECT_GT(j["speedup"].get<double>(), 1.0);

  // Watching an ended job replays it and ends at once.
  r = Client({"watch", job_id});
  EXPECT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_THAT(Lines(r.out).back(), HasSubstr(absl::StrCat(job_id, ": completed")));
}

// `kforge suite --server`: every problem submitted to the cluster at once, the figures from the
// ended jobs. A problem folder and a PyTorch module (where torch is here) run; a module that does
// not import is refused before any call, naming its line.
TEST_F(CoordinatorE2eTest, SuiteSubmitsEveryProblemAndReportsTheFigures) {
  const bool torch = TorchMissing().empty();
  fs::create_directories(dir_.path() + "/suite-in");
  testing::WriteSynthReplayProblem(dir_, "suite-in/1_replay");
  dir_.Write("suite-in/2_broken.py", "import torch\nclass Model(torch.nn.Module:\n    pass\n");
  if (torch) {
    dir_.Write("suite-in/3_softsign.py",
               "import torch\nimport torch.nn as nn\n\nclass Model(nn.Module):\n    def __init__(self):\n"
               "        super().__init__()\n\n    def forward(self, x):\n        return x / (1 + torch.abs(x))\n\n"
               "batch_size = 8\ndim = 128\n\ndef get_inputs():\n    return [torch.rand(batch_size, dim)]\n\n"
               "def get_init_inputs():\n    return []\n");
  }
  RunResult r = Client({"suite", dir_.path() + "/suite-in", "--budget", "4", "--out", dir_.path() + "/suite-out",
                        "--json"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  const nlohmann::json j = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  ASSERT_EQ(j["table"].size(), torch ? 3u : 2u) << j.dump(2);
  EXPECT_EQ(j["correct"], torch ? 2 : 1) << j.dump(2);
  const auto& t = j["table"];
  EXPECT_EQ(t[0]["problem"], "1_replay");
  EXPECT_EQ(t[0]["outcome"], "correct");
  EXPECT_GT(t[0]["speedup_eager"].get<double>(), 1.0);
  EXPECT_EQ(t[0]["evaluations"], 4);
  EXPECT_EQ(t[1]["outcome"], "refused");
  EXPECT_THAT(t[1]["reason"].get<std::string>(), HasSubstr("2_broken.py:2"));
  if (torch) {
    EXPECT_EQ(t[2]["template"], "elementwise");
    EXPECT_EQ(t[2]["outcome"], "correct") << t[2].dump();
    EXPECT_GT(t[2]["speedup_eager"].get<double>(), 0);
  }
  // The jobs are the tenant's, in the cluster's store.
  r = Client({"list"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_EQ(Count(r.out, "completed"), torch ? 2 : 1) << r.out;
}

TEST_F(CoordinatorE2eTest, CancelARunningJob) {
  testing::SynthSpace space;
  space.extra_z = 200;  // 4,000 configurations: still running when the cancel arrives
  const std::string problem = testing::WriteSynthReplayProblem(dir_, "big", space);
  RunResult r = Client({"submit", problem, "--budget", "100000", "--idempotency-key", "cancel-me"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  const std::string job_id = Lines(r.out).at(0);
  // The same key gives the same job.
  r = Client({"submit", problem, "--budget", "100000", "--idempotency-key", "cancel-me"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_EQ(Lines(r.out).at(0), job_id);

  r = Client({"cancel", job_id, "--reason", "test"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_THAT(r.out, HasSubstr("cancelled"));
  r = Client({"watch", job_id});
  EXPECT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_THAT(Lines(r.out).back(), HasSubstr(absl::StrCat(job_id, ": cancelled")));
  r = Client({"status", job_id});
  EXPECT_THAT(r.out, HasSubstr("state: cancelled"));
}

TEST_F(CoordinatorE2eTest, TokensAreChecked) {
  RunResult r = Client({"list"}, "kf_000000000000_0000");
  EXPECT_EQ(r.exit_code, 2) << Describe(r);
  EXPECT_EQ(Lines(r.err).size(), 1u) << Describe(r);
  r = Client({"list"}, "");
  EXPECT_EQ(r.exit_code, 2) << Describe(r);
  r = Client({"status", "job-nope"});
  EXPECT_EQ(r.exit_code, 1) << Describe(r);
  EXPECT_EQ(Lines(r.err).size(), 1u) << Describe(r);
  // A revoked key stops working.
  const std::string key_id = other_token_.substr(0, other_token_.rfind('_'));
  ASSERT_EQ(RunKforge({"admin", "key-revoke", key_id, "--db", db_}).exit_code, 0);
  r = Client({"list"}, other_token_);
  EXPECT_EQ(r.exit_code, 2) << Describe(r);
}

TEST_F(CoordinatorE2eTest, WorkersListsTheFleet) {
  // The coordinator's embedded workers announce themselves like fleet workers.
  RunResult r;
  for (int i = 0; i < 50; ++i) {
    r = Client({"workers"});
    if (r.exit_code == 0 && absl::StrContains(r.out, "/replay")) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_TRUE(absl::StrContains(r.out, "WORKER")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "/replay")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "/opencl")) << r.out;
  r = Client({"workers", "--json"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_TRUE(absl::StrContains(r.out, "\"seconds_since_heartbeat\"")) << r.out;
  r = Client({"workers"}, "kf_000000000000_0000");
  EXPECT_EQ(r.exit_code, 2) << Describe(r);
}

}  // namespace
}  // namespace kforge
