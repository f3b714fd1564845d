#pragma once

// Turning a problem's symbolic launch plan into numbers for one size set and param assignment.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/expr.h"
#include "kforge/v1/candidate.pb.h"
#include "kforge/v1/problem.pb.h"

namespace kforge {

// Knob values by name; ordered so that printing and hashing are stable.
using ParamAssignment = std::map<std::string, int64_t>;

struct LaunchArg {
  enum class Kind { kBuffer, kScalar, kInt };
  Kind kind = Kind::kInt;
  std::string name;   // buffer or scalar name; the expression for kInt
  int64_t value = 0;  // kInt only
};

struct ResolvedLaunch {
  std::string kernel;
  std::vector<int64_t> global;  // OpenCL
  std::vector<int64_t> local;   // OpenCL; empty = driver's choice
  std::vector<int64_t> grid;    // CUDA
  std::vector<int64_t> block;   // CUDA
  int64_t shared_bytes = 0;     // CUDA
  std::vector<LaunchArg> args;
};

// Sizes of the set, then the spec's defines, then the params (later ones shadow nothing: the
// loader forbids clashing names).
Bindings MakeBindings(const v1::SizeSet& sizes, const v1::KernelSpec& spec,
                      const ParamAssignment& params);

// Product of the evaluated shape; errors name the dimension that failed or is not positive.
[[nodiscard]] absl::StatusOr<int64_t> ShapeElements(const google::protobuf::RepeatedPtrField<std::string>& shape,
                                                    const Bindings& env);

// Evaluates every dimension and resolves every argument. `scratch` are the candidate's extra
// buffers (also accepted as buffer arguments).
[[nodiscard]] absl::StatusOr<ResolvedLaunch> ResolveLaunch(
    const v1::Launch& launch, const v1::Problem& problem,
    const google::protobuf::RepeatedPtrField<v1::ScratchBuffer>& scratch, const Bindings& env);

// The seed candidate of a problem with the given knob values.
v1::Candidate MakeSeedCandidate(const v1::Problem& problem, const ParamAssignment& params);

// "TILE=16,WPT=4"
std::string FormatParams(const ParamAssignment& params);

// The -D values a candidate is compiled with: the seed's defines, then its knobs (the loader
// forbids clashing names).
std::map<std::string, int64_t> CompileDefines(const v1::Problem& problem, const ParamAssignment& params);

}  // namespace kforge
