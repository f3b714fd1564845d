// Naive reference for C = A * B (row-major f32): one thread per element of C, summing over k in
// order. Trusted and deliberately simple; threads past the edge of C return early.
extern "C" __global__ void matmul_ref(const float* A, const float* B, float* C, const int M,
                                      const int N, const int K) {
  const int col = blockIdx.x * blockDim.x + threadIdx.x;
  const int row = blockIdx.y * blockDim.y + threadIdx.y;
  if (row >= M || col >= N) return;
  float acc = 0.0f;
  for (int k = 0; k < K; ++k) acc += A[row * K + k] * B[k * N + col];
  C[row * N + col] = acc;
}
