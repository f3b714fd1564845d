#pragma once

#include "services/gpu-worker/layer.h"

// Host-side buffer contents: random fills, poison patterns, and the tolerance comparison that
// decides whether a candidate computed the right answer.

#include <cstdint>
#include <random>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "kforge/v1/evaluation.pb.h"
#include "kforge/v1/problem.pb.h"
#include "kforge/v1/sandbox.pb.h"

namespace kforge::worker {

float HalfToFloat(uint16_t h);
uint16_t FloatToHalf(float f);
float Bf16ToFloat(uint16_t b);
uint16_t FloatToBf16(float f);

// Element i of raw bytes of the given dtype, as a double.
double ElementAt(const std::string& bytes, v1::DType dtype, int64_t i);

// Fresh contents for an input buffer.
std::string FillBytes(v1::DType dtype, int64_t elements, const v1::Fill& fill, std::mt19937_64& rng);

// Outputs are poisoned before every candidate run so unwritten elements fail. Two different
// patterns are used on the two validation runs, so an element left untouched fails at least one
// of them whatever the reference holds there. Pattern 0 is NaN for floats.
std::string PoisonBytes(v1::DType dtype, int64_t elements, int pattern);

// The sandbox side of v1::Poison: the number of bytes it stands for, refused when the dtype is
// unknown or the size is negative or larger than max_bytes. Checked before PoisonBytes expands it.
absl::StatusOr<int64_t> PoisonSize(const v1::Poison& poison, int64_t max_bytes);

struct CompareResult {
  bool ok = true;
  double max_abs_error = 0;
  double max_rel_error = 0;
  int64_t mismatches = 0;
  int64_t first_mismatch = -1;
  double got_at_first = 0;
  double want_at_first = 0;
};

// |got - want| <= atol + rtol * |want| for every element; NaN or infinity where the reference is
// finite always fails, a non-finite reference value must be matched exactly.
CompareResult CompareBytes(std::string_view got, std::string_view want, v1::DType dtype,
                           double atol, double rtol);

}  // namespace kforge::worker
