// Naive reference transpose: one thread per element, y[c * R + r] = x[r * C + c]. Threads past
// the edge of x do nothing.
extern "C" __global__ void transpose_ref(const float* x, float* y, const int R, const int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  const int r = blockIdx.y * blockDim.y + threadIdx.y;
  if (r < R && c < C) y[c * R + r] = x[r * C + c];
}
