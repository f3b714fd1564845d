#pragma once

#include "services/coordinator/layer.h"

// The evolution engine of one job: islands with ring migration, a quality-diversity grid per
// island, elites, a protected global best, and parent selection mixing exploit / explore /
// fitness-weighted choice with damping of parents that already have many children. It holds no
// I/O: the job runner feeds it evaluations in candidate sequence order and asks it for parents,
// so the same inputs always give the same choices (every random draw comes from the job seed and
// the proposal's sequence number).

#include <cstdint>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "kforge/v1/evaluation.pb.h"
#include "kforge/v1/job.pb.h"
#include "kforge/v1/llm_proxy.pb.h"

namespace kforge::coordinator {

struct EngineOptions {
  int islands = 2;
  int migration_interval = 25;  // evaluations between ring migrations
  double exploit_ratio = 0.6;   // parent from the island's elites (tournament)
  double explore_ratio = 0.15;  // parent uniformly from the island's grid
  double crossover_ratio = 0.1; // a second parent
  int elites = 6;               // per island
  int grid_bins = 6;            // per feature dimension
  int warmup_explore = 0;       // first proposals ask for distant children (0 = auto)
  // After the warm-up, this share of proposals are global draws from the global best: a sample
  // of the whole space for the screener to pick from. OptionsFromConfig sets 0 when screening is
  // off, where a global draw would be one random point. With an LLM configured, the mutator
  // decides per request, as for any other, whether the model or the knob tuner answers it.
  double global_ratio = 0.15;
  int64_t budget = 0;           // max evaluations, for the auto warm-up size
};

EngineOptions OptionsFromConfig(const v1::EvolutionConfig& config, const v1::Budget& budget);

struct Member {
  v1::Candidate candidate;
  v1::EvaluationResult result;
  double fitness = 0;
  // The fitness's ~95% interval from the benchmark's median intervals; 0 when it was not timed
  // (a replay problem's recorded times).
  double fitness_low = 0;
  double fitness_high = 0;
};

// Their benchmarks ran at different times: a margin for what the machine's drift between them
// could make of a gap (shared with the finalists' logic).
inline constexpr double kDriftMargin = 0.05;

// Whether `a` is fitter than `b` beyond what noise explains: beyond both intervals and the drift
// margin when both were timed, else by fitness alone.
bool FitterBeyondNoise(const Member& a, const Member& b);

// Members fittest first, where those that noise cannot tell from the fittest of their group come
// in candidate order (the earlier first): a rerun on a noisy device orders them alike.
void OrderBeyondNoise(std::vector<const Member*>& members);

struct Selection {
  int island = 0;
  std::vector<const Member*> parents;       // one, or two for crossover
  std::vector<const Member*> inspirations;  // top and diverse
  // Hint for the mutator: "explore", "exploit", "perturb", "global" (a sample of the whole
  // space to screen) or "".
  std::string strategy;
  bool stalled = false;  // chosen because the search stopped improving (for tests and traces)
};

class EvolutionEngine {
 public:
  EvolutionEngine(uint64_t seed, EngineOptions options);

  // Records an evaluation. Candidates must arrive in sequence order for determinism.
  void Ingest(const v1::Candidate& candidate, const v1::EvaluationResult& result);
  // Parents for the proposal with this sequence number. Empty parents only before any ok result.
  Selection Select(int64_t sequence);
  // The random stream for a proposal: the mutator's seed.
  uint64_t MutationSeed(int64_t sequence) const;

  // The fittest as measured (what the job reports).
  const Member* best() const { return best_; }
  // The one the search works from: the earliest member that no later one is fitter than beyond
  // noise (best() itself on a replay problem). Improvements are counted by it.
  const Member* lead() const { return lead_; }
  // The k fittest ok members, fittest first.
  std::vector<const Member*> Top(int k) const;
  // An ok member by candidate id; null if none.
  const Member* Find(const std::string& id) const;
  int64_t evaluations() const { return evaluations_; }
  int64_t since_improvement() const { return since_improvement_; }
  int island_count() const { return static_cast<int>(islands_.size()); }
  // Members per island (for tests of migration).
  std::vector<std::string> IslandMemberIds(int island) const;
  int64_t migrations() const { return migrations_; }

 private:
  struct Island {
    std::map<std::pair<int, int>, const Member*> grid;  // QD grid: best per cell
    std::vector<const Member*> elites;                  // best first
    std::set<std::string> ids;                          // every member, for "no duplicates"
  };
  std::pair<int, int> Cell(const Member& m) const;
  void AddToIsland(int island, const Member* m);
  void Migrate();
  // The fitness-weighted draw's weight, from `fitness`: the member's group's in OrderBeyondNoise
  // (GroupFitness), so that members noise cannot tell apart weigh the same.
  double Weight(const Member* m, double fitness) const;

  uint64_t seed_;
  EngineOptions opts_;
  std::vector<Island> islands_;
  std::map<std::string, Member> members_;           // ok candidates by id (stable addresses)
  std::map<std::string, int> children_;             // parent id -> children proposed
  std::set<std::pair<std::string, int>> migrated_;  // (candidate, destination island)
  const Member* best_ = nullptr;
  const Member* lead_ = nullptr;
  int64_t evaluations_ = 0;
  int64_t since_improvement_ = 0;
  int64_t migrations_ = 0;
};

}  // namespace kforge::coordinator
