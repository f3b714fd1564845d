/* CLBlast's SGEMM on the first OpenCL device, for bench/clblast_peer.sh: row-major C = A * B
 * (M x K times K x N), random inputs, `reps` timed calls after one warm-up, each timed on the
 * wall clock around the call and clFinish (CLBlast may launch more than one kernel). Prints the
 * median seconds. Built by the script with the system's CLBlast (libclblast-dev), not by CMake.
 *
 *   clblast_sgemm M N K REPS */
#define CL_TARGET_OPENCL_VERSION 300  /* the default, said: no #pragma message */
#include <clblast_c.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "peer_timing.h"

int main(int argc, char** argv) {
  if (argc != 5) {
    fprintf(stderr, "usage: clblast_sgemm M N K REPS\n");
    return 2;
  }
  const size_t m = strtoul(argv[1], NULL, 10), n = strtoul(argv[2], NULL, 10), k = strtoul(argv[3], NULL, 10);
  const int reps = atoi(argv[4]);
  cl_platform_id platform;
  cl_device_id device;
  if (clGetPlatformIDs(1, &platform, NULL) != CL_SUCCESS ||
      clGetDeviceIDs(platform, CL_DEVICE_TYPE_ALL, 1, &device, NULL) != CL_SUCCESS) {
    fprintf(stderr, "no OpenCL device\n");
    return 1;
  }
  cl_int err;
  cl_context ctx = clCreateContext(NULL, 1, &device, NULL, NULL, &err);
  cl_command_queue q = clCreateCommandQueue(ctx, device, 0, &err);
  float* host = malloc(sizeof(float) * (m * k + k * n));
  for (size_t i = 0; i < m * k + k * n; ++i) host[i] = (float)rand() / RAND_MAX * 2 - 1;
  cl_mem a = clCreateBuffer(ctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, sizeof(float) * m * k, host, &err);
  cl_mem b = clCreateBuffer(ctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, sizeof(float) * k * n, host + m * k, &err);
  cl_mem c = clCreateBuffer(ctx, CL_MEM_READ_WRITE, sizeof(float) * m * n, NULL, &err);
  double* t = malloc(sizeof(double) * (reps + 1));
  for (int r = 0; r <= reps; ++r) {  /* r == 0: the warm-up (CLBlast compiles its kernels then) */
    const double s = Now();
    CLBlastStatusCode st = CLBlastSgemm(CLBlastLayoutRowMajor, CLBlastTransposeNo, CLBlastTransposeNo, m, n, k,
                                        1.0f, a, 0, k, b, 0, n, 0.0f, c, 0, n, &q, NULL);
    clFinish(q);
    if (st != CLBlastSuccess) {
      fprintf(stderr, "CLBlastSgemm failed: %d\n", (int)st);
      return 1;
    }
    t[r] = Now() - s;
  }
  printf("%.6f\n", Median(t + 1, reps));
  return 0;
}
