#pragma once

#include "services/llm-proxy/layer.h"

// Every field of a MutateRequest comes from the network: CheckMutateRequest refuses what the
// mutators cannot use (no parent, a knob without values, a constraint that does not parse, an
// unknown enum value, a NaN, a count past the limit, ...) with INVALID_ARGUMENT naming the field,
// before any of it reaches code that assumes a well-formed problem.

#include <cstdint>

#include "absl/status/status.h"
#include "kforge/v1/llm_proxy.pb.h"

namespace kforge::llm {

struct RequestLimits {
  // Children per request. The coordinator asks for up to 512 per global draw (32 per screened
  // child at the default screen of 16), so the default leaves room for wider screens.
  int64_t max_count = 4096;
  // count x the parent's size: the most a response may carry (each child copies the parent's
  // source and plan).
  int64_t max_response_bytes = int64_t{64} << 20;
  // Declared values over all knobs, small enough that a draw's cost (linear in them) stays small;
  // the rest of the problem is held to CheckProblem's limits.
  int64_t max_total_values = 1 << 14;
  // One kernel source (the problem's reference and seed, a parent, an inspiration).
  int64_t max_source_bytes = int64_t{1} << 20;
  // A replay problem's recorded configurations (replay_space), sent once per proxy and space.
  int64_t max_replay_configurations = int64_t{1} << 20;
};

// OK, or INVALID_ARGUMENT naming the first field that is wrong ("problem.seed.params[2] 'TILE'
// has no values").
[[nodiscard]] absl::Status CheckMutateRequest(const v1::MutateRequest& request, const RequestLimits& limits);

}  // namespace kforge::llm
