// Row-wise softmax, one work-group per row (global size R * WG, local size WG).
//
// Passes over the row: its maximum and the sum of exp(x - max), then the normalised output. With
// ONLINE=1 the first two are one pass (a running maximum rescales the running sum), so the row is
// read twice instead of three times. Each pass strides over the row in steps of WG * ITEMS * VW; a
// work-item handles ITEMS vectors of VW elements per step, the vectors of neighbouring work-items
// adjacent (a work-group reads contiguous memory). Per-work-item results are combined with a tree
// reduction in local memory.
//
// Knobs (-D):
//   WG     work-items per row = work-group size; a power of two
//   ITEMS  vectors each work-item handles per loop step (independent loads in flight)
//   VW     elements per vector (1, 2, 4, 8, 16); a row's last partial vector goes element-wise
//   ONLINE 1: maximum and sum in one pass; 0: in two

#define CAT2(a, b) a##b
#define CAT(a, b) CAT2(a, b)
#if VW == 1
typedef float floatv;
#define VLOAD(p) (*(p))
#define VSTORE(v, p) (*(p) = (v))
#else
typedef CAT(float, VW) floatv;
#define VLOAD(p) CAT(vload, VW)(0, (p))
#define VSTORE(v, p) CAT(vstore, VW)((v), 0, (p))
#endif

inline float HMax(floatv v) {
  float t[VW];
  VSTORE(v, t);
  float m = t[0];
  for (int e = 1; e < VW; ++e) m = fmax(m, t[e]);
  return m;
}
inline float HSum(floatv v) {
  float t[VW];
  VSTORE(v, t);
  float s = 0.0f;
  for (int e = 0; e < VW; ++e) s += t[e];
  return s;
}
// (m, s) of a running sum of exp(x - m) moved to the maximum m2 >= m.
inline float Rescale(float s, float m, float m2) { return s == 0.0f ? 0.0f : s * exp(m - m2); }

// For every element of the row: FULL(c) for a whole vector at c, PART(c) for one element of the
// last, partial one.
#define FOR_ROW(FULL, PART)                                       \
  for (int base = 0; base < C; base += WG * ITEMS * VW) {         \
    for (int i = 0; i < ITEMS; ++i) {                             \
      const int c = base + (i * WG + lid) * VW;                   \
      if (c + VW <= C) {                                          \
        FULL(c)                                                   \
      } else {                                                    \
        for (int e = c; e < C && e < c + VW; ++e) { PART(e) }     \
      }                                                           \
    }                                                             \
  }

__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void softmax(__global const float* x, __global float* y, const int R, const int C) {
  const int r = get_group_id(0);
  const int lid = get_local_id(0);
  __global const float* xr = x + r * C;
  __global float* yr = y + r * C;
  __local float red_m[WG];
  __local float red_s[WG];

  float m = -INFINITY, sum = 0.0f;
#if ONLINE
#define FULL_MS(c) { const floatv v = VLOAD(xr + (c)); const float m2 = fmax(m, HMax(v)); \
                     sum = Rescale(sum, m, m2) + HSum(exp(v - (floatv)(m2))); m = m2; }
#define PART_MS(e) { const float m2 = fmax(m, xr[e]); sum = Rescale(sum, m, m2) + exp(xr[e] - m2); m = m2; }
  FOR_ROW(FULL_MS, PART_MS)
  red_m[lid] = m;
  red_s[lid] = sum;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int h = WG / 2; h > 0; h >>= 1) {
    if (lid < h) {
      const float m1 = red_m[lid], m2 = red_m[lid + h], mm = fmax(m1, m2);
      red_s[lid] = Rescale(red_s[lid], m1, mm) + Rescale(red_s[lid + h], m2, mm);
      red_m[lid] = mm;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  m = red_m[0];
  const float inv = 1.0f / red_s[0];
#else
  // Pass 1: row maximum.
#define FULL_M(c) { m = fmax(m, HMax(VLOAD(xr + (c)))); }
#define PART_M(e) { m = fmax(m, xr[e]); }
  FOR_ROW(FULL_M, PART_M)
  red_m[lid] = m;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int h = WG / 2; h > 0; h >>= 1) {
    if (lid < h) red_m[lid] = fmax(red_m[lid], red_m[lid + h]);
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  m = red_m[0];
  // Pass 2: sum of exp(x - max).
#define FULL_S(c) { sum += HSum(exp(VLOAD(xr + (c)) - (floatv)(m))); }
#define PART_S(e) { sum += exp(xr[e] - m); }
  FOR_ROW(FULL_S, PART_S)
  red_s[lid] = sum;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int h = WG / 2; h > 0; h >>= 1) {
    if (lid < h) red_s[lid] += red_s[lid + h];
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  const float inv = 1.0f / red_s[0];
#endif

  // Last pass: normalise.
#define FULL_Y(c) { VSTORE(exp(VLOAD(xr + (c)) - (floatv)(m)) * inv, yr + (c)); }
#define PART_Y(e) { yr[e] = exp(xr[e] - m) * inv; }
  FOR_ROW(FULL_Y, PART_Y)
}
