// Naive reference for row-wise softmax: one work-item per row, three sequential passes
// (row max, sum of exp(x - max), normalise). Out-of-range work-items return early.
__kernel void softmax_ref(__global const float* x, __global float* y, const int R, const int C) {
  const int r = get_global_id(0);
  if (r >= R) return;
  __global const float* xr = x + r * C;
  __global float* yr = y + r * C;
  float m = xr[0];
  for (int c = 1; c < C; ++c) m = fmax(m, xr[c]);
  float s = 0.0f;
  for (int c = 0; c < C; ++c) s += exp(xr[c] - m);
  for (int c = 0; c < C; ++c) yr[c] = exp(xr[c] - m) / s;
}
