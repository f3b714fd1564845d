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

}  // namespace kforge::testing
