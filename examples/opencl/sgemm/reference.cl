// Naive reference for C = A * B (row-major f32): one work-item per element of C, summing over k
// in order. Trusted and deliberately simple; the launch rounds the global size up to the
// work-group size, so out-of-range work-items return early.
__kernel void matmul_ref(__global const float* A, __global const float* B, __global float* C,
                         const int M, const int N, const int K) {
  const int col = get_global_id(0);
  const int row = get_global_id(1);
  if (row >= M || col >= N) return;
  float acc = 0.0f;
  for (int k = 0; k < K; ++k) acc += A[row * K + k] * B[k * N + col];
  C[row * N + col] = acc;
}
