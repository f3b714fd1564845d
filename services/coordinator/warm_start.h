#pragma once

#include "services/coordinator/layer.h"

// Warm start from the fleet's history: evaluations of the same kernel (same seed source and knob
// names) that earlier jobs ran on other devices or other shapes. They never stand in for a
// measurement here (a 2x faster GPU, or a different shape, times differently); they steer:
// - their best configurations, by mean relative rank over the earlier runs, are the first
//   proposals after the seed (WarmStart::Ranked);
// - their ranks are a prior for the screener's surrogate (Prior): each earlier run predicts a
//   child's rank among that run's own results, the runs are weighted by how well they order this
//   job's measurements so far, and the surrogate models what the prior gets wrong. A history that
//   disagrees with this device loses its weight as the job's own measurements come in.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/launch.h"
#include "common/param_space.h"
#include "common/store/store.h"
#include "kforge/v1/job.pb.h"

namespace kforge::coordinator {

// One earlier evaluation: the configuration and its cost (lower is better, in any unit of its
// run: the log of its time relative to that job's reference), or nullopt when it failed.
struct PriorPoint {
  ParamAssignment params;
  std::optional<double> cost;
};

// One earlier job's evaluations of the same kernel.
struct PriorRun {
  std::string job_id;
  std::string device;        // the device's name as its worker reported it
  bool other_shape = false;  // the problem's sizes differ from this job's
  bool other_tenant =
      false;  // a tenant that pools its history with this job's (Tenant.share_history)
  std::vector<PriorPoint> points;
};

struct WarmStart {
  std::vector<PriorRun> runs;

  bool empty() const { return runs.empty(); }
  int64_t evaluations() const;
  // "warm start: 40 evaluations from 2 earlier jobs on A100, W7800 (1 of another shape, 1 of
  // another tenant)".
  std::string Summary() const;
  // The configurations the runs measured, by their mean relative rank over the runs that measured
  // them (0: fastest; a failure ranks last), best first; ties in first-seen order.
  std::vector<ParamAssignment> Ranked() const;
};

// Where a job's history comes from: the tenant's newest `max_jobs` ended jobs, older than the
// asking one, of the same kernel
// (HashKernel), and where the tenant pools its history (Tenant.share_history), those of the other
// tenants that pool theirs. Only evaluations of the seed's own source (its knob variants) count,
// each measured there (a reused result is its original's), and not the runs of this very problem on
// this job's device class: those are measurements here, which the job reuses as they are.
struct WarmStartQuery {
  // Not empty: exactly these jobs, in this order (a resumed job's snapshot), whatever their tenant
  // or state now; the lookup below is skipped.
  std::vector<std::string> from_jobs;
  std::string tenant;
  std::string job_id;        // the asking job (never its own history)
  std::string device_class;  // the job's, as reuse compares it ("" = not known yet)
  int max_jobs = 8;
  size_t max_points_per_job = 4096;
};
[[nodiscard]] absl::StatusOr<WarmStart> LoadWarmStart(Store& store, const v1::Problem& problem,
                                                      const WarmStartQuery& query);

// The history as the screener reads it, over one job's knob space.
class Prior {
 public:
  Prior(const ParamSpace& space, const WarmStart& warm);

  bool empty() const { return runs_.empty(); }
  size_t runs() const { return runs_.size(); }
  // Each run's weight given this job's own measurements (value positions and costs, lower is
  // better): Kendall's agreement between the run's ranks and the costs over the pairs it can
  // rank, floored at 0; 1 while a run can rank fewer than kMinPairs pairs (no evidence yet).
  std::vector<double> Weights(const std::vector<std::vector<int>>& points,
                              const std::vector<double>& cost) const;
  // The same from each point's RunRanks (a caller that keeps them need not look them up again).
  std::vector<double> Weights(const std::vector<std::vector<std::optional<double>>>& run_ranks,
                              const std::vector<double>& cost) const;
  // Each run's rank of a point (nullopt: the run knows neither it nor a near neighbour).
  std::vector<std::optional<double>> RunRanks(const std::vector<int>& positions) const;
  // The weighted mean of a point's RunRanks; nullopt when no run with weight knows it.
  static std::optional<double> Combine(const std::vector<std::optional<double>>& run_ranks,
                                       const std::vector<double>& weights);
  // The weighted mean rank (0..1) the runs give a point (value positions); nullopt when no run
  // with weight knows it or a near neighbour of it.
  std::optional<double> Rank(const std::vector<int>& positions,
                             const std::vector<double>& weights) const;

  static constexpr int kMinPairs = 6;

 private:
  struct Run {
    std::map<std::vector<int>, double> rank;  // exact points
    // Where the run is small enough, a point it did not measure takes its nearest measured
    // neighbours' rank (fewest differing knobs); a dense run is looked up only.
    std::vector<std::pair<std::vector<int>, double>> neighbours;
  };
  std::optional<double> RunRank(const Run& run, const std::vector<int>& positions) const;

  std::vector<Run> runs_;
};

}  // namespace kforge::coordinator
