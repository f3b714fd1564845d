// What asking an OpenCL driver for CL_PROGRAM_BINARY_SIZES costs after a build: alternates builds of
// unique sources (a distinct #define each, so no cache answers) with and without the query and
// prints the medians. Not part of the build (the worker no longer asks: opencl_backend.cc):
//   g++ -O2 bench/pocl_binary_query.cc -o /tmp/q -lOpenCL
//   POCL_CACHE_DIR=$(mktemp -d) /tmp/q examples/opencl/matmul/seed.cl matmul
#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>
int main(int argc, char** argv) {
  std::ifstream in(argv[1]);
  std::stringstream ss; ss << in.rdbuf();
  const std::string src = ss.str();
  cl_platform_id plat; clGetPlatformIDs(1, &plat, nullptr);
  cl_device_id dev; clGetDeviceIDs(plat, CL_DEVICE_TYPE_ALL, 1, &dev, nullptr);
  cl_int err; cl_context ctx = clCreateContext(nullptr, 1, &dev, nullptr, nullptr, &err);
  std::vector<double> with, without;
  for (int i = 0; i < 16; ++i) {
    for (int q = 0; q < 2; ++q) {
      // A distinct define per build: a different program for PoCL's cache.
      std::string s = "#define UNIQUE_" + std::to_string(i * 2 + q) + " 1\n" + src;
      const char* p = s.c_str();
      auto t0 = std::chrono::steady_clock::now();
      cl_program prog = clCreateProgramWithSource(ctx, 1, &p, nullptr, &err);
      err = clBuildProgram(prog, 1, &dev, "-DTILE=16 -DWPT=4 -DPAD=1", nullptr, nullptr);
      if (err != CL_SUCCESS) { std::printf("build failed %d\n", err); return 1; }
      cl_kernel k = clCreateKernel(prog, argv[2], &err);
      if (q == 1) { size_t n = 0; clGetProgramInfo(prog, CL_PROGRAM_BINARY_SIZES, sizeof(n), &n, nullptr); }
      double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      (q ? with : without).push_back(sec);
      clReleaseKernel(k); clReleaseProgram(prog);
    }
  }
  auto med = [](std::vector<double> v) { std::sort(v.begin(), v.end()); return v[v.size() / 2]; };
  std::printf("build+kernel, median of 16 alternating: without query %.3f s, with CL_PROGRAM_BINARY_SIZES %.3f s\n", med(without), med(with));
}
