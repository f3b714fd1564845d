#pragma once

// A small OpenCL problem for tests that need a real one: c = a + b over 4096 floats, with a
// work-group size knob of three values.

#include <string>

#include "tests/testutil/temp_dir.h"

namespace kforge::testing {

inline constexpr char kVaddSeed[] =
    "__kernel void add(__global const float* a, __global const float* b, __global float* c, int n) {\n"
    "  int i = get_global_id(0);\n"
    "  if (i < n) c[i] = a[i] + b[i];\n"
    "}\n";

// Writes the problem folder at dir/rel and returns its path.
inline std::string WriteVaddProblem(const TempDir& dir, const std::string& rel) {
  dir.Write(rel + "/problem.yaml",
            "name: vadd\nbackend: opencl\nsizes: {N: 4096}\n"
            "buffers:\n  a: {dtype: f32, shape: [N], role: in}\n  b: {dtype: f32, shape: [N], role: in}\n"
            "  c: {dtype: f32, shape: [N], role: out}\n"
            "reference:\n  source: seed.cl\n  launches: [{kernel: add, global: [N], local: [64], args: [a, b, c, N]}]\n"
            "seed:\n  source: seed.cl\n  params: {WG: [32, 64, 128]}\n"
            "  launches: [{kernel: add, global: [N], local: [WG], args: [a, b, c, N]}]\n");
  dir.Write(rel + "/seed.cl", kVaddSeed);
  return dir.path() + "/" + rel;
}

}  // namespace kforge::testing
