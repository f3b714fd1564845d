// The coordinator spreads its model calls over every llm-proxy its address resolves to
// (round_robin): with two proxies behind one target, both answer a job's mutations. Before, the
// channel held one connection to one proxy, so an HPA's other proxies sat idle.

#include <algorithm>
#include <cstdio>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/integration/replay_fixture.h"
#include "tests/testutil/background_process.h"
#include "tests/testutil/subprocess.h"
#include "tests/testutil/temp_dir.h"

namespace kforge::testing {
namespace {

struct Served {
  std::unique_ptr<BackgroundProcess> process;
  int grpc_port = 0;
  int metrics_port = 0;
};

Served Start(const std::string& binary, const std::string& config) {
  Served s;
  s.process = std::make_unique<BackgroundProcess>(binary, std::vector<std::string>{"--config", config});
  const std::string line = s.process->WaitForLine("listening ", 60);
  EXPECT_FALSE(line.empty()) << binary << " did not start";
  EXPECT_EQ(std::sscanf(line.c_str(), "listening grpc=%d metrics=%d", &s.grpc_port, &s.metrics_port), 2) << line;
  return s;
}

// Mutations a proxy has answered (kforge_llm_proxy_mutations_total, every label set).
double Mutations(int metrics_port) {
  std::istringstream in(HttpGet(metrics_port, "/metrics"));
  double total = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("kforge_llm_proxy_mutations_total{", 0) == 0) total += std::stod(line.substr(line.rfind(' ') + 1));
  }
  return total;
}

TEST(ProxyBalanceTest, ACoordinatorSpreadsItsCallsOverEveryProxyItsAddressNames) {
  TempDir dir;
  std::vector<Served> proxies;
  for (int i = 0; i < 2; ++i) {
    const std::string cfg =
        dir.Write(absl::StrCat("proxy", i, ".yaml"),
                  "server: {listen: \"127.0.0.1:0\", metrics_listen: \"127.0.0.1:0\", log_level: warn}\n");
    proxies.push_back(Start(BinaryDir() + "/services/llm-proxy/kforge-llm-proxy", cfg));
    ASSERT_GT(proxies.back().grpc_port, 0);
  }
  // One target naming both, as a headless Service's DNS name resolves to every pod.
  const std::string target =
      absl::StrCat("ipv4:127.0.0.1:", proxies[0].grpc_port, ",127.0.0.1:", proxies[1].grpc_port);
  const std::string cfg = dir.Write(
      "coordinator.yaml",
      absl::StrCat("server: {listen: \"127.0.0.1:0\", metrics_listen: \"127.0.0.1:0\", log_level: warn}\n"
                   "store: {kind: sqlite, url: \"",
                   dir.path(), "/k.db\"}\nqueue: {kind: memory}\nworkers: {embedded: 2}\nauth: {required: false}\nllm_proxy: {address: \"",
                   target, "\"}\n"));
  Served coordinator = Start(BinaryDir() + "/services/coordinator/kforge-coordinator", cfg);
  ASSERT_GT(coordinator.grpc_port, 0);

  const std::string problem = WriteSynthReplayProblem(dir);
  const RunResult r = RunProgram(BinaryDir() + "/cli/kforge",
                                 {"submit", problem, "--budget", "40", "--seed", "5", "--watch", "--server",
                                  absl::StrCat("127.0.0.1:", coordinator.grpc_port)},
                                 {"KFORGE_TOKEN=", "KFORGE_DB="});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  ASSERT_NE(r.out.find("completed"), std::string::npos) << r.out;
  const double a = Mutations(proxies[0].metrics_port), b = Mutations(proxies[1].metrics_port);
  EXPECT_GT(a, 0) << "the first proxy answered nothing";
  EXPECT_GT(b, 0) << "the second proxy answered nothing";
  // Round robin: neither carries (nearly) all of it.
  EXPECT_GT(std::min(a, b) / (a + b), 0.2) << a << " and " << b;
}

}  // namespace
}  // namespace kforge::testing
