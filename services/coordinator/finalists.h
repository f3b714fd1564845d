#pragma once

#include "services/coordinator/layer.h"

// The finalists' re-measurement (at a checkpoint of a long job, and at its end) as logic without
// I/O: what a worker's side-by-side timing makes the job's confirmation, and when an earlier job's
// timing of the same finalists stands for this job's. JobDriver decides when to send one and
// stores what these return.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kforge/v1/job.pb.h"
#include "services/coordinator/evolution_engine.h"

namespace kforge::coordinator {

// A confirmation for the job, and the candidate it ranked first ("" when none of this job's).
struct ConfirmationOutcome {
  v1::Confirmation confirmation;
  std::string best;
};

// Whether `c` re-measured exactly these finalists (in any order).
[[nodiscard]] bool SameFinalists(const v1::Confirmation& c, const std::vector<const Member*>& top);

// The first finalist of `c` when it timed fine and is one of this job's candidates ("" otherwise).
[[nodiscard]] std::string ConfirmedWinner(const v1::Confirmation& c, const EvolutionEngine& engine);

// The earlier job every finalist's evaluation was reused from ("" when they were not all reused
// from one job).
[[nodiscard]] std::string ReusedFromOneJob(const std::vector<const Member*>& finalists);

// The request's name (its candidate id): "<job>-confirm<evaluations>" and "e" for the end's, "c"
// for a checkpoint's.
[[nodiscard]] std::string ConfirmationName(const std::string& job_id, int64_t evaluations,
                                           bool final);

// What the worker's re-measurement `r` (sent at `sent_at` evaluations) makes the job's
// confirmation: the finalists with their first-measured speedups, and a note when the side-by-side
// timing re-ranked the search's best. A failed one makes a confirmation that says why, at the end
// (`final`); at a checkpoint it changes nothing (nullopt: the last good one stands).
[[nodiscard]] std::optional<ConfirmationOutcome> ConfirmationFrom(const v1::EvaluationResult& r,
                                                                  bool final, int64_t sent_at,
                                                                  const EvolutionEngine& engine);

// The finalists a side-by-side re-measurement still has to rank (`finalists` in fitness order):
// the first, and every other its own benchmark does not already put below the first beyond the
// ~95% intervals of their medians, and 5% more for drift between the two benchmarks, on every
// bench size set (against one worker's same timing of the reference, the candidates' time
// intervals; else each speedup's interval with the reference's interval in it). All of them when
// an evaluation failed, was reused, or ran on another device than the first; a finalist whose
// timings lack the intervals (an older worker) stays in, and all do when the first's lack them.
[[nodiscard]] std::vector<const Member*> Contenders(const std::vector<const Member*>& finalists);

// A finalist's row as its benchmark timed it (rounds 0): the speedup's interval with the
// reference's in it, geometric means over the size sets.
[[nodiscard]] v1::FinalistTiming BenchmarkedFinalist(const Member& m);

// The confirmation the finalists' own benchmarks make when they leave a single contender (at
// least two finalists): nothing to re-measure (rounds 0, a note says so). nullopt otherwise.
[[nodiscard]] std::optional<ConfirmationOutcome> BenchmarkConfirmation(const std::vector<const Member*>& finalists,
                                                                       int64_t evaluations);

// The re-measurement of `earlier`, the job every finalist's evaluation was reused from, renamed to
// this job's candidates, when it timed exactly these finalists on `device_class` (nullopt
// otherwise). `evaluations`: this job's count now.
[[nodiscard]] std::optional<ConfirmationOutcome> BorrowedConfirmation(
    const v1::Job& earlier, const std::vector<const Member*>& finalists,
    const std::string& device_class, int64_t evaluations, const EvolutionEngine& engine);

}  // namespace kforge::coordinator
