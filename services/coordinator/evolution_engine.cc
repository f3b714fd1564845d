#include "services/coordinator/evolution_engine.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <tuple>

#include "common/hash.h"

namespace kforge::coordinator {

EngineOptions OptionsFromConfig(const v1::EvolutionConfig& c, const v1::Budget& budget) {
  EngineOptions o;
  if (c.islands() > 0) o.islands = c.islands();
  if (c.migration_interval() > 0) o.migration_interval = c.migration_interval();
  if (c.exploit_ratio() > 0) o.exploit_ratio = c.exploit_ratio();
  if (c.explore_ratio() > 0) o.explore_ratio = c.explore_ratio();
  if (c.warmup_explore() > 0) o.warmup_explore = c.warmup_explore();
  if (c.crossover_ratio() > 0) o.crossover_ratio = c.crossover_ratio();
  if (c.screen_children() == 1) o.global_ratio = 0;
  o.budget = budget.max_candidates();
  return o;
}

namespace {

// The fitness's interval: the speedup is a geometric mean over size sets of reference / candidate
// medians, so its bounds are that mean of each set's median over the candidate's interval ends.
std::pair<double, double> FitnessInterval(const v1::EvaluationResult& r) {
  double log_low = 0, log_high = 0;
  int sets = 0;
  for (const auto& t : r.timings()) {
    const v1::TimingStats& c = t.candidate();
    if (t.speedup() <= 0) continue;
    if (c.median_seconds() <= 0 || c.median_low_seconds() <= 0 || c.median_high_seconds() <= 0) return {0, 0};
    log_low += std::log(c.median_seconds() / c.median_high_seconds());
    log_high += std::log(c.median_seconds() / c.median_low_seconds());
    ++sets;
  }
  if (sets == 0) return {0, 0};
  return {r.speedup() * std::exp(log_low / sets), r.speedup() * std::exp(log_high / sets)};
}

bool Timed(const Member& m) { return m.fitness_high > 0; }

// Sorts `v` fittest first (equals in candidate order) and calls group(begin, end, place) for each
// run of members that noise cannot tell from the run's first, fittest run first.
template <typename Group>
void ForEachNoiseGroup(std::vector<const Member*>& v, Group group) {
  std::stable_sort(v.begin(), v.end(), [](const Member* a, const Member* b) {
    if (a->fitness != b->fitness) return a->fitness > b->fitness;
    return a->candidate.sequence() < b->candidate.sequence();
  });
  int place = 0;
  for (size_t i = 0; i < v.size(); ++place) {
    size_t j = i + 1;
    while (j < v.size() && !FitterBeyondNoise(*v[i], *v[j])) ++j;
    group(i, j, place);
    i = j;
  }
}

// What a fitness-weighted draw weighs each member by, the same for a group of OrderBeyondNoise:
// its fitness where it was not timed; where it was, 1 / (1 + the group's place), since any value
// measured with noise, even the group's, moves the draw's boundaries from run to run.
std::map<const Member*, double> GroupFitness(std::vector<const Member*> v) {
  std::map<const Member*, double> out;
  ForEachNoiseGroup(v, [&](size_t begin, size_t end, int place) {
    const double f = Timed(*v[begin]) ? 1.0 / (1 + place) : v[begin]->fitness;
    for (size_t k = begin; k < end; ++k) out[v[k]] = f;
  });
  return out;
}

}  // namespace

bool FitterBeyondNoise(const Member& a, const Member& b) {
  if (Timed(a) && Timed(b)) return a.fitness_low > b.fitness_high * (1 + kDriftMargin);
  return a.fitness > b.fitness;
}

void OrderBeyondNoise(std::vector<const Member*>& v) {
  // Between groups the order is the fitness's; within one, the candidates'.
  ForEachNoiseGroup(v, [&v](size_t begin, size_t end, int) {
    std::stable_sort(v.begin() + static_cast<std::ptrdiff_t>(begin), v.begin() + static_cast<std::ptrdiff_t>(end),
                     [](const Member* a, const Member* b) { return a->candidate.sequence() < b->candidate.sequence(); });
  });
}

EvolutionEngine::EvolutionEngine(uint64_t seed, EngineOptions options)
    : seed_(seed), opts_(options), islands_(std::max(1, options.islands)) {
  if (opts_.warmup_explore == 0) {
    // A short spread-out start pays off before local search; a tenth of the budget, 4 to 16.
    opts_.warmup_explore = opts_.budget > 0 ? static_cast<int>(std::clamp<int64_t>(opts_.budget / 10, 4, 16)) : 8;
  }
}

uint64_t EvolutionEngine::MutationSeed(int64_t sequence) const {
  const std::string h = Sha256Hex(std::to_string(seed_) + "/mutate/" + std::to_string(sequence));
  return std::stoull(h.substr(0, 16), nullptr, 16);
}

std::pair<int, int> EvolutionEngine::Cell(const Member& m) const {
  // Features the evaluation measured: shared/local memory and registers (or code size). With no
  // resource data (replay), the first two knobs' positions stand in.
  const auto& r = m.result.resources();
  const int bins = opts_.grid_bins;
  auto log_bin = [bins](double v) { return std::clamp(static_cast<int>(std::log2(v + 1.0) / 2.0), 0, bins - 1); };
  if (r.shared_bytes() > 0 || r.registers_per_thread() > 0) {
    // Code size: the binary's when the backend reports it (CUDA), else the source's (OpenCL).
    const int64_t code_bytes = r.binary_bytes() > 0 ? r.binary_bytes() : r.source_bytes();
    const int f2 = r.registers_per_thread() > 0 ? std::clamp(r.registers_per_thread() / 32, 0, bins - 1)
                                                : log_bin(static_cast<double>(code_bytes) / 1024.0);
    return {log_bin(static_cast<double>(r.shared_bytes()) / 64.0), f2};
  }
  std::vector<int64_t> vals;
  for (const auto& [k, v] : std::map<std::string, int64_t>(m.candidate.params().begin(), m.candidate.params().end())) {
    vals.push_back(v);
  }
  auto knob_bin = [bins](int64_t v) { return static_cast<int>(std::llabs(v) % bins); };
  return {vals.size() > 0 ? knob_bin(vals[0]) : 0, vals.size() > 1 ? knob_bin(vals[1]) : 0};
}

void EvolutionEngine::AddToIsland(int island, const Member* m) {
  Island& is = islands_[island];
  if (!is.ids.insert(m->candidate.id()).second) return;
  auto cell = Cell(*m);
  auto it = is.grid.find(cell);
  if (it == is.grid.end() || FitterBeyondNoise(*m, *it->second)) is.grid[cell] = m;
  is.elites.push_back(m);
  OrderBeyondNoise(is.elites);
  if (static_cast<int>(is.elites.size()) > opts_.elites) is.elites.resize(opts_.elites);
}

void EvolutionEngine::Migrate() {
  // Ring: each island's best is copied once to the next island, unless already there.
  const int n = static_cast<int>(islands_.size());
  if (n < 2) return;
  std::vector<const Member*> bests(n, nullptr);
  for (int i = 0; i < n; ++i) bests[i] = islands_[i].elites.empty() ? nullptr : islands_[i].elites.front();
  for (int i = 0; i < n; ++i) {
    const Member* m = bests[i];
    const int dest = (i + 1) % n;
    if (m == nullptr || islands_[dest].ids.contains(m->candidate.id())) continue;
    if (!migrated_.insert({m->candidate.id(), dest}).second) continue;
    AddToIsland(dest, m);
    ++migrations_;
  }
}

void EvolutionEngine::Ingest(const v1::Candidate& c, const v1::EvaluationResult& r) {
  ++evaluations_;
  ++since_improvement_;
  for (const auto& p : c.parent_ids()) ++children_[p];
  if (r.outcome() == v1::OUTCOME_OK && r.speedup() > 0) {
    Member& m = members_[c.id()];
    m.candidate = c;
    m.result = r;
    m.fitness = r.speedup();
    std::tie(m.fitness_low, m.fitness_high) = FitnessInterval(r);
    const int island = std::clamp(c.island(), 0, static_cast<int>(islands_.size()) - 1);
    if (c.mutator() == v1::MUTATOR_KIND_SEED) {
      for (int i = 0; i < static_cast<int>(islands_.size()); ++i) AddToIsland(i, &m);
    } else {
      AddToIsland(island, &m);
    }
    if (best_ == nullptr || m.fitness > best_->fitness) best_ = &m;
    // Only an improvement beyond noise moves the search: a rerun would not see the others.
    if (lead_ == nullptr || FitterBeyondNoise(m, *lead_)) {
      lead_ = &m;
      since_improvement_ = 0;
    }
  }
  if (opts_.migration_interval > 0 && evaluations_ % opts_.migration_interval == 0) Migrate();
}

std::vector<const Member*> EvolutionEngine::Top(int k) const {
  std::vector<const Member*> all;
  for (const auto& [id, m] : members_) all.push_back(&m);
  // Ties go to the earlier candidate, as for best().
  std::stable_sort(all.begin(), all.end(), [](const Member* a, const Member* b) {
    if (a->fitness != b->fitness) return a->fitness > b->fitness;
    return a->candidate.sequence() < b->candidate.sequence();
  });
  if (static_cast<int>(all.size()) > k) all.resize(std::max(k, 0));
  return all;
}

const Member* EvolutionEngine::Find(const std::string& id) const {
  auto it = members_.find(id);
  return it == members_.end() ? nullptr : &it->second;
}

double EvolutionEngine::Weight(const Member* m, double fitness) const {
  auto it = children_.find(m->candidate.id());
  const int kids = it == children_.end() ? 0 : it->second;
  // Damping: a parent's pull halves roughly every three children.
  return fitness * fitness / std::pow(1.0 + kids, 0.6);
}

Selection EvolutionEngine::Select(int64_t sequence) {
  Selection s;
  const uint64_t mutation_seed = MutationSeed(sequence);
  std::mt19937_64 rng(mutation_seed ^ 0x9e3779b97f4a7c15ULL);
  std::uniform_real_distribution<double> u(0, 1);
  s.island = static_cast<int>(sequence % static_cast<int64_t>(islands_.size()));
  Island& is = islands_[s.island];
  if (is.elites.empty()) {
    if (lead_ != nullptr) s.parents.push_back(lead_);
    s.strategy = "explore";
    return s;
  }
  // Stagnation: after many evaluations without improvement, every third proposal explores.
  const bool stuck = since_improvement_ >= 12 && sequence % 3 == 0;
  // Its own stream, so that the other choices do not depend on the global ratio.
  std::mt19937_64 global_rng(mutation_seed ^ 0x5bd1e995ULL);
  if (sequence <= opts_.warmup_explore) {
    s.parents.push_back(is.elites.front());
    s.strategy = "explore";
  } else if (lead_ != nullptr && u(global_rng) < opts_.global_ratio) {
    // The needle optima of real tuning spaces sit in regions that local search from the first
    // basins rarely reaches; a screened sample of the whole space does (bench/README.md). Its
    // child counts as the best's in the damping, as every child does.
    s.parents.push_back(lead_);
    s.strategy = "global";
  } else if (stuck) {
    // Jump from the island's best to a nearby basin; alternate with a sample of the whole space.
    s.parents.push_back(is.elites.front());
    s.strategy = (sequence / 3) % 2 == 0 ? "perturb" : "global";
    s.stalled = true;
  } else {
    const double r = u(rng);
    const Member* parent = nullptr;
    if (r < opts_.exploit_ratio) {
      // Tournament of three among the elites by damped fitness; the island's best competes.
      std::uniform_int_distribution<size_t> pick(0, is.elites.size() - 1);
      // Half of the exploit draws take the island's best outright: local search around it is
      // what finds the narrow optima of real tuning spaces.
      if (u(rng) < 0.5) parent = is.elites.front();
      if (parent == nullptr) {
        const std::map<const Member*, double> f = GroupFitness(is.elites);
        for (int t = 0; t < 3; ++t) {
          const Member* c = is.elites[pick(rng)];
          if (parent == nullptr || Weight(c, f.at(c)) > Weight(parent, f.at(parent))) parent = c;
        }
      }
      s.strategy = "exploit";
    } else if (r < opts_.exploit_ratio + opts_.explore_ratio) {
      std::uniform_int_distribution<size_t> pick(0, is.grid.size() - 1);
      auto it = is.grid.begin();
      std::advance(it, pick(rng));
      parent = it->second;
    } else {
      // Fitness-weighted over the grid, with damping; the cells stand for diversity.
      std::vector<const Member*> cells;
      for (const auto& [cell, m] : is.grid) cells.push_back(m);
      const std::map<const Member*, double> f = GroupFitness(cells);
      double total = 0;
      for (const Member* m : cells) total += Weight(m, f.at(m));
      double x = u(rng) * total;
      for (const Member* m : cells) {
        parent = m;
        x -= Weight(m, f.at(m));
        if (x <= 0) break;
      }
    }
    s.parents.push_back(parent);
    if (u(rng) < opts_.crossover_ratio && is.elites.size() > 1) {
      std::uniform_int_distribution<size_t> pick(0, is.elites.size() - 1);
      const Member* other = is.elites[pick(rng)];
      if (other != parent) s.parents.push_back(other);
    }
  }
  // Inspirations: the global best, the island's runner-up, and a member of another cell.
  if (lead_ != nullptr && lead_ != s.parents.front()) s.inspirations.push_back(lead_);
  if (is.elites.size() > 1 && is.elites[1] != s.parents.front()) s.inspirations.push_back(is.elites[1]);
  if (is.grid.size() > 1) {
    std::uniform_int_distribution<size_t> pick(0, is.grid.size() - 1);
    auto it = is.grid.begin();
    std::advance(it, pick(rng));
    if (it->second != s.parents.front()) s.inspirations.push_back(it->second);
  }
  return s;
}

std::vector<std::string> EvolutionEngine::IslandMemberIds(int island) const {
  return {islands_[island].ids.begin(), islands_[island].ids.end()};
}

}  // namespace kforge::coordinator
