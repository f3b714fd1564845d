// The llm proxy's gRPC surface under hostile input, served in-process on a free loopback port:
// malformed requests are refused with a status naming what is wrong and the server still serves
// afterwards; concurrent calls run on the pool's threads only and the surplus is refused at once;
// a huge count is refused; work whose client has gone stops.

#include <dirent.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <future>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/launch.h"
#include "common/param_space.h"
#include "common/problem_loader.h"
#include "common/server_util.h"
#include "gmock/gmock.h"
#include "grpcpp/generic/generic_stub.h"
#include "gtest/gtest.h"
#include "services/llm-proxy/parametric_mutator.h"
#include "services/llm-proxy/proxy_service.h"
#include "tests/testutil/temp_dir.h"

namespace kforge::llm {
namespace {

using ::testing::HasSubstr;

int ThreadsInThisProcess() {
  int n = 0;
  DIR* d = opendir("/proc/self/task");
  if (d == nullptr) return -1;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] != '.') ++n;
  }
  closedir(d);
  return n;
}

// The service on 127.0.0.1:0 with a client channel to it.
class InProcessProxy {
 public:
  InProcessProxy(CancellableMutator& mutator, ProxyServiceOptions options) : service_(mutator, options) {
    auto started = StartGrpcServer("127.0.0.1:0", {&service_});
    EXPECT_TRUE(started.ok()) << started.status();
    if (started.ok()) server_ = *std::move(started);
    channel_ = grpc::CreateChannel(absl::StrCat("127.0.0.1:", server_.port), grpc::InsecureChannelCredentials());
    stub_ = v1::LlmProxyService::NewStub(channel_);
  }
  ~InProcessProxy() {
    if (server_.server) server_.server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  }

  grpc::Status Mutate(const v1::MutateRequest& req, v1::MutateResponse* resp, double deadline_seconds = 30) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::milliseconds(static_cast<int64_t>(deadline_seconds * 1000)));
    return stub_->Mutate(&ctx, req, resp);
  }

  // Any method with raw bytes: what a client that does not use our protos can send.
  grpc::Status Raw(const std::string& method, const std::string& bytes, std::string* reply = nullptr) {
    grpc::GenericStub generic(channel_);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    grpc::Slice slice(bytes);
    grpc::ByteBuffer request(&slice, 1), response;
    std::promise<grpc::Status> done;
    generic.UnaryCall(&ctx, method, grpc::StubOptions(), &request, &response,
                      [&done](grpc::Status s) { done.set_value(std::move(s)); });
    grpc::Status s = done.get_future().get();
    if (reply != nullptr && s.ok()) {
      std::vector<grpc::Slice> slices;
      (void)response.Dump(&slices);
      reply->clear();
      for (const auto& sl : slices) reply->append(reinterpret_cast<const char*>(sl.begin()), sl.size());
    }
    return s;
  }

  LlmProxyServiceImpl& service() { return service_; }
  v1::LlmProxyService::Stub& stub() { return *stub_; }

 private:
  LlmProxyServiceImpl service_;  // before the server: it outlives it
  StartedServer server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::LlmProxyService::Stub> stub_;
};

v1::Problem Matmul() {
  auto problem = LoadProblem(testing::SourceDir() + "/examples/opencl/matmul");
  EXPECT_TRUE(problem.ok()) << problem.status();
  return problem.value_or(v1::Problem());
}

v1::MutateRequest GoodRequest(const v1::Problem& problem) {
  auto space = ParamSpace::Create(problem);
  EXPECT_TRUE(space.ok()) << space.status();
  v1::Candidate seed = MakeSeedCandidate(problem, space->DefaultAssignment().value_or(ParamAssignment{}));
  seed.set_id("seed");
  seed.set_job_id("job-1");
  v1::MutateRequest req;
  req.set_job_id("job-1");
  *req.mutable_problem() = problem;
  *req.add_parents()->mutable_candidate() = seed;
  req.set_seed(7);
  req.set_count(2);
  return req;
}

// Knobs of 160 values each (4.1M points, all scanned) under a constraint nothing meets: a
// request for it runs for seconds before it finds the space empty.
v1::MutateRequest SlowRequest(const v1::Problem& base) {
  v1::MutateRequest req = GoodRequest(base);
  v1::KernelSpec* seed = req.mutable_problem()->mutable_seed();
  seed->clear_params();
  seed->clear_constraints();
  for (const char* name : {"X", "Y", "Z"}) {
    v1::Param* p = seed->add_params();
    p->set_name(name);
    for (int v = 1; v <= 160; ++v) p->add_values(v);
  }
  seed->add_constraints("X < 0");
  req.mutable_problem()->set_content_hash("");
  v1::Candidate* parent = req.mutable_parents(0)->mutable_candidate();
  parent->clear_params();
  for (const char* name : {"X", "Y", "Z"}) (*parent->mutable_params())[name] = 1;
  req.set_strategy("explore");
  req.set_count(1);
  return req;
}

bool WaitFor(const std::function<bool()>& condition, double seconds) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
  while (std::chrono::steady_clock::now() < end) {
    if (condition()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return condition();
}

struct Malformed {
  std::string what;
  std::function<void(v1::MutateRequest&)> spoil;
  std::string names;  // in the status message
};

std::vector<Malformed> MalformedRequests() {
  auto param = [](v1::MutateRequest& r, int i) { return r.mutable_problem()->mutable_seed()->mutable_params(i); };
  return {
      {"no parents", [](v1::MutateRequest& r) { r.clear_parents(); }, "parents"},
      {"three parents",
       [](v1::MutateRequest& r) {
         *r.add_parents() = r.parents(0);
         *r.add_parents() = r.parents(0);
       },
       "parents"},
      {"an empty parent", [](v1::MutateRequest& r) { r.mutable_parents(0)->clear_candidate(); }, "parents[0].candidate"},
      {"a parent without source", [](v1::MutateRequest& r) { r.mutable_parents(0)->mutable_candidate()->clear_source(); },
       "parents[0].candidate.source"},
      {"no problem", [](v1::MutateRequest& r) { r.clear_problem(); }, "problem"},
      {"a knob without values", [param](v1::MutateRequest& r) { param(r, 0)->clear_values(); }, "needs 1 to 4096 values"},
      {"a knob with a million values",
       [param](v1::MutateRequest& r) {
         for (int i = 0; i < 1000000; ++i) param(r, 1)->add_values(i);
       },
       "values"},
      {"a knob declared twice", [param](v1::MutateRequest& r) { param(r, 1)->set_name(param(r, 0)->name()); },
       "already defined"},
      {"a knob without a name", [param](v1::MutateRequest& r) { param(r, 0)->clear_name(); }, "is not a valid name"},
      {"a constraint that does not parse",
       [](v1::MutateRequest& r) { r.mutable_problem()->mutable_seed()->add_constraints("TILE <= ((("); },
       "constraints[2]"},
      {"a constraint over an unknown name",
       [](v1::MutateRequest& r) { r.mutable_problem()->mutable_seed()->add_constraints("NOPE > 1"); }, "'NOPE'"},
      {"an unknown strategy", [](v1::MutateRequest& r) { r.set_strategy("rm -rf"); }, "strategy"},
      {"an unknown backend", [](v1::MutateRequest& r) { r.mutable_problem()->set_backend(static_cast<v1::Backend>(77)); },
       "problem.backend"},
      {"an unknown dtype",
       [](v1::MutateRequest& r) { r.mutable_problem()->mutable_buffers(0)->set_dtype(static_cast<v1::DType>(42)); },
       "problem.buffers[0] (A).dtype"},
      {"an unknown preferred mutator", [](v1::MutateRequest& r) { r.set_preferred(static_cast<v1::MutatorKind>(9)); },
       "preferred"},
      {"a NaN tolerance",
       [](v1::MutateRequest& r) {
         r.mutable_problem()->mutable_check()->set_atol(std::numeric_limits<double>::quiet_NaN());
       },
       "problem.check.atol"},
      {"an infinite fill",
       [](v1::MutateRequest& r) {
         r.mutable_problem()->mutable_buffers(0)->mutable_fill()->set_b(std::numeric_limits<double>::infinity());
       },
       "problem.buffers[0] (A).fill"},
      {"a huge source",
       [](v1::MutateRequest& r) { r.mutable_parents(0)->mutable_candidate()->set_source(std::string(2 << 20, 'x')); },
       "parents[0].candidate.source"},
      {"a huge count", [](v1::MutateRequest& r) { r.set_count(1000000); }, "count"},
      {"a negative count", [](v1::MutateRequest& r) { r.set_count(-5); }, "count"},
      {"more children than a response may carry",
       [](v1::MutateRequest& r) {
         r.set_count(4000);
         r.mutable_parents(0)->mutable_candidate()->set_source(std::string(512 << 10, 'x'));
       },
       "response limit"},
      {"an inspiration from another job",
       [](v1::MutateRequest& r) {
         auto* ins = r.add_inspirations();
         *ins = r.parents(0);
         ins->mutable_candidate()->set_job_id("job-2");
       },
       "inspirations[0].candidate.job_id"},
      {"an inspiration from another problem",
       [](v1::MutateRequest& r) {
         auto* ins = r.add_inspirations();
         *ins = r.parents(0);
         (*ins->mutable_candidate()->mutable_params())["BLOCK_SIZE_X"] = 32;
       },
       "'BLOCK_SIZE_X', which is not a knob"},
      {"a NaN speedup",
       [](v1::MutateRequest& r) {
         r.mutable_parents(0)->mutable_result()->set_speedup(std::numeric_limits<double>::quiet_NaN());
       },
       "parents[0].result.speedup"},
  };
}

TEST(LlmProxyHostileTest, MalformedRequestsAreRefusedAndTheServerGoesOn) {
  const v1::Problem problem = Matmul();
  ParametricMutator parametric;
  InProcessProxy proxy(parametric, {.threads = 2, .queue = 4});
  v1::MutateResponse resp;
  ASSERT_TRUE(proxy.Mutate(GoodRequest(problem), &resp).ok());
  for (const Malformed& m : MalformedRequests()) {
    SCOPED_TRACE(m.what);
    v1::MutateRequest req = GoodRequest(problem);
    m.spoil(req);
    v1::MutateResponse r;
    const grpc::Status s = proxy.Mutate(req, &r);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr(m.names));
    EXPECT_EQ(r.children_size(), 0);
  }
  // Bytes that are no MutateRequest, and a method the server does not have.
  EXPECT_FALSE(proxy.Raw("/kforge.v1.LlmProxyService/Mutate", std::string("\xff\xff\xff\xff\x0f garbage", 14)).ok());
  EXPECT_EQ(proxy.Raw("/kforge.v1.LlmProxyService/Explode", "").error_code(), grpc::StatusCode::UNIMPLEMENTED);
  // The server is still there and still right.
  v1::MutateResponse after;
  const grpc::Status s = proxy.Mutate(GoodRequest(problem), &after);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(after.children_size(), 2);
  // The worker answers before it counts itself free.
  EXPECT_TRUE(WaitFor([&] { return proxy.service().pool_stats().running == 0; }, 5));
}

TEST(LlmProxyHostileTest, TheHealthServiceRefusesMalformedRequestsAndGoesOn) {
  ParametricMutator parametric;
  InProcessProxy proxy(parametric, {.threads = 1, .queue = 1});
  const std::string method = "/grpc.health.v1.Health/Check";
  std::string reply;
  ASSERT_TRUE(proxy.Raw(method, "", &reply).ok());  // the whole server: SERVING
  EXPECT_EQ(reply, std::string("\x08\x01", 2));
  // Not a HealthCheckRequest; a service name of 1 MB; a service it does not know.
  EXPECT_FALSE(proxy.Raw(method, std::string("\x0a\xff\xff\xff\xff\x0f", 6)).ok());
  const std::string big(1 << 20, 'x');
  std::string big_request = std::string("\x0a") + "\x80\x80\x40" + big;  // field 1, length 1 MiB
  EXPECT_FALSE(proxy.Raw(method, big_request).ok());
  EXPECT_EQ(proxy.Raw(method, std::string("\x0a\x04nope", 6)).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(proxy.Raw("/grpc.health.v1.Health/Nope", "").error_code(), grpc::StatusCode::UNIMPLEMENTED);
  ASSERT_TRUE(proxy.Raw(method, "", &reply).ok());
  EXPECT_EQ(reply, std::string("\x08\x01", 2));
}

TEST(LlmProxyHostileTest, AHugeCountIsRefusedAtOnce) {
  const v1::Problem problem = Matmul();
  ParametricMutator parametric;
  InProcessProxy proxy(parametric, {.threads = 1, .queue = 0, .limits = {.max_count = 100}});
  v1::MutateRequest req = GoodRequest(problem);
  req.set_count(1000000);
  v1::MutateResponse resp;
  const auto start = std::chrono::steady_clock::now();
  const grpc::Status s = proxy.Mutate(req, &resp);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("count 1000000 is above the proxy's limit of 100"));
  req.set_count(100);  // at the limit: served
  ASSERT_TRUE(proxy.Mutate(req, &resp).ok());
  EXPECT_GT(resp.children_size(), 0);
}

// Holds every call until released (or until the call no longer wants an answer).
class GateMutator final : public CancellableMutator {
 public:
  absl::StatusOr<v1::MutateResponse> MutateCancellable(const v1::MutateRequest&, const SeenFn&,
                                                       const CancelledFn& cancelled) override {
    const int now = ++inside_;
    int peak = peak_.load();
    while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
    }
    while (!open_.load() && !cancelled()) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    --inside_;
    if (!open_.load()) return absl::CancelledError("cancelled");
    v1::MutateResponse resp;
    resp.set_message("released");
    return resp;
  }
  void Open() { open_ = true; }
  int inside() const { return inside_.load(); }
  int peak() const { return peak_.load(); }

 private:
  std::atomic<bool> open_{false};
  std::atomic<int> inside_{0};
  std::atomic<int> peak_{0};
};

TEST(LlmProxyHostileTest, ConcurrentCallsUseThePoolAndTheSurplusIsRefusedAtOnce) {
  const v1::Problem problem = Matmul();
  GateMutator gate;
  InProcessProxy proxy(gate, {.threads = 2, .queue = 3});
  const v1::MutateRequest req = GoodRequest(problem);
  // Warm the channel up, so that its own threads are counted before.
  v1::MutateResponse warm;
  (void)proxy.Mutate(req, &warm, 0.2);
  ASSERT_TRUE(WaitFor([&] { return proxy.service().pool_stats().running == 0; }, 5));
  const int threads_before = ThreadsInThisProcess();

  constexpr int kCalls = 50;
  struct Call {
    grpc::ClientContext ctx;
    v1::MutateResponse resp;
    std::promise<grpc::Status> done;
  };
  std::vector<std::unique_ptr<Call>> calls;
  std::vector<std::future<grpc::Status>> results;
  for (int i = 0; i < kCalls; ++i) {
    auto c = std::make_unique<Call>();
    c->ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    results.push_back(c->done.get_future());
    Call* raw = c.get();
    proxy.stub().async()->Mutate(&raw->ctx, &req, &raw->resp, [raw](grpc::Status s) { raw->done.set_value(std::move(s)); });
    calls.push_back(std::move(c));
  }
  // Two run, three wait, and the other 45 are refused without waiting for them.
  int refused = 0;
  ASSERT_TRUE(WaitFor(
      [&] {
        for (auto& f : results) {
          if (f.valid() && f.wait_for(std::chrono::seconds(0)) == std::future_status::ready) {
            const grpc::Status s = f.get();
            EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
            EXPECT_THAT(s.error_message(), HasSubstr("busy"));
            ++refused;
          }
        }
        return refused >= kCalls - 5;
      },
      10));
  EXPECT_EQ(refused, kCalls - 5);
  ASSERT_TRUE(WaitFor([&] { return gate.inside() == 2; }, 5));
  const WorkerPool::Stats during = proxy.service().pool_stats();
  EXPECT_EQ(during.threads, 2);
  EXPECT_EQ(during.running, 2);
  EXPECT_EQ(during.queued, 3);
  EXPECT_GE(during.rejected, kCalls - 5);
  // No thread per call: the count grows by gRPC's own few at most.
  const int threads_during = ThreadsInThisProcess();
  EXPECT_LT(threads_during - threads_before, 16) << threads_before << " -> " << threads_during;

  gate.Open();
  int served = 0;
  for (auto& f : results) {
    if (!f.valid()) continue;
    ASSERT_EQ(f.wait_for(std::chrono::seconds(10)), std::future_status::ready);
    const grpc::Status s = f.get();
    EXPECT_TRUE(s.ok()) << s.error_message();
    ++served;
  }
  EXPECT_EQ(served, 5);
  EXPECT_EQ(gate.peak(), 2);
  EXPECT_EQ(proxy.service().pool_stats().peak_running, 2);
}

TEST(LlmProxyHostileTest, WorkStopsWhenItsClientHasGone) {
  const v1::Problem problem = Matmul();
  GateMutator gate;
  InProcessProxy proxy(gate, {.threads = 1, .queue = 2});
  v1::MutateResponse resp;
  const grpc::Status s = proxy.Mutate(GoodRequest(problem), &resp, 0.3);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  // The worker saw the deadline and is free again.
  EXPECT_TRUE(WaitFor([&] { return proxy.service().pool_stats().running == 0 && gate.inside() == 0; }, 3));
}

TEST(LlmProxyHostileTest, ALongScanStopsAtTheClientsDeadline) {
  const v1::Problem problem = Matmul();
  ParametricMutator parametric;
  InProcessProxy proxy(parametric, {.threads = 1, .queue = 0});
  v1::MutateResponse resp;
  const grpc::Status s = proxy.Mutate(SlowRequest(problem), &resp, 0.5);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << s.error_message();
  const auto gone = std::chrono::steady_clock::now();
  EXPECT_TRUE(WaitFor([&] { return proxy.service().pool_stats().running == 0; }, 5));
  EXPECT_LT(std::chrono::steady_clock::now() - gone, std::chrono::seconds(2));
  // The one thread is free for the next call.
  const grpc::Status next = proxy.Mutate(GoodRequest(problem), &resp);
  EXPECT_TRUE(next.ok()) << next.error_message();
}

TEST(LlmProxyHostileTest, ShutdownAnswersTheCallsUnderWay) {
  const v1::Problem problem = Matmul();
  GateMutator gate;
  auto proxy = std::make_unique<InProcessProxy>(gate, ProxyServiceOptions{.threads = 1, .queue = 1});
  const v1::MutateRequest req = GoodRequest(problem);
  std::vector<std::future<grpc::Status>> calls;
  for (int i = 0; i < 2; ++i) {
    calls.push_back(std::async(std::launch::async, [&] {
      v1::MutateResponse r;
      return proxy->Mutate(req, &r, 30);
    }));
  }
  ASSERT_TRUE(WaitFor([&] { return proxy->service().pool_stats().queued == 1 && gate.inside() == 1; }, 5));
  const auto start = std::chrono::steady_clock::now();
  proxy->service().BeginShutdown();
  for (auto& c : calls) {
    ASSERT_EQ(c.wait_for(std::chrono::seconds(3)), std::future_status::ready);
    EXPECT_EQ(c.get().error_code(), grpc::StatusCode::UNAVAILABLE);
  }
  v1::MutateResponse r;
  EXPECT_EQ(proxy->Mutate(req, &r).error_code(), grpc::StatusCode::UNAVAILABLE);
  proxy.reset();  // server shutdown and pool joined
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(3));
}

}  // namespace
}  // namespace kforge::llm
