#include "services/coordinator/surrogate.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <limits>
#include <map>
#include <numeric>

#include "absl/strings/str_cat.h"

namespace kforge::coordinator {
namespace {

// Kernel shapes tried at each fit: categorical-only at three widths, ordinal-only, and mixes.
struct ShapeSpec {
  double categorical;
  double ordinal;
};
constexpr ShapeSpec kShapes[] = {{0.5, 0}, {1, 0}, {3, 0}, {1, 2}, {0.3, 4}, {0, 6}};
constexpr double kExtraWeights[] = {0, 2};
static_assert(Surrogate::kHammingShape < static_cast<int>(std::size(kShapes)) &&
                  kShapes[Surrogate::kHammingShape].categorical == 1 && kShapes[Surrogate::kHammingShape].ordinal == 0 &&
                  kExtraWeights[0] == 0,
              "kHammingShape must name the plain categorical shape without derived features");
constexpr int kSearchedShapes = static_cast<int>(std::size(kShapes) * std::size(kExtraWeights) * 2);
static_assert(Surrogate::kGlobalDrawShape == kSearchedShapes,
              "kGlobalDrawShape follows the searched shapes");

// The global-draw shape's trend weight. A unit Hamming part plus this much linear trend per knob;
// measured against 2, 4 and 16 in bench/README.md.
constexpr double kGlobalDrawTrend = 8;

// In-place Cholesky of a row-major n x n matrix (lower triangle); false if not positive definite.
bool Cholesky(std::vector<double>& a, size_t n) {
  for (size_t j = 0; j < n; ++j) {
    double d = a[j * n + j];
    for (size_t k = 0; k < j; ++k) d -= a[j * n + k] * a[j * n + k];
    if (!(d > 0)) return false;
    d = std::sqrt(d);
    a[j * n + j] = d;
    for (size_t i = j + 1; i < n; ++i) {
      double s = a[i * n + j];
      for (size_t k = 0; k < j; ++k) s -= a[i * n + k] * a[j * n + k];
      a[i * n + j] = s / d;
    }
  }
  return true;
}

// Solves L z = b in place.
void ForwardSolve(const std::vector<double>& l, size_t n, std::vector<double>& b) {
  for (size_t i = 0; i < n; ++i) {
    double s = b[i];
    for (size_t k = 0; k < i; ++k) s -= l[i * n + k] * b[k];
    b[i] = s / l[i * n + i];
  }
}

// Solves L^T z = b in place.
void BackwardSolve(const std::vector<double>& l, size_t n, std::vector<double>& b) {
  for (size_t i = n; i-- > 0;) {
    double s = b[i];
    for (size_t k = i + 1; k < n; ++k) s -= l[k * n + i] * b[k];
    b[i] = s / l[i * n + i];
  }
}

}  // namespace

int Surrogate::ShapeCount() { return kSearchedShapes; }

Surrogate::Shape Surrogate::ShapeAt(int index) {
  if (index == kGlobalDrawShape) return {.categorical = 1, .trend = kGlobalDrawTrend};
  const int per_weighting = static_cast<int>(std::size(kShapes) * std::size(kExtraWeights));
  const ShapeSpec& spec = kShapes[index % std::size(kShapes)];
  return {spec.categorical, spec.ordinal, kExtraWeights[(index % per_weighting) / std::size(kShapes)],
          index >= per_weighting};
}

Surrogate::Surrogate(std::vector<int> cardinality, std::vector<int> extra_span, SurrogateOptions options)
    : options_(options) {
  for (size_t p = 0; p < cardinality.size(); ++p) {
    if (cardinality[p] > 1) {
      active_.push_back(static_cast<int>(p));
      span_.push_back(cardinality[p] - 1);
    }
  }
  for (size_t e = 0; e < extra_span.size(); ++e) {
    if (extra_span[e] > 0) extra_.emplace_back(static_cast<int>(cardinality.size() + e), extra_span[e]);
  }
}

double Surrogate::Kernel(const std::vector<int>& a, const std::vector<int>& b, const Shape& s) const {
  if (active_.empty()) return 1;
  double differ = 0;
  double distance = 0;
  for (size_t i = 0; i < active_.size(); ++i) {
    const int p = active_[i];
    if (a[p] != b[p]) {
      const double w = s.weighted ? relevance_[i] : 1.0;
      differ += w;
      distance += w * std::abs(a[p] - b[p]) / span_[i];
    }
  }
  double extra = 0;
  for (const auto& [i, span] : extra_) extra += std::abs(a[i] - b[i]) / span;
  const double d = static_cast<double>(active_.size());
  double trend = 0;
  if (s.trend > 0) {
    // A dot product of the positions, centred on each knob's range: a linear model per knob
    // under the similarity part.
    for (size_t i = 0; i < active_.size(); ++i) {
      const int p = active_[i];
      trend += (a[p] / span_[i] - 0.5) * (b[p] / span_[i] - 0.5);
    }
    trend *= s.trend / d;
  }
  return trend + std::exp(-(s.categorical * differ + s.ordinal * distance + s.extra * extra) / d);
}

double Surrogate::FitShape(const Shape& shape, std::vector<double>* chol, std::vector<double>* alpha) const {
  const size_t n = x_.size();
  chol->assign(n * n, 0);
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = 0; j <= i; ++j) (*chol)[i * n + j] = Kernel(x_[i], x_[j], shape);
    (*chol)[i * n + i] += options_.noise;
  }
  if (!Cholesky(*chol, n)) return std::numeric_limits<double>::quiet_NaN();
  *alpha = y_;
  ForwardSolve(*chol, n, *alpha);
  double fit = 0;
  for (double v : *alpha) fit += v * v;  // y^T K^-1 y, via the forward half
  BackwardSolve(*chol, n, *alpha);
  double log_det = 0;
  for (size_t i = 0; i < n; ++i) log_det += std::log((*chol)[i * n + i]);
  return -0.5 * fit - log_det;
}

absl::Status Surrogate::Fit(const std::vector<std::vector<int>>& points, const std::vector<double>& objective) {
  if (points.size() != objective.size()) {
    return absl::InvalidArgumentError(absl::StrCat("surrogate: ", points.size(), " points but ", objective.size(),
                                                   " objective values"));
  }
  if (points.size() < 2) return absl::FailedPreconditionError("surrogate: needs at least two points");
  if (options_.fixed_shape > kGlobalDrawShape) {
    return absl::InvalidArgumentError(
        absl::StrCat("surrogate: no kernel shape ", options_.fixed_shape));
  }
  for (const auto& p : points) {
    const size_t need = extra_.empty() ? (active_.empty() ? 0 : active_.back() + 1) : extra_.back().first + 1;
    if (p.size() < need) return absl::InvalidArgumentError("surrogate: point with too few features");
  }
  // Keep the best half and the most recent rest when there are too many points: the cubic fit
  // cost stays bounded, and the model stays sharp where the search is.
  std::vector<size_t> keep(points.size());
  std::iota(keep.begin(), keep.end(), 0);
  const size_t cap = static_cast<size_t>(std::max(2, options_.max_points));
  if (keep.size() > cap) {
    std::vector<size_t> by_value = keep;
    std::stable_sort(by_value.begin(), by_value.end(), [&](size_t a, size_t b) { return objective[a] < objective[b]; });
    std::vector<bool> chosen(points.size(), false);
    for (size_t i = 0; i < cap / 2; ++i) chosen[by_value[i]] = true;
    size_t taken = cap / 2;
    for (size_t i = points.size(); i-- > 0 && taken < cap;) {
      if (!chosen[i]) {
        chosen[i] = true;
        ++taken;
      }
    }
    keep.clear();
    for (size_t i = 0; i < points.size(); ++i) {
      if (chosen[i]) keep.push_back(i);
    }
  }
  x_.clear();
  y_.clear();
  for (size_t i : keep) {
    x_.push_back(points[i]);
    y_.push_back(objective[i]);
  }
  const double n = static_cast<double>(y_.size());
  y_mean_ = std::accumulate(y_.begin(), y_.end(), 0.0) / n;
  double var = 0;
  for (double v : y_) var += (v - y_mean_) * (v - y_mean_);
  y_scale_ = std::sqrt(var / n);
  if (!(y_scale_ > 1e-12)) y_scale_ = 1;
  for (double& v : y_) v = (v - y_mean_) / y_scale_;

  EstimateRelevance();
  double best = -std::numeric_limits<double>::infinity();
  std::vector<double> chol, alpha;
  const bool fixed = options_.fixed_shape >= 0;
  for (int index = fixed ? options_.fixed_shape : 0;
       index < (fixed ? options_.fixed_shape + 1 : ShapeCount()); ++index) {
    const Shape s = ShapeAt(index);
    if (s.extra > 0 && extra_.empty()) continue;
    const double lml = FitShape(s, &chol, &alpha);
    if (std::isnan(lml) || lml <= best) continue;
    best = lml;
    shape_ = s;
    shape_index_ = index;
    chol_ = std::move(chol);
    alpha_ = std::move(alpha);
  }
  if (std::isinf(best)) return absl::InternalError("surrogate: no kernel shape gave a positive-definite fit");
  return absl::OkStatus();
}

void Surrogate::EstimateRelevance() {
  // Per knob, the share of the targets' variance its values explain (adjusted for the number of
  // groups, so that a knob with many values does not look relevant by chance), floored, and
  // scaled to average 1: a cheap stand-in for per-knob length scales.
  const size_t d = active_.size();
  relevance_.assign(d, 1.0);
  const double n = static_cast<double>(y_.size());
  double total = 0;
  for (double v : y_) total += v * v;  // y_ is standardised: mean 0
  if (d == 0 || total <= 0) return;
  double sum = 0;
  for (size_t i = 0; i < d; ++i) {
    std::map<int, std::pair<double, int>> groups;  // position -> (sum, count)
    for (size_t j = 0; j < x_.size(); ++j) {
      auto& g = groups[x_[j][active_[i]]];
      g.first += y_[j];
      g.second += 1;
    }
    double between = 0;
    for (const auto& [pos, g] : groups) between += g.first * g.first / g.second;
    const double k = static_cast<double>(groups.size());
    const double within_mean = n > k ? (total - between) / (n - k) : 0;
    const double effect = std::max(0.0, (between - (k - 1) * within_mean) / (total + within_mean));
    relevance_[i] = 0.1 + effect;
    sum += relevance_[i];
  }
  for (double& r : relevance_) r *= static_cast<double>(d) / sum;
}

Surrogate::Prediction Surrogate::Predict(const std::vector<int>& point) const {
  const size_t n = x_.size();
  std::vector<double> k(n);
  double mean = 0;
  for (size_t i = 0; i < n; ++i) {
    k[i] = Kernel(point, x_[i], shape_);
    mean += k[i] * alpha_[i];
  }
  ForwardSolve(chol_, n, k);
  double explained = 0;
  for (double v : k) explained += v * v;
  const double var = std::max(1e-12, Kernel(point, point, shape_) - explained);
  return {y_mean_ + y_scale_ * mean, y_scale_ * std::sqrt(var)};
}

}  // namespace kforge::coordinator
