#pragma once

// The one place a work stream's name is derived: every producer (the coordinator's job runner)
// and consumer (workers, `kforge run`) of a problem's work uses it.

#include <string>
#include <string_view>

#include "kforge/v1/problem.pb.h"

namespace kforge {

// "<backend>" for any device of the problem's backend (device_class empty), otherwise
// "<backend>:<device_class>" (e.g. "cuda:NVIDIA H200"). Replay problems always use "replay". A
// problem whose reference is a PyTorch module goes to "<backend>+torch[:<device_class>]", which
// only workers that have torch read.
[[nodiscard]] std::string StreamFor(const v1::Problem& problem, std::string_view device_class = "");

// The stream of `backend` problems (with a PyTorch reference when `torch`).
[[nodiscard]] std::string StreamOf(v1::Backend backend, bool torch, std::string_view device_class = "");

}  // namespace kforge
