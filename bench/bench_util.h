#pragma once

// Small helpers shared by the benchmark programs: timing, summary statistics, loading an example,
// reading a server's CPU time.

#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/param_space.h"
#include "common/problem_loader.h"

namespace kforge::bench {

// An example's problem and its knob space (the benchmarks that evaluate real configurations).
inline absl::StatusOr<std::pair<v1::Problem, ParamSpace>> LoadExample(const std::string& dir) {
  auto problem = LoadProblem(dir);
  if (!problem.ok()) return problem.status();
  auto space = ParamSpace::Create(*problem);
  if (!space.ok()) return space.status();
  return std::pair<v1::Problem, ParamSpace>(*std::move(problem), *std::move(space));
}

inline double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

inline double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

// CPU seconds (user + system) used so far by process `root` and its living children, read from
// /proc: a server's share of a measurement (PostgreSQL's backends are the postmaster's
// children). 0 when it cannot be read.
inline double ProcessTreeCpuSeconds(pid_t root) {
  const double tick = static_cast<double>(sysconf(_SC_CLK_TCK));
  double total = 0;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string name = entry.path().filename().string();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream in(entry.path() / "stat");
    std::string line;
    if (!std::getline(in, line)) continue;
    // pid (comm) state ppid ... utime(14) stime(15): comm may hold spaces, so parse after ')'.
    const size_t close = line.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(line.substr(close + 2));
    std::string state;
    long long ppid = 0;
    rest >> state >> ppid;
    const long long pid = std::stoll(name);
    if (pid != root && ppid != root) continue;
    std::string skip;
    for (int field = 5; field < 14; ++field) rest >> skip;
    long long utime = 0, stime = 0;
    rest >> utime >> stime;
    total += static_cast<double>(utime + stime) / tick;
  }
  return total;
}

}  // namespace kforge::bench
