#pragma once

#include "services/coordinator/layer.h"

// A Gaussian-process surrogate over knob assignments, used to screen the parametric mutator's
// children: of several cheap proposals, evaluate the one the model expects to be best, with
// Thompson-style noise so that uncertain regions still get visited.
//
// Points are knob value positions (indices into each knob's declared values). The kernel mixes a
// categorical part (how many knobs differ) with an ordinal part (how far apart the positions
// are), and for global draws a linear trend: tuning spaces have both kinds of knobs (a flag, a tile
// size), and which part explains a space best differs per kernel and device, so each fit picks the
// shape with the highest marginal likelihood from a small fixed set. Targets are log run times,
// standardised.

#include <cstdint>
#include <vector>

#include "absl/status/status.h"

namespace kforge::coordinator {

struct SurrogateOptions {
  double noise = 1e-2;   // observation noise, relative to the standardised targets
  int max_points = 256;  // beyond this, the best and the most recent points are kept
  // A kernel shape chosen by an earlier fit (shape_index()): skips the search over shapes, which
  // costs a factorisation per shape.
  int fixed_shape = -1;
};

class Surrogate {
 public:
  // `cardinality[p]`: how many values knob p declares; knobs with one value are ignored. A point
  // holds the knobs' value positions, then one entry per `extra_span` element: derived ordinal
  // features (such as a knob value's power-of-two alignment) whose range is that span.
  explicit Surrogate(std::vector<int> cardinality, std::vector<int> extra_span = {}, SurrogateOptions options = {});

  // Fits to points and their objective (lower is better). Needs at least two points; errors
  // for mismatched sizes.
  [[nodiscard]] absl::Status Fit(const std::vector<std::vector<int>>& points, const std::vector<double>& objective);

  struct Prediction {
    double mean = 0;  // in objective units
    double sd = 0;
  };
  // Only after a successful Fit.
  Prediction Predict(const std::vector<int>& point) const;

  // The chosen kernel shape, to reuse with SurrogateOptions::fixed_shape.
  int shape_index() const { return shape_index_; }
  static int ShapeCount();
  // The shape that counts differing knobs only, at unit width: no ordinal or derived part.
  static constexpr int kHammingShape = 1;
  // Never chosen by a fit, only fixed: the Hamming shape plus a linear trend per knob, for global
  // draws. The similarity parts revert to the mean away from the data; the trend extrapolates
  // along a knob (larger tiles were faster, so the largest, unseen, may be fastest), which is
  // what ranks a sample of the whole space usefully. Its prior variance is largest at the ends of
  // the ranges, so a Thompson draw that knows little leans toward the corners of the space.
  static constexpr int kGlobalDrawShape = 24;

 private:
  struct Shape {
    double categorical = 1;
    double ordinal = 0;
    double extra = 0;
    bool weighted = false;  // knobs weighted by their estimated relevance
    double trend = 0;       // weight of a linear trend in each knob's position
  };
  void EstimateRelevance();
  static Shape ShapeAt(int index);
  double Kernel(const std::vector<int>& a, const std::vector<int>& b, const Shape& s) const;
  // Cholesky factor and weights for `shape`; returns the log marginal likelihood, or NaN if the
  // matrix is not positive definite.
  double FitShape(const Shape& shape, std::vector<double>* chol, std::vector<double>* alpha) const;

  std::vector<int> active_;   // knobs with more than one value
  std::vector<double> span_;  // per active knob: positions - 1
  std::vector<double> relevance_;  // per active knob, mean 1
  std::vector<std::pair<int, double>> extra_;  // derived features: (index in a point, span)
  SurrogateOptions options_;
  Shape shape_;
  int shape_index_ = -1;
  std::vector<std::vector<int>> x_;
  std::vector<double> y_;     // standardised
  double y_mean_ = 0;
  double y_scale_ = 1;
  std::vector<double> chol_;  // lower-triangular, row-major n x n
  std::vector<double> alpha_;
};

}  // namespace kforge::coordinator
