#pragma once

// A synthetic Kernel Tuner cache and replay problem folder for the job runner and `kforge run`
// tests: three knobs X (5 values) x Y (4 values) x Z (6 values) = 120 configurations, times from
// a smooth bowl with one optimum, some recorded failures and some absent configurations.

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "tests/testutil/temp_dir.h"

namespace kforge::testing {

struct SynthSpace {
  std::vector<int64_t> x = {1, 2, 4, 8, 16};
  std::vector<int64_t> y = {32, 64, 128, 256};
  std::vector<int64_t> z = {0, 1, 2, 3, 4, 5};
  // Extra Z values (6, 7, ...) scale the space up for the kill and signal tests.
  int extra_z = 0;
};

enum class SynthKind { kOk, kCompileFail, kRuntimeFail, kAbsent };

inline SynthKind SynthKindOf(int64_t x, int64_t y, int64_t z) {
  if (x * y >= 4096) return SynthKind::kAbsent;                // X=16, Y=256
  if (x == 2 && y == 128 && z == 3) return SynthKind::kAbsent;  // a hole in the middle
  if (z == 5 && x >= 8) return SynthKind::kCompileFail;
  if (y == 32 && z == 1) return SynthKind::kRuntimeFail;
  return SynthKind::kOk;
}

// Milliseconds: a smooth bowl, optimum 1.0 at X=8, Y=64, Z=4; the default (1, 32, 0) is 6.3.
inline double SynthTimeMs(int64_t x, int64_t y, int64_t z) {
  const double lx = std::log2(static_cast<double>(x)) - 3, ly = std::log2(static_cast<double>(y)) - 6;
  const double dz = static_cast<double>(z) - 4;
  return 1.0 + 0.3 * lx * lx + 0.2 * ly * ly + 0.15 * dz * dz;
}

inline std::string SynthCacheJson(const SynthSpace& s = {}) {
  std::vector<int64_t> zs = s.z;
  for (int i = 0; i < s.extra_z; ++i) zs.push_back(6 + i);
  nlohmann::json j;
  j["device_name"] = "Synthetic GPU";
  j["kernel_name"] = "synth";
  j["tune_params_keys"] = {"X", "Y", "Z"};
  j["tune_params"] = {{"X", s.x}, {"Y", s.y}, {"Z", zs}};
  nlohmann::json cache = nlohmann::json::object();
  for (int64_t x : s.x) {
    for (int64_t y : s.y) {
      for (int64_t z : zs) {
        const SynthKind kind = SynthKindOf(x, y, z);
        if (kind == SynthKind::kAbsent) continue;
        nlohmann::json rec = {{"X", x}, {"Y", y}, {"Z", z}, {"compile_time", 120.5}, {"benchmark_time", 33.0}};
        if (kind == SynthKind::kOk) rec["time"] = SynthTimeMs(x, y, z);
        if (kind == SynthKind::kCompileFail) rec["time"] = "CompilationFailedConfig";
        if (kind == SynthKind::kRuntimeFail) rec["time"] = "RuntimeFailedConfig";
        cache[absl::StrCat(x, ",", y, ",", z)] = rec;
      }
    }
  }
  j["cache"] = cache;
  return j.dump(1);
}

// Writes problem.yaml + cache.json under dir/rel; returns the folder.
inline std::string WriteSynthReplayProblem(const TempDir& dir, const std::string& rel = "synth",
                                           const SynthSpace& space = {},
                                           const std::string& name = "synth-replay") {
  dir.Write(rel + "/cache.json", SynthCacheJson(space));
  dir.Write(rel + "/problem.yaml", absl::StrCat("name: ", name,
                                                "\nbackend: replay\n"
                                                "description: a synthetic recorded space\n"
                                                "replay: {cache: cache.json}\n"));
  return dir.path() + "/" + rel;
}

}  // namespace kforge::testing
