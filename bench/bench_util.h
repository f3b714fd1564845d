#pragma once

// Small helpers shared by the benchmark programs: timing and summary statistics.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

namespace kforge::bench {

inline double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

inline double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

}  // namespace kforge::bench
