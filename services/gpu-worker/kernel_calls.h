#pragma once

#include "services/gpu-worker/layer.h"

// A resolved launch plan (common/launch.h) as the sandbox's kernel calls: grid and block sizes,
// and each argument as a buffer name or a typed scalar value.

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/launch.h"
#include "kforge/v1/problem.pb.h"
#include "kforge/v1/sandbox.pb.h"

namespace kforge::worker {

// InvalidArgument when an argument cannot be expressed (an integer beyond i32, an unknown scalar).
absl::StatusOr<std::vector<v1::KernelCall>> ToCalls(const std::vector<ResolvedLaunch>& launches,
                                                    const v1::Problem& p);

// The distinct kernel entry points the launches use, sorted.
std::vector<std::string> KernelNames(const std::vector<ResolvedLaunch>& launches);

}  // namespace kforge::worker
