/* Timing helpers of the peer-library programs the bench scripts build with cc (clblast_sgemm.c,
 * openblas_sgemm.c): the monotonic clock, and the median of timed repetitions. */
#pragma once

#include <stdlib.h>
#include <time.h>

static double Now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int CmpDouble(const void* a, const void* b) {
  const double x = *(const double*)a, y = *(const double*)b;
  return x < y ? -1 : x > y;
}

/* The median of t[0..n), sorting it. */
static double Median(double* t, int n) {
  qsort(t, n, sizeof(double), CmpDouble);
  return t[n / 2];
}
