// The worker's gRPC admin service end to end: a real server on a free port, a real client with
// deadlines, real evaluations (replay and OpenCL), and the metrics they leave behind.

#include <signal.h>

#include <chrono>
#include <cstdio>
#include <thread>
#include <cmath>
#include <fstream>
#include <functional>
#include <limits>

#include "common/clock.h"
#include "common/logging.h"
#include "common/problem_loader.h"
#include "common/launch.h"
#include "common/param_space.h"
#include "common/server_util.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "kforge/v1/worker.grpc.pb.h"
#include "prometheus/text_serializer.h"
#include "services/gpu-worker/worker_service.h"
#include "tests/testutil/background_process.h"
#include "tests/testutil/temp_dir.h"

namespace kforge::worker {
namespace {

constexpr char kCache[] = R"({
  "device_name": "Test GPU", "kernel_name": "k", "problem_size": [1],
  "tune_params_keys": ["BX", "U"],
  "tune_params": {"BX": [32, 64, 128], "U": [1, 2]},
  "objective": "time",
  "cache": {
    "32,1": {"BX": 32, "U": 1, "time": 4.0},
    "32,2": {"BX": 32, "U": 2, "time": 3.0},
    "64,1": {"BX": 64, "U": 1, "time": 2.0},
    "64,2": {"BX": 64, "U": 2, "time": "CompilationFailedConfig"},
    "128,1": {"BX": 128, "U": 1, "time": "RuntimeFailedConfig"}
  }
})";

class WorkerServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_.Write("replay/problem.yaml", "name: tiny-replay\nbackend: replay\nreplay: {cache: cache.json}\n");
    dir_.Write("replay/cache.json", kCache);
    auto p = LoadProblem(dir_.path() + "/replay");
    ASSERT_TRUE(p.ok()) << p.status();
    problem_ = *p;
    EvaluatorOptions eo;
    eo.sandbox.binary = testing::BinaryDir() + "/services/gpu-worker/kforge-sandbox";
    eo.min_samples = 3;
    eo.min_bench_seconds = 0.001;
    evaluator_ = std::make_unique<Evaluator>(eo, clock_, MakeLogger("worker-test", spdlog::level::warn));
    core_ = std::make_unique<WorkerCore>(WorkerCoreOptions{.worker_id = "w1", .slots = 2}, *evaluator_,
                                         *registry_, MakeLogger("worker-test", spdlog::level::warn));
    core_->ProbeBackends();
    service_ = std::make_unique<WorkerAdminServiceImpl>(*core_);
    auto server = StartGrpcServer("127.0.0.1:0", {service_.get()});
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(server->server);
    auto channel = grpc::CreateChannel("127.0.0.1:" + std::to_string(server->port), grpc::InsecureChannelCredentials());
    stub_ = v1::WorkerAdminService::NewStub(channel);
  }
  void TearDown() override {
    if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  }

  v1::EvaluationRequest Replay(int64_t bx, int64_t u) {
    v1::EvaluationRequest req;
    *req.mutable_problem() = problem_;
    auto* c = req.mutable_candidate();
    c->set_id("c");
    (*c->mutable_params())["BX"] = bx;
    (*c->mutable_params())["U"] = u;
    return req;
  }

  grpc::Status Call(const v1::EvaluationRequest& req, v1::EvaluationResult* out) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    return stub_->Evaluate(&ctx, req, out);
  }

  testing::TempDir dir_;
  v1::Problem problem_;
  RealClock clock_;
  std::shared_ptr<prometheus::Registry> registry_ = std::make_shared<prometheus::Registry>();
  std::unique_ptr<Evaluator> evaluator_;
  std::unique_ptr<WorkerCore> core_;
  std::unique_ptr<WorkerAdminServiceImpl> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::WorkerAdminService::Stub> stub_;
};

TEST_F(WorkerServiceTest, ReplayOutcomesFollowTheRecording) {
  v1::EvaluationResult r;
  ASSERT_TRUE(Call(Replay(64, 1), &r).ok());
  EXPECT_EQ(r.outcome(), v1::OUTCOME_OK);
  // Default assignment (BX=32, U=1) is the reference: 4 ms / 2 ms.
  EXPECT_DOUBLE_EQ(r.speedup(), 2.0);
  EXPECT_EQ(r.worker_id(), "local");
  ASSERT_TRUE(Call(Replay(64, 2), &r).ok());
  EXPECT_EQ(r.outcome(), v1::OUTCOME_COMPILE_ERROR);
  ASSERT_TRUE(Call(Replay(128, 1), &r).ok());
  EXPECT_EQ(r.outcome(), v1::OUTCOME_LAUNCH_ERROR);
  ASSERT_TRUE(Call(Replay(128, 2), &r).ok());  // absent from the recording
  EXPECT_EQ(r.outcome(), v1::OUTCOME_REJECTED);
  ASSERT_TRUE(Call(Replay(16, 1), &r).ok());  // not a declared value
  EXPECT_EQ(r.outcome(), v1::OUTCOME_REJECTED);
}

TEST_F(WorkerServiceTest, InfoDrainAndMetrics) {
  v1::EvaluationResult r;
  ASSERT_TRUE(Call(Replay(64, 1), &r).ok());
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::WorkerInfo info;
  ASSERT_TRUE(stub_->GetInfo(&ctx, v1::GetInfoRequest(), &info).ok());
  EXPECT_EQ(info.worker_id(), "w1");
  EXPECT_EQ(info.slots(), 2);
  EXPECT_EQ(info.evaluations_total(), 1);
  bool has_replay = false;
  for (const auto& d : info.devices()) has_replay = has_replay || d.backend() == v1::BACKEND_REPLAY;
  EXPECT_TRUE(has_replay);
  // No NVIDIA driver here: CUDA must be reported as unavailable with a reason, not crash.
  bool cuda_listed = false;
  for (const auto& d : info.devices()) cuda_listed = cuda_listed || d.backend() == v1::BACKEND_CUDA;
  for (const auto& u : info.unavailable_backends()) cuda_listed = cuda_listed || u.rfind("cuda: ", 0) == 0;
  EXPECT_TRUE(cuda_listed);

  const std::string text = prometheus::TextSerializer().Serialize(registry_->Collect());
  EXPECT_NE(text.find("kforge_worker_evaluations_total{backend=\"replay\",outcome=\"ok\"} 1"), std::string::npos) << text;
  EXPECT_NE(text.find("kforge_worker_stage_duration_seconds_bucket"), std::string::npos);

  grpc::ClientContext dctx;
  dctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::DrainResponse dr;
  ASSERT_TRUE(stub_->Drain(&dctx, v1::DrainRequest(), &dr).ok());
  grpc::Status st = Call(Replay(64, 1), &r);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAVAILABLE);
}

TEST_F(WorkerServiceTest, OpenClExampleOverGrpc) {
  if (evaluator_->Probe(v1::BACKEND_OPENCL).available() == false) GTEST_SKIP() << "no OpenCL device";
  auto p = LoadProblem(testing::SourceDir() + "/examples/opencl/transpose");
  ASSERT_TRUE(p.ok()) << p.status();
  v1::EvaluationRequest req;
  *req.mutable_problem() = *p;
  auto space = ParamSpace::Create(*p);
  *req.mutable_candidate() = MakeSeedCandidate(*p, *space->DefaultAssignment());
  v1::EvaluationResult r;
  ASSERT_TRUE(Call(req, &r).ok());
  EXPECT_EQ(r.outcome(), v1::OUTCOME_OK) << r.message();
  EXPECT_GT(r.speedup(), 0);

  // What crossed to and from the sandbox is counted per evaluation and in the metrics. The
  // first evaluation sends every input set; a second one finds them resident and sends less.
  EXPECT_GT(r.sandbox_bytes_sent(), 0);
  EXPECT_GT(r.sandbox_bytes_received(), 0);
  v1::EvaluationResult again;
  ASSERT_TRUE(Call(req, &again).ok());
  EXPECT_EQ(again.outcome(), v1::OUTCOME_OK) << again.message();
  EXPECT_LT(again.sandbox_bytes_sent(), r.sandbox_bytes_sent() / 2)
      << "inputs stay in the sandbox: " << again.sandbox_bytes_sent() << " vs "
      << r.sandbox_bytes_sent();
  const std::string text = prometheus::TextSerializer().Serialize(registry_->Collect());
  EXPECT_NE(text.find("kforge_worker_sandbox_transfer_bytes_total{backend=\"opencl\",direction="
                      "\"to_sandbox\"}"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("kforge_worker_sandbox_transfer_bytes_total{backend=\"opencl\",direction="
                      "\"from_sandbox\"}"),
            std::string::npos);
}

// Every malformed request is refused with a status that names what is wrong, and the worker
// goes on serving: no request may abort the process or hold its memory.
TEST_F(WorkerServiceTest, MalformedRequestsAreRefusedAndTheWorkerServesOn) {
  auto p = LoadProblem(testing::SourceDir() + "/examples/opencl/transpose");
  ASSERT_TRUE(p.ok()) << p.status();
  v1::EvaluationRequest good;
  *good.mutable_problem() = *p;
  *good.mutable_candidate() = MakeSeedCandidate(*p, *ParamSpace::Create(*p)->DefaultAssignment());
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  using Mutation = std::function<void(v1::EvaluationRequest&)>;
  auto shape = [](const std::vector<std::string>& dims) {
    return [dims](v1::EvaluationRequest& r) {
      auto* b = r.mutable_problem()->mutable_buffers(0);
      b->clear_shape();
      for (const auto& d : dims) b->add_shape(d);
    };
  };
  const std::vector<std::pair<std::string, Mutation>> cases = {
      {"unknown dtype", [](auto& r) { r.mutable_problem()->mutable_buffers(0)->set_dtype(static_cast<v1::DType>(99)); }},
      {"unknown role", [](auto& r) { r.mutable_problem()->mutable_buffers(0)->set_role(static_cast<v1::BufferRole>(42)); }},
      {"unknown backend", [](auto& r) { r.mutable_problem()->set_backend(static_cast<v1::Backend>(77)); }},
      {"unknown fill", [](auto& r) { r.mutable_problem()->mutable_buffers(0)->mutable_fill()->set_kind(static_cast<v1::Fill::Kind>(9)); }},
      {"NaN fill", [nan](auto& r) { r.mutable_problem()->mutable_buffers(0)->mutable_fill()->set_a(nan); }},
      {"shape N / 0", shape({"N / 0"})},
      {"overflowing shape", shape({"9223372036854775807", "4"})},
      {"1e9 x 1e9 shape", shape({"1000000000", "1000000000"})},
      {"2^60 elements", shape({"1152921504606846976"})},
      {"zero shape", shape({"0"})},
      {"no shape", shape({})},
      {"bad expression", shape({"N +* 2"})},
      {"NaN atol", [nan](auto& r) { r.mutable_problem()->mutable_check()->set_atol(nan); }},
      {"infinite rtol", [inf](auto& r) { r.mutable_problem()->mutable_check()->set_rtol(inf); }},
      {"negative atol", [](auto& r) { r.mutable_problem()->mutable_check()->set_atol(-1); }},
      {"a million trials", [](auto& r) { r.mutable_problem()->mutable_check()->set_trials(1000000); }},
      {"timeout 1e300", [](auto& r) { r.set_timeout_seconds(1e300); }},
      {"timeout 1e6", [](auto& r) { r.set_timeout_seconds(1e6); }},
      {"NaN timeout", [nan](auto& r) { r.set_timeout_seconds(nan); }},
      {"negative timeout", [](auto& r) { r.set_timeout_seconds(-5); }},
      {"no size sets", [](auto& r) { r.mutable_problem()->clear_size_sets(); }},
      {"zero size", [](auto& r) { (*r.mutable_problem()->mutable_size_sets(0)->mutable_sizes())["N"] = 0; }},
      {"no buffers", [](auto& r) { r.mutable_problem()->clear_buffers(); }},
      {"duplicate buffer", [](auto& r) { *r.mutable_problem()->add_buffers() = r.problem().buffers(0); }},
      {"30,000-character name", [](auto& r) { r.mutable_problem()->set_name(std::string(30000, 'a')); }},
      {"empty reference", [](auto& r) { r.mutable_problem()->mutable_reference()->clear_source(); }},
      {"no reference launches", [](auto& r) { r.mutable_problem()->mutable_reference()->clear_launches(); }},
      {"NaN scalar", [nan](auto& r) {
         auto* s = r.mutable_problem()->add_scalars();
         s->set_name("alpha");
         s->set_dtype(v1::DTYPE_F32);
         s->set_value(nan);
       }},
      {"param without values", [](auto& r) { r.mutable_problem()->mutable_seed()->mutable_params(0)->clear_values(); }},
      {"empty request", [](auto& r) { r.Clear(); }},
  };
  for (const auto& [name, mutate] : cases) {
    v1::EvaluationRequest req = good;
    mutate(req);
    v1::EvaluationResult r;
    grpc::Status st = Call(req, &r);
    EXPECT_FALSE(st.ok()) << name << ": accepted, outcome " << r.outcome() << " " << r.message();
    EXPECT_FALSE(st.error_message().empty()) << name;
    EXPECT_LE(st.error_message().size(), 1000u) << name;
  }
  // Still serving, with every slot free.
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::WorkerInfo info;
  ASSERT_TRUE(stub_->GetInfo(&ctx, v1::GetInfoRequest(), &info).ok());
  EXPECT_EQ(info.busy(), 0);
  if (evaluator_->Probe(v1::BACKEND_OPENCL).available()) {
    v1::EvaluationResult r;
    ASSERT_TRUE(Call(good, &r).ok());
    EXPECT_EQ(r.outcome(), v1::OUTCOME_OK) << r.message();
  }
}

// A replay cache is read only from the configured folders, and never from a device or a pipe.
TEST_F(WorkerServiceTest, ReplayCachesComeOnlyFromConfiguredFolders) {
  EvaluatorOptions eo;
  eo.replay_roots = std::vector<std::string>{dir_.path() + "/replay"};
  Evaluator restricted(eo, clock_, MakeLogger("worker-test", spdlog::level::warn));
  v1::EvaluationRequest req = Replay(32, 1);
  EXPECT_TRUE(restricted.CheckRequest(req).ok());
  for (const std::string& path : std::vector<std::string>{"/etc/passwd", "/dev/zero", dir_.path() + "/replay/../../x.json"}) {
    req.mutable_problem()->mutable_replay()->set_cache_path(path);
    absl::Status st = restricted.CheckRequest(req);
    EXPECT_TRUE(absl::IsPermissionDenied(st)) << path << ": " << st;
  }
  eo.replay_roots = std::vector<std::string>{};
  Evaluator none(eo, clock_, MakeLogger("worker-test", spdlog::level::warn));
  EXPECT_TRUE(absl::IsPermissionDenied(none.CheckRequest(Replay(32, 1))));
  // Unrestricted (the embedded run), /dev/zero is still no cache: an infra error, no crash.
  req.mutable_problem()->mutable_replay()->set_cache_path("/dev/zero");
  v1::EvaluationResult r;
  ASSERT_TRUE(Call(req, &r).ok());
  EXPECT_EQ(r.outcome(), v1::OUTCOME_INFRA_ERROR);
  EXPECT_NE(r.message().find("not a regular file"), std::string::npos) << r.message();
}

// SIGTERM while a candidate hangs for the longest timeout a request may ask: the worker drains,
// kills the sandbox after worker.drain_seconds, answers the call and exits 0.
TEST_F(WorkerServiceTest, SigtermEndsAHangingEvaluationAndTheProcess) {
  if (!evaluator_->Probe(v1::BACKEND_OPENCL).available()) GTEST_SKIP() << "no OpenCL device";
  testing::BackgroundProcess worker(
      testing::BinaryDir() + "/services/gpu-worker/kforge-gpu-worker",
      {"--config", dir_.Write("worker.yaml", "worker: {backends: opencl, drain_seconds: 1}\n")},
      {"KFORGE_WORKER_SERVER_LISTEN=127.0.0.1:0", "KFORGE_WORKER_SERVER_METRICS_LISTEN=127.0.0.1:0"});
  const std::string line = worker.WaitForLine("listening ", 30);
  ASSERT_FALSE(line.empty()) << "worker did not start";
  int grpc_port = 0, metrics_port = 0;
  ASSERT_EQ(std::sscanf(line.c_str(), "listening grpc=%d metrics=%d", &grpc_port, &metrics_port), 2) << line;
  auto stub = v1::WorkerAdminService::NewStub(
      grpc::CreateChannel("127.0.0.1:" + std::to_string(grpc_port), grpc::InsecureChannelCredentials()));

  auto p = LoadProblem(testing::SourceDir() + "/examples/opencl/transpose");
  ASSERT_TRUE(p.ok()) << p.status();
  v1::EvaluationRequest req;
  *req.mutable_problem() = *p;
  *req.mutable_candidate() = MakeSeedCandidate(*p, *ParamSpace::Create(*p)->DefaultAssignment());
  std::string source = req.candidate().source();
  const size_t body = source.find('{');
  ASSERT_NE(body, std::string::npos);
  source.insert(body + 1, "\n  for (;;) {}\n");
  req.mutable_candidate()->set_source(source);
  req.set_timeout_seconds(600);

  grpc::Status status;
  v1::EvaluationResult result;
  std::thread call([&] {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
    status = stub->Evaluate(&ctx, req, &result);
  });
  std::this_thread::sleep_for(std::chrono::seconds(3));  // compiled and spinning by now
  const auto t0 = std::chrono::steady_clock::now();
  const int rc = worker.Kill(SIGTERM);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  call.join();
  EXPECT_EQ(rc, 0);
  EXPECT_LT(seconds, 15);
  if (status.ok()) {
    EXPECT_NE(result.outcome(), v1::OUTCOME_OK);
  }
}

}  // namespace
}  // namespace kforge::worker
