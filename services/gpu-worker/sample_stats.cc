#include "services/gpu-worker/sample_stats.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace kforge::worker {

double SortedMedian(const std::vector<double>& s) {
  const size_t n = s.size();
  return n % 2 == 1 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
}

double SortedQuantile(const std::vector<double>& s, double p) {
  return s[static_cast<size_t>(std::floor(p * static_cast<double>(s.size() - 1) + 0.5))];
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return SortedMedian(v);
}

std::pair<size_t, size_t> MedianIntervalRanks(size_t n) {
  if (n == 0) return {0, 0};
  // P(X <= k) for X ~ Binomial(n, 1/2), accumulated in logs to stay finite for large n.
  size_t lo = 0;
  double cdf = 0;
  const double half_n = static_cast<double>(n) * std::log(0.5);
  for (size_t k = 0; k < n / 2; ++k) {
    const double log_choose = std::lgamma(static_cast<double>(n) + 1) - std::lgamma(static_cast<double>(k) + 1) -
                              std::lgamma(static_cast<double>(n - k) + 1);
    cdf += std::exp(log_choose + half_n);
    if (cdf > 0.025) break;
    lo = k;  // [s[k], s[n - 1 - k]] misses the median with probability 2 P(X <= k) = 2 cdf
  }
  return {lo, n - 1 - lo};
}

MedianInterval MedianWithInterval(std::vector<double> v) {
  MedianInterval m;
  if (v.empty()) return m;
  std::sort(v.begin(), v.end());
  const auto [lo, hi] = MedianIntervalRanks(v.size());
  m.median = SortedMedian(v);
  m.low = v[lo];
  m.high = v[hi];
  return m;
}

double MedianRelError(std::vector<double> v) {
  if (v.size() < 3) return std::numeric_limits<double>::infinity();
  const MedianInterval m = MedianWithInterval(std::move(v));
  if (m.median <= 0) return std::numeric_limits<double>::infinity();
  return (m.high - m.low) / (2 * m.median);
}

double RelativeSpread(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double med = SortedMedian(v);
  return med > 0 ? (SortedQuantile(v, 0.8) - SortedQuantile(v, 0.2)) / med : 0;
}

}  // namespace kforge::worker
