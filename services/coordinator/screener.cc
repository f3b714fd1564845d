#include "services/coordinator/screener.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <random>
#include <tuple>
#include <utility>

#include "common/hash.h"
#include "google/protobuf/util/message_differencer.h"
#include "services/coordinator/surrogate.h"

namespace kforge::coordinator {

namespace {

// Alignment class of a knob value: 1 + log2 for a power of two, else 0. GPU block and tile sizes
// behave alike when they are alike in this (warps, memory transactions, banks, and whether they
// divide power-of-two problem sizes): 32 and 64 are neighbours, 96 is not, though its position is
// between them. Measured against trailing zero bits in bench/README.md.
int Alignment(int64_t v) {
  const uint64_t a = static_cast<uint64_t>(v < 0 ? -v : v);
  return std::has_single_bit(a) ? std::countr_zero(a) + 1 : 0;
}

// The objective of a variant's first `n` points: the log times, a failure counting as the worst
// time among them (0 when none succeeded).
std::vector<double> ObjectiveOf(const std::vector<std::optional<double>>& log_time, size_t n) {
  double worst = -INFINITY;
  for (size_t i = 0; i < n; ++i) {
    if (log_time[i].has_value()) worst = std::max(worst, *log_time[i]);
  }
  if (std::isinf(worst)) worst = 0;
  std::vector<double> objective;
  objective.reserve(n);
  for (size_t i = 0; i < n; ++i) objective.push_back(log_time[i].value_or(worst));
  return objective;
}

// The least-squares slope of `y` on the known `x`, floored at 0, and the known x's mean (0 and 0
// with fewer than two known x).
std::pair<double, double> NonNegativeSlope(const std::vector<std::optional<double>>& x, const std::vector<double>& y) {
  double mean_x = 0, mean_y = 0, n = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    if (!x[i].has_value()) continue;
    mean_x += *x[i];
    mean_y += y[i];
    ++n;
  }
  if (n < 2) return {0.0, 0.0};
  mean_x /= n;
  mean_y /= n;
  double cov = 0, var = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    if (!x[i].has_value()) continue;
    cov += (*x[i] - mean_x) * (y[i] - mean_y);
    var += (*x[i] - mean_x) * (*x[i] - mean_x);
  }
  return {var > 1e-12 ? std::max(0.0, cov / var) : 0.0, mean_x};
}

}  // namespace

Screener::Screener(const ParamSpace& space, ScreenerOptions options) : space_(space), options_(options) {
  for (const auto& p : space_.params()) {
    cardinality_.push_back(p.values_size());
    int lo = 64, hi = 0;
    for (int64_t v : p.values()) {
      lo = std::min(lo, Alignment(v));
      hi = std::max(hi, Alignment(v));
    }
    alignment_span_.push_back(p.values_size() > 1 ? hi - lo : 0);
  }
}

std::vector<int> Screener::Features(const std::vector<int>& positions) const {
  std::vector<int> f = positions;
  for (size_t p = 0; p < positions.size(); ++p) f.push_back(Alignment(space_.params()[p].values(positions[p])));
  return f;
}

std::vector<int> Screener::Positions(const std::vector<int>& features) const {
  return std::vector<int>(features.begin(), features.begin() + static_cast<std::ptrdiff_t>(space_.params().size()));
}

void Screener::SetPrior(const v1::Candidate& seed, const WarmStart& warm) {
  Prior prior(space_, warm);
  if (prior.empty()) return;
  prior_.emplace(std::move(prior));
  prior_variant_ = VariantKey(seed);
}

std::vector<double> Screener::PriorWeights(History& h, const std::vector<double>& objective) const {
  // Each point's ranks by the history's runs, looked up once (a run answers by a scan).
  while (h.prior_ranks.size() < h.points.size()) h.prior_ranks.push_back(prior_->RunRanks(Positions(h.points[h.prior_ranks.size()])));
  return prior_->Weights(h.prior_ranks, objective);
}

std::optional<int> Screener::ChooseByPrior(const std::vector<std::vector<int>>& children,
                                           const std::vector<double>& weights) const {
  std::optional<int> best;
  double best_rank = 0;
  for (size_t i = 0; i < children.size(); ++i) {
    const std::optional<double> rank = prior_->Rank(children[i], weights);
    if (rank.has_value() && (!best.has_value() || *rank < best_rank)) {
      best_rank = *rank;
      best = static_cast<int>(i);
    }
  }
  return best;
}

std::string Screener::VariantKey(const v1::Candidate& c) {
  v1::Candidate probe;
  probe.set_source(c.source());
  *probe.mutable_plan() = c.plan();
  return hasher_.Hash(probe);
}

void Screener::Record(const v1::Candidate& candidate, const v1::EvaluationResult& result) {
  if (result.outcome() == v1::OUTCOME_INFRA_ERROR || result.outcome() == v1::OUTCOME_UNSPECIFIED) return;
  auto idx = space_.ValueIndices(ParamAssignment(candidate.params().begin(), candidate.params().end()));
  if (!idx.has_value()) return;
  History& h = variants_[VariantKey(candidate)];
  h.points.push_back(Features(*idx));
  if (result.outcome() == v1::OUTCOME_OK && result.speedup() > 0) {
    // Lower is better: the log of the time relative to the reference.
    h.log_time.push_back(-std::log(result.speedup()));
    ++h.ok;
  } else {
    h.log_time.push_back(std::nullopt);
  }
}

std::optional<int> Screener::ChooseByOracle(
    const std::vector<const v1::Candidate*>& children) const {
  std::optional<int> best;
  std::optional<double> best_cost;
  for (size_t i = 0; i < children.size(); ++i) {
    const std::optional<double> cost = options_.oracle(*children[i]);
    if (cost.has_value() && (!best_cost.has_value() || *cost < *best_cost)) {
      best_cost = cost;
      best = static_cast<int>(i);
    }
  }
  return best;
}

int Screener::Choose(const std::vector<const v1::Candidate*>& children, uint64_t seed, ScreenScope scope) {
  if (children.size() < 2) return 0;
  if (options_.oracle) {
    if (const std::optional<int> pick = ChooseByOracle(children); pick.has_value()) return *pick;
  }
  // A proposal's children usually carry the parent's source and plan byte for byte: compare
  // those before hashing (the key normalises the source, so differing bytes can still match).
  const v1::Candidate& first = *children.front();
  const std::string key = VariantKey(first);
  for (size_t i = 1; i < children.size(); ++i) {
    const v1::Candidate& c = *children[i];
    const bool same_bytes =
        c.source() == first.source() &&
        google::protobuf::util::MessageDifferencer::Equals(c.plan(), first.plan());
    if (!same_bytes && VariantKey(c) != key) return 0;
  }
  auto it = variants_.find(key);
  const bool with_prior = prior_.has_value() && key == prior_variant_;
  const bool modelled = it != variants_.end() && it->second.ok >= options_.min_points;
  if (!modelled && !with_prior) return 0;
  // Every child's value positions; a knob value outside the space: no ranking.
  std::vector<std::vector<int>> child_positions;
  child_positions.reserve(children.size());
  for (const v1::Candidate* c : children) {
    auto idx = space_.ValueIndices(ParamAssignment(c->params().begin(), c->params().end()));
    if (!idx.has_value()) return 0;
    child_positions.push_back(*std::move(idx));
  }
  if (!modelled) {
    // Too few points of its own for a model: the history ranks the children, its runs weighted
    // by how they order what the variant has measured (equally before that).
    std::vector<double> weights(prior_->runs(), 1.0);
    if (it != variants_.end()) {
      History& h = it->second;
      weights = PriorWeights(h, ObjectiveOf(h.log_time, h.points.size()));
    }
    return ChooseByPrior(child_positions, weights).value_or(0);
  }
  History& h = it->second;
  const std::vector<double> objective = ObjectiveOf(h.log_time, h.points.size());

  // Choosing the kernel shape costs a factorisation per shape, so it is chosen on the first T
  // points, for T in a geometric series, and reused until the history reaches the next T. A
  // function of the history alone: a resumed job makes the same choices as an uninterrupted one.
  size_t threshold = static_cast<size_t>(options_.min_points);
  while (true) {
    const auto next = static_cast<size_t>(std::ceil(static_cast<double>(threshold) * options_.reselect_growth));
    if (next > h.points.size()) break;
    threshold = std::max(next, threshold + 1);
  }
  threshold = std::clamp<size_t>(threshold, 2, h.points.size());
  if (h.shape < 0 || h.shape_points != threshold) {
    Surrogate chooser(cardinality_, alignment_span_, {.max_points = options_.max_points});
    const std::vector<std::vector<int>> first(h.points.begin(), h.points.begin() + threshold);
    if (!chooser.Fit(first, ObjectiveOf(h.log_time, threshold)).ok()) return 0;
    h.shape = chooser.shape_index();
    h.shape_points = threshold;
  }
  const bool global = scope == ScreenScope::kGlobal;
  Surrogate model(cardinality_, alignment_span_,
                  {.max_points = options_.max_points,
                   .fixed_shape = global ? Surrogate::kGlobalDrawShape : h.shape});
  // With a history: the objective's linear part in the history's rank is taken out (its slope
  // fitted here, never negative), and the surrogate models the rest.
  std::vector<double> weights;
  double slope = 0, mean_rank = 0;
  std::vector<double> residual = objective;
  if (with_prior) {
    weights = PriorWeights(h, objective);
    std::vector<std::optional<double>> rank;
    rank.reserve(h.prior_ranks.size());
    for (const auto& run_ranks : h.prior_ranks) rank.push_back(Prior::Combine(run_ranks, weights));
    std::tie(slope, mean_rank) = NonNegativeSlope(rank, objective);
    for (size_t i = 0; i < rank.size(); ++i) residual[i] -= slope * (rank[i].value_or(mean_rank) - mean_rank);
  }
  if (!model.Fit(h.points, residual).ok()) return 0;

  std::mt19937_64 rng(seed ^ 0x2545f4914f6cdd1dULL);
  std::normal_distribution<double> z(0, 1);
  int best = 0;
  double best_score = INFINITY;
  for (size_t i = 0; i < children.size(); ++i) {
    const std::vector<int>& idx = child_positions[i];
    const auto pred = model.Predict(Features(idx));
    double prior_part = 0;
    if (slope > 0) prior_part = slope * (prior_->Rank(idx, weights).value_or(mean_rank) - mean_rank);
    const double score = prior_part + pred.mean + (global ? options_.global_exploration : options_.exploration) * pred.sd * z(rng);
    if (score < best_score) {
      best_score = score;
      best = static_cast<int>(i);
    }
  }
  return best;
}

}  // namespace kforge::coordinator
