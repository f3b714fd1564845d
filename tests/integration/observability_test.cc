// The dashboards and alerts against the real thing: scripts/cluster.sh starts PostgreSQL, Redis,
// the coordinator, the llm-proxy (its model a scripted OpenAI-compatible server on loopback) and
// a worker, with a real Prometheus scraping every service. While a job runs, every expression of
// every Grafana dashboard panel and every alert rule (tests/deploy/dashboard_queries.py lists
// them) goes through Prometheus' HTTP API: each parses, each panel returns data, and no alert
// condition holds in this healthy cluster.

#include <signal.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/ascii.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testutil/background_process.h"
#include "tests/testutil/postgres_server.h"
#include "tests/testutil/prometheus_query.h"
#include "tests/testutil/redis_server.h"
#include "tests/testutil/scripted_http_server.h"
#include "tests/testutil/subprocess.h"
#include "tests/testutil/temp_dir.h"
#include "tests/testutil/vadd_problem.h"

namespace kforge::testing {
namespace {

// Polls until the query's first value reaches `at_least`.
bool WaitFor(int port, const std::string& promql, double at_least, double timeout_seconds) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_seconds);
  while (std::chrono::steady_clock::now() < until) {
    if (FirstSampleValue(PrometheusQuery(port, promql)).value_or(-1) >= at_least) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  return false;
}

class ObservabilityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (PostgresServer::BinDir().empty()) GTEST_SKIP() << "PostgreSQL is not installed";
    if (!RedisServer::Available()) GTEST_SKIP() << "redis-server is not installed";
    if (!std::filesystem::exists("/usr/bin/prometheus")) GTEST_SKIP() << "prometheus is not installed";
    cluster_dir_ = dir_.path() + "/cluster";
    // PostgreSQL runs as 'nobody' when the tests run as root: it must reach its folder.
    std::filesystem::permissions(dir_.path(), std::filesystem::perms::others_exec | std::filesystem::perms::group_exec,
                                 std::filesystem::perm_options::add);
  }
  void TearDown() override {
    if (!cluster_dir_.empty() && std::filesystem::exists(cluster_dir_)) {
      RunProgram(SourceDir() + "/scripts/cluster.sh", {"stop", cluster_dir_});
    }
  }
  std::string Log(const std::string& name) { return dir_.Read("cluster/logs/" + name + ".log"); }

  TempDir dir_;
  std::string cluster_dir_;
};

TEST_F(ObservabilityTest, EveryPanelReturnsDataAndEveryAlertParsesWhileAJobRuns) {
  // The model rewrites the kernel with a new variable name each time: every reply is a new candidate,
  // so the job runs until it is cancelled.
  ScriptedHttpServer model;
  for (int i = 0; i < 400; ++i) {
    const std::string reply = absl::StrCat(
        "Here it is:\n```c\n__kernel void add(__global const float* a, __global const float* b, __global float* c, "
        "int n) {\n  int i = get_global_id(0);\n  if (i < n) {\n    float v", i, " = a[i];\n    c[i] = v", i,
        " + b[i];\n  }\n}\n```\n");
    model.Push({200, {}, OpenAiChatReply(reply, 120, 60)});
  }
  const std::string providers =
      dir_.Write("llm.yaml", absl::StrCat("providers:\n  - {name: scripted, kind: openai, base_url: \"",
                                          model.url(), "/v1\", model: scripted-1, timeout_seconds: 10, "
                                          "input_usd_per_mtok: 1, output_usd_per_mtok: 2}\n"));
  const std::string problem = WriteVaddProblem(dir_, "p");

  RunResult up = RunProgram(SourceDir() + "/scripts/cluster.sh", {"start", cluster_dir_},
                            {"BUILD_DIR=" + BinaryDir(), "WORKERS=1", "SCRAPE_INTERVAL=1s", "PROVIDERS=" + providers,
                             "LLM_PROBABILITY=1", "CONFIRM_EVERY=5"});
  ASSERT_EQ(up.exit_code, 0) << up.out << up.err;
  const int prom = std::stoi(std::string(absl::StripAsciiWhitespace(dir_.Read("cluster/prometheus.port"))));
  // The script prints "export KFORGE_SERVER=host:port KFORGE_TOKEN=...".
  const size_t at = up.out.find("KFORGE_SERVER=");
  ASSERT_NE(at, std::string::npos) << up.out;
  const std::string server = up.out.substr(at + 14, up.out.find(' ', at) - at - 14);
  const std::vector<std::string> env = {
      "KFORGE_SERVER=" + server,
      "KFORGE_TOKEN=" + std::string(absl::StripAsciiWhitespace(dir_.Read("cluster/token")))};

  RunResult submit = RunProgram(BinaryDir() + "/cli/kforge", {"submit", problem, "--budget", "400"}, env);
  ASSERT_EQ(submit.exit_code, 0) << submit.out << submit.err;
  const std::vector<std::string> lines = absl::StrSplit(absl::StripAsciiWhitespace(submit.out), '\n');
  const std::string job_id = lines.back();
  ASSERT_EQ(job_id.rfind("job-", 0), 0u) << submit.out;

  // Every service is scraped, the job's gauges and the model's counters have samples, and the
  // rate windows of the panels have at least two points.
  for (const char* service : {"kforge-coordinator", "kforge-llm-proxy", "kforge-worker"}) {
    EXPECT_TRUE(WaitFor(prom, absl::StrCat("up{job=\"", service, "\"}"), 1, 30))
        << service << " is not scraped\n" << Log("prometheus");
  }
  // The store and the queue through their exporters, and an Alertmanager that Prometheus sends to.
  // (scripts/install-deps.sh installs them; the script leaves out what is not installed.)
  if (std::filesystem::exists("/usr/bin/prometheus-postgres-exporter")) {
    EXPECT_TRUE(WaitFor(prom, "pg_up", 1, 30)) << Log("postgres-exporter") << Log("prometheus");
  }
  if (std::filesystem::exists("/usr/bin/prometheus-redis-exporter")) {
    EXPECT_TRUE(WaitFor(prom, "redis_up", 1, 30)) << Log("redis-exporter") << Log("prometheus");
  }
  if (std::filesystem::exists("/usr/bin/prometheus-alertmanager")) {
    const nlohmann::json am = nlohmann::json::parse(HttpGet(prom, "/api/v1/alertmanagers"), nullptr, false);
    ASSERT_FALSE(am.is_discarded());
    EXPECT_EQ(am["data"]["activeAlertmanagers"].size(), 1u) << am.dump() << Log("alertmanager");
  }
  ASSERT_TRUE(WaitFor(prom, absl::StrCat("kforge_coordinator_job_evaluations{job_id=\"", job_id, "\"}"), 6, 120))
      << "the job made no progress\n" << Log("coordinator") << Log("proxy") << Log("worker0");
  ASSERT_TRUE(WaitFor(prom, "sum(kforge_llm_proxy_model_requests_total)", 3, 60)) << Log("proxy");
  // The running-jobs table's confirmed best: a checkpoint's re-measurement (every 5 evaluations).
  ASSERT_TRUE(WaitFor(prom, absl::StrCat("kforge_coordinator_job_confirmed_speedup_high{job_id=\"", job_id, "\"}"),
                      0.01, 120))
      << "no re-measurement of the finalists while the job ran\n" << Log("coordinator");
  ASSERT_TRUE(WaitFor(prom, "sum(kforge_worker_evaluations_total)", 3, 30)) << Log("worker0");
  std::this_thread::sleep_for(std::chrono::seconds(5));

  // Every metric the dashboards and alerts may use is exported (a panel's `or vector(0)` would
  // hide a name that no service exports); only the store's error counter waits for an error.
  std::vector<std::string> missing;
  std::ifstream names_file(SourceDir() + "/deploy/prometheus/metric-names.txt");
  const std::string names((std::istreambuf_iterator<char>(names_file)), std::istreambuf_iterator<char>());
  ASSERT_FALSE(names.empty());
  for (absl::string_view name : absl::StrSplit(names, '\n', absl::SkipEmpty())) {
    name = absl::StripAsciiWhitespace(name);
    // Two counters wait for their event: a store error, a dispatch a tenant's quota held back.
    if (name.empty() || name[0] == '#' || name == "kforge_store_errors_total" ||
        name == "kforge_coordinator_dispatch_refused_total") {
      continue;
    }
    const nlohmann::json r = PrometheusQuery(prom, absl::StrCat("count({__name__=~\"", name, "(_bucket)?\"})"));
    if (FirstSampleValue(r).value_or(0) <= 0) missing.emplace_back(name);
  }
  EXPECT_TRUE(missing.empty()) << "not exported: " << absl::StrJoin(missing, ", ");

  RunResult listed =
      RunProgram("/usr/bin/env", {"python3", SourceDir() + "/tests/deploy/dashboard_queries.py", job_id, "--root", SourceDir()});
  ASSERT_EQ(listed.exit_code, 0) << listed.out << listed.err;
  int panels = 0, alerts = 0;
  std::vector<std::string> empty;
  for (absl::string_view line : absl::StrSplit(listed.out, '\n', absl::SkipEmpty())) {
    auto q = nlohmann::json::parse(line, nullptr, false);
    ASSERT_FALSE(q.is_discarded()) << line;
    const std::string source = q["source"], expr = q["expr"], kind = q["kind"];
    nlohmann::json reply = PrometheusQuery(prom, expr);
    EXPECT_EQ(reply.value("status", ""), "success") << source << ": " << expr << "\n" << reply.dump();
    if (reply.value("status", "") != "success") continue;
    const bool has_data = !reply["data"]["result"].empty();
    if (kind == "panel") {
      ++panels;
      if (!has_data) empty.push_back(absl::StrCat(source, ": ", expr));
    } else {
      ++alerts;
      EXPECT_FALSE(has_data) << "alert condition holds in a healthy cluster: " << source << ": " << expr << "\n"
                             << reply.dump();
    }
  }
  EXPECT_GE(panels, 40) << listed.out;
  EXPECT_GE(alerts, 7) << listed.out;
  EXPECT_TRUE(empty.empty()) << "panels without data:\n" << absl::StrJoin(empty, "\n");
  // The job was still running while the panels were queried (its panels need it).
  RunResult status = RunProgram(BinaryDir() + "/cli/kforge", {"status", job_id}, env);
  EXPECT_NE(status.out.find("running"), std::string::npos) << status.out << status.err;
  RunResult cancel = RunProgram(BinaryDir() + "/cli/kforge", {"cancel", job_id}, env);
  EXPECT_EQ(cancel.exit_code, 0) << cancel.out << cancel.err;
  // A cancelled job leaves the per-job series.
  EXPECT_TRUE(WaitFor(prom, absl::StrCat("absent(kforge_coordinator_job_evaluations{job_id=\"", job_id, "\"})"), 1, 30));

  // A coordinator that dies (SIGKILL: no clean release of its leases) and is restarted by the
  // script takes its running job back at once (the same jobs.owner), not after the lease's 30 s,
  // and Prometheus scrapes the new process at the same target.
  submit = RunProgram(BinaryDir() + "/cli/kforge", {"submit", problem, "--budget", "400"}, env);
  ASSERT_EQ(submit.exit_code, 0) << submit.out << submit.err;
  const std::string second = std::string(absl::StripAsciiWhitespace(submit.out)).substr(
      std::string(absl::StripAsciiWhitespace(submit.out)).rfind('\n') + 1);
  const std::string evals = absl::StrCat("kforge_coordinator_job_evaluations{job_id=\"", second, "\"}");
  ASSERT_TRUE(WaitFor(prom, evals, 3, 120)) << Log("coordinator");
  const double before = FirstSampleValue(PrometheusQuery(prom, evals)).value_or(0);
  const int pid = std::stoi(std::string(absl::StripAsciiWhitespace(dir_.Read("cluster/coordinator.pid"))));
  ASSERT_EQ(kill(pid, SIGKILL), 0);
  RunResult restarted = RunProgram(SourceDir() + "/scripts/cluster.sh", {"restart", "coordinator", cluster_dir_},
                                   {"BUILD_DIR=" + BinaryDir()});
  ASSERT_EQ(restarted.exit_code, 0) << restarted.out << restarted.err;
  EXPECT_NE(restarted.out.find("restarted coordinator"), std::string::npos) << restarted.out;
  EXPECT_TRUE(WaitFor(prom, evals, before + 3, 15))
      << "the restarted coordinator did not take its job back at once\n" << Log("coordinator");
  cancel = RunProgram(BinaryDir() + "/cli/kforge", {"cancel", second}, env);
  EXPECT_EQ(cancel.exit_code, 0) << cancel.out << cancel.err;
}

}  // namespace
}  // namespace kforge::testing
