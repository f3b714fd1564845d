// Naive reference transpose: one work-item per element, y[c * R + r] = x[r * C + c]. The
// launch rounds the global size up, so out-of-range work-items do nothing.
__kernel void transpose_ref(__global const float* x, __global float* y, const int R,
                            const int C) {
  const int c = get_global_id(0);
  const int r = get_global_id(1);
  if (r < R && c < C) y[c * R + r] = x[r * C + c];
}
