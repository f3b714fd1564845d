#pragma once

// `kforge suite PATHS... --budget N`: many problems (KernelBench-style module files, or problem
// folders) optimised one after another, embedded, and the figures the field reports: the share
// that ends with a correct kernel, fast_1 (correct and faster than PyTorch eager; and than
// torch.compile where it was measured), the geometric-mean speedup, and a table with each
// problem's template, outcome (or why it could not run) and speedups.

#include <cstdint>
#include <string>
#include <vector>

#include "cli/run_command.h"

namespace kforge::cli {

struct SuiteArgs {
  std::vector<std::string> paths;  // files, folders of them, problem folders
  RunArgs run;                     // budget, seed, workers, --set/--fit/--backend, timeouts
  std::string out_dir = "kforge-suite";
  bool json = false;
};

int RunSuite(const SuiteArgs& args);

}  // namespace kforge::cli
