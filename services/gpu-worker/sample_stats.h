#pragma once

#include "services/gpu-worker/layer.h"

// Distribution-free statistics of timing samples: a median and the interval that holds the
// population's median with ~95% probability (order statistics, binomial ranks), whatever the
// shape of the noise. Timings are skewed (interference only ever adds time), so no normal
// approximation is used.

#include <cstddef>
#include <utility>
#include <vector>

namespace kforge::worker {

double Median(std::vector<double> v);
// Of samples sorted ascending (non-empty): the median, and the sample at rank p * (n - 1),
// rounded to the nearest.
double SortedMedian(const std::vector<double>& sorted);
double SortedQuantile(const std::vector<double>& sorted, double p);

// 0-based ranks (lo, hi) in n sorted samples of the ~95% interval of the median: the widest ranks
// with P(Binomial(n, 1/2) < lo + 1) <= 2.5%; (0, n - 1) when n is too small for 95%.
std::pair<size_t, size_t> MedianIntervalRanks(size_t n);

struct MedianInterval {
  double median = 0;
  double low = 0;
  double high = 0;
};
MedianInterval MedianWithInterval(std::vector<double> v);

// Half the interval's width relative to the median; infinite for fewer than 3 samples.
double MedianRelError(std::vector<double> v);

// (p80 - p20) / median: how noisy one measurement was.
double RelativeSpread(std::vector<double> v);

}  // namespace kforge::worker
