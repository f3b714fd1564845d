// kforge-llm-proxy over gRPC: the service in-process with a real client, and the real binaries
// (kforge run --llm-proxy against a running kforge-llm-proxy).

#include <signal.h>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <set>
#include <vector>

#include "common/kt_cache.h"
#include "common/launch.h"
#include "common/param_space.h"
#include "common/problem_loader.h"
#include "common/server_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/llm-proxy/parametric_mutator.h"
#include "services/llm-proxy/client/remote_mutator.h"
#include "services/llm-proxy/proxy_service.h"
#include "tests/integration/replay_fixture.h"
#include "tests/testutil/background_process.h"
#include "tests/testutil/subprocess.h"
#include "tests/testutil/temp_dir.h"

namespace kforge::llm {
namespace {

// kforge-llm-proxy on free loopback ports, its config in `dir`.
std::unique_ptr<testing::BackgroundProcess> StartProxy(const testing::TempDir& dir) {
  return std::make_unique<testing::BackgroundProcess>(
      testing::BinaryDir() + "/services/llm-proxy/kforge-llm-proxy",
      std::vector<std::string>{"--config", dir.Write("proxy.yaml", "server: {listen: \"127.0.0.1:0\", "
                                                                   "metrics_listen: \"127.0.0.1:0\"}\n")});
}

// Reads the "listening grpc=P metrics=M" line a service prints once it serves.
void WaitForPorts(testing::BackgroundProcess& proc, int* grpc_port) {
  const std::string line = proc.WaitForLine("listening ", 30);
  ASSERT_FALSE(line.empty()) << "the proxy did not start";
  int metrics_port = 0;
  ASSERT_EQ(std::sscanf(line.c_str(), "listening grpc=%d metrics=%d", grpc_port, &metrics_port), 2) << line;
}

TEST(LlmProxyServiceTest, RemoteMutationsHonourTheSeenHashes) {
  auto problem = LoadProblem(testing::SourceDir() + "/examples/opencl/matmul");
  ASSERT_TRUE(problem.ok()) << problem.status();
  ParametricMutator parametric;
  LlmProxyServiceImpl service(parametric);
  auto server = StartGrpcServer("127.0.0.1:0", {&service});
  ASSERT_TRUE(server.ok()) << server.status();
  RemoteMutator remote(grpc::CreateChannel("127.0.0.1:" + std::to_string(server->port), grpc::InsecureChannelCredentials()),
                       10);
  EXPECT_TRUE(remote.WantsSeenHashes());
  auto space = ParamSpace::Create(*problem);
  v1::Candidate seed = MakeSeedCandidate(*problem, *space->DefaultAssignment());
  seed.set_id("seed");
  std::set<std::string> seen = {seed.content_hash()};
  for (int i = 0; i < 15; ++i) {
    v1::MutateRequest req;
    *req.mutable_problem() = *problem;
    *req.add_parents()->mutable_candidate() = seed;
    req.set_seed(static_cast<uint64_t>(i + 1));
    for (const auto& h : seen) req.add_seen_hashes(h);
    auto r = remote.Mutate(req, [&](const std::string& h) { return seen.contains(h); });
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->children_size(), 1) << r->message();
    const auto& c = r->children(0);
    EXPECT_FALSE(seen.contains(c.content_hash())) << "re-proposed a seen candidate";
    auto valid = space->IsValid(ParamAssignment(c.params().begin(), c.params().end()));
    EXPECT_TRUE(valid.ok() && *valid);
    seen.insert(c.content_hash());
  }
  server->server->Shutdown();
}

// Counts the requests that carried a replay space's configurations.
class SpaceCountingMutator final : public CancellableMutator {
 public:
  explicit SpaceCountingMutator(CancellableMutator& inner) : inner_(inner) {}
  absl::StatusOr<v1::MutateResponse> MutateCancellable(const v1::MutateRequest& request, const SeenFn& seen,
                                                       const CancelledFn& cancelled) override {
    if (request.replay_space().configurations_size() > 0) ++with_configurations;
    if (!request.replay_space().key().empty()) ++with_key;
    return inner_.MutateCancellable(request, seen, cancelled);
  }
  std::atomic<int> with_configurations{0};
  std::atomic<int> with_key{0};

 private:
  CancellableMutator& inner_;
};

// The proxy has no copy of a replay problem's cache: the recorded configurations cross once per
// proxy and space, by key after that, and the parametric mutator proposes only those.
TEST(LlmProxyServiceTest, AReplayProblemsRecordedSpaceCrossesOnceAndBoundsTheProposals) {
  testing::TempDir dir;
  auto problem = LoadProblem(testing::WriteSynthReplayProblem(dir));
  ASSERT_TRUE(problem.ok()) << problem.status();
  auto cache = LoadKtCache(problem->replay().cache_path(), problem->replay().cache_file());
  ASSERT_TRUE(cache.ok()) << cache.status();
  ParametricMutator parametric;
  SpaceCountingMutator counting(parametric);
  LlmProxyServiceImpl service(counting);
  auto server = StartGrpcServer("127.0.0.1:0", {&service});
  ASSERT_TRUE(server.ok()) << server.status();
  auto space = ParamSpace::Create(*problem);
  ASSERT_TRUE(space.ok()) << space.status();
  v1::Candidate seed = MakeSeedCandidate(*problem, *space->DefaultAssignment());
  seed.set_id("seed");
  int children = 0;
  for (int coordinator = 0; coordinator < 2; ++coordinator) {  // a second caller finds the space held
    RemoteMutator remote(
        grpc::CreateChannel("127.0.0.1:" + std::to_string(server->port), grpc::InsecureChannelCredentials()), 10);
    for (int i = 0; i < 20; ++i) {
      v1::MutateRequest req;
      *req.mutable_problem() = *problem;
      *req.add_parents()->mutable_candidate() = seed;
      req.set_seed(static_cast<uint64_t>(100 * coordinator + i + 1));
      req.set_strategy("global");  // wide random samples: unrecorded points would show up
      req.set_count(64);
      auto r = remote.Mutate(req, [](const std::string&) { return false; });
      ASSERT_TRUE(r.ok()) << r.status();
      for (const auto& c : r->children()) {
        const ParamAssignment a(c.params().begin(), c.params().end());
        EXPECT_TRUE(cache->Records(a)) << "proposed an unrecorded configuration " << FormatParams(a);
        ++children;
      }
    }
  }
  EXPECT_GT(children, 1000);
  EXPECT_EQ(counting.with_configurations.load(), 1);
  EXPECT_EQ(counting.with_key.load(), 41);  // 40 mutations, and the one the proxy asked to resend

  // A key that does not match its configurations is refused, naming the field.
  auto stub = v1::LlmProxyService::NewStub(
      grpc::CreateChannel("127.0.0.1:" + std::to_string(server->port), grpc::InsecureChannelCredentials()));
  v1::MutateRequest bad;
  *bad.mutable_problem() = *problem;
  *bad.add_parents()->mutable_candidate() = seed;
  bad.mutable_replay_space()->set_key(std::string(64, 'a'));
  for (const auto& p : cache->keys) bad.mutable_replay_space()->add_params(p);
  bad.mutable_replay_space()->add_configurations("1,32,0");
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::MutateResponse resp;
  grpc::Status st = stub->Mutate(&ctx, bad, &resp);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(st.error_message(), ::testing::HasSubstr("replay_space.key"));
  server->server->Shutdown();
}

TEST(LlmProxyServiceTest, KforgeRunAgainstARunningProxy) {
  testing::TempDir dir;
  std::unique_ptr<testing::BackgroundProcess> proxy = StartProxy(dir);
  int grpc_port = 0;
  ASSERT_NO_FATAL_FAILURE(WaitForPorts(*proxy, &grpc_port));
  auto r = testing::RunProgram(testing::BinaryDir() + "/cli/kforge",
                               {"run", testing::SourceDir() + "/examples/replay/pnpoly", "--budget", "15", "--llm-proxy",
                                "127.0.0.1:" + std::to_string(grpc_port), "--db", dir.path() + "/k.db", "--out",
                                dir.path() + "/out"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, ::testing::HasSubstr("remote kforge-llm-proxy"));
  EXPECT_THAT(r.out, ::testing::HasSubstr("15 evaluations"));
}

TEST(LlmProxyServiceTest, SigtermStopsTheProxyWhileACallIsUnderWay) {
  testing::TempDir dir;
  std::unique_ptr<testing::BackgroundProcess> proxy = StartProxy(dir);
  int grpc_port = 0;
  ASSERT_NO_FATAL_FAILURE(WaitForPorts(*proxy, &grpc_port));

  // Calls that run for seconds each: 4.1M points to scan under a constraint nothing meets.
  auto problem = LoadProblem(testing::SourceDir() + "/examples/opencl/matmul");
  ASSERT_TRUE(problem.ok()) << problem.status();
  v1::MutateRequest req;
  *req.mutable_problem() = *problem;
  v1::KernelSpec* seed = req.mutable_problem()->mutable_seed();
  seed->clear_params();
  seed->clear_constraints();
  v1::Candidate* parent = req.add_parents()->mutable_candidate();
  parent->set_source(problem->seed().source());
  for (const char* name : {"X", "Y", "Z"}) {
    v1::Param* p = seed->add_params();
    p->set_name(name);
    for (int v = 1; v <= 160; ++v) p->add_values(v);
    (*parent->mutable_params())[name] = 1;
  }
  seed->add_constraints("X < 0");
  req.set_strategy("explore");
  auto stub = v1::LlmProxyService::NewStub(
      grpc::CreateChannel("127.0.0.1:" + std::to_string(grpc_port), grpc::InsecureChannelCredentials()));
  std::vector<std::future<grpc::Status>> calls;
  for (int i = 0; i < 4; ++i) {
    calls.push_back(std::async(std::launch::async, [&] {
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
      v1::MutateResponse resp;
      return stub->Mutate(&ctx, req, &resp);
    }));
  }
  for (auto& c : calls) {
    EXPECT_EQ(c.wait_for(std::chrono::milliseconds(500)), std::future_status::timeout) << "a call ended early";
  }

  const pid_t pid = proxy->pid();
  const auto start = std::chrono::steady_clock::now();
  ASSERT_EQ(kill(pid, SIGTERM), 0);
  auto exited = std::async(std::launch::async, [&] { return proxy->Wait(); });
  if (exited.wait_for(std::chrono::seconds(3)) != std::future_status::ready) {
    ADD_FAILURE() << "the proxy still runs 3 s after SIGTERM";
    kill(pid, SIGKILL);
  }
  EXPECT_EQ(exited.get(), 0);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(3));
  for (auto& c : calls) {
    ASSERT_EQ(c.wait_for(std::chrono::seconds(5)), std::future_status::ready);
    const grpc::Status s = c.get();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
  }
}

}  // namespace
}  // namespace kforge::llm
