#pragma once

// Reader for Kernel Tuner cache files (JSON, optionally gzip-compressed): the recorded search
// space and per-configuration results that the replay backend and the search benchmark use.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "common/launch.h"
#include "common/mutator.h"
#include "kforge/v1/problem.pb.h"

namespace kforge {

struct KtEntry {
  bool ok = false;
  double time_ms = 0;        // recorded mean time when ok
  std::string failure;       // CompilationFailedConfig, RuntimeFailedConfig, InvalidConfig, ...
  double compile_ms = 0;
  double benchmark_ms = 0;

  // Part of the recorded space: Kernel Tuner marks restriction violations InvalidConfig.
  bool recorded() const { return failure != "InvalidConfig"; }
};

struct KtCache {
  std::string device_name;
  std::string kernel_name;
  std::vector<std::string> keys;                   // parameter order
  std::vector<std::vector<int64_t>> values;        // allowed values per key
  absl::flat_hash_map<std::string, KtEntry> entries;  // key: comma-joined values in key order

  // Looks up an assignment; nullopt when the configuration is absent (invalid).
  std::optional<KtEntry> Find(const ParamAssignment& a) const;
  // Whether the assignment is a configuration of the recorded space (present, not InvalidConfig):
  // the restriction set of a replay problem.
  bool Records(const ParamAssignment& a) const;
  // The fastest ok entry's time.
  std::optional<double> OptimumMs() const;
  size_t ValidCount() const;
};

// The restriction set of a problem's params: for a replay problem, the configurations its cache
// records (the cache is read once, here); for any other problem, nullptr (no restriction).
[[nodiscard]] absl::StatusOr<ValidityFn> ReplayValidity(const v1::Problem& problem);

// A replay problem's recorded space in a form that crosses the network: the parameter order, each
// recorded configuration's values comma-joined in that order (sorted), and a key over both.
struct RecordedSpace {
  std::string key;
  std::vector<std::string> params;
  std::vector<std::string> configurations;
};
[[nodiscard]] absl::StatusOr<RecordedSpace> RecordedSpaceOf(const v1::Problem& problem);
std::string RecordedSpaceKey(const std::vector<std::string>& params, const std::vector<std::string>& configurations);
// The restriction set a recorded space describes.
ValidityFn RecordedSpaceValidity(const std::vector<std::string>& params,
                                 const std::vector<std::string>& configurations);

// Errors name the file and what is malformed.
[[nodiscard]] absl::StatusOr<KtCache> LoadKtCache(const std::string& path,
                                                   const std::string& display_name = "");

// Reads a whole file, transparently gunzipping.
[[nodiscard]] absl::StatusOr<std::string> ReadMaybeGzipFile(const std::string& path);

}  // namespace kforge
