#pragma once

// `kforge suite PATHS... --budget N`: many problems (KernelBench-style module files, or problem
// folders) optimised one after another, embedded, and the figures the field reports: the share
// that ends with a correct kernel, fast_1 (correct and faster than PyTorch eager; and than
// torch.compile where it was measured), the geometric-mean speedup, and a table with each
// problem's template, outcome (or why it could not run) and speedups. With --server the problems
// are submitted to a kforge cluster instead (all at once; the fleet runs them side by side) and
// the figures come from their ended jobs.

#include <cstdint>
#include <string>
#include <vector>

#include "cli/coordinator_client.h"
#include "cli/run_command.h"

namespace kforge::cli {

struct SuiteArgs {
  std::vector<std::string> paths;  // files, folders of them, problem folders
  RunArgs run;                     // budget, seed, workers, --set/--fit/--backend, timeouts
  std::string out_dir = "kforge-suite";
  bool json = false;
  // Submit to this cluster instead of running embedded ("" = embedded).
  ClientArgs client;
  double poll_seconds = 2;  // how often the jobs' states are read while they run
};

int RunSuite(const SuiteArgs& args);

}  // namespace kforge::cli
