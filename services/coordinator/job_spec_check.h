#pragma once

#include "services/coordinator/layer.h"

// The bounds every job spec is held to before it is stored: every number finite and within a
// range a coordinator can run, and INVALID_ARGUMENT naming the field otherwise. A spec arrives
// over the wire from a tenant; one that passes cannot make a coordinator allocate without bound
// (a job with 2^31 islands) or loop for ever (a NaN budget).

#include "absl/status/status.h"
#include "kforge/v1/job.pb.h"

namespace kforge::coordinator {

// Screening cost grows with the children offered (each is hashed and scored); past a few hundred
// it buys nothing.
inline constexpr int kMaxScreenChildren = 256;
inline constexpr int kMaxIslands = 64;
inline constexpr int kMaxInFlightPerJob = 4096;
inline constexpr int kMaxPriority = 1000;

[[nodiscard]] absl::Status CheckJobSpec(const v1::JobSpec& spec);

}  // namespace kforge::coordinator
