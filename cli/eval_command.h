#pragma once

#include <string>

#include "kforge/v1/evaluation.pb.h"

namespace kforge::cli {

// The longest wall-clock limit per sandboxed run that eval and run accept (a day).
inline constexpr double kMaxTimeoutSeconds = 86400;

// Where the embedded commands keep the device runtimes' compiled-kernel caches between runs:
// $XDG_CACHE_HOME/kforge, else $HOME/.cache/kforge; "" when neither is set.
std::string DefaultCacheDir();
// The sandboxes' runtime cache folder under a --cache-dir ("" for "").
std::string RuntimeCacheDir(const std::string& cache_dir);
// The kernel binary cache's folder in --cache-dir ("" when none).
std::string BinaryCacheDir(const std::string& cache_dir);

struct EvalArgs {
  std::string problem_dir;
  std::string source_file;   // "" = the seed's source
  std::string params;        // "K=V,K=V"; "" = the seed's default params
  std::string launches_file; // "" = the seed's launch plan
  bool json = false;
  double timeout_seconds = 60;
  double compile_timeout_seconds = 30;  // per compilation (a macro bomb costs this, not more)
  std::string cache_dir = DefaultCacheDir();  // the runtimes' kernel caches; "" = none kept
};

// Runs one candidate through the local pipeline. Exit code: 0 ok, 1 any other outcome, 2 bad
// input.
int RunEval(const EvalArgs& args);

// The staged, human-readable report.
std::string FormatReport(const v1::EvaluationResult& result);

}  // namespace kforge::cli
