// The cluster as separate processes on loopback: PostgreSQL, Redis, kforge-coordinator,
// kforge-llm-proxy (mutual TLS and a token between it and the coordinator) and three
// kforge-gpu-workers pulling from the queue. Three jobs from two tenants run while a worker is
// killed mid-run, the proxy is killed and restarted, the coordinator restarts, Redis restarts
// without its data and PostgreSQL restarts: every job completes, every candidate has exactly one
// evaluation in PostgreSQL, the proxy made mutations, each tenant sees only its own jobs, and bad
// tokens and a crafted problem are refused with every process still up.

#include <signal.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/store/api_key.h"
#include "common/store/postgres_store.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "kforge/v1/coordinator.grpc.pb.h"
#include "tests/integration/replay_fixture.h"
#include "tests/testutil/background_process.h"
#include "tests/testutil/postgres_server.h"
#include "tests/testutil/redis_server.h"
#include "tests/testutil/subprocess.h"
#include "tests/testutil/store_checks.h"
#include "tests/testutil/temp_dir.h"
#include "tests/testutil/test_certs.h"

namespace kforge::testing {
namespace {

class ClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (PostgresServer::BinDir().empty()) GTEST_SKIP() << "PostgreSQL is not installed";
    if (!RedisServer::Available()) GTEST_SKIP() << RedisServer::kAbsent;
    ASSERT_TRUE(postgres_.Start().ok());
    ASSERT_TRUE(postgres_.Sql("CREATE DATABASE cluster").ok());
    ASSERT_TRUE(redis_.Start()) << redis_.error();
    // Tenants and their keys, as `kforge admin` makes them.
    auto store = PostgresStore::Open(postgres_.Url("cluster"));
    ASSERT_TRUE(store.ok()) << store.status();
    for (const char* name : {"team-a", "team-b"}) {
      v1::Tenant t;
      t.set_name(name);
      ASSERT_TRUE((*store)->CreateTenant(t).ok());
      auto key = MintApiKey(name, "test", false);
      ASSERT_TRUE(key.ok());
      ASSERT_TRUE((*store)->CreateApiKey(key->record).ok());
      tokens_[name] = key->token;
    }
    SynthSpace space;
    space.extra_z = 100;
    const std::string folder = WriteSynthReplayProblem(dir_, "synth", space);
    for (const auto& entry : std::filesystem::directory_iterator(folder)) {
      std::ifstream in(entry.path(), std::ios::binary);
      files_[entry.path().filename().string()] = std::string(std::istreambuf_iterator<char>(in), {});
    }
    problems_ = dir_.path() + "/problems";
    auto certs = MakeTestCerts(dir_.path());
    ASSERT_TRUE(certs.ok()) << certs.status();
    certs_ = *certs;
    proxy_token_file_ = dir_.Write("proxy-token", "e2e-proxy-token\n");
    proxy_port_ = FreePort();
    StartProxy();
    StartCoordinator();
    for (int i = 0; i < 3; ++i) workers_.push_back(StartWorker(i));
  }

  // On a fixed port, so that the coordinator finds it again after a restart.
  void StartProxy() {
    const std::string cfg = dir_.Write(
        "proxy.yaml",
        absl::StrCat("server: {listen: \"127.0.0.1:", proxy_port_,
                     "\", metrics_listen: \"127.0.0.1:0\", log_level: warn,\n"
                     "         tls: {cert: \"", certs_.server_cert, "\", key: \"", certs_.server_key,
                     "\", client_ca: \"", certs_.ca, "\"}}\nauth: {token_file: \"", proxy_token_file_, "\"}\n"));
    proxy_ = std::make_unique<BackgroundProcess>(BinaryDir() + "/services/llm-proxy/kforge-llm-proxy",
                                                 std::vector<std::string>{"--config", cfg});
    const std::string line = proxy_->WaitForLine("listening ", 30);
    ASSERT_FALSE(line.empty()) << "the proxy did not start";
    int grpc = 0;
    ASSERT_EQ(std::sscanf(line.c_str(), "listening grpc=%d metrics=%d", &grpc, &proxy_metrics_port_), 2) << line;
  }

  // Mutations the proxy has answered since it (re)started.
  double ProxyMutations() {
    const std::string text = HttpGet(proxy_metrics_port_, "/metrics");
    double total = 0;
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) {
      if (line.rfind("kforge_llm_proxy_mutations_total{", 0) != 0) continue;
      total += std::stod(line.substr(line.rfind(' ') + 1));
    }
    return total;
  }

  void StartCoordinator() {
    const std::string cfg = dir_.Write(
        "coordinator.yaml",
        absl::StrCat("server: {listen: \"127.0.0.1:0\", metrics_listen: \"127.0.0.1:0\", log_level: warn}\n"
                     "store: {kind: postgres, url: \"",
                     postgres_.Url("cluster"), "\"}\nqueue: {kind: redis, url: \"", redis_.url(),
                     "\"}\nauth: {required: true}\njobs: {slots: 2, always_remeasure: true, problems_dir: \"", problems_,
                     "\"}\nllm_proxy: {address: \"127.0.0.1:", proxy_port_, "\", token_file: \"", proxy_token_file_,
                     "\",\n  tls: {ca: \"", certs_.ca, "\", cert: \"", certs_.client_cert, "\", key: \"",
                     certs_.client_key, "\"}}\n"));
    coordinator_ = std::make_unique<BackgroundProcess>(BinaryDir() + "/services/coordinator/kforge-coordinator",
                                                       std::vector<std::string>{"--config", cfg});
    const std::string line = coordinator_->WaitForLine("listening ", 30);
    ASSERT_FALSE(line.empty()) << "the coordinator did not start";
    ASSERT_EQ(std::sscanf(line.c_str(), "listening grpc=%d metrics=%d", &port_, &coordinator_metrics_port_), 2)
        << line;
    stub_ = v1::CoordinatorService::NewStub(
        grpc::CreateChannel(absl::StrCat("127.0.0.1:", port_), grpc::InsecureChannelCredentials()));
  }

  std::unique_ptr<BackgroundProcess> StartWorker(int i, const std::string& backends = "replay") {
    const std::string cfg = dir_.Write(
        absl::StrCat("worker", i, ".yaml"),
        absl::StrCat("server: {listen: \"127.0.0.1:0\", metrics_listen: \"127.0.0.1:0\", log_level: warn}\n"
                     "worker: {id: w",
                     i, ", backends: ", backends, ", slots: 1, replay_dirs: \"", problems_, "\"}\nqueue: {url: \"",
                     redis_.url(), "\", pull: true}\ncompile_cache: {dir: \"", dir_.path(), "/worker-cache", i,
                     "\"}\n"));
    auto w = std::make_unique<BackgroundProcess>(BinaryDir() + "/services/gpu-worker/kforge-gpu-worker",
                                                 std::vector<std::string>{"--config", cfg});
    EXPECT_FALSE(w->WaitForLine("listening ", 30).empty()) << "worker " << i << " did not start";
    return w;
  }

  std::unique_ptr<grpc::ClientContext> Ctx(const std::string& token) {
    auto ctx = std::make_unique<grpc::ClientContext>();
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    if (!token.empty()) ctx->AddMetadata("authorization", "Bearer " + token);
    return ctx;
  }

  std::string Submit(const std::string& tenant, int64_t budget, uint64_t seed) {
    return Submit(tenant, files_, budget, seed);
  }
  std::string Submit(const std::string& tenant, const std::map<std::string, std::string>& files, int64_t budget,
                     uint64_t seed) {
    v1::SubmitJobRequest req;
    for (const auto& [name, bytes] : files) (*req.mutable_problem_files())[name] = bytes;
    req.mutable_spec()->mutable_budget()->set_max_candidates(budget);
    req.mutable_spec()->set_seed(seed);
    v1::SubmitJobResponse resp;
    grpc::Status st = stub_->SubmitJob(Ctx(tokens_[tenant]).get(), req, &resp);
    EXPECT_TRUE(st.ok()) << st.error_message();
    return resp.job().id();
  }

  // The job as its tenant sees it; retried while the coordinator restarts.
  v1::Job Get(const std::string& tenant, const std::string& id) {
    v1::GetJobRequest req;
    req.set_job_id(id);
    v1::Job job;
    for (int i = 0; i < 100; ++i) {
      grpc::Status st = stub_->GetJob(Ctx(tokens_[tenant]).get(), req, &job);
      if (st.ok()) return job;
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    ADD_FAILURE() << "GetJob " << id << " kept failing";
    return job;
  }

  void WaitForEvaluations(const std::string& tenant, const std::string& id, int64_t n) {
    for (int i = 0; i < 600; ++i) {
      v1::Job j = Get(tenant, id);
      if (j.progress().evaluations() >= n || j.state() == v1::JOB_STATE_COMPLETED) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }

  TempDir dir_;
  PostgresServer postgres_;
  RedisServer redis_;  // no persistence: a restart loses everything
  std::map<std::string, std::string> tokens_;
  std::map<std::string, std::string> files_;
  std::string problems_;
  std::unique_ptr<BackgroundProcess> coordinator_;
  std::unique_ptr<BackgroundProcess> proxy_;
  std::vector<std::unique_ptr<BackgroundProcess>> workers_;
  TestCerts certs_;
  std::string proxy_token_file_;
  int proxy_port_ = 0;
  int proxy_metrics_port_ = 0;
  int port_ = 0;
  int coordinator_metrics_port_ = 0;
  std::unique_ptr<v1::CoordinatorService::Stub> stub_;
};

// `kforge health` against the coordinator: the server as a whole, or its CoordinatorService
// (readiness). Exit 0 when SERVING.
int Health(int port, const std::string& service) {
  std::vector<std::string> args = {"health", "--server", absl::StrCat("127.0.0.1:", port)};
  if (!service.empty()) args.insert(args.end(), {"--service", service});
  return RunProgram(BinaryDir() + "/cli/kforge", args).exit_code;
}

bool WaitForHealth(int port, const std::string& service, bool serving, double seconds) {
  for (double waited = 0; waited < seconds; waited += 0.5) {
    if ((Health(port, service) == 0) == serving) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  return false;
}

// An outage is visible: a coordinator cut off from PostgreSQL says it is not ready (its
// CoordinatorService's health, what the Kubernetes readiness probe asks) while it stays alive (the
// server's overall health, the liveness probe), counts the failed samples and drops the job
// gauges it can no longer read; when the database is back, so is all of it.
TEST_F(ClusterTest, ACoordinatorCutOffFromItsStoreIsNotReadyAndSaysSo) {
  constexpr const char* kService = "kforge.v1.CoordinatorService";
  ASSERT_TRUE(WaitForHealth(port_, kService, true, 15));
  EXPECT_NE(HttpGet(coordinator_metrics_port_, "/metrics").find("kforge_coordinator_jobs{"), std::string::npos);
  postgres_.Stop();
  // The store rides out a restarting database for up to 30 s before a call fails: the sample
  // that notices takes that long.
  EXPECT_TRUE(WaitForHealth(port_, kService, false, 75)) << "still ready without its database";
  EXPECT_EQ(Health(port_, ""), 0) << "alive all the same";
  const std::string text = HttpGet(coordinator_metrics_port_, "/metrics");
  EXPECT_EQ(text.find("kforge_coordinator_jobs{"), std::string::npos) << "a stale gauge kept";
  EXPECT_EQ(text.find("kforge_coordinator_sample_failures_total{dependency=\"store\"} 0"), std::string::npos)
      << "no failed sample counted";
  ASSERT_TRUE(postgres_.Start().ok());
  EXPECT_TRUE(WaitForHealth(port_, kService, true, 75)) << "not ready again with its database back";
  EXPECT_NE(HttpGet(coordinator_metrics_port_, "/metrics").find("kforge_coordinator_jobs{"), std::string::npos);
}

TEST_F(ClusterTest, JobsCompleteThroughWorkerDeathCoordinatorRestartAndServerRestarts) {
  const std::string a1 = Submit("team-a", 300, 1);
  const std::string b1 = Submit("team-b", 300, 2);
  const std::string a2 = Submit("team-a", 200, 3);
  ASSERT_FALSE(a1.empty() || b1.empty() || a2.empty());

  WaitForEvaluations("team-a", a1, 20);
  EXPECT_GT(ProxyMutations(), 0) << "the coordinator's proposals come from the proxy";
  workers_[0]->Kill(SIGKILL);  // mid-evaluation or between: its lease comes back either way
  proxy_->Kill(SIGKILL);       // the jobs' own parametric mutators answer until it is back
  WaitForEvaluations("team-a", a1, 40);
  StartProxy();
  WaitForEvaluations("team-a", a1, 60);
  EXPECT_EQ(coordinator_->Kill(SIGTERM), 0) << "a clean shutdown";
  StartCoordinator();
  WaitForEvaluations("team-a", a1, 100);
  ASSERT_TRUE(redis_.RestartEmpty()) << redis_.error();
  WaitForEvaluations("team-a", a1, 140);
  ASSERT_TRUE(postgres_.Restart().ok());

  std::map<std::string, std::string> jobs = {{a1, "team-a"}, {b1, "team-b"}, {a2, "team-a"}};
  for (const auto& [id, tenant] : jobs) {
    v1::Job j;
    for (int i = 0; i < 1200; ++i) {
      j = Get(tenant, id);
      if (j.state() == v1::JOB_STATE_COMPLETED || j.state() == v1::JOB_STATE_FAILED) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    EXPECT_EQ(j.state(), v1::JOB_STATE_COMPLETED) << id << ": " << j.state_reason();
    EXPECT_EQ(j.progress().evaluations(), j.spec().budget().max_candidates()) << id;
  }
  // In PostgreSQL: every candidate of every job has exactly one evaluation.
  auto store = PostgresStore::Open(postgres_.Url("cluster"));
  ASSERT_TRUE(store.ok()) << store.status();
  for (const auto& [id, tenant] : jobs) ExpectOneEvaluationPerCandidate(**store, id);

  // The fleet: the killed worker drops out once its heartbeats stop for the TTL (15 s); the live
  // ones are back within a heartbeat (5 s) of Redis losing their entries.
  std::set<std::string> fleet;
  for (int i = 0; i < 300; ++i) {
    v1::ListWorkersResponse workers;
    ASSERT_TRUE(stub_->ListWorkers(Ctx(tokens_["team-a"]).get(), v1::ListWorkersRequest(), &workers).ok());
    fleet.clear();
    for (const auto& w : workers.workers()) fleet.insert(w.worker_id());
    if (fleet == std::set<std::string>{"w1", "w2"}) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(fleet, (std::set<std::string>{"w1", "w2"}));

  // Tenants see only their own jobs; missing and wrong tokens are refused.
  v1::GetJobRequest other;
  other.set_job_id(a1);
  v1::Job out;
  EXPECT_EQ(stub_->GetJob(Ctx(tokens_["team-b"]).get(), other, &out).error_code(), grpc::StatusCode::NOT_FOUND);
  v1::ListJobsResponse list;
  ASSERT_TRUE(stub_->ListJobs(Ctx(tokens_["team-b"]).get(), v1::ListJobsRequest(), &list).ok());
  ASSERT_EQ(list.jobs_size(), 1);
  EXPECT_EQ(list.jobs(0).id(), b1);
  EXPECT_EQ(stub_->GetJob(Ctx("").get(), other, &out).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(stub_->GetJob(Ctx("kf_000000000000_0").get(), other, &out).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);

  // A crafted problem is refused, and nothing died.
  v1::SubmitJobRequest bad;
  (*bad.mutable_problem_files())["problem.yaml"] =
      "name: x\nbackend: opencl\nsizes: {N: 9999999999999999999999}\nbuffers: {a: {dtype: f32, shape: [N]}}\n";
  bad.mutable_spec()->mutable_budget()->set_max_candidates(5);
  v1::SubmitJobResponse resp;
  EXPECT_EQ(stub_->SubmitJob(Ctx(tokens_["team-a"]).get(), bad, &resp).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(kill(coordinator_->pid(), 0), 0);
  EXPECT_EQ(kill(proxy_->pid(), 0), 0);
  for (size_t i = 1; i < workers_.size(); ++i) EXPECT_EQ(kill(workers_[i]->pid(), 0), 0) << "worker " << i;
}

TEST_F(ClusterTest, AnOpenClJobReMeasuresItsFinalistsBeforeItReportsItsBest) {
  workers_.push_back(StartWorker(9, "opencl"));
  const std::map<std::string, std::string> files = {
      {"problem.yaml",
       "name: scale-cluster\nbackend: opencl\nsizes: {N: 65536}\n"
       "buffers:\n  x: {dtype: f32, shape: [N], role: in}\n  y: {dtype: f32, shape: [N], role: out}\n"
       "reference:\n  source: k.cl\n  launches: [{kernel: scale, global: [N], local: [64], args: [x, y, N]}]\n"
       "seed:\n  source: k.cl\n  params: {WG: [16, 32, 64, 128]}\n"
       "  launches: [{kernel: scale, global: [N], local: [WG], args: [x, y, N]}]\n"},
      {"k.cl",
       "kernel void scale(global const float* x, global float* y, int n) {\n"
       "  int i = get_global_id(0);\n  if (i < n) y[i] = 2.0f * x[i];\n}\n"}};
  const std::string id = Submit("team-a", files, 4, 1);
  v1::Job job;
  auto ended = [](v1::JobState s) {
    return s == v1::JOB_STATE_COMPLETED || s == v1::JOB_STATE_FAILED || s == v1::JOB_STATE_CANCELLED;
  };
  for (int i = 0; i < 1200 && !ended(job.state()); ++i) {
    job = Get("team-a", id);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (job.state() == v1::JOB_STATE_FAILED && job.state_reason().find("OpenCL") != std::string::npos) {
    GTEST_SKIP() << "no OpenCL device: " << job.state_reason();
  }
  ASSERT_EQ(job.state(), v1::JOB_STATE_COMPLETED) << job.state_reason();
  EXPECT_EQ(job.progress().evaluations(), 4);
  // Through Redis to the OpenCL worker and back: the three fittest, timed side by side.
  const v1::Confirmation& c = job.confirmation();
  ASSERT_EQ(c.finalists_size(), 3) << c.note();
  EXPECT_EQ(c.worker_id(), "w9");
  EXPECT_EQ(c.finalists(0).candidate_id(), job.best().id());
  EXPECT_EQ(c.finalists(0).rounds(), 9);
  EXPECT_GT(c.finalists(0).speedup_low(), 0);
  EXPECT_GT(c.finalists(0).first_speedup(), 0);
  v1::GetBestRequest req;
  req.set_job_id(id);
  v1::GetBestResponse best;
  ASSERT_TRUE(stub_->GetBest(Ctx(tokens_["team-a"]).get(), req, &best).ok());
  EXPECT_EQ(best.best().candidate().id(), job.best().id());
  // The worker's PoCL kept its compiled kernels in compile_cache.dir.
  EXPECT_TRUE(std::filesystem::is_directory(dir_.path() + "/worker-cache9/pocl"));
}

}  // namespace
}  // namespace kforge::testing
