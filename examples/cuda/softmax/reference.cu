// Naive reference for row-wise softmax: one thread per row, three sequential passes (row max,
// sum of exp(x - max), normalise). Threads past the last row return early.
extern "C" __global__ void softmax_ref(const float* x, float* y, const int R, const int C) {
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= R) return;
  const float* xr = x + r * C;
  float* yr = y + r * C;
  float m = xr[0];
  for (int c = 1; c < C; ++c) m = fmaxf(m, xr[c]);
  float s = 0.0f;
  for (int c = 0; c < C; ++c) s += expf(xr[c] - m);
  for (int c = 0; c < C; ++c) yr[c] = expf(xr[c] - m) / s;
}
