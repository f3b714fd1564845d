#pragma once

#include "services/coordinator/layer.h"

// Screening of cheap children: the parametric mutator offers several children per proposal and
// the screener picks the one to evaluate, by a Thompson-style draw from a Gaussian-process
// surrogate of the job's evaluations. Children that differ only in their knobs share a "variant"
// (same source and launch plan); each variant has its own history, so a model-written kernel
// never borrows another kernel's timings. Deterministic: the same evaluations and seed give the
// same choice.

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/hash.h"
#include "common/param_space.h"
#include "kforge/v1/candidate.pb.h"
#include "kforge/v1/evaluation.pb.h"
#include "services/coordinator/warm_start.h"

namespace kforge::coordinator {

// What the children on offer are. Local: a handful of moves around a parent, ranked by a model
// whose kernel shape fits the variant's history best (fine detail near the search). Global: a
// wide random sample of the whole space, ranked by a plain "how many knobs differ" kernel plus a
// linear trend per knob (Surrogate::kGlobalDrawShape), with milder noise: the question there is
// which region deserves a visit, the shape that fits local detail best generalises poorly across
// the space, and only the trend says anything about values far from the data (measured in
// bench/README.md).
enum class ScreenScope { kLocal, kGlobal };

// A known cost of a child (lower is better; nullopt: unknown, or it would fail). With one, the
// screener ranks children by it instead of by the model, and defers to the model when it knows
// none of them: benchmarks on recorded spaces use it to measure how far the model's screening is
// from perfect, over the whole job or a phase of it (kforge-bench-search --screen-oracle).
using ScreenOracle = std::function<std::optional<double>(const v1::Candidate&)>;

struct ScreenerOptions {
  int min_points = 4;      // successful evaluations of a variant before its model is used
  int max_points = 256;    // surrogate size cap: the fit is cubic in it
  double reselect_growth = 1.25;  // the kernel shape is re-chosen when the history grows this much
  double exploration = 2;  // scale of the Thompson noise on the predicted spread (2 measured best)
  double global_exploration = 1;  // the same for global draws (1 measured best)
  ScreenOracle oracle;            // empty in service use
};

class Screener {
 public:
  Screener(const ParamSpace& space, ScreenerOptions options = {});

  // Records an evaluation (in sequence order). Infrastructure errors say nothing about the
  // candidate and are skipped; every other failure counts as the variant's worst time.
  void Record(const v1::Candidate& candidate, const v1::EvaluationResult& result);
  // The fleet's history of this kernel (warm_start.h), for the seed's variant (the seed's source and
  // plan with any knobs): until the variant has enough points of its own, children are ranked by
  // the history alone; from then on the surrogate models this job's costs as a linear function of
  // the history's rank (its slope fitted to the job's own points, never negative) plus what that
  // misses. A history that orders this job's measurements badly weighs nothing.
  void SetPrior(const v1::Candidate& seed, const WarmStart& warm);
  // The index of the child to evaluate; 0 when there is no model yet (too few points, children
  // of different variants, or knob values outside the space).
  int Choose(const std::vector<const v1::Candidate*>& children, uint64_t seed,
             ScreenScope scope = ScreenScope::kLocal);

 private:
  struct History {
    std::vector<std::vector<int>> points;
    std::vector<std::vector<std::optional<double>>> prior_ranks;  // per point, each history run's rank
    std::vector<std::optional<double>> log_time;  // nullopt: failed
    int ok = 0;
    int shape = -1;          // the surrogate's kernel shape, re-chosen as the history grows
    size_t shape_points = 0;  // history size when it was chosen
  };
  std::string VariantKey(const v1::Candidate& c);
  // The child the oracle ranks first; nullopt when it knows none of them.
  std::optional<int> ChooseByOracle(const std::vector<const v1::Candidate*>& children) const;
  // Value positions followed by each knob's alignment class: the surrogate's point.
  std::vector<int> Features(const std::vector<int>& positions) const;
  // The value positions of a Features point.
  std::vector<int> Positions(const std::vector<int>& features) const;
  // The child the history ranks first (nullopt: it knows none of them).
  std::optional<int> ChooseByPrior(const std::vector<std::vector<int>>& children, const std::vector<double>& weights) const;
  // The prior's weights given the variant's own points.
  std::vector<double> PriorWeights(History& h, const std::vector<double>& objective) const;

  const ParamSpace& space_;
  CandidateHasher hasher_;  // a job's candidates mostly share one source: normalised once
  ScreenerOptions options_;
  std::vector<int> cardinality_;     // values per knob, for the surrogate
  std::vector<int> alignment_span_;
  std::map<std::string, History> variants_;
  std::optional<Prior> prior_;
  std::string prior_variant_;
};

}  // namespace kforge::coordinator
