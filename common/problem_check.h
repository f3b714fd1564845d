#pragma once

// Checks a Problem that arrives as a message (over gRPC, from a queue, from the store) with the
// loader's structural rules plus the limits a worker can afford. A worker, a proxy or a
// coordinator runs this before touching a problem it did not load itself: no crafted problem may
// abort a process, hold unbounded memory or make an unbounded wait. Errors name the field
// ("buffers[2] (A).shape[1]: ...").

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "kforge/v1/problem.pb.h"

namespace kforge {

struct ProblemLimits {
  // What a worker holds by default (limits.max_buffer_mb, limits.max_problem_mb): the loader
  // checks the same, so a problem `kforge validate` accepts is one a default worker runs.
  int64_t max_buffer_bytes = int64_t{1} << 30;   // one buffer in one size set
  int64_t max_problem_bytes = int64_t{4} << 30;  // all buffers of one size set together
  int max_size_sets = 16;
  int max_buffers = 64;
  int max_scalars = 64;
  int max_trials = 64;
  int max_params = 64;
  int max_param_values = 4096;
  int max_constraints = 64;
  int max_launches = 64;
  int max_dims = 8;            // shape dimensions
  int64_t max_name_bytes = 128;
  int64_t max_expression_bytes = 4096;
  int64_t max_source_bytes = 1 << 20;
  int64_t max_description_bytes = 64 << 10;
};

// The whole check; the first problem found is returned as InvalidArgument.
[[nodiscard]] absl::Status CheckProblem(const v1::Problem& problem, const ProblemLimits& limits);

}  // namespace kforge
