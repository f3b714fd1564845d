#pragma once

// A valid OpenCL problem folder for the loader and summary tests, written into a TempDir.

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "gtest/gtest.h"
#include "tests/testutil/temp_dir.h"

namespace kforge::testing {

inline constexpr char kProblemYaml[] = R"yaml(name: matmul-test.v1
backend: opencl
description: C = A * B with extras
sizes:
  - {name: square, sizes: {M: 64, N: 64, K: 32}}
  - {name: odd, sizes: {M: 33, N: 17, K: 5}, bench: false}
scalars:
  alpha: {dtype: f32, value: 1.5}
buffers:
  A: {dtype: f32, shape: [M, K], role: in, fill: "uniform(-2, 2)"}
  B: {dtype: f16, shape: [K, N], role: in}
  idx: {dtype: i32, shape: [N], role: in}
  bytes: {dtype: u8, shape: ["ceil_div(N, 4) * 4"], role: in, fill: zeros}
  C: {dtype: f32, shape: [M, N], role: out}
  acc: {dtype: f64, shape: M, role: inout, fill: "arange(0, 0.5)"}
check: {atol: 1e-4, rtol: 2e-3, trials: 5}
reference:
  source: reference.cl
  defines: {BS: 16}
  launches:
    - kernel: matmul_ref
      global: ["ceil_div(N, BS) * BS", "ceil_div(M, BS) * BS"]
      local: [BS, BS]
      args: [A, B, C, M, N, K, alpha]
seed:
  source: seed.cl
  params: {TILE: [8, 16, 32], WPT: [1, 2, 4]}
  constraints:
    - "TILE % WPT == 0"
    - "TILE / WPT >= 4"
  scratch:
    partial: {dtype: f32, shape: ["ceil_div(M, TILE)", N]}
  launches:
    - kernel: matmul
      global: ["ceil_div(N, TILE) * (TILE / WPT)", "ceil_div(M, TILE) * TILE"]
      local: ["TILE / WPT", TILE]
      args: [A, B, C, M, N, K, partial, "K / 2"]
)yaml";

inline constexpr char kReferenceCl[] =
    "// Trusted reference.\n"
    "kernel void matmul_ref(global const float* A, global const half* B, global float* C,\n"
    "                       int M, int N, int K, float alpha) {\n"
    "  int j = get_global_id(0), i = get_global_id(1);\n"
    "  if (i < M && j < N) C[i * N + j] = 0.0f;\n"
    "}\n";

inline constexpr char kSeedCl[] =
    "#ifndef TILE\n#define TILE 16\n#endif\n"
    "kernel void matmul(global const float* A, global const half* B, global float* C,\n"
    "                   int M, int N, int K, global float* partial, int half_k) {\n"
    "}\n";

// Writes the problem folder with `yaml` (default: the valid one) under dir/rel; returns its path.
inline std::string WriteProblem(const TempDir& dir, const std::string& yaml = kProblemYaml,
                                const std::string& rel = "problem") {
  dir.Write(absl::StrCat(rel, "/reference.cl"), kReferenceCl);
  dir.Write(absl::StrCat(rel, "/seed.cl"), kSeedCl);
  dir.Write(absl::StrCat(rel, "/problem.yaml"), yaml);
  return absl::StrCat(dir.path(), "/", rel);
}

// `text` with the one occurrence of `from` replaced; fails the test if it is not there once.
inline std::string ReplaceOnce(const std::string& text, const std::string& from,
                               const std::string& to) {
  const size_t pos = text.find(from);
  EXPECT_NE(pos, std::string::npos) << "'" << from << "' not in the text";
  if (pos == std::string::npos) return text;
  EXPECT_EQ(text.find(from, pos + 1), std::string::npos) << "'" << from << "' is not unique";
  std::string out = text;
  out.replace(pos, from.size(), to);
  return out;
}

// 1-based line of the first occurrence of `needle`, 0 if absent.
inline int LineOf(const std::string& text, const std::string& needle) {
  const size_t pos = text.find(needle);
  if (pos == std::string::npos) return 0;
  int line = 1;
  for (size_t i = 0; i < pos; ++i) line += text[i] == '\n';
  return line;
}

}  // namespace kforge::testing
