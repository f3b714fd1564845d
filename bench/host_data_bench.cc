// kforge-bench-host: throughput of the worker's host-side buffer work per validation run, against
// memcmp over the same bytes measured in the same run (the floor for reading two buffers).
//
//   build/bench/kforge-bench-host [--benchmark_filter=...]

#include <cstring>
#include <random>
#include <string>

#include "benchmark/benchmark.h"
#include "services/gpu-worker/host_data.h"

namespace {

// Two buffers of n elements that agree within tolerance (the common, passing case): equal bytes,
// or for f32 with `close`, every element off by a relative 2^-20 (a kernel that sums in another
// order).
std::pair<std::string, std::string> Buffers(kforge::v1::DType dtype, int64_t n,
                                            bool close = false) {
  kforge::v1::Fill fill;
  fill.set_kind(kforge::v1::Fill::KIND_UNIFORM);
  fill.set_a(-1);
  fill.set_b(1);
  std::mt19937_64 rng(1);
  std::string want = kforge::worker::FillBytes(dtype, n, fill, rng);
  std::string got = want;
  if (close && dtype == kforge::v1::DTYPE_F32) {
    for (int64_t i = 0; i < n; ++i) {
      float v;
      std::memcpy(&v, got.data() + 4 * i, 4);
      v *= 1.0f + 0x1p-20f;
      std::memcpy(got.data() + 4 * i, &v, 4);
    }
  }
  return {got, want};
}

void BM_CompareBytes(benchmark::State& state, kforge::v1::DType dtype, bool close) {
  const int64_t n = state.range(0);
  auto [got, want] = Buffers(dtype, n, close);
  for (auto _ : state) {
    auto r = kforge::worker::CompareBytes(got, want, dtype, 1e-5, 1e-3);
    benchmark::DoNotOptimize(r);
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(got.size() + want.size()));
}

void BM_Memcmp(benchmark::State& state) {
  const int64_t n = state.range(0);
  auto [got, want] = Buffers(kforge::v1::DTYPE_F32, n);
  for (auto _ : state) {
    int c = std::memcmp(got.data(), want.data(), got.size());
    benchmark::DoNotOptimize(c);
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(got.size() + want.size()));
}

// 8M elements: one 4096 x 2048 f32 output, as in the CUDA softmax example.
constexpr int64_t kElements = int64_t{4096} * 2048;
BENCHMARK(BM_Memcmp)->Arg(kElements)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_CompareBytes, f32_equal, kforge::v1::DTYPE_F32, false)
    ->Arg(kElements)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_CompareBytes, f32_close, kforge::v1::DTYPE_F32, true)
    ->Arg(kElements)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_CompareBytes, f16_equal, kforge::v1::DTYPE_F16, false)
    ->Arg(kElements)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_CompareBytes, i32_equal, kforge::v1::DTYPE_I32, false)
    ->Arg(kElements)
    ->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
