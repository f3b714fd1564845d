/* OpenBLAS's SGEMM on the host's cores, for bench/clblast_peer.sh: row-major C = A * B (M x K
 * times K x N), random inputs, `reps` timed calls after one warm-up, each timed on the wall clock.
 * Prints the median seconds and the thread count OpenBLAS used. Built by the script with Debian's
 * libopenblas-dev, not by CMake.
 *
 *   openblas_sgemm M N K REPS */
#include <cblas-openblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "peer_timing.h"

int openblas_get_num_threads(void);

int main(int argc, char** argv) {
  if (argc != 5) {
    fprintf(stderr, "usage: openblas_sgemm M N K REPS\n");
    return 2;
  }
  const size_t m = strtoul(argv[1], NULL, 10), n = strtoul(argv[2], NULL, 10), k = strtoul(argv[3], NULL, 10);
  const int reps = atoi(argv[4]);
  float* a = malloc(sizeof(float) * m * k);
  float* b = malloc(sizeof(float) * k * n);
  float* c = malloc(sizeof(float) * m * n);
  for (size_t i = 0; i < m * k; ++i) a[i] = (float)rand() / RAND_MAX * 2 - 1;
  for (size_t i = 0; i < k * n; ++i) b[i] = (float)rand() / RAND_MAX * 2 - 1;
  double* t = malloc(sizeof(double) * (reps + 1));
  for (int r = 0; r <= reps; ++r) { /* r == 0: the warm-up (thread pool start, page faults) */
    const double s = Now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (blasint)m, (blasint)n, (blasint)k, 1.0f, a,
                (blasint)k, b, (blasint)n, 0.0f, c, (blasint)n);
    t[r] = Now() - s;
  }
  printf("%.6f %d\n", Median(t + 1, reps), openblas_get_num_threads());
  return 0;
}
