// Row-wise softmax, one work-group per row (global size R * WG, local size WG).
//
// Three passes over the row: row maximum, sum of exp(x - max), then the normalised output.
// Each pass strides over the row in steps of WG * ITEMS; a work-item handles ITEMS elements per
// step (WG apart, so a work-group reads contiguous memory). The per-work-item maxima and sums
// are combined with a tree reduction in local memory.
//
// Knobs (-D):
//   WG     work-items per row = work-group size; a power of two
//   ITEMS  elements each work-item handles per loop step (independent loads in flight)

__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void softmax(__global const float* x, __global float* y, const int R, const int C) {
  const int r = get_group_id(0);
  const int lid = get_local_id(0);
  __global const float* xr = x + r * C;
  __global float* yr = y + r * C;
  __local float red[WG];

  // Pass 1: row maximum.
  float m = -INFINITY;
  for (int base = 0; base < C; base += WG * ITEMS) {
    for (int i = 0; i < ITEMS; ++i) {
      const int c = base + i * WG + lid;
      if (c < C) m = fmax(m, xr[c]);
    }
  }
  red[lid] = m;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int s = WG / 2; s > 0; s >>= 1) {
    if (lid < s) red[lid] = fmax(red[lid], red[lid + s]);
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  m = red[0];
  barrier(CLK_LOCAL_MEM_FENCE);  // everyone has read red[0] before it is reused

  // Pass 2: sum of exp(x - max).
  float sum = 0.0f;
  for (int base = 0; base < C; base += WG * ITEMS) {
    for (int i = 0; i < ITEMS; ++i) {
      const int c = base + i * WG + lid;
      if (c < C) sum += exp(xr[c] - m);
    }
  }
  red[lid] = sum;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int s = WG / 2; s > 0; s >>= 1) {
    if (lid < s) red[lid] += red[lid + s];
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  const float inv = 1.0f / red[0];

  // Pass 3: normalise.
  for (int base = 0; base < C; base += WG * ITEMS) {
    for (int i = 0; i < ITEMS; ++i) {
      const int c = base + i * WG + lid;
      if (c < C) yr[c] = exp(xr[c] - m) * inv;
    }
  }
}
