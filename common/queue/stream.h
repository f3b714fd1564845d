#pragma once

// The one place a work stream's name is derived: every producer (the coordinator's job runner)
// and consumer (workers, `kforge run`) of a problem's work uses it.

#include <string>
#include <string_view>

#include "kforge/v1/problem.pb.h"

namespace kforge {

// "<backend>" for any device of the problem's backend (device_class empty), otherwise
// "<backend>:<device_class>" (e.g. "cuda:NVIDIA H200"). Replay problems always use "replay".
[[nodiscard]] std::string StreamFor(const v1::Problem& problem, std::string_view device_class = "");

}  // namespace kforge
