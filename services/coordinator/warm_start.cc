#include "services/coordinator/warm_start.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/hash.h"
#include "common/status_macros.h"
#include "services/coordinator/job_runner.h"

namespace kforge::coordinator {

namespace {

// A run of at most this many points answers for points it did not measure by their nearest
// neighbours; a larger one (a brute-forced space) is looked up only, which is both exact there
// and cheap (a global draw ranks 512 children).
constexpr size_t kMaxNeighbourRun = 2048;

// Each point's relative rank within its run: 0 for the fastest, 1 for the slowest; a failure
// ranks last. Equal costs share the lower rank.
std::vector<double> RelativeRanks(const std::vector<std::optional<double>>& cost) {
  std::vector<double> ok;
  for (const auto& c : cost) {
    if (c.has_value()) ok.push_back(*c);
  }
  std::sort(ok.begin(), ok.end());
  std::vector<double> rank;
  rank.reserve(cost.size());
  for (const auto& c : cost) {
    if (!c.has_value() || ok.size() < 2) {
      rank.push_back(c.has_value() ? 0.0 : 1.0);
      continue;
    }
    const auto below = std::lower_bound(ok.begin(), ok.end(), *c) - ok.begin();
    rank.push_back(static_cast<double>(below) / static_cast<double>(ok.size() - 1));
  }
  return rank;
}

// The problem's shapes: each size set's sizes.
std::vector<std::map<std::string, int64_t>> Sizes(const v1::Problem& p) {
  std::vector<std::map<std::string, int64_t>> out;
  for (const v1::SizeSet& s : p.size_sets()) out.emplace_back(s.sizes().begin(), s.sizes().end());
  return out;
}

int Differing(const std::vector<int>& a, const std::vector<int>& b) {
  int d = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) d += a[i] != b[i];
  return d;
}

}  // namespace

int64_t WarmStart::evaluations() const {
  int64_t n = 0;
  for (const PriorRun& r : runs) n += static_cast<int64_t>(r.points.size());
  return n;
}

std::string WarmStart::Summary() const {
  if (runs.empty()) return "";
  std::vector<std::string> devices;
  int other_shape = 0, other_tenant = 0;
  for (const PriorRun& r : runs) {
    const std::string d = r.device.empty() ? "an unnamed device" : r.device;
    if (std::find(devices.begin(), devices.end(), d) == devices.end()) devices.push_back(d);
    other_shape += r.other_shape;
    other_tenant += r.other_tenant;
  }
  std::string s =
      absl::StrCat("warm start: ", evaluations(), " evaluations from ", runs.size(), " earlier job",
                   runs.size() == 1 ? "" : "s", " on ", absl::StrJoin(devices, ", "));
  std::vector<std::string> notes;
  if (other_shape > 0) notes.push_back(absl::StrCat(other_shape, " of another shape"));
  if (other_tenant > 0) notes.push_back(absl::StrCat(other_tenant, " of another tenant"));
  if (!notes.empty()) absl::StrAppend(&s, " (", absl::StrJoin(notes, ", "), ")");
  return s;
}

std::vector<ParamAssignment> WarmStart::Ranked() const {
  std::map<ParamAssignment, std::pair<double, int>> score;  // sum of relative ranks, runs
  std::vector<const ParamAssignment*> order;                // first seen
  for (const PriorRun& r : runs) {
    std::vector<std::optional<double>> cost;
    for (const PriorPoint& p : r.points) cost.push_back(p.cost);
    const std::vector<double> rank = RelativeRanks(cost);
    std::set<const ParamAssignment*> counted;  // a run measuring a point twice counts it once
    for (size_t i = 0; i < r.points.size(); ++i) {
      auto [it, fresh] = score.try_emplace(r.points[i].params, 0.0, 0);
      if (fresh) order.push_back(&it->first);
      if (!counted.insert(&it->first).second) continue;
      it->second.first += rank[i];
      ++it->second.second;
    }
  }
  std::vector<std::pair<double, size_t>> mean;
  for (size_t i = 0; i < order.size(); ++i) {
    const auto& [sum, n] = score.at(*order[i]);
    mean.emplace_back(sum / n, i);
  }
  std::stable_sort(mean.begin(), mean.end());
  std::vector<ParamAssignment> out;
  out.reserve(mean.size());
  for (const auto& [m, i] : mean) out.push_back(*order[i]);
  return out;
}

namespace {

// One earlier job's evaluations of the seed's variants, as a run of the history (fewer than two
// points: none).
absl::StatusOr<std::optional<PriorRun>> RunOf(Store& store, const v1::Job& job,
                                              const v1::Problem& problem, const WarmStartQuery& q) {
  const bool same_problem = job.spec().problem().content_hash() == problem.content_hash();
  KF_ASSIGN_OR_RETURN(std::vector<v1::Candidate> cands, store.ListCandidates(job.id()));
  KF_ASSIGN_OR_RETURN(std::vector<v1::EvaluationResult> evals, store.ListEvaluations(job.id()));
  std::map<std::string, const v1::Candidate*> by_id;
  for (const v1::Candidate& c : cands) by_id[c.id()] = &c;
  PriorRun run{.job_id = job.id(),
               .other_shape = Sizes(job.spec().problem()) != Sizes(problem),
               .other_tenant = job.spec().tenant() != q.tenant};
  const std::string& seed_source = job.spec().problem().seed().source();
  for (const v1::EvaluationResult& e : evals) {
    if (!e.reused_from_job().empty() || run.points.size() >= q.max_points_per_job) continue;
    if (same_problem && (q.device_class.empty() || e.device().device_class() == q.device_class))
      continue;
    auto it = by_id.find(e.candidate_id());
    if (it == by_id.end() || it->second->source() != seed_source) continue;
    std::optional<double> cost;
    switch (e.outcome()) {
      case v1::OUTCOME_OK:
        if (!std::isfinite(e.speedup()) || e.speedup() <= 0) continue;
        cost = -std::log(e.speedup());
        break;
      case v1::OUTCOME_COMPILE_ERROR:
      case v1::OUTCOME_LAUNCH_ERROR:
      case v1::OUTCOME_WRONG_ANSWER:
      case v1::OUTCOME_REJECTED:
        break;  // the configuration fails: it ranks last
      default:
        continue;  // a timeout or the machine's fault says little about the configuration
    }
    if (run.device.empty()) run.device = e.device().name();
    run.points.push_back(
        {ParamAssignment(it->second->params().begin(), it->second->params().end()), cost});
  }
  if (run.points.size() < 2) return std::nullopt;
  return run;
}

}  // namespace

absl::StatusOr<WarmStart> LoadWarmStart(Store& store, const v1::Problem& problem,
                                        const WarmStartQuery& q) {
  WarmStart warm;
  // Nothing to tune, nothing to transfer; and no tenant must never read as "any tenant".
  if (problem.seed().params().empty() || q.tenant.empty()) return warm;
  if (!q.from_jobs.empty()) {
    for (const std::string& id : q.from_jobs) {
      KF_ASSIGN_OR_RETURN(v1::Job job, store.GetJob(id));
      KF_ASSIGN_OR_RETURN(std::optional<PriorRun> run, RunOf(store, job, problem, q));
      if (run.has_value()) warm.runs.push_back(*std::move(run));
    }
    return warm;
  }
  // The tenants whose history this job may use: its own, and where it pools its history, every
  // tenant that pools theirs. A tenant without a record (embedded runs) has its own only.
  std::set<std::string> tenants = {q.tenant};
  absl::StatusOr<v1::Tenant> tenant = store.GetTenant(q.tenant);
  if (!tenant.ok() && !absl::IsNotFound(tenant.status())) return tenant.status();
  const bool pooled = tenant.ok() && tenant->share_history();
  if (pooled) {
    KF_ASSIGN_OR_RETURN(std::vector<v1::Tenant> all, store.ListTenants());
    for (const v1::Tenant& t : all) {
      if (t.share_history()) tenants.insert(t.name());
    }
  }
  // Ended jobs only (their evaluations no longer change, so a resumed job can rebuild the same
  // history), older than the asking job, newest first; a bounded scan.
  constexpr int kPage = 32, kMaxScanned = 256;
  const std::string kernel_key = HashKernel(problem);
  std::string after = q.job_id;
  for (int scanned = 0; scanned < kMaxScanned && static_cast<int>(warm.runs.size()) < q.max_jobs;) {
    KF_ASSIGN_OR_RETURN(std::vector<v1::Job> jobs, store.ListJobs({.tenant = pooled ? "" : q.tenant,
                                                                   .kernel_key = kernel_key,
                                                                   .limit = kPage,
                                                                   .after_job_id = after}));
    for (const v1::Job& job : jobs) {
      ++scanned;
      after = job.id();
      if (static_cast<int>(warm.runs.size()) >= q.max_jobs) break;
      if (job.id() == q.job_id || !IsFinalJobState(job.state()) ||
          !tenants.contains(job.spec().tenant()))
        continue;
      KF_ASSIGN_OR_RETURN(std::optional<PriorRun> run, RunOf(store, job, problem, q));
      if (run.has_value()) warm.runs.push_back(*std::move(run));
    }
    if (static_cast<int>(jobs.size()) < kPage) break;
  }
  return warm;
}

Prior::Prior(const ParamSpace& space, const WarmStart& warm) {
  for (const PriorRun& r : warm.runs) {
    std::vector<std::vector<int>> points;
    std::vector<std::optional<double>> cost;
    for (const PriorPoint& p : r.points) {
      // A configuration outside this job's space (another shape's knob values) says nothing here.
      auto idx = space.ValueIndices(p.params);
      if (!idx.has_value() || idx->size() != space.params().size()) continue;
      points.push_back(*std::move(idx));
      cost.push_back(p.cost);
    }
    if (points.size() < 2) continue;
    const std::vector<double> rank = RelativeRanks(cost);
    Run run;
    for (size_t i = 0; i < points.size(); ++i) run.rank.try_emplace(points[i], rank[i]);
    if (run.rank.size() <= kMaxNeighbourRun) {
      for (const auto& [p, rk] : run.rank) run.neighbours.emplace_back(p, rk);
    }
    runs_.push_back(std::move(run));
  }
}

std::optional<double> Prior::RunRank(const Run& run, const std::vector<int>& positions) const {
  if (auto it = run.rank.find(positions); it != run.rank.end()) return it->second;
  if (run.neighbours.empty()) return std::nullopt;
  // The mean rank of the nearest measured points, if they are near (at most 2 knobs apart).
  int best = 3;
  double sum = 0;
  int n = 0;
  for (const auto& [p, rk] : run.neighbours) {
    const int d = Differing(p, positions);
    if (d < best) {
      best = d;
      sum = 0;
      n = 0;
    }
    if (d == best) {
      sum += rk;
      ++n;
    }
  }
  if (n == 0) return std::nullopt;
  return sum / n;
}

std::vector<std::optional<double>> Prior::RunRanks(const std::vector<int>& positions) const {
  std::vector<std::optional<double>> out;
  out.reserve(runs_.size());
  for (const Run& run : runs_) out.push_back(RunRank(run, positions));
  return out;
}

std::vector<double> Prior::Weights(const std::vector<std::vector<int>>& points,
                                   const std::vector<double>& cost) const {
  std::vector<std::vector<std::optional<double>>> run_ranks;
  run_ranks.reserve(points.size());
  for (const auto& p : points) run_ranks.push_back(RunRanks(p));
  return Weights(run_ranks, cost);
}

std::vector<double> Prior::Weights(const std::vector<std::vector<std::optional<double>>>& run_ranks,
                                   const std::vector<double>& cost) const {
  std::vector<double> weights;
  weights.reserve(runs_.size());
  for (size_t k = 0; k < runs_.size(); ++k) {
    std::vector<std::pair<double, double>> known;  // (run's rank, this job's cost)
    for (size_t i = 0; i < run_ranks.size() && i < cost.size(); ++i) {
      if (k < run_ranks[i].size() && run_ranks[i][k].has_value())
        known.emplace_back(*run_ranks[i][k], cost[i]);
    }
    int64_t concordant = 0, discordant = 0;
    for (size_t i = 0; i < known.size(); ++i) {
      for (size_t j = i + 1; j < known.size(); ++j) {
        const double a = known[i].first - known[j].first, b = known[i].second - known[j].second;
        if (a == 0 || b == 0) continue;
        ((a > 0) == (b > 0) ? concordant : discordant) += 1;
      }
    }
    const int64_t pairs = concordant + discordant;
    weights.push_back(pairs < kMinPairs
                          ? 1.0
                          : std::max(0.0, static_cast<double>(concordant - discordant) /
                                              static_cast<double>(pairs)));
  }
  return weights;
}

std::optional<double> Prior::Combine(const std::vector<std::optional<double>>& run_ranks,
                                     const std::vector<double>& weights) {
  double sum = 0, total = 0;
  for (size_t k = 0; k < run_ranks.size() && k < weights.size(); ++k) {
    if (weights[k] <= 0 || !run_ranks[k].has_value()) continue;
    sum += weights[k] * *run_ranks[k];
    total += weights[k];
  }
  if (total <= 0) return std::nullopt;
  return sum / total;
}

std::optional<double> Prior::Rank(const std::vector<int>& positions,
                                  const std::vector<double>& weights) const {
  return Combine(RunRanks(positions), weights);
}

}  // namespace kforge::coordinator
