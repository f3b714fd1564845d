#pragma once

#include "services/gpu-worker/layer.h"

// Stage 1: checks a candidate before any compiler or device sees it. Pure logic.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/launch.h"
#include "kforge/v1/candidate.pb.h"
#include "kforge/v1/problem.pb.h"
#include "kforge/v1/sandbox.pb.h"

namespace kforge::worker {

struct ScreenOptions {
  int64_t max_source_bytes = 256 * 1024;
  int64_t max_launches = 16;
  int64_t max_total_work_items = int64_t{1} << 32;
  int64_t max_scratch_bytes = int64_t{1} << 30;
};

// One size set's launches with every expression evaluated.
struct ScreenedSizeSet {
  const v1::SizeSet* size_set = nullptr;
  std::vector<ResolvedLaunch> launches;
  std::map<std::string, int64_t> scratch_bytes;  // candidate scratch buffers
};

struct ScreenedCandidate {
  ParamAssignment params;
  std::map<std::string, int64_t> defines;  // compile-time -D values (seed defines + params)
  std::vector<ScreenedSizeSet> sets;       // in problem order
};

// Headers a candidate may include, per backend. Anything else (paths, quotes, macros) is refused.
bool IsAllowedInclude(v1::Backend backend, absl::string_view header);

// Refuses #include of anything but allow-listed toolkit headers in any spelling (digraphs,
// trigraphs, line continuations, comments between tokens), __has_include, #embed and #import.
// The error names the line.
[[nodiscard]] absl::Status ScreenIncludes(v1::Backend backend, absl::string_view source);

// Evaluates a launch plan against a problem for every size set; shared by the reference (with
// no limits checked beyond sanity) and by candidates.
[[nodiscard]] absl::StatusOr<std::vector<ScreenedSizeSet>> ResolvePlan(
    const v1::Problem& problem, const v1::KernelSpec& spec_for_defines,
    const google::protobuf::RepeatedPtrField<v1::Launch>& launches,
    const google::protobuf::RepeatedPtrField<v1::ScratchBuffer>& scratch,
    const ParamAssignment& params, const v1::DeviceLimits& limits, const ScreenOptions& opts);

// The whole screening stage. An error's message is the rejection reason shown to users.
[[nodiscard]] absl::StatusOr<ScreenedCandidate> Screen(const v1::Problem& problem,
                                                       const v1::Candidate& candidate,
                                                       const v1::DeviceLimits& limits,
                                                       const ScreenOptions& opts);

}  // namespace kforge::worker
