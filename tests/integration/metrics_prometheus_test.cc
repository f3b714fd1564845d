// The worker's /metrics scraped by a real Prometheus server: the series exist under the names
// the dashboards and alerts use, and an evaluation moves the counters.

#include <chrono>
#include <filesystem>
#include <thread>

#include "common/param_space.h"
#include "common/problem_loader.h"
#include "common/launch.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "kforge/v1/worker.grpc.pb.h"
#include "tests/testutil/background_process.h"
#include "tests/testutil/prometheus_query.h"
#include "tests/testutil/temp_dir.h"

namespace kforge {
namespace {

std::string FindPrometheus() {
  for (const char* p : {"/usr/bin/prometheus", "/usr/local/bin/prometheus"}) {
    if (std::filesystem::exists(p)) return p;
  }
  return "";
}

// Polls a PromQL query until it returns at least one sample; returns the first value.
std::optional<double> QueryUntil(int port, const std::string& promql, double timeout_seconds) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_seconds);
  while (std::chrono::steady_clock::now() < until) {
    if (auto v = testing::FirstSampleValue(testing::PrometheusQuery(port, promql)); v.has_value()) return v;
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
  }
  return std::nullopt;
}

TEST(MetricsPrometheusTest, RealPrometheusScrapesTheWorker) {
  const std::string prom = FindPrometheus();
  if (prom.empty()) GTEST_SKIP() << "prometheus is not installed (scripts/install-deps.sh installs it)";
  testing::TempDir dir;
  dir.Write("replay/problem.yaml", "name: tiny\nbackend: replay\nreplay: {cache: c.json}\n");
  dir.Write("replay/c.json",
            R"({"device_name": "d", "kernel_name": "k", "tune_params_keys": ["A"], "tune_params": {"A": [1, 2]},
                "cache": {"1": {"A": 1, "time": 2.0}, "2": {"A": 2, "time": 1.0}}})");
  // The worker on free ports; it prints the ports it bound.
  testing::BackgroundProcess worker(testing::BinaryDir() + "/services/gpu-worker/kforge-gpu-worker",
                                    {"--config", dir.Write("worker.yaml", "worker: {backends: replay, replay_dirs: \"" +
                                                                          dir.path() + "/replay\"}\n")},
                                    {"KFORGE_WORKER_SERVER_LISTEN=127.0.0.1:0",
                                     "KFORGE_WORKER_SERVER_METRICS_LISTEN=127.0.0.1:0"});
  const std::string line = worker.WaitForLine("listening ", 30);
  ASSERT_FALSE(line.empty()) << "worker did not start";
  int grpc_port = 0, metrics_port = 0;
  ASSERT_EQ(std::sscanf(line.c_str(), "listening grpc=%d metrics=%d", &grpc_port, &metrics_port), 2) << line;

  // One evaluation so that the counters have a series.
  auto problem = LoadProblem(dir.path() + "/replay");
  ASSERT_TRUE(problem.ok()) << problem.status();
  auto stub = v1::WorkerAdminService::NewStub(
      grpc::CreateChannel("127.0.0.1:" + std::to_string(grpc_port), grpc::InsecureChannelCredentials()));
  v1::EvaluationRequest req;
  *req.mutable_problem() = *problem;
  *req.mutable_candidate() = MakeSeedCandidate(*problem, {{"A", 2}});
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  v1::EvaluationResult result;
  ASSERT_TRUE(stub->Evaluate(&ctx, req, &result).ok());
  EXPECT_EQ(result.outcome(), v1::OUTCOME_OK);

  const int prom_port = testing::FreePort();
  const std::string config = dir.Write(
      "prometheus.yml", "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
                        "scrape_configs:\n"
                        "  - job_name: kforge-worker\n"
                        "    static_configs: [{targets: ['127.0.0.1:" + std::to_string(metrics_port) + "']}]\n");
  testing::BackgroundProcess prometheus(prom, {"--config.file=" + config, "--storage.tsdb.path=" + dir.path() + "/tsdb",
                                               "--web.listen-address=127.0.0.1:" + std::to_string(prom_port)});
  ASSERT_TRUE(prometheus.started());
  auto up = QueryUntil(prom_port, "up{job=\"kforge-worker\"} == 1", 40);
  ASSERT_TRUE(up.has_value()) << "prometheus never scraped the worker";
  auto evals = QueryUntil(prom_port, "kforge_worker_evaluations_total{backend=\"replay\",outcome=\"ok\"}", 20);
  ASSERT_TRUE(evals.has_value());
  EXPECT_EQ(*evals, 1.0);
  EXPECT_TRUE(QueryUntil(prom_port, "kforge_worker_busy_slots", 10).has_value());
  EXPECT_TRUE(QueryUntil(prom_port, "sum(kforge_worker_stage_duration_seconds_count)", 10).has_value());
}

}  // namespace
}  // namespace kforge
