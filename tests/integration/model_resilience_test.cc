// Model mutations when things go wrong, end to end with the real binaries and a scripted
// OpenAI-compatible endpoint on loopback: a proxy killed mid-run or never there, a model endpoint
// that is down, a model budget that runs out, a run resumed after its totals were lost, and
// prompts that carry what failed.

#include <signal.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/store/sqlite_store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testutil/background_process.h"
#include "tests/testutil/scripted_http_server.h"
#include "tests/testutil/subprocess.h"
#include "tests/testutil/temp_dir.h"
#include "tests/testutil/vadd_problem.h"

namespace kforge::testing {
namespace {

using ::testing::HasSubstr;

std::string Kforge() { return BinaryDir() + "/cli/kforge"; }

// An LLM config naming the scripted server (or any base URL).
std::string LlmConfig(const TempDir& dir, const std::string& base_url, const std::string& extra = "") {
  return dir.Write("llm.yaml", absl::StrCat("probability: 1.0\nproviders:\n  - {name: scripted, kind: openai, "
                                            "base_url: \"",
                                            base_url, "/v1\", model: m1, timeout_seconds: 5, max_retries: 1",
                                            extra, "}\n"));
}

// The one job of a SQLite database.
v1::Job OnlyJob(const std::string& db) {
  auto store = SqliteStore::Open(db);
  EXPECT_TRUE(store.ok()) << store.status();
  if (!store.ok()) return {};
  auto jobs = (*store)->ListJobs({});
  EXPECT_TRUE(jobs.ok() && jobs->size() == 1u);
  return jobs.ok() && !jobs->empty() ? jobs->front() : v1::Job{};
}

std::string EventLog(const std::string& db, const std::string& job_id) {
  auto store = SqliteStore::Open(db);
  if (!store.ok()) return "";
  auto events = (*store)->ListEvents(job_id, 1, 10000);
  std::string out;
  if (events.ok()) {
    for (const auto& e : *events) absl::StrAppend(&out, e.message(), "\n");
  }
  return out;
}

bool NoOpenCl(const RunResult& r) { return r.exit_code == 1 && r.err.find("not available") != std::string::npos; }

TEST(ModelResilienceTest, AProxyKilledMidRunLeavesTheJobToTheKnobTuner) {
  TempDir dir;
  BackgroundProcess proxy(BinaryDir() + "/services/llm-proxy/kforge-llm-proxy",
                          {"--config", dir.Write("proxy.yaml", "server: {listen: \"127.0.0.1:0\", "
                                                               "metrics_listen: \"127.0.0.1:0\"}\n")});
  const std::string line = proxy.WaitForLine("listening ", 30);
  int grpc_port = 0, metrics_port = 0;
  ASSERT_EQ(std::sscanf(line.c_str(), "listening grpc=%d metrics=%d", &grpc_port, &metrics_port), 2) << line;
  const std::string db = dir.path() + "/k.db";
  BackgroundProcess run(Kforge(), {"run", SourceDir() + "/examples/replay/pnpoly", "--budget", "1500", "--llm-proxy",
                                   absl::StrCat("127.0.0.1:", grpc_port), "--db", db, "--out", dir.path() + "/out"});
  // Let the run use the proxy for a while, then kill the proxy outright.
  size_t proposed = 0;
  for (int i = 0; i < 3000 && proposed < 20; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    if (auto store = SqliteStore::Open(db); store.ok()) {
      if (auto jobs = (*store)->ListJobs({}); jobs.ok() && !jobs->empty()) {
        if (auto cands = (*store)->ListCandidates(jobs->front().id()); cands.ok()) proposed = cands->size();
      }
    }
  }
  ASSERT_GE(proposed, 20u) << "the run did not get going";
  proxy.Kill(SIGKILL);
  EXPECT_EQ(run.Wait(), 0);
  const v1::Job job = OnlyJob(db);
  EXPECT_EQ(job.state(), v1::JOB_STATE_COMPLETED) << job.state_reason();
  EXPECT_EQ(job.progress().evaluations(), 1500) << job.state_reason();
  const std::string events = EventLog(db, job.id());
  EXPECT_THAT(events, HasSubstr("the parametric mutator answers until it is back")) << events;
}

TEST(ModelResilienceTest, AProxyThatIsNeverThereIsNoFailure) {
  TempDir dir;
  const std::string db = dir.path() + "/k.db";
  // Nothing listens on port 1.
  RunResult r = RunProgram(Kforge(), {"run", SourceDir() + "/examples/replay/pnpoly", "--budget", "20", "--llm-proxy",
                                      "127.0.0.1:1", "--db", db, "--out", dir.path() + "/out"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("20 evaluations"));
  const v1::Job job = OnlyJob(db);
  EXPECT_EQ(job.state(), v1::JOB_STATE_COMPLETED);
  // Said once, not at every proposal.
  const std::string events = EventLog(db, job.id());
  size_t said = 0;
  for (size_t at = 0; (at = events.find("answers until it is back", at)) != std::string::npos; ++at) ++said;
  EXPECT_EQ(said, 1u) << events;
}

TEST(ModelResilienceTest, ADeadModelEndpointCostsAFewCallsNotEveryOne) {
  TempDir dir;
  ScriptedHttpServer server;  // nothing scripted: every request gets HTTP 500
  const std::string problem = WriteVaddProblem(dir, "p");
  const std::string db = dir.path() + "/k.db";
  RunResult r = RunProgram(Kforge(), {"run", problem, "--budget", "3", "--llm", LlmConfig(dir, server.url()), "--db",
                                      db, "--out", dir.path() + "/out", "--workers", "1"});
  if (NoOpenCl(r)) GTEST_SKIP() << "no OpenCL device";
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  // 3 failed calls open the breaker (each 2 attempts: max_retries 1); later proposals skip it.
  EXPECT_LE(server.requests().size(), 6u);
  const v1::Job job = OnlyJob(db);
  EXPECT_EQ(job.state(), v1::JOB_STATE_COMPLETED) << job.state_reason();
}

TEST(ModelResilienceTest, AModelBudgetStopsModelCallsNotTheJobAndIsNeverCrossed) {
  TempDir dir;
  ScriptedHttpServer server;
  for (int i = 0; i < 20; ++i) server.Push({200, {}, OpenAiChatReply("I cannot improve this kernel.", 1000, 500)});
  const std::string db = dir.path() + "/k.db";
  RunResult r = RunProgram(Kforge(), {"run", SourceDir() + "/examples/opencl/matmul", "--budget", "10", "--llm",
                                      LlmConfig(dir, server.url(), ", max_output_tokens: 600"), "--max-llm-tokens",
                                      "4000", "--db", db, "--out", dir.path() + "/out", "--workers", "1"});
  if (NoOpenCl(r)) GTEST_SKIP() << "no OpenCL device";
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const v1::Job job = OnlyJob(db);
  EXPECT_EQ(job.state(), v1::JOB_STATE_COMPLETED);
  EXPECT_EQ(job.state_reason(), "budget: max_candidates") << "the job's own budget ends it";
  EXPECT_EQ(job.progress().evaluations(), 10);
  EXPECT_LE(job.progress().llm_tokens(), 4000) << "a call that could cross the cap is not made";
  EXPECT_GE(job.progress().llm_tokens(), 1500) << "calls within the cap are made";
  EXPECT_EQ(static_cast<int64_t>(server.requests().size()) * 1500, job.progress().llm_tokens());
}

TEST(ModelResilienceTest, AResumedJobsModelTotalsAreTheSumOfItsCallRecords) {
  TempDir dir;
  ScriptedHttpServer server;
  for (int i = 0; i < 40; ++i) server.Push({200, {}, OpenAiChatReply("No code this time.", 300, 100)});
  const std::string db = dir.path() + "/k.db";
  const std::string cfg = LlmConfig(dir, server.url());
  RunResult first = RunProgram(Kforge(), {"run", SourceDir() + "/examples/opencl/matmul", "--budget", "4", "--llm",
                                          cfg, "--db", db, "--out", dir.path() + "/out", "--workers", "1"});
  if (NoOpenCl(first)) GTEST_SKIP() << "no OpenCL device";
  ASSERT_EQ(first.exit_code, 0) << first.out << first.err;
  // A crash after the last checkpoint: the job's totals are stale and it is still running.
  v1::Job job = OnlyJob(db);
  {
    auto store = SqliteStore::Open(db);
    ASSERT_TRUE(store.ok());
    job.set_state(v1::JOB_STATE_RUNNING);
    job.mutable_spec()->mutable_budget()->set_max_candidates(7);
    job.mutable_progress()->set_llm_tokens(1);
    job.mutable_progress()->set_llm_cost_usd(123);
    ASSERT_TRUE((*store)->UpdateJob(job, kNoFence).ok());
  }
  RunResult resumed = RunProgram(Kforge(), {"run", SourceDir() + "/examples/opencl/matmul", "--resume", "--llm", cfg,
                                            "--db", db, "--out", dir.path() + "/out2", "--workers", "1"});
  ASSERT_EQ(resumed.exit_code, 0) << resumed.out << resumed.err;
  job = OnlyJob(db);
  auto store = SqliteStore::Open(db);
  ASSERT_TRUE(store.ok());
  auto calls = (*store)->ListModelCalls(job.id(), 1, 10000);
  ASSERT_TRUE(calls.ok());
  int64_t tokens = 0;
  for (const auto& c : *calls) tokens += c.usage().input_tokens() + c.usage().output_tokens();
  EXPECT_EQ(static_cast<int64_t>(calls->size()), static_cast<int64_t>(server.requests().size()));
  EXPECT_EQ(job.progress().llm_tokens(), tokens);
  EXPECT_EQ(job.progress().llm_tokens(), static_cast<int64_t>(server.requests().size()) * 400);
  EXPECT_DOUBLE_EQ(job.progress().llm_cost_usd(), 0) << "the config has no prices";
}

TEST(ModelResilienceTest, PromptsCarryRecentFailuresTheDeviceAndTheKnobs) {
  TempDir dir;
  ScriptedHttpServer server;
  // First a kernel that does not compile, then correct variants.
  server.Push({200, {}, OpenAiChatReply("```c\n__kernel void add(__global const float* a) { this is not C }\n```\n")});
  for (int i = 0; i < 6; ++i) {
    server.Push({200, {},
                 OpenAiChatReply(absl::StrCat("```c\n__kernel void add(__global const float* a, __global const float* b, "
                                          "__global float* c, int n) {\n  int i = get_global_id(0);\n  if (i < n) {\n"
                                          "    float v", i, " = a[i];\n    c[i] = v", i, " + b[i];\n  }\n}\n```\n"))});
  }
  const std::string problem = WriteVaddProblem(dir, "p");
  RunResult r = RunProgram(Kforge(), {"run", problem, "--budget", "4", "--llm", LlmConfig(dir, server.url()), "--db",
                                      dir.path() + "/k.db", "--out", dir.path() + "/out", "--workers", "1"});
  if (NoOpenCl(r)) GTEST_SKIP() << "no OpenCL device";
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const std::vector<ReceivedRequest> requests = server.requests();
  ASSERT_GE(requests.size(), 2u);
  // The prompt is JSON-escaped in the request body: read it back.
  auto prompt = [&](size_t i) {
    auto body = nlohmann::json::parse(requests[i].body, nullptr, false);
    std::string text;
    for (const auto& m : body["messages"]) text += m.value("content", "");
    return text;
  };
  const std::string first = prompt(0);
  EXPECT_THAT(first, HasSubstr("Knobs (the allowed values): WG in {32, 64, 128}"));
  EXPECT_THAT(first, HasSubstr("Target device: "));
  const std::string later = prompt(1);
  EXPECT_THAT(later, HasSubstr("A recent attempt that failed"));
  EXPECT_THAT(later, HasSubstr("outcome compile_error"));
  EXPECT_THAT(later, HasSubstr("feedback: "));
  EXPECT_THAT(later, HasSubstr("+__kernel void add(__global const float* a) { this is not C }"))
      << "the failed change, as a diff against its parent";
}

}  // namespace
}  // namespace kforge::testing
