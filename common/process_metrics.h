#pragma once

// The standard process_* series (CPU seconds, resident and virtual memory, open and maximum file
// descriptors, start time, threads) read from /proc/self at each scrape, under the names every
// Prometheus client library uses, so stock dashboards and alerts work on kforge's services.

#include <vector>

#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"

namespace kforge {

class ProcessCollector final : public prometheus::Collectable {
 public:
  std::vector<prometheus::MetricFamily> Collect() const override;
};

}  // namespace kforge
