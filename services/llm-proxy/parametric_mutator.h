#pragma once

#include "services/llm-proxy/layer.h"

// The parametric mutator: tunes knob values within the declared values and constraints. It needs
// no model, and it is what runs when no LLM is configured.
//
// Moves: a neighbour move (one to three knobs stepped along their declared, ordered values by k
// positions, P(k) ~ 1/k up to a third of the knob's range; a size-like knob at a power of two
// often steps along its powers of two instead), a random reset (a drawn valid assignment, size
// knobs leaning to their powers of two and range ends), and uniform crossover of two parents. A
// child is only emitted when it is valid and unseen; while unseen valid neighbours of the parent
// remain, one of them is proposed before anything farther away. Strategies
// (MutateRequest.strategy): "explore" asks for resets, "global" for a wide sample of resets to
// screen, "perturb" for a jump of two to four knobs, "exploit" for neighbours only.

#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <vector>

#include "common/hash.h"
#include "common/param_space.h"
#include "services/llm-proxy/cancellable_mutator.h"
#include "services/llm-proxy/variant_memo.h"

namespace kforge::llm {

struct ParametricOptions {
  double reset_probability = 0.08;   // a random reset instead of a neighbour move
  int neighbour_tries = 64;          // random neighbour draws before the systematic scan
  // The chance that a knob with at least kMinPowerOfTwoLadder power-of-two values, at one of
  // them, moves to the next or second-next power of two (x2, x4, /2, /4) rather than by
  // positions: GPU block and tile sizes behave alike at alike powers of two (warps, memory
  // transactions, banks), and good values are often 32 and 128 with 48..112 poor in between.
  // Measured in bench/README.md.
  double power_of_two_moves = 0.6;
  // The same prior for random draws: the chance that a size knob (one with kMinPowerOfTwoLadder
  // or more powers of two among other values) takes one of its powers of two or an end of its
  // range (where a monotone trend puts the best value), drawn uniformly, rather than any of its
  // values. Jumps (perturbations and global draws: a share of the proposals and a stalled
  // search's explorations) always do; resets (the warm-up's spread-out start, the occasional reset)
  // half the time, so that a space whose best values are not powers of two is still sampled evenly.
  // Measured in bench/README.md.
  double power_of_two_jumps = 1.0;
  double power_of_two_resets = 0.5;
  int64_t max_scan = 1 << 22;        // the largest space scanned exhaustively for unseen points
  // Problems whose spaces stay cached (least recently used goes first). A space is a few KB to a
  // few MB (its declared values, parsed constraints and size sets); a proxy serves a handful of
  // jobs at a time, and a miss costs only re-parsing the constraints.
  size_t max_cached_spaces = 64;
  // Knob variants whose validity and content hash are remembered across calls (VariantMemo), for
  // all problems together; a few hundred bytes each (about 30 MB at most).
  size_t max_memo_variants = 1 << 17;
};

// Knobs with fewer power-of-two values (a tile of 1..4, a flag) step by positions only: a 3
// between 2 and 4 is as likely a good value as either.
inline constexpr int kMinPowerOfTwoLadder = 4;

class ParametricMutator final : public CancellableMutator {
 public:
  explicit ParametricMutator(ParametricOptions options = {}, ValidityFn extra_validity = nullptr)
      : options_(options), validity_(std::move(extra_validity)), memo_(options.max_memo_variants) {}

  absl::StatusOr<v1::MutateResponse> MutateCancellable(const v1::MutateRequest& request, const SeenFn& seen,
                                                       const CancelledFn& cancelled) override;
  // Spaces cached now (at most options.max_cached_spaces).
  size_t cached_spaces() const;
  // Knob variants remembered now (at most options.max_memo_variants).
  size_t memo_variants() const { return memo_.size(); }

 private:
  // A problem's space, with each knob's power-of-two positions (in declared order) worked out once:
  // the moves and draws consult them for every knob they touch.
  struct Space {
    ParamSpace space;
    // Per knob, its power-of-two positions: neighbour moves step along them.
    std::vector<std::vector<int>> ladders;
    // Per size knob, its ladder and range ends: random draws favour them (empty for other knobs).
    std::vector<std::vector<int>> favoured;
    // A replay problem's recorded configurations (MutateRequest.replay_space); null: no restriction.
    ValidityFn recorded;
    std::string key;  // what defines it (SpaceFor's cache key)
  };
  // One call's tries: knob variants of one parent.
  struct Tries {
    CandidateHasher hasher;                     // primed with the parent
    std::shared_ptr<VariantMemo::Table> table;  // the memo's variants of this space and parent
    std::string key;                            // scratch: the variant being tried
  };
  absl::StatusOr<std::shared_ptr<const Space>> SpaceFor(const v1::MutateRequest& request);
  // Whether the knob variant of the tries' parent at value positions `at` is valid and unseen.
  bool Acceptable(const Space& s, const std::vector<int>& at, const SeenFn& seen,
                  Tries& tries) const;
  // `*used_up` in: every single-knob variant of the parent is known invalid or seen
  // (MutateRequest.neighbours_used_up), so those tries are not looked up (their random draws are
  // still made: the rest of the call draws the same); out: the systematic scan found none.
  std::optional<ParamAssignment> Neighbour(const Space& s, const v1::Candidate& parent,
                                           const SeenFn& seen, Tries& tries,
                                           const CancelledFn& cancelled, bool* used_up,
                                           std::mt19937_64& rng) const;
  // Two to four knobs set to uniformly drawn values: a jump to a nearby basin.
  std::optional<ParamAssignment> Perturb(const Space& s, const v1::Candidate& parent,
                                         const SeenFn& seen, Tries& tries,
                                         std::mt19937_64& rng) const;
  // A uniformly drawn valid assignment, size knobs at a favoured position (a power of two or a
  // range end) with `*power_of_two` chance; sets it to 0 when the first few such draws find nothing
  // unseen (they are used up).
  std::optional<ParamAssignment> Reset(const Space& s, const v1::Candidate& parent,
                                       const SeenFn& seen, Tries& tries,
                                       const CancelledFn& cancelled, double* power_of_two,
                                       std::mt19937_64& rng) const;

  ParametricOptions options_;
  ValidityFn validity_;
  mutable VariantMemo memo_;
  mutable std::mutex mu_;
  // By a hash of what defines a space (knobs, constraints, defines, size sets): never by the
  // request's own content_hash, which a client could set to another problem's.
  struct Cached {
    std::shared_ptr<const Space> space;
    std::list<std::string>::iterator recent;  // its key in recent_
  };
  std::map<std::string, Cached> spaces_;
  std::list<std::string> recent_;  // keys, most recently used first
};

// Builds the child candidate of `parent` with other params (source and plan unchanged).
v1::Candidate WithParams(const v1::Candidate& parent, const ParamAssignment& params,
                         CandidateHasher* hasher = nullptr);

}  // namespace kforge::llm
