#include "services/llm-proxy/parametric_mutator.h"

#include <algorithm>
#include <bit>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/hash.h"
#include "common/kt_cache.h"
#include "services/llm-proxy/client/remote_mutator.h"

namespace kforge::llm {

v1::Candidate WithParams(const v1::Candidate& parent, const ParamAssignment& params, CandidateHasher* hasher) {
  v1::Candidate c;
  c.set_job_id(parent.job_id());
  c.set_source(parent.source());
  *c.mutable_plan() = parent.plan();
  for (const auto& [k, v] : params) (*c.mutable_params())[k] = v;
  c.add_parent_ids(parent.id());
  c.set_mutator(v1::MUTATOR_KIND_PARAMETRIC);
  c.set_content_hash(hasher != nullptr ? hasher->Hash(c) : HashCandidate(c));
  return c;
}

namespace {

// Reset draws that lean to favoured positions (powers of two, range ends) before plain ones take
// over. That many in a row fail (invalid or seen) mostly when those are used up; the rest of the
// call then draws plainly. A tightly constrained space may trip it by chance, which costs only
// the prior.
constexpr int kPowerOfTwoResetTries = 64;

// The positions of a knob's power-of-two values, in declared order.
std::vector<int> PowerOfTwoPositions(const v1::Param& param) {
  std::vector<int> out;
  for (int j = 0; j < param.values_size(); ++j) {
    const int64_t v = param.values(j);
    if (v > 0 && std::has_single_bit(static_cast<uint64_t>(v))) out.push_back(j);
  }
  return out;
}

// Size knobs: those with kMinPowerOfTwoLadder or more powers of two among other values.
bool IsSizeKnob(const v1::Param& param, const std::vector<int>& ladder) {
  return static_cast<int>(ladder.size()) >= kMinPowerOfTwoLadder &&
         static_cast<int>(ladder.size()) < param.values_size();
}

// The positions random draws favour on a size knob: its powers of two and the ends of its range,
// its smallest and largest values (a monotone trend, such as more work per thread being faster,
// puts the best value at an end, which need not be a power of two: a tile of 1, 2, 4, 6, .., 20).
// Empty for other knobs.
std::vector<int> FavouredPositions(const v1::Param& param, const std::vector<int>& ladder) {
  if (!IsSizeKnob(param, ladder)) return {};
  std::vector<int> out = ladder;
  const auto [lo, hi] = std::minmax_element(param.values().begin(), param.values().end());
  out.push_back(static_cast<int>(lo - param.values().begin()));
  out.push_back(static_cast<int>(hi - param.values().begin()));
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

// With chance `chance`, a size knob's position becomes one of its favoured ones, drawn uniformly.
void TowardFavoured(const std::vector<int>& favoured, double chance, int* position,
                    std::mt19937_64& rng) {
  std::uniform_real_distribution<double> u(0, 1);
  if (favoured.empty() || u(rng) >= chance) return;
  std::uniform_int_distribution<size_t> pick(0, favoured.size() - 1);
  *position = favoured[pick(rng)];
}

// The parent's value positions, and which knobs have more than one value to move between.
std::optional<std::vector<int>> Position(const ParamSpace& space, const v1::Candidate& parent,
                                         std::vector<int>* tunable) {
  const auto& params = space.params();
  for (size_t i = 0; i < params.size(); ++i) {
    if (params[i].values_size() > 1) tunable->push_back(static_cast<int>(i));
  }
  return space.ValueIndices(ParamAssignment(parent.params().begin(), parent.params().end()));
}

// What a problem's space depends on: its knobs, constraints, defines and size sets.
std::string SpaceKey(const v1::Problem& problem) {
  v1::Problem defining;
  *defining.mutable_size_sets() = problem.size_sets();
  *defining.mutable_seed()->mutable_params() = problem.seed().params();
  *defining.mutable_seed()->mutable_constraints() = problem.seed().constraints();
  *defining.mutable_seed()->mutable_defines() = problem.seed().defines();
  return HashProblem(defining);
}

}  // namespace

absl::StatusOr<std::shared_ptr<const ParametricMutator::Space>> ParametricMutator::SpaceFor(
    const v1::MutateRequest& request) {
  const v1::Problem& problem = request.problem();
  const v1::ReplaySpace& replay = request.replay_space();
  // A replay problem's recorded configurations are part of its space.
  const std::string key = replay.key().empty() ? SpaceKey(problem) : absl::StrCat(SpaceKey(problem), "/", replay.key());
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = spaces_.find(key);
    if (it != spaces_.end()) {
      recent_.splice(recent_.begin(), recent_, it->second.recent);
      return it->second.space;
    }
  }
  ValidityFn recorded;
  if (!replay.key().empty()) {
    if (replay.configurations().empty()) {
      return absl::FailedPreconditionError(absl::StrCat(kReplaySpaceUnknown, ": ", replay.key()));
    }
    const std::vector<std::string> params(replay.params().begin(), replay.params().end());
    const std::vector<std::string> configurations(replay.configurations().begin(), replay.configurations().end());
    if (RecordedSpaceKey(params, configurations) != replay.key()) {
      return absl::InvalidArgumentError("replay_space.key is not the key of its params and configurations");
    }
    recorded = RecordedSpaceValidity(params, configurations);
  }
  // Parsed outside the lock: a large space does not hold up calls for other problems.
  auto space = ParamSpace::Create(problem);
  if (!space.ok()) return space.status();
  std::vector<std::vector<int>> ladders, favoured;
  for (const v1::Param& p : space->params()) {
    if (p.values().empty()) {
      return absl::InvalidArgumentError(absl::StrCat("problem.seed.params '", p.name(), "' has no values"));
    }
    ladders.push_back(PowerOfTwoPositions(p));
    favoured.push_back(FavouredPositions(p, ladders.back()));
  }
  auto shared = std::make_shared<const Space>(
      Space{*std::move(space), std::move(ladders), std::move(favoured), std::move(recorded), key});
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = spaces_.find(key); it != spaces_.end()) return it->second.space;  // raced: one wins
  recent_.push_front(key);
  spaces_[key] = Cached{shared, recent_.begin()};
  while (spaces_.size() > std::max<size_t>(1, options_.max_cached_spaces)) {
    spaces_.erase(recent_.back());
    recent_.pop_back();
  }
  return shared;
}

size_t ParametricMutator::cached_spaces() const {
  std::lock_guard<std::mutex> lock(mu_);
  return spaces_.size();
}

bool ParametricMutator::Acceptable(const Space& s, const std::vector<int>& at, const SeenFn& seen,
                                   Tries& tries) const {
  // A try the memo knows costs a lookup by its positions: no assignment is built for it.
  VariantMemo::KeyOf(at, &tries.key);
  const VariantMemo::Variant* v = memo_.Find(*tries.table, tries.key);
  VariantMemo::Variant fresh;
  if (v == nullptr) {
    const ParamAssignment a = s.space.FromIndices(at);
    auto valid = s.space.IsValid(a);
    fresh.valid =
        valid.ok() && *valid && (!validity_ || validity_(a)) && (!s.recorded || s.recorded(a));
    if (fresh.valid) fresh.hash = tries.hasher.HashParamsText(ParamsText(a));
    v = memo_.Put(*tries.table, tries.key, std::move(fresh));
  }
  return v->valid && !seen(v->hash);
}

std::optional<ParamAssignment> ParametricMutator::Neighbour(
    const Space& s, const v1::Candidate& parent, const SeenFn& seen, Tries& tries,
    const CancelledFn& cancelled, bool* used_up, std::mt19937_64& rng) const {
  const ParamSpace& space = s.space;
  std::vector<int> tunable;
  auto idx = Position(space, parent, &tunable);
  if (!idx.has_value() || tunable.empty()) {
    *used_up = true;
    return std::nullopt;
  }
  const bool known_used_up = *used_up;
  *used_up = false;
  const auto& params = space.params();
  std::uniform_real_distribution<double> u(0, 1);
  for (int t = 0; t < options_.neighbour_tries; ++t) {
    std::vector<int> next = *idx;
    const double r = u(rng);
    const int changes = std::min<int>(static_cast<int>(tunable.size()), r < 0.7 ? 1 : r < 0.9 ? 2 : 3);
    std::vector<int> order = tunable;
    std::shuffle(order.begin(), order.end(), rng);
    for (int c = 0; c < changes; ++c) {
      const int p = order[c];
      const int n = params[p].values_size();
      // Step length k with P(k) ~ 1/k up to a third of the knob's range: mostly close, but a
      // knob with many values can still be crossed in a few moves.
      const int max_step = std::max(2, n / 3);
      double norm = 0;
      for (int k = 1; k <= max_step; ++k) norm += 1.0 / k;
      double x = u(rng) * norm;
      int step = 1;
      for (int k = 1; k <= max_step; ++k) {
        x -= 1.0 / k;
        if (x <= 0) {
          step = k;
          break;
        }
      }
      const std::vector<int>& ladder = s.ladders[p];
      const auto rung = std::find(ladder.begin(), ladder.end(), next[p]);
      if (static_cast<int>(ladder.size()) >= kMinPowerOfTwoLadder && rung != ladder.end() &&
          u(rng) < options_.power_of_two_moves) {
        const int rungs = u(rng) < 0.7 ? 1 : 2;
        const int to = static_cast<int>(rung - ladder.begin()) + (u(rng) < 0.5 ? -rungs : rungs);
        next[p] = ladder[std::clamp(to, 0, static_cast<int>(ladder.size()) - 1)];
        continue;
      }
      next[p] = std::clamp(next[p] + (u(rng) < 0.5 ? -step : step), 0, n - 1);
    }
    int changed = 0;
    for (int p : tunable) changed += next[p] != (*idx)[p];
    if (changed == 0 || (changed == 1 && known_used_up)) continue;
    if (Acceptable(s, next, seen, tries)) return space.FromIndices(next);
  }
  // Systematic: every single-knob change at growing distance, in random order per distance.
  int max_n = 0;
  for (int p : tunable) max_n = std::max(max_n, params[p].values_size());
  for (int dist = 1; dist < max_n; ++dist) {
    if (cancelled()) return std::nullopt;
    std::vector<std::pair<int, int>> moves;
    for (int p : tunable) {
      for (int delta : {-dist, dist}) {
        const int v = (*idx)[p] + delta;
        if (v >= 0 && v < params[p].values_size()) moves.emplace_back(p, v);
      }
    }
    // Drawn even when known used up: the rest of the call draws the same.
    std::shuffle(moves.begin(), moves.end(), rng);
    if (known_used_up) continue;
    for (const auto& [p, v] : moves) {
      std::vector<int> next = *idx;
      next[p] = v;
      if (Acceptable(s, next, seen, tries)) return space.FromIndices(next);
    }
  }
  *used_up = true;
  return std::nullopt;
}

std::optional<ParamAssignment> ParametricMutator::Perturb(const Space& s,
                                                          const v1::Candidate& parent,
                                                          const SeenFn& seen, Tries& tries,
                                                          std::mt19937_64& rng) const {
  const ParamSpace& space = s.space;
  std::vector<int> tunable;
  auto idx = Position(space, parent, &tunable);
  if (!idx.has_value() || tunable.size() < 2) return std::nullopt;
  const auto& params = space.params();
  std::uniform_int_distribution<int> how_many(2,
                                              std::min<int>(4, static_cast<int>(tunable.size())));
  for (int t = 0; t < 64; ++t) {
    std::vector<int> next = *idx;
    std::vector<int> order = tunable;
    std::shuffle(order.begin(), order.end(), rng);
    const int k = how_many(rng);
    for (int c = 0; c < k; ++c) {
      const int p = order[c];
      std::uniform_int_distribution<int> v(0, params[p].values_size() - 1);
      next[p] = v(rng);
      TowardFavoured(s.favoured[p], options_.power_of_two_jumps, &next[p], rng);
    }
    if (Acceptable(s, next, seen, tries)) return space.FromIndices(next);
  }
  return std::nullopt;
}

std::optional<ParamAssignment> ParametricMutator::Reset(const Space& s, const v1::Candidate& parent,
                                                        const SeenFn& seen, Tries& tries,
                                                        const CancelledFn& cancelled,
                                                        double* power_of_two,
                                                        std::mt19937_64& rng) const {
  const ParamSpace& space = s.space;
  const int64_t total = space.TotalAssignments();
  std::uniform_int_distribution<int64_t> pick(0, total - 1);
  for (int t = 0; t < 256; ++t) {
    std::vector<int> at = space.DecodeIndices(pick(rng));
    // Only the first draws lean to favoured positions. When they find nothing unseen, those are
    // used up (a wide global draw in a space with few of them): the rest of the call draws
    // plainly, at the cost it had before.
    if (*power_of_two > 0) {
      if (t == kPowerOfTwoResetTries) {
        *power_of_two = 0;
      } else {
        for (size_t p = 0; p < at.size(); ++p) {
          TowardFavoured(s.favoured[p], *power_of_two, &at[p], rng);
        }
      }
    }
    if (Acceptable(s, at, seen, tries)) return space.FromIndices(at);
  }
  // Dense scan from a random offset: finds an unseen valid point whenever one exists.
  if (total <= options_.max_scan) {
    const int64_t start = pick(rng);
    for (int64_t i = 0; i < total; ++i) {
      // Millions of points may take seconds: stop when nobody waits for the answer.
      if (i % 1024 == 0 && cancelled()) return std::nullopt;
      std::vector<int> at = space.DecodeIndices((start + i) % total);
      if (Acceptable(s, at, seen, tries)) return space.FromIndices(at);
    }
  }
  return std::nullopt;
}

absl::StatusOr<v1::MutateResponse> ParametricMutator::MutateCancellable(const v1::MutateRequest& req,
                                                                         const SeenFn& seen,
                                                                         const CancelledFn& cancelled) {
  if (req.parents().empty()) {
    if (!req.problem().reference().has_pytorch()) return absl::InvalidArgumentError("mutate needs a parent");
    // A problem without a seed (a PyTorch reference no template fits): there are no knobs to tune
    // until a model has written a first kernel.
    v1::MutateResponse none;
    none.set_message("no kernel to tune: the problem has no seed, and only a model writes its first kernel");
    return none;
  }
  if (req.count() < 0) return absl::InvalidArgumentError(absl::StrCat("count ", req.count(), " is negative"));
  auto space_or = SpaceFor(req);
  if (!space_or.ok()) return space_or.status();
  const Space& s = **space_or;
  std::mt19937_64 rng(req.seed());
  std::uniform_real_distribution<double> u(0, 1);
  v1::MutateResponse resp;
  // Children proposed in this call count as seen for the next ones.
  absl::flat_hash_set<std::string> local;
  SeenFn seen_all = [&](const std::string& h) { return local.contains(h) || seen(h); };
  // Every child is a knob variant of the first parent: its source is normalised once, and each try
  // hashes only its params.
  Tries tries;
  tries.hasher.Prime(req.parents(0).candidate());
  tries.table = memo_.For(absl::StrCat(s.key, "/", tries.hasher.BaseKey()));
  const int count = std::max(1, req.count());
  // Lowered to 0 by Reset once a call has used up the favoured positions.
  double jump_bias = options_.power_of_two_jumps;
  double reset_bias = options_.power_of_two_resets;
  bool neighbours_used_up = req.neighbours_used_up();
  for (int i = 0; i < count; ++i) {
    if (cancelled()) return absl::CancelledError("the mutation was cancelled (the caller left or the proxy stops)");
    const v1::Candidate& p1 = req.parents(0).candidate();
    std::optional<ParamAssignment> child;
    std::string note;
    if (req.parents_size() >= 2) {
      const v1::Candidate& p2 = req.parents(1).candidate();
      for (int t = 0; t < 32 && !child; ++t) {
        ParamAssignment a;
        // Sorted order: a protobuf map iterates in a per-instance random order.
        const ParamAssignment sorted1(p1.params().begin(), p1.params().end());
        for (const auto& [k, v] : sorted1) {
          auto it = p2.params().find(k);
          a[k] = (it != p2.params().end() && u(rng) < 0.5) ? it->second : v;
        }
        auto at = s.space.ValueIndices(a);  // none: a value the space does not declare
        if (at.has_value() && Acceptable(s, *at, seen_all, tries)) child = std::move(a);
      }
      note = "crossover";
    }
    if (!child && req.strategy() == "perturb") {
      child = Perturb(s, p1, seen_all, tries, rng);
      note = "perturbation";
    }
    const bool global = req.strategy() == "global";
    const bool explore = req.strategy() == "explore" || global;
    const bool exploit = req.strategy() == "exploit";
    if (!child && !exploit && (explore || u(rng) < options_.reset_probability)) {
      child = Reset(s, p1, seen_all, tries, cancelled, global ? &jump_bias : &reset_bias, rng);
      note = global ? "global draw" : "random reset";
    }
    if (!child) {
      // Known used up: said by the caller, or found by this call before it had children (those
      // count as seen here but not for the caller, so a later scan says nothing about its set).
      bool used_up = neighbours_used_up;
      child = Neighbour(s, p1, seen_all, tries, cancelled, &used_up, rng);
      note = "neighbour";
      if (used_up && local.empty()) neighbours_used_up = true;
    }
    if (!child) {
      child = Reset(s, p1, seen_all, tries, cancelled, &reset_bias, rng);
      note = "random reset (no unseen neighbour)";
    }
    if (!child && cancelled()) {
      return absl::CancelledError("the mutation was cancelled (the caller left or the proxy stops)");
    }
    if (!child) {
      resp.set_message("parameter space exhausted: every valid assignment was already proposed");
      break;
    }
    v1::Candidate c = WithParams(p1, *child, &tries.hasher);
    if (req.parents_size() >= 2) c.add_parent_ids(req.parents(1).candidate().id());
    c.set_note(note);
    local.insert(c.content_hash());
    *resp.add_children() = std::move(c);
  }
  resp.set_neighbours_used_up(neighbours_used_up);
  return resp;
}

}  // namespace kforge::llm
