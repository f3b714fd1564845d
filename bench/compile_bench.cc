// kforge-bench-compile: CUDA compile latency, NVRTC in-process against an nvcc subprocess on
// the same kernels (every CUDA example's seed with its default params), and the cost of a warm
// compile-cache hit (key hashing + lookup, the exact path the CUDA backend takes).
//
//   kforge-bench-compile [--arch sm_90] [--reps 3] [--nvcc /usr/local/cuda/bin/nvcc]

#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/bench_util.h"
#include "common/param_space.h"
#include "common/problem_loader.h"
#include "services/gpu-worker/cuda_compiler.h"
#include "services/gpu-worker/device_backend.h"

using namespace kforge;
namespace fs = std::filesystem;

int main(int argc, char** argv) {
  CLI::App app{"kforge CUDA compile latency benchmark", "kforge-bench-compile"};
  std::string arch = "sm_90";
  std::string nvcc = "/usr/local/cuda/bin/nvcc";
  std::string examples = std::string(KFORGE_SOURCE_DIR) + "/examples/cuda";
  int reps = 3;
  app.add_option("--arch", arch, "target architecture");
  app.add_option("--nvcc", nvcc, "nvcc to compare against");
  app.add_option("--examples", examples, "folder of CUDA problem folders");
  app.add_option("--reps", reps, "repetitions per kernel and compiler");
  CLI11_PARSE(app, argc, argv);

  auto nvrtc = worker::Nvrtc::Load();
  if (!nvrtc.ok()) {
    std::cerr << nvrtc.status().message() << "\n";
    return 1;
  }
  const std::string tmp = (fs::temp_directory_path() / absl::StrCat("kforge-bench-compile-", getpid())).string();
  fs::create_directories(tmp);
  std::cout << "| kernel | NVRTC in-process | nvcc subprocess | ratio | warm cache hit |\n|---|---|---|---|---|\n";
  double sum_nvrtc = 0, sum_nvcc = 0;
  std::vector<double> all_hits;
  std::vector<std::string> dirs;
  for (const auto& e : fs::directory_iterator(examples)) dirs.push_back(e.path().string());
  std::sort(dirs.begin(), dirs.end());
  for (const auto& dir : dirs) {
    auto p = LoadProblem(dir);
    if (!p.ok()) continue;
    auto space = ParamSpace::Create(*p);
    std::map<std::string, int64_t> defs(p->seed().defines().begin(), p->seed().defines().end());
    const ParamAssignment params = *space->DefaultAssignment();
    for (const auto& [k, v] : params) defs[k] = v;
    const std::string src = tmp + "/k.cu";
    std::ofstream(src) << p->seed().source();
    std::vector<double> t_nvrtc, t_nvcc, hits;
    for (int r = 0; r < reps; ++r) {
      double s = bench::Now();
      worker::NvrtcOutput out = (*nvrtc)->Compile(p->seed().source(), defs, arch);
      t_nvrtc.push_back(bench::Now() - s);
      if (!out.ok) std::cerr << dir << ": " << out.log << "\n";
      std::vector<std::string> args = {nvcc, "-cubin", absl::StrCat("-arch=", arch), "--std=c++17",
                                       "-o", tmp + "/k.cubin", src};
      for (const auto& [k, v] : defs) args.push_back(absl::StrCat("-D", k, "=", v));
      std::vector<char*> argvv;
      for (auto& a : args) argvv.push_back(a.data());
      argvv.push_back(nullptr);
      s = bench::Now();
      pid_t pid = fork();
      if (pid == 0) {
        execv(argvv[0], argvv.data());
        _exit(127);
      }
      int status = 0;
      waitpid(pid, &status, 0);
      t_nvcc.push_back(bench::Now() - s);
      if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) std::cerr << dir << ": nvcc failed\n";
      // Warm hit: key the request and find it, as CudaBackend::Compile does before compiling.
      v1::CompileRequest req;
      req.set_source(p->seed().source());
      for (const auto& [k, v] : defs) (*req.mutable_defines())[k] = v;
      for (const auto& l : p->seed().launches()) req.add_kernels(l.kernel());
      std::map<std::string, int> cache = {{worker::CompileCacheKey(req, arch + "|" + (*nvrtc)->Version()), 1}};
      s = bench::Now();
      const bool hit = cache.count(worker::CompileCacheKey(req, arch + "|" + (*nvrtc)->Version())) == 1;
      hits.push_back(bench::Now() - s);
      if (!hit) std::cerr << "cache miss?\n";
    }
    const double a = bench::Median(t_nvrtc), b = bench::Median(t_nvcc), h = bench::Median(hits);
    sum_nvrtc += a;
    sum_nvcc += b;
    all_hits.push_back(h);
    std::cout << absl::StrFormat("| %s | %.0f ms | %.0f ms | %.2fx | %.3f ms |\n", fs::path(dir).filename().string(),
                                 a * 1e3, b * 1e3, b / a, h * 1e3);
  }
  std::cout << absl::StrFormat("\n%s, %s: nvcc / NVRTC over all kernels = %.2fx; warm hit median %.3f ms\n",
                               (*nvrtc)->Version(), arch, sum_nvcc / sum_nvrtc, bench::Median(all_hits) * 1e3);
  fs::remove_all(tmp);
  return 0;
}
