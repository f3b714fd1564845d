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

int openblas_get_num_threads(void);

static double Now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int Cmp(const void* a, const void* b) {
  const double x = *(const double*)a, y = *(const double*)b;
  return x < y ? -1 : x > y;
}

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
  qsort(t + 1, reps, sizeof(double), Cmp);
  printf("%.6f %d\n", t[1 + reps / 2], openblas_get_num_threads());
  return 0;
}
