#pragma once

#include <string>
#include <vector>

namespace kforge::testing {

struct RunResult {
  int exit_code = -1;  // -1 when killed by a signal
  std::string out;     // stdout
  std::string err;     // stderr
};

// Runs a program with arguments (no shell), capturing stdout and stderr.
RunResult RunProgram(const std::string& program, const std::vector<std::string>& args,
                     const std::vector<std::string>& extra_env = {});

// How a program run under a time limit ended.
struct Outcome {
  bool exited = false;
  int exit_code = -1;
  int signal = 0;
  bool timed_out = false;
  double seconds = 0;
  std::string out;
  std::string err;

  // The ending, the time and the tails of stderr and stdout, for a failure message.
  std::string Describe() const;
};

// Runs args[0] with args (no shell) in a process group of its own, killed whole when the limit
// passes and after it exits (whatever it started goes with it). Keeps the first 4 MiB of each
// stream.
Outcome RunWithLimit(const std::vector<std::string>& args, double limit_seconds);

// How a kforge command may end, whatever its input: within its limit, not by a signal, with exit
// 0 (ok), 1 (failed) or 2 (bad input). "" when it did; else what went wrong, with its output.
std::string JudgeKforgeExit(const Outcome& o, const std::string& cmd);

}  // namespace kforge::testing
