// CoordinatorService over real gRPC on loopback, with the in-process store and queue and replay
// workers: jobs submitted as problem files run to their end, tenants see only their own jobs,
// tokens are checked, crafted problems are refused without harm, cancel is final, a retried submit
// gets the same job, and a restarted coordinator resumes what was running.

#include <atomic>
#include <cmath>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/kt_cache.h"
#include "common/logging.h"
#include "common/queue/memory_queue.h"
#include "common/queue/stream.h"
#include "common/server_util.h"
#include "common/store/api_key.h"
#include "common/store/memory_store.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "kforge/v1/coordinator.grpc.pb.h"
#include "services/coordinator/auth.h"
#include "services/coordinator/coordinator_service.h"
#include "services/coordinator/job_api.h"
#include "services/coordinator/job_manager.h"
#include "services/gpu-worker/evaluator.h"
#include "services/gpu-worker/queue_worker.h"
#include "services/llm-proxy/parametric_mutator.h"
#include "tests/integration/replay_fixture.h"
#include "tests/testutil/store_checks.h"
#include "tests/testutil/temp_dir.h"

namespace kforge::coordinator {
namespace {

using ::testing::HasSubstr;

absl::StatusOr<std::shared_ptr<Mutator>> ReplayMutator(const v1::Problem& problem) {
  absl::StatusOr<ValidityFn> validity = ReplayValidity(problem);
  if (!validity.ok()) return validity.status();
  return std::make_shared<llm::ParametricMutator>(llm::ParametricOptions{}, *validity);
}

// A coordinator: manager, API and gRPC server over a shared store and queue.
struct Coordinator {
  Coordinator(Store& store, WorkQueue& queue, Clock& clock, const std::string& problems_dir, const std::string& owner)
      : log(MakeLogger("coordinator-test", spdlog::level::err)),
        manager(store, queue, ReplayMutator, clock, log,
                {.owner = owner, .max_running = 4, .slots = 2, .lease_seconds = 2, .scan_seconds = 0.1}),
        api(store, queue, manager, {.problems_dir = problems_dir}),
        auth(store, /*required=*/true),
        service(api, auth, /*watch_poll_seconds=*/0.05) {
    auto started = StartGrpcServer("127.0.0.1:0", {&service});
    EXPECT_TRUE(started.ok()) << started.status();
    if (started.ok()) server = *std::move(started);
    manager.Start();
  }
  ~Coordinator() {
    manager.Stop();
    if (server.server) server.server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  }
  std::unique_ptr<v1::CoordinatorService::Stub> Stub() const {
    return v1::CoordinatorService::NewStub(
        grpc::CreateChannel(absl::StrCat("127.0.0.1:", server.port), grpc::InsecureChannelCredentials()));
  }

  Logger log;
  JobManager manager;
  JobApi api;
  Authenticator auth;
  CoordinatorServiceImpl service;
  StartedServer server;
};

class CoordinatorServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    folder_ = testing::WriteSynthReplayProblem(dir_);
    for (const auto& entry : std::filesystem::directory_iterator(folder_)) {
      std::ifstream in(entry.path(), std::ios::binary);
      files_[entry.path().filename().string()] = std::string(std::istreambuf_iterator<char>(in), {});
    }
    token_a_ = MakeTenant("team-a", false);
    token_b_ = MakeTenant("team-b", false);
    auto worker_key = MintApiKey("team-a", "worker", /*service=*/true);
    ASSERT_TRUE(worker_key.ok());
    ASSERT_TRUE(store_.CreateApiKey(worker_key->record).ok());
    service_token_ = worker_key->token;
    coordinator_ = std::make_unique<Coordinator>(store_, queue_, clock_, dir_.path() + "/problems", "coord-1");
    stub_ = coordinator_->Stub();
    StartWorkers(2);
  }
  void TearDown() override {
    coordinator_.reset();
    workers_stop_ = true;
    queue_.Close();
    for (auto& t : workers_) t.join();
  }

  std::string MakeTenant(const std::string& name, bool service) {
    v1::Tenant t;
    t.set_name(name);
    EXPECT_TRUE(store_.CreateTenant(t).ok());
    auto k = MintApiKey(name, "test", service);
    EXPECT_TRUE(k.ok());
    EXPECT_TRUE(store_.CreateApiKey(k->record).ok());
    return k->token;
  }

  void StartWorkers(int n) {
    for (int i = 0; i < n; ++i) {
      evaluators_.push_back(std::make_unique<worker::Evaluator>(worker::EvaluatorOptions{}, clock_, log_));
      worker::Evaluator* ev = evaluators_.back().get();
      workers_.emplace_back([this, ev, i] {
        v1::Problem p;
        p.set_backend(v1::BACKEND_REPLAY);
        worker::QueueWorker w(queue_, *ev, StreamFor(p), absl::StrCat("w", i), log_);
        w.Run(workers_stop_);
      });
    }
  }

  static std::unique_ptr<grpc::ClientContext> Ctx(const std::string& token) {
    auto ctx = std::make_unique<grpc::ClientContext>();
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    if (!token.empty()) ctx->AddMetadata("authorization", "Bearer " + token);
    return ctx;
  }

  v1::SubmitJobRequest Request(int64_t budget, const std::string& key = "") {
    v1::SubmitJobRequest req;
    for (const auto& [name, bytes] : files_) (*req.mutable_problem_files())[name] = bytes;
    req.mutable_spec()->mutable_budget()->set_max_candidates(budget);
    req.mutable_spec()->set_seed(7);
    req.set_idempotency_key(key);
    return req;
  }

  grpc::Status Submit(const std::string& token, const v1::SubmitJobRequest& req, v1::Job* job) {
    v1::SubmitJobResponse resp;
    grpc::Status st = stub_->SubmitJob(Ctx(token).get(), req, &resp);
    *job = resp.job();
    return st;
  }

  // Reads the watch stream to its end; returns the events and the final status.
  std::pair<std::vector<v1::JobEvent>, grpc::Status> Watch(const std::string& token, const std::string& job_id,
                                                           int64_t from = 0) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    ctx.AddMetadata("authorization", "Bearer " + token);
    v1::WatchJobRequest req;
    req.set_job_id(job_id);
    req.set_from_sequence(from);
    auto reader = stub_->WatchJob(&ctx, req);
    std::vector<v1::JobEvent> events;
    v1::JobEvent e;
    while (reader->Read(&e)) events.push_back(e);
    return {events, reader->Finish()};
  }

  void ExpectOneEvaluationPerCandidate(const std::string& job_id) {
    testing::ExpectOneEvaluationPerCandidate(store_, job_id);
  }

  testing::TempDir dir_;
  std::string folder_;
  std::map<std::string, std::string> files_;
  RealClock clock_;
  MemoryStore store_;
  MemoryWorkQueue queue_{clock_, WorkQueueOptions{.lease_seconds = 5}};
  Logger log_ = MakeLogger("coordinator-test", spdlog::level::err);
  std::string token_a_, token_b_, service_token_;
  std::unique_ptr<Coordinator> coordinator_;
  std::unique_ptr<v1::CoordinatorService::Stub> stub_;
  std::vector<std::unique_ptr<worker::Evaluator>> evaluators_;
  std::vector<std::thread> workers_;
  std::atomic<bool> workers_stop_{false};
};

TEST_F(CoordinatorServiceTest, ASubmittedJobRunsToItsBudgetAndTheWatchStreamFollowsIt) {
  v1::Job job;
  ASSERT_TRUE(Submit(token_a_, Request(25), &job).ok());
  EXPECT_EQ(job.spec().tenant(), "team-a");
  EXPECT_EQ(job.state(), v1::JOB_STATE_QUEUED);
  auto [events, st] = Watch(token_a_, job.id());
  ASSERT_TRUE(st.ok()) << st.error_message();
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back().state_changed(), v1::JOB_STATE_COMPLETED);
  for (size_t i = 1; i < events.size(); ++i) EXPECT_EQ(events[i].sequence(), events[i - 1].sequence() + 1);
  v1::Job done;
  ASSERT_TRUE(stub_->GetJob(Ctx(token_a_).get(), [&] {
                      v1::GetJobRequest r;
                      r.set_job_id(job.id());
                      return r;
                    }(), &done)
                  .ok());
  EXPECT_EQ(done.state(), v1::JOB_STATE_COMPLETED);
  EXPECT_EQ(done.progress().evaluations(), 25);
  ExpectOneEvaluationPerCandidate(job.id());
  // A watcher that lost the stream resumes from the last sequence it saw + 1.
  auto [rest, st2] = Watch(token_a_, job.id(), events[events.size() - 2].sequence() + 1);
  ASSERT_TRUE(st2.ok());
  ASSERT_EQ(rest.size(), 1u);
  EXPECT_EQ(rest[0].sequence(), events.back().sequence());
  // The best, with its source.
  v1::GetBestRequest br;
  br.set_job_id(job.id());
  v1::GetBestResponse best;
  ASSERT_TRUE(stub_->GetBest(Ctx(token_a_).get(), br, &best).ok());
  EXPECT_EQ(best.best().result().outcome(), v1::OUTCOME_OK);
  EXPECT_NEAR(best.best().result().speedup(), done.progress().best_speedup(), 1e-9);
}

TEST_F(CoordinatorServiceTest, ATenantSeesOnlyItsOwnJobs) {
  v1::Job job;
  ASSERT_TRUE(Submit(token_a_, Request(5), &job).ok());
  v1::GetJobRequest get;
  get.set_job_id(job.id());
  v1::Job out;
  EXPECT_EQ(stub_->GetJob(Ctx(token_b_).get(), get, &out).error_code(), grpc::StatusCode::NOT_FOUND);
  v1::CancelJobRequest cancel;
  cancel.set_job_id(job.id());
  EXPECT_EQ(stub_->CancelJob(Ctx(token_b_).get(), cancel, &out).error_code(), grpc::StatusCode::NOT_FOUND);
  v1::ListCandidatesRequest lc;
  lc.set_job_id(job.id());
  v1::ListCandidatesResponse cands;
  EXPECT_EQ(stub_->ListCandidates(Ctx(token_b_).get(), lc, &cands).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(Watch(token_b_, job.id()).second.error_code(), grpc::StatusCode::NOT_FOUND);
  v1::ListJobsResponse list_b, list_a;
  ASSERT_TRUE(stub_->ListJobs(Ctx(token_b_).get(), v1::ListJobsRequest(), &list_b).ok());
  EXPECT_EQ(list_b.jobs_size(), 0);
  ASSERT_TRUE(stub_->ListJobs(Ctx(token_a_).get(), v1::ListJobsRequest(), &list_a).ok());
  ASSERT_EQ(list_a.jobs_size(), 1);
  EXPECT_EQ(list_a.jobs(0).id(), job.id());
}

TEST_F(CoordinatorServiceTest, MissingWrongAndServiceTokensAreRefused) {
  v1::Job job;
  EXPECT_EQ(Submit("", Request(5), &job).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(Submit("kf_000000000000_deadbeef", Request(5), &job).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(Submit("not-a-token", Request(5), &job).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(Submit(service_token_, Request(5), &job).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  auto jobs = store_.ListJobs({});
  ASSERT_TRUE(jobs.ok());
  EXPECT_TRUE(jobs->empty());
  // A revoked key stops working at once.
  auto keys = store_.ListApiKeys("team-b");
  ASSERT_TRUE(keys.ok() && !keys->empty());
  ASSERT_TRUE(store_.RevokeApiKey(keys->front().id()).ok());
  EXPECT_EQ(Submit(token_b_, Request(5), &job).error_code(), grpc::StatusCode::UNAUTHENTICATED);
}

// A problem whose reference is a PyTorch module (FILE) writing OUTPUT.
std::string TorchYaml(const std::string& file, const std::string& output) {
  return "name: t\nbackend: opencl\nsizes: {n: 64}\nbuffers:\n"
         "  x: {dtype: f32, shape: [n], role: in, fill: \"uniform(0, 1)\"}\n"
         "  out: {dtype: f32, shape: [n], role: out}\ncheck: {atol: 0.001, rtol: 0.001}\n"
         "reference:\n  pytorch: " + file + "\n  inputs: [x]\n  outputs: [" + output + "]\n";
}

TEST_F(CoordinatorServiceTest, CraftedProblemsAreRefusedWithTheReasonAndNothingDies) {
  struct Case {
    std::map<std::string, std::string> files;
    std::string says;
  };
  const std::vector<Case> cases = {
      {{}, "problem_files is empty"},
      {{{"seed.cl", "x"}}, "no problem.yaml"},
      {{{"problem.yaml", "name: [unclosed"}}, "problem.yaml"},
      {{{"problem.yaml", files_["problem.yaml"]}, {"../escape.cl", "x"}}, "leaves its folder"},
      {{{"problem.yaml", files_["problem.yaml"]}, {"/etc/passwd", "x"}}, "bad file name"},
      {{{"problem.yaml", "name: x\nbackend: opencl\nsizes: {N: 99999999999999999999}\n"}}, "problem.yaml"},
      {{{"problem.yaml", "name: x\nbackend: replay\nreplay: {cache: /etc/shadow}\n"}}, ""},
      {{{"problem.yaml", std::string(1000, '\x01')}}, "problem.yaml"},
      // PyTorch references: a host path, a module that is not there, outputs naming no buffer.
      {{{"problem.yaml", TorchYaml("/etc/passwd", "out")}}, "/etc/passwd"},
      {{{"problem.yaml", TorchYaml("model.py", "out")}}, "model.py"},
      {{{"problem.yaml", TorchYaml("model.py", "nope")}, {"model.py", "class Model: pass\n"}}, "nope"},
  };
  for (const auto& c : cases) {
    v1::SubmitJobRequest req = Request(5);
    req.clear_problem_files();
    for (const auto& [n, b] : c.files) (*req.mutable_problem_files())[n] = b;
    v1::Job job;
    grpc::Status st = Submit(token_a_, req, &job);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.says << ": " << st.error_message();
    EXPECT_THAT(st.error_message(), HasSubstr(c.says));
  }
  // Still serving.
  v1::Job job;
  ASSERT_TRUE(Submit(token_a_, Request(5), &job).ok());
  EXPECT_TRUE(Watch(token_a_, job.id()).second.ok());
}

TEST_F(CoordinatorServiceTest, OutOfBoundsSpecsAreRefusedAtSubmitNamingTheField) {
  v1::SubmitJobRequest islands = Request(5);
  islands.mutable_spec()->mutable_evolution()->set_islands(2147483647);
  v1::SubmitJobRequest nan_wall = Request(0);
  nan_wall.mutable_spec()->mutable_budget()->set_max_wall_seconds(std::nan(""));
  v1::SubmitJobRequest priority = Request(5);
  priority.mutable_spec()->set_priority(-2147483647 - 1);
  for (const auto& [req, field] : std::vector<std::pair<v1::SubmitJobRequest, std::string>>{
           {islands, "evolution.islands"}, {nan_wall, "budget.max_wall_seconds"}, {priority, "priority"}}) {
    v1::Job job;
    const grpc::Status st = Submit(token_a_, req, &job);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << field;
    EXPECT_THAT(st.error_message(), HasSubstr(field));
  }
  auto jobs = store_.ListJobs({});
  ASSERT_TRUE(jobs.ok());
  EXPECT_TRUE(jobs->empty());
}

// A submitted problem carries its files and names no host path: a replay cache outside the
// submitted files is refused before any file is looked at, whether it exists or not, and nothing
// a refused submit sent stays on the coordinator's disk.
TEST_F(CoordinatorServiceTest, ASubmittedProblemNamesNoHostPathAndARefusedOneLeavesNothing) {
  const std::string problems = dir_.path() + "/problems";
  auto entries = [&] {
    std::set<std::string> out;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(problems, ec)) out.insert(e.path().filename().string());
    return out;
  };
  const std::set<std::string> before = entries();
  std::vector<std::string> messages;
  for (const std::string cache : {"/etc/shadow", "/etc/no-such-file", "../../../etc/passwd", "cache.json/../../x"}) {
    v1::SubmitJobRequest req = Request(5);
    (*req.mutable_problem_files())["problem.yaml"] =
        absl::StrCat("name: hostile\nbackend: replay\nreplay: {cache: \"", cache, "\"}\n");
    v1::Job job;
    const grpc::Status st = Submit(token_a_, req, &job);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << cache;
    EXPECT_THAT(st.error_message(), HasSubstr("must name a file of the problem folder"));
    std::string m = st.error_message();
    if (size_t at = m.find(cache); at != std::string::npos) m.erase(at, cache.size());
    messages.push_back(m);
  }
  // An existing host file and a missing one read alike.
  EXPECT_EQ(messages[0], messages[1]);
  // A source that leaves the folder, and a submit the loader refuses for its size: gone again.
  v1::SubmitJobRequest big = Request(5);
  (*big.mutable_problem_files())["problem.yaml"] = "name: big\nbackend: replay\nreplay: {cache: cache.json}\n";
  (*big.mutable_problem_files())["cache.json"] = std::string(3 << 20, '{');
  v1::Job job;
  EXPECT_EQ(Submit(token_a_, big, &job).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(entries(), before);
  // An accepted replay problem is kept for the workers, under its content's name.
  ASSERT_TRUE(Submit(token_a_, Request(5), &job).ok());
  EXPECT_EQ(entries().size(), before.size() + 1);
  EXPECT_THAT(job.spec().problem().replay().cache_path(), HasSubstr(problems));
}

TEST_F(CoordinatorServiceTest, CancelIsFinalAndStopsTheJob) {
  v1::Job job;
  ASSERT_TRUE(Submit(token_a_, Request(100000), &job).ok());
  for (int i = 0; i < 200 && store_.ListEvaluations(job.id())->size() < 5; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  v1::CancelJobRequest cancel;
  cancel.set_job_id(job.id());
  cancel.set_reason("enough");
  v1::Job out;
  ASSERT_TRUE(stub_->CancelJob(Ctx(token_a_).get(), cancel, &out).ok());
  EXPECT_EQ(out.state(), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(out.state_reason(), "cancelled by user: enough");
  auto [events, st] = Watch(token_a_, job.id());
  ASSERT_TRUE(st.ok()) << st.error_message();
  // The runner stops within its store check; its count stays put after that.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  for (int i = 0; i < 100 && coordinator_->manager.RunningHere() > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(coordinator_->manager.RunningHere(), 0);
  const size_t evaluated = store_.ListEvaluations(job.id())->size();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(store_.ListEvaluations(job.id())->size(), evaluated);
  auto stored = store_.GetJob(job.id());
  ASSERT_TRUE(stored.ok());
  EXPECT_EQ(stored->state(), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(stored->state_reason(), "cancelled by user: enough");
}

TEST_F(CoordinatorServiceTest, ARetriedSubmitWithTheSameKeyGetsTheSameJob) {
  v1::Job a, b, c;
  ASSERT_TRUE(Submit(token_a_, Request(5, "retry-1"), &a).ok());
  ASSERT_TRUE(Submit(token_a_, Request(5, "retry-1"), &b).ok());
  ASSERT_TRUE(Submit(token_b_, Request(5, "retry-1"), &c).ok());
  EXPECT_EQ(a.id(), b.id());
  EXPECT_NE(a.id(), c.id()) << "keys are per tenant";
}

TEST_F(CoordinatorServiceTest, ARestartedCoordinatorResumesTheJobsThatWereRunning) {
  v1::Job job;
  ASSERT_TRUE(Submit(token_a_, Request(60), &job).ok());
  for (int i = 0; i < 200 && store_.ListEvaluations(job.id())->size() < 10; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  coordinator_.reset();  // a clean shutdown: its jobs are interrupted, their leases released
  auto stopped = store_.GetJob(job.id());
  ASSERT_TRUE(stopped.ok());
  EXPECT_EQ(stopped->state(), v1::JOB_STATE_INTERRUPTED);
  coordinator_ = std::make_unique<Coordinator>(store_, queue_, clock_, dir_.path() + "/problems", "coord-2");
  stub_ = coordinator_->Stub();
  auto [events, st] = Watch(token_a_, job.id());
  ASSERT_TRUE(st.ok()) << st.error_message();
  auto done = store_.GetJob(job.id());
  ASSERT_TRUE(done.ok());
  EXPECT_EQ(done->state(), v1::JOB_STATE_COMPLETED) << done->state_reason();
  EXPECT_EQ(done->progress().evaluations(), 60);
  ExpectOneEvaluationPerCandidate(job.id());
}

}  // namespace
}  // namespace kforge::coordinator
